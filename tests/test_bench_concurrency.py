"""`localspec bench --concurrency`: the flag's list, the requests each client sends, one batch
of client threads, the summary and its crossover, llama-server's lifecycle (against a stand-in
server), and a short run on the real model."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from localspec import concurrency as cc
from localspec import native_server as ns
from localspec.cli import main
from localspec.commands.bench_concurrency import Load, with_native
from localspec.errors import LocalspecError
from localspec.prompts import select_prompts


def point(config: str, n: int, speed: float) -> cc.Point:
    return cc.Point(config, n, speed, speed, speed, 1.0, 2.0, n, None)


# ----- the flag ------------------------------------------------------------------------------


def test_a_concurrency_list_is_sorted_counts() -> None:
    assert cc.concurrency_list("8, 1,2,4") == [1, 2, 4, 8]
    assert cc.concurrency_list("3") == [3]


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("0", "0 clients is out of range"),
        ("x", "'x' is not a whole number of clients"),
        ("1,,2", "'1,,2' has an empty item"),
        ("1,", "has an empty item"),
        ("", "give client counts"),
        ("2,2", "2 is given twice"),
        ("65", "between 1 and 64"),
        ("1.5", "'1.5' is not a whole number"),
    ],
)
def test_a_bad_concurrency_list_is_one_line_and_exit_2(capsys, text: str, said: str) -> None:  # type: ignore[no-untyped-def]
    # refused by argparse: before the (missing) model is looked at
    with pytest.raises(SystemExit) as refused:
        main(["bench", "/nope/model.gguf", "--concurrency", text])
    err = capsys.readouterr().err
    assert refused.value.code == 2
    assert len(err.strip().splitlines()) == 2  # the error, and where to read more
    assert "argument --concurrency:" in err and said in err
    assert "Traceback" not in err


def test_the_concurrency_bench_refuses_what_does_not_apply(capsys) -> None:  # type: ignore[no-untyped-def]
    cases = [
        (["--scenarios", "agent"], "--concurrency and --scenarios"),
        (["--no-adaptive"], "--no-adaptive does not apply to --concurrency"),
        (["--modes", "none"], "give the one speculative mode"),
        (["--modes", "ngram-simple,suffix"], "give the one speculative mode"),
        (["--native", "/nope"], "--native /nope: no executable llama-server"),
    ]
    for extra, expected in cases:
        code = main(["bench", "/nope/model.gguf", "--concurrency", "1,2", *extra])
        err = capsys.readouterr().err
        assert code == 2 and expected in err, (extra, err)


# ----- the measurement -----------------------------------------------------------------------


def test_clients_ask_for_different_prompts_and_a_repeat_shifts_them() -> None:
    plan = cc.client_plan(2, 3, 6, repeat=0)
    assert [[r.prompt for r in client] for client in plan] == [[0, 2, 4], [1, 3, 5]]
    shifted = cc.client_plan(2, 3, 6, repeat=1)
    assert [[r.prompt for r in client] for client in shifted] == [[1, 3, 5], [2, 4, 0]]
    seeds = [r.seed for client in plan + shifted for r in client]
    assert len(set(seeds)) == len(seeds)  # a sampled request draws its own


def test_a_batch_runs_its_clients_at_once() -> None:
    running, most = 0, 0
    lock = threading.Lock()

    def send(request: cc.Request) -> int:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.05)
        with lock:
            running -= 1
        return 10

    timing = cc.run_batch(send, cc.client_plan(4, 2, 6, 0), threading.Event())
    tokens, wall, latencies = timing.tokens, timing.wall_s, timing.latencies_s
    assert tokens == 80 and len(latencies) == 8
    assert most == 4
    assert wall < 0.05 * 8  # not one after the other
    assert all(x >= 0.04 for x in latencies)


def test_throughput_in_flight_ends_when_a_client_runs_out_of_work() -> None:
    """Two clients: one sends two short requests (done at 4 s), the other one long request
    (0-10 s). In flight is up to 4 s: 20 + 20 tokens, and 4 s of the long request's 100
    tokens spread over 10 s; the drain after it (one request alone) is not counted."""
    spans = (
        cc.Span(0, 0.0, 2.0, 20),
        cc.Span(0, 2.0, 4.0, 20),
        cc.Span(1, 0.0, 10.0, 100),
    )
    timing = cc.Timing(140, 10.0, spans)
    assert timing.in_flight_tokens_per_s() == pytest.approx((20 + 20 + 40) / 4.0)
    assert timing.latencies_s == (2.0, 2.0, 10.0)
    alone = cc.Timing(40, 4.0, spans[:2])  # one client: in flight is the whole batch
    assert alone.in_flight_tokens_per_s() == pytest.approx(10.0)
    assert cc.Timing(0, 0.0, ()).in_flight_tokens_per_s() == 0.0


def test_a_client_failure_stops_the_batch_and_is_raised() -> None:
    def send(request: cc.Request) -> int:
        if request.prompt == 1:
            raise LocalspecError("the server went away")
        time.sleep(0.01)
        return 1

    stop = threading.Event()
    with pytest.raises(LocalspecError, match="went away"):
        cc.run_batch(send, cc.client_plan(2, 5, 6, 0), stop)
    assert stop.is_set()


def test_configurations_alternate_and_count_their_shared_drafts() -> None:
    wanted = [0, 0]

    def config(name: str, extra: int) -> cc.Config:
        def send(request: cc.Request) -> int:
            wanted[0] += extra
            wanted[1] += extra // 2
            return 5

        return cc.Config(name, send, lambda: (wanted[0], wanted[1]))

    configs = [config(cc.PLAIN, 0), config(cc.FIXED, 4), config(cc.LOAD_AWARE, 2)]
    runs = list(cc.run_level(configs, 2, 1, 6, 3, threading.Event()))
    order = [r.config for r in runs]
    assert order[:3] == [cc.PLAIN, cc.FIXED, cc.LOAD_AWARE]
    assert order[3:6] == [cc.FIXED, cc.LOAD_AWARE, cc.PLAIN]  # rotated by the repeat
    points = {p.config: p for p in cc.summarise(runs)}
    assert points[cc.PLAIN].shared_draft is None  # nothing wanted: no share
    assert points[cc.FIXED].shared_draft == pytest.approx(0.5)
    assert all(p.requests == 6 and p.tokens_per_s > 0 for p in points.values())


def test_percentiles_interpolate() -> None:
    assert cc.percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert cc.percentile([1.0] * 19 + [21.0], 95) == pytest.approx(2.0)
    assert cc.percentile([], 95) == 0.0


# ----- the crossover and the comparison --------------------------------------------------------


def test_the_crossover_is_the_first_count_where_plain_beats_fixed() -> None:
    points = [
        point(cc.PLAIN, 1, 20),
        point(cc.FIXED, 1, 40),
        point(cc.PLAIN, 2, 35),
        point(cc.FIXED, 2, 38),
        point(cc.PLAIN, 4, 60),
        point(cc.FIXED, 4, 45),
        point(cc.PLAIN, 8, 70),
        point(cc.FIXED, 8, 50),
    ]
    assert cc.crossover(points) == 4
    assert "plain batching beats fixed speculation from 4 clients" in cc.meaning(points)[0]


def test_no_crossover_where_speculation_stays_ahead_or_a_side_is_missing() -> None:
    ahead = [point(cc.PLAIN, n, 10 * n) for n in (1, 2)] + [
        point(cc.FIXED, n, 10 * n + 1) for n in (1, 2)
    ]
    assert cc.crossover(ahead) is None
    assert cc.meaning(ahead)[0].startswith("no crossover")
    assert cc.crossover([point(cc.PLAIN, 1, 10)]) is None
    assert cc.crossover([point(cc.PLAIN, 1, 10), point(cc.FIXED, 2, 1)]) is None
    cut_short = [*ahead, point(cc.PLAIN, 4, 100)]  # interrupted before fixed ran at 4
    assert cc.meaning(cut_short)[0].endswith("up to 2 clients")


def test_the_native_ratio_takes_the_best_native_configuration() -> None:
    points = [
        point(cc.LOAD_AWARE, 2, 30),
        point("native plain", 2, 20),
        point("native ngram-simple", 2, 25),
        point(cc.LOAD_AWARE, 4, 30),  # no native run at 4
    ]
    assert cc.native_ratios(points) == {2: (pytest.approx(1.2), "native ngram-simple")}
    assert any("1.20x llama-server's best" in line for line in cc.meaning(points))
    # in flight, each configuration by its own figure: plain is llama-server's best there
    flights = {cc.LOAD_AWARE: 33.0, "native plain": 30.0, "native ngram-simple": 22.0}
    points = [replace(p, in_flight=flights.get(p.config, 0.0)) for p in points]
    assert cc.native_ratios(points, in_flight=True)[2] == (pytest.approx(1.1), "native plain")
    assert any("in flight 1.10x (native plain)" in line for line in cc.meaning(points))


def test_a_run_whose_plain_repeats_part_says_what_it_cannot_tell_apart() -> None:
    steady = [point(cc.PLAIN, 4, 60), point(cc.LOAD_AWARE, 4, 58)]
    assert not any(line.startswith("spread") for line in cc.meaning(steady))
    parted = [replace(steady[0], tokens_per_s_min=54.5, tokens_per_s_max=61.1), steady[1]]
    parted += [replace(point(cc.PLAIN, 8, 64), tokens_per_s_min=61.7, tokens_per_s_max=66.9)]
    assert cc.repeats_spread(parted) == (pytest.approx(0.121, abs=0.001), 4)
    assert (
        "spread: plain batching's repeats at 4 clients differ by 12%: configurations closer "
        "than that are not told apart by this run"
    ) in cc.meaning(parted)


# ----- llama-server ------------------------------------------------------------------------------


def stand_in(arg_checks: str = "", body_checks: str = "") -> str:
    """A stand-in for llama-server (a real HTTP server in a real process): /health, and a
    POST answered with ``n_predict`` tokens of "x", each request's mode and ``n_predict``
    appended to ``<executable>.log``; ``arg_checks`` run on ``args`` and ``body_checks`` on
    each request's ``body``."""
    return f"""\
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

args = sys.argv[1:]
mode = args[args.index("--spec-type") + 1] if "--spec-type" in args else "none"
{arg_checks}

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        {body_checks}
        with open(sys.argv[0] + ".log", "a") as log:
            log.write(f"server {{mode}} {{body['n_predict']}}\\n")
        reply = json.dumps({{"content": "x", "tokens_predicted": body["n_predict"]}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *a):
        pass

ThreadingHTTPServer(("127.0.0.1", int(args[args.index("--port") + 1])), Handler).serve_forever()
"""


STAND_IN = stand_in(
    arg_checks="""assert args[args.index("-np") + 1] == "2" and args[args.index("-c") + 1] == "1024"
assert mode in ("none", "ngram-simple")""",
    body_checks='assert body["cache_prompt"] and body["top_k"] == 0 and body["min_p"] == 0',
)


def stand_in_settings(tmp_path: Path, script: str) -> ns.ServerSettings:
    tool = tmp_path / ns.SERVER
    tool.write_text(f"#!{sys.executable}\n{script}")
    tool.chmod(0o755)
    return ns.ServerSettings(tmp_path, tmp_path / "m.gguf", None, 2, 512, 16, "off")


def test_the_server_is_started_asked_and_stopped(tmp_path: Path) -> None:
    settings = stand_in_settings(tmp_path, STAND_IN)
    for mode in ("none", "ngram-simple"):
        with ns.running_server(settings, 2, mode) as url:
            send = ns.server_sender(url, ["a", "b"], [None, None], 7, 0.0, threading.Event())
            timing = cc.run_batch(send, cc.client_plan(2, 2, 2, 0), threading.Event())
            assert timing.tokens == 28 and len(timing.latencies_s) == 4
        with pytest.raises(LocalspecError, match="did not answer"):  # stopped on the way out
            ns.completion(url, {"prompt": "a"})


def test_llama_servers_run_between_localspecs_runs_and_stop_with_the_level(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    record_pid = f"import os; open({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\n')"
    script = stand_in(arg_checks=record_pid)
    settings = stand_in_settings(tmp_path, script)
    log = (tmp_path / ns.SERVER).with_suffix(".log")
    stop = threading.Event()
    prompts = [replace(select_prompts("qa")[0], schema=None)] * 2
    load = Load(prompts, 1, 2, 7, 0.0, "ngram-simple", stop)

    def send(request: cc.Request) -> int:  # localspec's side, in the servers' log
        with log.open("a") as f:
            f.write("here\n")
        return 7

    def here(load: Load, configs, level: int):  # type: ignore[no-untyped-def]
        return cc.run_level(configs, level, load.requests, 2, load.repeats, stop)

    runs = list(with_native(load, [cc.Config(cc.PLAIN, send)], settings, ["a", "b"], 1, 1, here))
    assert [r.config for r in runs] == [
        cc.PLAIN, "native plain", "native ngram-simple",  # repeat 1
        "native plain", "native ngram-simple", cc.PLAIN,  # repeat 2, rotated
    ]  # fmt: skip
    # the servers' warm-ups, then every request in that order, in one log
    assert log.read_text().splitlines() == [
        "server none 8", "server ngram-simple 8",
        "here", "server none 7", "server ngram-simple 7",
        "server none 7", "server ngram-simple 7", "here",
    ]  # fmt: skip
    for pid in map(int, pids.read_text().split()):  # both servers stopped with the level
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_server_that_fails_to_load_says_why(tmp_path: Path) -> None:
    failing = "print('error: cannot open m.gguf'); raise SystemExit(1)"
    settings = stand_in_settings(tmp_path, failing)
    with (
        pytest.raises(LocalspecError, match="ended while loading") as failed,
        ns.running_server(settings, 1, "none"),
    ):
        pass
    assert "cannot open m.gguf" in str(failed.value.hint)


def test_the_server_command_matches_the_engine() -> None:
    s = ns.ServerSettings(Path("/bin"), Path("m.gguf"), None, 3, 4096, 16, "off")
    cmd = ns.server_command(s, 4, 8080, "ngram-simple")
    assert cmd[cmd.index("-np") + 1] == "4" and cmd[cmd.index("-c") + 1] == "16384"
    assert cmd[cmd.index("-t") + 1] == "3" and cmd[cmd.index("--spec-draft-n-max") + 1] == "16"
    assert "--spec-type" not in ns.server_command(s, 4, 8080, "none")
    body = ns.completion_body("p", 8, 0.0, 1, '{"type": "object"}')
    assert body["json_schema"] == {"type": "object"} and body["cache_prompt"] is True


# ----- the real model ----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.usefixtures("ctrl_c_raises")
def test_a_short_concurrency_bench_on_the_real_model(capsys, tmp_path: Path, qwen_path) -> None:  # type: ignore[no-untyped-def]
    out, md, svg = tmp_path / "c.json", tmp_path / "c.md", tmp_path / "c.svg"
    # a bench that hangs (a dead scheduler thread leaves its clients waiting) fails, not
    # stalls: a real SIGINT (it wakes a blocked join) ends it as Ctrl-C would, with 130
    watchdog = threading.Timer(180, os.kill, (os.getpid(), signal.SIGINT))
    watchdog.start()
    try:
        code = main(
            ["bench", str(qwen_path), "--concurrency", "1,2", "-n", "8", "--repeat", "1",
             "--requests", "1", "--json", str(out), "--markdown", str(md), "--plot", str(svg)]
        )  # fmt: skip
    finally:
        watchdog.cancel()
    assert code == 0
    report = json.loads(out.read_text())
    points = {(p["config"], p["concurrency"]): p for p in report["points"]}
    assert set(points) == {(c, n) for c in cc.CONFIGS for n in (1, 2)}
    for p in points.values():
        assert p["tokens_per_s"] > 0
        assert p["in_flight_tokens_per_s"] > 0
        assert 0 < p["latency_p50_s"] <= p["latency_p95_s"]
        assert p["requests"] == p["concurrency"]
    assert report["crossover"] in (None, 1, 2)
    assert report["cost_curve"]["rows"][0] == 1 and report["cost_curve"]["seconds"][0] > 0
    assert "| 2 | load-aware |" in md.read_text()
    assert svg.read_text().lstrip().startswith("<?xml")
    printed = capsys.readouterr()
    assert "crossover" in printed.out and "tok/s" in printed.err
