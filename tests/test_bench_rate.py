"""`localspec bench --rate`: random arrivals, the open loop, the summary, the command."""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
from itertools import pairwise
from pathlib import Path
from types import SimpleNamespace

import pytest

from localspec import arrivals as ar
from localspec import concurrency as cc
from localspec import native_server as ns
from localspec.cli import main
from localspec.commands.bench_concurrency import Load, with_native
from tests.test_bench_concurrency import stand_in, stand_in_settings


def test_a_rate_list_is_sorted_rates() -> None:
    assert ar.rate_list("0.4, 0.1,2") == [0.1, 0.4, 2.0]


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("0", "out of range"),
        ("-1", "out of range"),
        ("nan", "out of range"),
        ("fast", "not a rate"),
        ("0.1,,0.2", "empty item"),
        ("0.1,0.1", "given twice"),
        ("", "give request rates"),
    ],
)
def test_a_bad_rate_list_is_one_line_and_exit_2(capsys, text: str, said: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(argparse.ArgumentTypeError, match=said):
        ar.rate_list(text)
    with pytest.raises(SystemExit) as exited:
        main(["bench", "--rate", text])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--rate", "0.1", "--concurrency", "2"], "two different benches"),
        (["--rate", "0.1", "--fim"], "--fim and --rate are two different benches"),
        (["--rate", "0.1", "--scenarios", "agent"], "--rate and --scenarios"),
        (["--rate", "0.1", "--no-adaptive"], "--no-adaptive does not apply to --rate"),
        (["--rate", "0.1", "--modes", "none"], "--modes with --rate"),
        (["--parallel", "2"], "--parallel applies to --rate only"),
        (["--concurrency", "2", "--parallel", "2"], "as many slots as its most clients"),
        (["--requests", "2"], "--requests applies to --concurrency and --rate"),
    ],
)
def test_the_rate_bench_refuses_what_does_not_apply(capsys, argv: list[str], said: str) -> None:  # type: ignore[no-untyped-def]
    assert main(["bench", "qwen2.5-coder-0.5b", *argv]) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err


def test_arrivals_are_one_sequence_of_gaps_scaled_by_the_rate() -> None:
    slow, fast = ar.arrival_plan(0.5, 8, 3, 0), ar.arrival_plan(2.0, 8, 3, 0)
    assert slow[0].at_s == 0.0 and len(slow) == 8
    assert all(a.at_s < b.at_s for a, b in pairwise(slow))
    assert [a.at_s for a in slow] == pytest.approx([4 * a.at_s for a in fast])
    assert [a.request for a in slow] == [a.request for a in fast]
    assert [a.request.prompt for a in slow] == [0, 1, 2, 0, 1, 2, 0, 1]
    again = ar.arrival_plan(0.5, 8, 3, 1)  # another repeat: other times, prompts shifted
    assert [a.request.prompt for a in again][:3] == [1, 2, 0]
    assert [a.at_s for a in again] != [a.at_s for a in slow]
    assert ar.arrival_plan(0.5, 8, 3, 0) == slow  # the same for every configuration


def test_requests_are_sent_at_their_times_whatever_still_runs() -> None:
    sent: dict[int, float] = {}
    plan = [ar.Arrival(t, cc.Request(i, i)) for i, t in enumerate((0.0, 0.1, 0.2))]

    def send(request: cc.Request) -> int:
        sent[request.prompt] = time.perf_counter()
        time.sleep(0.5)  # longer than the gaps: an open loop does not wait for it
        return 10 + request.prompt

    t0 = time.perf_counter()
    timing = ar.run_arrivals(send, plan, threading.Event())
    offsets = [sent[i] - t0 for i in range(3)]
    # a closed loop would send at 0, 0.5 and 1.0 s; the margins are a busy 2-core machine's
    assert offsets == pytest.approx([0.0, 0.1, 0.2], abs=0.15)
    assert timing.tokens == 33 and timing.wall_s < 1.3
    assert [s.client for s in timing.spans] == [0, 1, 2]  # in arrival order
    assert all(0.45 < x < 0.8 for x in timing.latencies_s)  # from arrival to answer


def test_a_failure_stops_the_arrivals_and_is_raised() -> None:
    sent: list[int] = []

    def send(request: cc.Request) -> int:
        sent.append(request.prompt)
        if request.prompt == 0:
            raise RuntimeError("server gone")
        return 1

    plan = [ar.Arrival(0.3 * i, cc.Request(i, i)) for i in range(5)]
    stop = threading.Event()
    with pytest.raises(RuntimeError, match="server gone"):
        ar.run_arrivals(send, plan, stop)
    assert stop.is_set() and sent == [0]


@pytest.mark.usefixtures("ctrl_c_raises")
def test_ctrl_c_between_arrivals_stops_the_requests_in_flight_and_sends_no_more() -> None:
    sent: list[int] = []
    stop = threading.Event()

    def send(request: cc.Request) -> int:
        sent.append(request.prompt)
        stop.wait(30)  # a request in flight ends once stop is set, as the senders do
        return 0

    plan = [ar.Arrival(0.0, cc.Request(0, 0)), ar.Arrival(30.0, cc.Request(1, 1))]
    # a real SIGINT, as Ctrl-C sends it (it wakes the wait for the next arrival)
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
    t0 = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        ar.run_arrivals(send, plan, stop)
    assert time.perf_counter() - t0 < 5 and stop.is_set() and sent == [0]


def run(config: str, rate: float, latencies: tuple[float, ...], tokens: int = 10) -> ar.RateRun:
    return ar.RateRun(
        config, rate, 0, tokens * len(latencies), 10.0, latencies, (tokens,) * len(latencies)
    )


def test_a_rate_point_sums_up_its_requests_latencies() -> None:
    runs = [run(cc.PLAIN, 0.5, (1.0, 2.0, 3.0)), run(cc.PLAIN, 0.5, (4.0,), tokens=20)]
    (point,) = ar.summarise_rates(runs)
    assert point.mean_s == pytest.approx(2.5) and point.p50_s == pytest.approx(2.5)
    assert point.requests == 4 and point.tokens_per_s == pytest.approx(50 / 20)
    assert point.per_token_ms == pytest.approx(200)  # the median of 100, 200, 300, 200 ms
    assert point.to_dict()["latency_mean_s"] == 2.5


def test_the_meaning_compares_latencies_with_plain_batching_and_llama_server() -> None:
    points = ar.summarise_rates(
        [
            run(cc.PLAIN, 0.5, (3.0,)),
            run(cc.FIXED, 0.5, (2.5,)),
            run(cc.LOAD_AWARE, 0.5, (2.0,)),
            run("native plain", 0.5, (3.2,)),
            run("native ngram-simple", 0.5, (2.4,)),
            run(cc.PLAIN, 2.0, (5.0,)),
            run(cc.FIXED, 2.0, (7.0,)),
            run(cc.LOAD_AWARE, 2.0, (5.0,)),
        ]
    )
    lines = ar.rate_meaning(points)
    assert "0.5 requests/s: load-aware answers soonest (mean 2.00 s, p95 2.00 s)" in lines
    assert any("load-aware 1.50x sooner than plain batching" in x for x in lines)
    assert any("1.20x sooner than llama-server's best (native ngram-simple)" in x for x in lines)
    assert "2 requests/s: load-aware 1.00x sooner than plain batching (mean latency)" in lines


def test_llama_server_gets_the_same_arrivals_with_as_many_slots(tmp_path: Path) -> None:
    script = stand_in(arg_checks='assert args[args.index("-np") + 1] == "3"')
    settings = stand_in_settings(tmp_path, script)
    stop = threading.Event()
    prompts = [SimpleNamespace(schema=None)] * 2  # two prompts, no schema
    load = Load(prompts, 4, 1, 7, 0.0, "ngram-simple", stop)  # type: ignore[arg-type]

    def here(load: Load, configs, rate: float):  # type: ignore[no-untyped-def]
        return ar.run_rate(configs, rate, load.requests, len(load.prompts), load.repeats, stop)

    runs = list(with_native(load, [], settings, ["a", "b"], 3, 20.0, here))
    assert [r.config for r in runs] == ["native plain", "native ngram-simple"]
    assert all(r.tokens == 28 and len(r.latencies_s) == 4 for r in runs)
    log = (tmp_path / ns.SERVER).with_suffix(".log").read_text().split("\n")
    assert log.count("server none 7") == 4 and log.count("server ngram-simple 7") == 4


# ----- the real model ----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.usefixtures("ctrl_c_raises")
def test_a_short_rate_bench_on_the_real_model(capsys, tmp_path: Path, qwen_path) -> None:  # type: ignore[no-untyped-def]
    out, md, png = tmp_path / "r.json", tmp_path / "r.md", tmp_path / "r.png"
    watchdog = threading.Timer(180, os.kill, (os.getpid(), signal.SIGINT))  # fail, not hang
    watchdog.start()
    try:
        code = main(
            ["bench", str(qwen_path), "--rate", "2,8", "-n", "8", "--repeat", "1",
             "--requests", "3", "--parallel", "2", "--json", str(out), "--markdown", str(md),
             "--plot", str(png)]
        )  # fmt: skip
    finally:
        watchdog.cancel()
    assert code == 0
    report = json.loads(out.read_text())
    assert report["slots"] == 2 and report["rates"] == [2.0, 8.0] and not report["partial"]
    points = {(p["config"], p["rate"]): p for p in report["points"]}
    assert set(points) == {(c, r) for c in cc.CONFIGS for r in (2.0, 8.0)}
    for p in points.values():
        assert p["requests"] == 3 and p["tokens_per_s"] > 0
        assert 0 < p["latency_p50_s"] <= p["latency_p95_s"]
    assert all(len(r["latencies_s"]) == 3 for r in report["runs"])
    assert "| 8 | load-aware |" in md.read_text()
    assert png.read_bytes().startswith(b"\x89PNG")
    printed = capsys.readouterr()
    assert "sooner than plain batching" in printed.out and "requests/s" in printed.err
