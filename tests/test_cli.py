"""`localspec run` as users run it: output, JSON, --compare, and every bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from localspec.cli import main


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "localspec", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=900,
    )


@pytest.mark.slow
def test_a_compare_with_no_token_measures_no_speedup(smollm_path: Path) -> None:
    # SmolLM2 ends this raw prompt at once (greedy): there is no speed to compare
    argv = ["run", str(smollm_path), "-p", "Write a long story about a dragon.", "-n", "16"]
    done = run_cli(*argv, "--compare", "--json")
    report = json.loads(done.stdout)
    assert report["n_tokens"] == 0 and report["speedup"] is None
    assert "no token was generated" in run_cli(*argv, "--compare").stderr


@pytest.mark.slow
def test_run_json_compare_on_code_edit(qwen_path: Path) -> None:
    done = run_cli("run", str(qwen_path), "-n", "64", "--json", "--compare")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["mode"] == "ngram-simple" and report["n_tokens"] == 64
    assert report["finish_reason"] == "length"
    assert report["stats"]["drafted"] > 0 and report["stats"]["accepted"] > 0
    assert report["speedup"] > 0 and report["plain_tokens_per_s"] > 0
    assert len(report["plain_runs_tokens_per_s"]) == 2  # plain before and after
    assert report["lossless"]["identical"] or report["lossless"]["near_tie"]
    for key in (
        "acceptance_rate",
        "acceptance_per_position",
        "mean_acceptance_length",
        "rounds",
        "draft_ms",
        "verify_ms",
        "ttft_ms",
        "tokens_per_s",
    ):
        assert key in report["stats"]


@pytest.mark.slow
def test_run_compare_checks_a_seeded_sampled_run_where_only_lookups_draft(
    smollm_path: Path,
) -> None:
    """With a seed, a lookup's drafts are judged by plain sampling's own draws: --compare
    reports losslessness at T > 0 too (tokens, or a draw on an edge); a draft model's
    rejection sampling is another draw of the same distribution: not compared."""
    ask = ("run", str(smollm_path), "-n", "24", "--json", "--compare", "--temp", "0.8")
    seeded = json.loads(run_cli(*ask, "--seed", "5").stdout)
    assert seeded["lossless"]["identical"] or seeded["lossless"]["near_tie"]
    assert seeded["lossless"]["margin_is"] == "draw margin"
    assert seeded["lossless"]["checked"]
    unseeded = run_cli(*ask)  # other draws: not compared, and it says why
    assert json.loads(unseeded.stdout)["lossless"] == {
        "checked": False,
        "why": "sampling without --seed: each run draws its own text (give --seed N)",
    }
    drafted = run_cli(*ask, "--seed", "5", "-md", str(smollm_path))
    assert "rejection sampling" in json.loads(drafted.stdout)["lossless"]["why"]
    plain_text = [a for a in ask if a != "--json"]
    said = run_cli(*plain_text, "--seed", "5", "-md", str(smollm_path))
    assert "lossless: not checked (a model's draft is accepted by rejection" in said.stderr


def test_run_streams_text(smollm_path: Path) -> None:
    done = run_cli(
        "run", str(smollm_path), "-p", "The capital of France is", "-n", "8", "--mode", "none"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()
    assert "[none] 8 tokens" in done.stderr


@pytest.fixture
def bad_files(tmp_path: Path, smollm_path: Path) -> dict[str, Path]:
    text = tmp_path / "notes.gguf"
    text.write_text("hello, not a model")
    truncated = tmp_path / "truncated.gguf"
    with smollm_path.open("rb") as src:
        truncated.write_bytes(src.read(3_000_000))
    return {"text": text, "truncated": truncated}


def error_of(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse refuses a flag value itself
        code = exc.code
    assert code == 2
    return capsys.readouterr().err


def test_bad_model_inputs(capsys, tmp_path: Path, bad_files, qwen_path, smollm_path) -> None:  # type: ignore[no-untyped-def]
    assert "model file not found" in error_of(capsys, "run", str(tmp_path / "nope.gguf"))
    assert "is not a GGUF file" in error_of(capsys, "run", str(bad_files["text"]))
    assert "truncated" in error_of(capsys, "run", str(bad_files["truncated"]))
    assert "did you mean" in error_of(capsys, "run", "qwen2.5-coder")
    err = error_of(capsys, "run", str(qwen_path), "-md", str(smollm_path), "-n", "4")
    assert "incompatible draft" in err and "vocabulary" in err


def test_bad_flag_combinations(capsys, qwen_path) -> None:  # type: ignore[no-untyped-def]
    q = str(qwen_path)
    assert "does not use one" in error_of(capsys, "run", q, "-md", q, "--mode", "ngram-simple")
    assert "needs a draft model" in error_of(capsys, "run", q, "--mode", "draft-model")
    assert "--spec-draft-n-min" in error_of(
        capsys, "run", q, "--spec-draft-n-max", "2", "--spec-draft-n-min", "4"
    )
    assert "--spec-draft-p-min" in error_of(capsys, "run", q, "--spec-draft-p-min", "1.5")
    assert "argument --temp: -1 is out of range" in error_of(capsys, "run", q, "--temp", "-1")
    assert "unknown mode 'fast'" in error_of(capsys, "run", q, "--mode", "fast")
    assert "cannot read the prompt file" in error_of(capsys, "run", q, "-f", "/nonexistent")


@pytest.mark.slow
def test_prompt_longer_than_context(capsys, qwen_path) -> None:  # type: ignore[no-untyped-def]
    err = error_of(capsys, "run", str(qwen_path), "-c", "256", "-p", "word " * 400)
    assert "context holds 256" in err and "--ctx-size" in err
    # a prompt that fits a small context (batches are capped to it) still runs
    assert main(["run", str(qwen_path), "-c", "256", "-p", "word " * 200, "-n", "4"]) == 0


def test_malformed_catalog_from_the_cli(capsys, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "models.toml"
    bad.write_text('default_model = "a"\n\n[[model]]\nname = "a"\nrepo = 5\nfile = "a.gguf"\n')
    monkeypatch.setenv("LOCALSPEC_CATALOG", str(bad))
    err = error_of(capsys, "run", "a")
    assert f"{bad}:3: model 'a': field 'repo' must be a string" in err


@pytest.mark.slow
def test_run_a_chain_reports_each_drafter(qwen_path: Path) -> None:
    done = run_cli("run", str(qwen_path), "--mode", "ngram-simple,draft-self", "-n", "48")
    assert done.returncode == 0, done.stderr
    out = done.stdout + done.stderr
    assert "[ngram-simple+draft-self] 48 tokens" in out
    assert "ngram-simple: drafted" in out and "draft-self: drafted" in out
    assert "shadow check(s)" in out
    assert "draft-self: keeping 18 of 24 layers (0-5,12-23)" in done.stderr


@pytest.mark.slow
def test_run_says_when_the_context_filled(smollm_path: Path) -> None:
    """finish "length" either way; the summary says which limit it was."""
    long = " ".join(["word"] * 240)
    done = run_cli("run", str(smollm_path), "-p", long, "-n", "40", "-c", "256", "--mode", "none")
    assert "finish: length (the context is full: raise -c)" in done.stderr
    short = run_cli("run", str(smollm_path), "-p", "Hi", "-n", "3", "--json", "--mode", "none")
    report = json.loads(short.stdout)
    assert report["finish_reason"] == "length" and report["context_full"] is False


@pytest.mark.slow
def test_run_reads_the_prompt_from_standard_input(smollm_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "localspec", "run", str(smollm_path), "-f", "-", "-n", "4"],
        input="def fibonacci(n):",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and "[ngram-simple] 4 tokens" in done.stderr, done.stderr


def test_a_mistyped_command_is_pointed_to_the_one_meant(capsys) -> None:  # type: ignore[no-untyped-def]
    assert "hint: did you mean serve?" in error_of(capsys, "serv", "qwen2.5-coder-0.5b")
    assert "did you mean" not in error_of(capsys, "xyzzy")
