"""`localspec probe` on a busy machine: another process keeps a core busy the whole time (a
CPU hog, bounded in time), and the probe must still rank the configuration that is known to
be faster first and print no speedup above the machine's ceiling."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from localspec.cli import main
from localspec.measure import CEILING_SLACK

pytestmark = pytest.mark.slow  # a CPU hog for a minute: the whole suite only

HOG = "import time\nend = time.time() + 600\nwhile time.time() < end:\n    pass\n"


@pytest.fixture
def cpu_hog() -> Iterator[None]:
    hog = subprocess.Popen([sys.executable, "-c", HOG])
    try:
        yield
    finally:
        hog.kill()
        hog.wait()


def probe_json(capsys, *argv: str) -> dict:  # type: ignore[no-untyped-def, type-arg]
    assert main(["probe", *argv, "--json", "--no-hf-cache", "--prompts", "code-edit"]) == 0
    printed = capsys.readouterr()
    assert "machine busy" in printed.err  # the header says so
    return json.loads(printed.out)


def assert_nothing_above_the_ceiling(report: dict) -> None:  # type: ignore[type-arg]
    limit = report["ceiling"] * CEILING_SLACK
    for row in report["all_lengths"]:
        assert row["speedup"] <= limit, row
    for m in report["measurements"]:
        assert m["speedup"] <= limit, m
        assert m["measured"] <= limit or m["noisy"], m


def test_probe_ranks_right_with_a_cpu_hog(
    capsys, monkeypatch, tmp_path, cpu_hog, qwen_f16_path, qwen_path, qwen_q4_0_path
) -> None:  # type: ignore[no-untyped-def]
    """Two drafts of the F16 target, both measured and ranked by what was measured. Which
    is faster depends on the machine: the Q4_0 where its weights are repacked, within 15%
    of the Q4_K_M (inside a hog's noise) where they are not (an AMX CPU). Whether either
    beats plain decoding at length 8 depends on it too: on a compute-bound 2-core CPU the
    F16 target's step is only 1.6 times its draft's, and with a hog eight drafts kept whole
    measured 0.87x (docs/benchmarks.md). The lookup below is the configuration known to
    be faster."""
    monkeypatch.setenv("LOCALSPEC_CACHE", str(tmp_path))  # nothing saved where users look
    common = ["-n", "48", "--lengths", "8", "--budget", "60"]
    drafts = probe_json(
        capsys,
        str(qwen_f16_path),
        "--modes",
        "draft-model",
        "--candidates",
        f"{qwen_path},{qwen_q4_0_path}",
        *common,
    )
    ranking = drafts["ranking"]
    assert {Path(r["draft"]).name for r in ranking} == {qwen_path.name, qwen_q4_0_path.name}
    speeds = [r["speedup"] for r in ranking]
    assert speeds == sorted(speeds, reverse=True) and speeds[-1] > 0, ranking
    assert_nothing_above_the_ceiling(drafts)

    lookup = probe_json(capsys, str(qwen_path), "--modes", "ngram-simple", *common)
    assert lookup["ranking"][0]["mode"] == "ngram-simple"
    assert lookup["ranking"][0]["speedup"] > 1.0
    assert not lookup["recommendation"].startswith("don't speculate")
    assert_nothing_above_the_ceiling(lookup)
