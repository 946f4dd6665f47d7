"""`localspec bench --scenarios`: multi-request scenarios, per-request speedups against plain
decoding and against ngram-simple."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localspec.cli import main
from localspec.errors import LocalspecError
from localspec.scenarios import (
    RequestRun,
    all_scenarios,
    headline,
    select_scenarios,
    summarise_requests,
)


def test_the_packaged_scenarios() -> None:
    found = {s.name: s for s in all_scenarios()}
    assert list(found) == [
        "regenerate",
        "regenerate-code",
        "batch",
        "docstrings",
        "agent",
        "unrelated",
    ]
    for name in ("regenerate", "regenerate-code"):
        assert len(set(found[name].prompts)) == 1 and len(found[name].prompts) == 3
        assert found[name].temperature == 0.7
    assert len(found["batch"].prompts) == 12 and len(set(found["batch"].prompts)) == 12
    assert len(found["docstrings"].prompts) == 8 and len(found["agent"].prompts) == 5
    assert all("{item}" not in p for s in found.values() for p in s.prompts)
    assert [s.name for s in select_scenarios("agent,batch")] == ["agent", "batch"]
    assert len(select_scenarios("all")) == 6
    with pytest.raises(LocalspecError, match="unknown scenario reroll"):
        select_scenarios("batch,reroll")


def run(mode: str, repeat: int, index: int, tps: float) -> RequestRun:
    return RequestRun("agent", mode, repeat, index, 100, tps, 50, 40, 30)


def test_each_request_is_compared_within_its_repeat() -> None:
    runs = [
        run("none", 0, 1, 40.0),
        run("ngram-simple", 0, 1, 40.0),
        run("suffix+ngram-simple", 0, 1, 40.0),
        run("none", 0, 2, 40.0),
        run("ngram-simple", 0, 2, 50.0),
        run("suffix+ngram-simple", 0, 2, 100.0),
        run("none", 1, 2, 20.0),  # a slow repeat: its ratios, not its raw speeds, count
        run("ngram-simple", 1, 2, 25.0),
        run("suffix+ngram-simple", 1, 2, 60.0),
    ]
    cells = {(c.mode, c.index): c for c in summarise_requests(runs)}
    second = cells[("suffix+ngram-simple", 2)]
    assert second.vs_plain == (2.75, 2.5, 3.0)
    assert second.vs_lookup == pytest.approx((2.2, 2.0, 2.4))
    assert second.from_memory == pytest.approx(0.3)
    assert cells[("suffix+ngram-simple", 1)].vs_plain == (1.0, 1.0, 1.0)
    (line,) = headline(list(cells.values()), "suffix+ngram-simple")
    assert line.startswith("agent, requests 2-2: suffix+ngram-simple 2.75x plain, 2.20x")
    assert "noisy" not in line
    # faster than plain with nothing accepted: the machine moved, and the summary says so
    runs += [run("none", 0, 3, 40.0), run("ngram-simple", 0, 3, 40.0)]
    runs.append(RequestRun("agent", "suffix+ngram-simple", 0, 3, 100, 50.0, 10, 0, 0))
    (line,) = headline(summarise_requests(runs), "suffix+ngram-simple")
    assert line.endswith("(median; 1 request of them noisy)")


@pytest.mark.slow
def test_a_tiny_scenario_bench_writes_json_and_markdown(
    capsys, tmp_path: Path, smollm_path
) -> None:  # type: ignore[no-untyped-def]
    out, md = tmp_path / "s.json", tmp_path / "s.md"
    argv = ["bench", str(smollm_path), "--scenarios", "regenerate", "-n", "24", "--repeat", "1"]
    assert main([*argv, "--json", str(out), "--markdown", str(md)]) == 0
    report = json.loads(out.read_text())
    cells = {(c["mode"], c["request"]) for c in report["requests"]}
    modes = ("none", "ngram-simple", "suffix+ngram-simple")
    assert cells == {(m, i) for m in modes for i in (1, 2, 3)}
    assert any(line.startswith("regenerate, requests 2-3") for line in report["meaning"])
    assert "| regenerate | 2 | suffix+ngram-simple |" in md.read_text()
    printed = capsys.readouterr()
    assert "vs ngram-simple" in printed.out and "vs ngram-simple" not in printed.err


def test_scenario_flags_are_checked(capsys, smollm_path) -> None:  # type: ignore[no-untyped-def]
    code = main(["bench", str(smollm_path), "--scenarios", "nope"])
    assert code == 2 and "unknown scenario nope" in capsys.readouterr().err
    code = main(["bench", str(smollm_path), "--scenarios", "batch", "--native", "x"])
    assert code == 2 and "--native and --plot" in capsys.readouterr().err
