"""`localspec probe` on the real F16/Q4_K_M Qwen pair and the draftless modes; the ranking
maths and the prompt files without llama.cpp."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from localspec import Engine
from localspec.cli import main
from localspec.engine.costs import VerifyCost
from localspec.errors import LocalspecError
from localspec.measure import Pair, judge
from localspec.probe import (
    Measurement,
    best_per_config_family,
    chosen,
    compute_bound_note,
    export_command,
    rank,
    recommendation,
)
from localspec.probe_results import ProbeConfig, saved_choice
from localspec.prompts import load_prompt_file, select_prompts


@pytest.mark.slow
def test_probe_ranks_saves_and_feeds_mode_auto(
    capsys, monkeypatch, tmp_path, qwen_f16_path, qwen_path, smollm_path
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("LOCALSPEC_CACHE", str(tmp_path))
    code = main(
        [
            "probe",
            str(qwen_f16_path),
            "--candidates",
            f"{qwen_path},{smollm_path}",
            "--no-hf-cache",
            "--prompts",
            "code-edit",  # one prompt: the mean over prompts is checked without llama.cpp
            "-n",
            "32",
            "--lengths",
            "4,8",
            "--repeat",
            "2",
            "--modes",
            "ngram-simple,draft-self,draft-mtp,draft-model",
            "--json",
            "--save",
            "--export",
            "llama-server",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    report = json.loads(out)  # the exported command line is a field, not a line after it
    assert report["export"] and "llama-server" in report["export"]
    modes = {r["mode"] for r in report["ranking"]}
    assert modes == {"ngram-simple", "draft-self", "draft-model"}
    assert len(report["measurements"]) == 3 * 2  # 3 configs x 2 lengths, one prompt
    assert all(
        m["plain_tokens_per_s"] > 0 and m["tokens_per_s"] > 0 for m in report["measurements"]
    )
    speedups = [r["speedup"] for r in report["ranking"]]
    assert speedups == sorted(speedups, reverse=True)
    assert report["incompatible"][0]["candidate"] == str(smollm_path)
    assert "vocabulary sizes differ" in report["incompatible"][0]["why"]
    assert report["unavailable_modes"] == [
        {"mode": "draft-mtp", "why": "no NextN (MTP) layers in this GGUF"}
    ]
    assert report["recommendation"]

    # the saved winner: the best measured configuration, else the best estimate; the table
    # shows it, even behind a noisy length of its own configuration
    measured = [r for r in report["all_lengths"] if not r["noisy"]]
    winner = measured[0] if measured else report["all_lengths"][0]
    assert report["winner"] == winner and winner in report["ranking"]
    if winner["noisy"]:  # a busy machine: auto refuses what could not be measured reliably
        with pytest.raises(LocalspecError, match="could not measure its winner reliably"):
            saved_choice(qwen_f16_path)
    else:
        choice = saved_choice(qwen_f16_path)
        assert choice is not None
        assert choice.mode == (winner["mode"] if winner["speedup"] >= 1.03 else "none")
        with Engine.load(qwen_f16_path, mode="auto") as engine:
            assert engine.mode == choice.mode

    # Acceptance is deterministic at temperature 0: probe and `run` agree on it.
    probed = next(
        m
        for m in report["measurements"]
        if m["mode"] == "draft-model" and m["n_max"] == 4 and m["kind"] == "code-edit"
    )
    assert (
        main(
            [
                "run",
                str(qwen_f16_path),
                "-md",
                str(qwen_path),
                "-n",
                "32",
                "--no-adaptive",
                "--spec-draft-n-max",
                "4",
                "--json",
            ]
        )
        == 0
    )
    ran = json.loads(capsys.readouterr().out)
    assert abs(ran["stats"]["acceptance_rate"] - probed["acceptance_rate"]) < 0.05


@pytest.mark.slow
def test_ctrl_c_prints_partial_results(qwen_path: Path, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "LOCALSPEC_CACHE": str(tmp_path),
        "PYTHONUNBUFFERED": "1",
        "COLUMNS": "200",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "localspec",
            "probe",
            str(qwen_path),
            "--no-hf-cache",
            "--prompts",
            "code-edit,qa,summary",
            "-n",
            "24",
            "--lengths",
            "4,8,16",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        # a suite started from a background job hands its children an ignored SIGINT
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "(accept" in line:
            proc.send_signal(signal.SIGINT)
            break
    rest = proc.stdout.read()
    assert proc.wait(timeout=120) == 130
    assert "interrupted: partial results follow" in rest
    assert "recommendation" in rest and "ngram-simple" in rest


def fake(config: ProbeConfig, kind: str, speed: float) -> Measurement:
    pairs = (Pair(10.0, speed, 10.0), Pair(10.0, speed, 10.0))
    return Measurement(config, f"p-{kind}", kind, pairs, judge(pairs, 10.0, None), 0.5, 2.0, (0.5,))


def test_rates_shown_come_from_the_pairs_judged() -> None:
    """A pair whose plain runs moved apart is set aside for the speedup, and for the tok/s
    printed beside it: 34 tok/s over 32 beside a 0.86x speedup read as a contradiction."""
    config = ProbeConfig("ngram-simple", 4)
    pairs = (Pair(20.0, 17.0, 20.0), Pair(20.0, 17.4, 20.4), Pair(30.0, 60.0, 50.0))
    m = Measurement(config, "p", "qa", pairs, judge(pairs, 10.0, None), 0.5, 2.0, (0.5,))
    assert m.tokens_per_s == pytest.approx(17.2) and m.plain_tokens_per_s == pytest.approx(20.1)
    assert m.speedup == pytest.approx(m.tokens_per_s / m.plain_tokens_per_s, rel=0.01)


def test_rank_uses_geometric_means_and_recommends_honestly() -> None:
    ngram, draft = ProbeConfig("ngram-simple", 8), ProbeConfig("draft-model", 4, "/m/d.gguf")
    ms = [
        fake(ngram, "code-edit", 40.0),
        fake(ngram, "creative", 9.0),
        fake(draft, "code-edit", 12.0),
        fake(draft, "creative", 12.0),
    ]
    ranking = rank(ms)
    assert ranking[0].config == ngram
    assert ranking[0].speedup == pytest.approx((4.0 * 0.9) ** 0.5)
    text = recommendation(ranking)
    assert text.startswith("use ngram-simple n=8")
    assert "for creative prompts: use draft-model d.gguf n=4 (1.20x)" in text
    slow = rank([fake(ngram, "creative", 9.0)])
    assert recommendation(slow).startswith("don't speculate on this machine")
    # an estimate ranked first (its runs too spread to trust) is not what the advice follows
    unsure = [dataclasses.replace(r, noisy=True) if r.config == draft else r for r in rank(ms)]
    unsure = [r for r in unsure if r.config == draft] + [
        dataclasses.replace(r, speedup=0.5) for r in unsure if r.config == ngram
    ]
    text = recommendation(unsure)
    assert "the best estimate is draft-model d.gguf n=4" in text
    advice = "don't speculate on this machine for these prompts: the best measured reliably"
    assert f"{advice}, ngram-simple n=8, gives 0.50x" in text


def test_the_table_keeps_the_row_mode_auto_runs() -> None:
    """The best length of a configuration may be an estimate (noisy) and a shorter one of
    the same configuration the best measured: the table keeps both, or the advice and
    ``--mode auto`` would name a row nobody was shown."""
    ngram8, ngram4 = ProbeConfig("ngram-simple", 8), ProbeConfig("ngram-simple", 4)
    draft = ProbeConfig("draft-model", 4, "/m/d.gguf")
    ranking = rank([fake(ngram8, "qa", 14.0), fake(ngram4, "qa", 12.0), fake(draft, "qa", 10.5)])
    ranking = [dataclasses.replace(r, noisy=r.config == ngram8) for r in ranking]
    table = best_per_config_family(ranking)
    assert [r.config for r in table] == [ngram8, ngram4, draft]
    assert chosen(ranking) is not None and chosen(ranking).config == ngram4
    # when the best length is measured, the family has one row, as before
    measured = [dataclasses.replace(r, noisy=False) for r in ranking]
    assert [r.config for r in best_per_config_family(measured)] == [ngram8, draft]


def test_export_commands() -> None:
    target = Path("/m/t.gguf")
    draft = ProbeConfig("draft-model", 6, "/m/d.gguf")
    assert export_command(draft, target, "llama-server") == (
        "llama-server -m /m/t.gguf -md /m/d.gguf --spec-type draft-simple --spec-draft-n-max 6"
    )
    assert '"num_speculative_tokens": 6' in export_command(draft, target, "vllm")
    assert "--spec-type ngram-simple" in export_command(
        ProbeConfig("ngram-simple", 16), target, "llama-server"
    )
    assert "--spec-type draft-mtp" in export_command(
        ProbeConfig("draft-mtp", 3), target, "llama-server"
    )
    assert '"method": "mtp"' in export_command(ProbeConfig("draft-mtp", 3), target, "vllm")
    assert export_command(ProbeConfig("draft-self", 4), target, "llama-server").startswith("#")


def test_prompt_files_and_kinds(tmp_path: Path) -> None:
    assert [p.kind for p in select_prompts("creative,french")] == ["creative", "french"]
    with pytest.raises(LocalspecError, match="unknown kind"):
        select_prompts("poetry")
    good = tmp_path / "p.toml"
    good.write_text('[[prompt]]\nname = "a"\nkind = "qa"\ntext = "Why?"\n')
    assert load_prompt_file(good)[0].text == "Why?"
    bad = tmp_path / "bad.toml"
    bad.write_text('[[prompt]]\nname = "a"\ntext = "Why?"\n')
    with pytest.raises(LocalspecError, match="prompt #1: field 'kind'"):
        load_prompt_file(bad)
    broken = tmp_path / "broken.toml"
    broken.write_text("[[prompt]\n")
    with pytest.raises(LocalspecError, match="not valid TOML"):
        load_prompt_file(broken)
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    with pytest.raises(LocalspecError, match="empty"):
        load_prompt_file(empty)


def test_mode_auto_refuses_a_noisy_winner(monkeypatch, tmp_path, smollm_path) -> None:  # type: ignore[no-untyped-def]
    from localspec.probe import save

    monkeypatch.setenv("LOCALSPEC_CACHE", str(tmp_path))
    busy = fake(ProbeConfig("ngram-simple", 8), "qa", 60.0)  # 6x on a 10x ceiling: fine...
    noisy = Measurement(
        busy.config, busy.prompt, busy.kind, busy.pairs, judge(busy.pairs, 2.0, None), 0.5, 2.0, ()
    )  # ...but above a 2x ceiling: noisy, no prediction
    saved = json.loads(save(smollm_path, rank([noisy]), [noisy]).read_text())
    assert saved["winner"]["noisy"] is True and saved["winner"]["spread"] == [6.0, 6.0]
    with pytest.raises(LocalspecError, match="could not measure its winner reliably"):
        Engine.load(smollm_path, mode="auto")


@pytest.mark.parametrize(
    ("winner", "expected"),
    [
        ({"speedup": 2.0}, "damaged: its winner has no draft length"),
        ({"mode": "ngram-simple", "n_max": None, "speedup": 2.0}, "no draft length"),
        ({"mode": "ngram-simple", "n_max": 8, "speedup": "fast"}, "speedup is 'fast'"),
        ({"mode": "warp-drive", "n_max": 8, "speedup": 2.0}, "unknown mode 'warp-drive'"),
        ({"mode": "ngram-simple", "n_max": 100000, "speedup": 2.0}, "settings are wrong"),
        (
            {"mode": "draft-model", "n_max": 8, "speedup": 2.0, "draft": "/gone/d.gguf"},
            "stale: its winner's draft model /gone/d.gguf is gone",
        ),
        ("not json {", "damaged: not a probe's results"),
    ],
    ids=["fields", "n_max", "speedup", "mode", "too-long", "draft-gone", "json"],
)
def test_mode_auto_refuses_a_damaged_or_stale_probe_file(  # type: ignore[no-untyped-def]
    capsys, monkeypatch, tmp_path, smollm_path, winner, expected
) -> None:
    """The saved file is the user's to edit or to damage: one line naming it, exit 2."""
    from localspec.cli import main
    from localspec.probe_results import probe_file

    monkeypatch.setenv("LOCALSPEC_CACHE", str(tmp_path))
    saved = probe_file(smollm_path)
    saved.parent.mkdir(parents=True)
    text = winner if isinstance(winner, str) else json.dumps({"winner": winner})
    saved.write_text(text)
    code = main(["run", str(smollm_path), "--mode", "auto", "-n", "2", "-p", "hi"])
    err = capsys.readouterr().err
    assert code == 2 and expected in err and str(saved) in err and "probe" in err, err
    assert "Traceback" not in err and "internal error" not in err


@pytest.mark.slow
def test_probe_measures_the_memory_with_the_earlier_prompts_remembered(
    capsys, monkeypatch, tmp_path, qwen_path
) -> None:  # type: ignore[no-untyped-def]
    """The memory mode drafts a prompt with the answers to the prompts probed before it
    remembered: the first finds nothing (it drafts as ngram-simple), a request asked again
    is drafted from its earlier answer."""
    monkeypatch.setenv("LOCALSPEC_CACHE", str(tmp_path))
    ask = "List the planets of the solar system, one per line, with one fact each."
    prompts = tmp_path / "again.toml"
    prompts.write_text(
        f'[[prompt]]\nname = "first"\nkind = "qa"\ntext = "{ask}"\n'
        f'[[prompt]]\nname = "again"\nkind = "qa"\ntext = "{ask}"\n'
    )
    args = ["probe", str(qwen_path), "--prompts", str(prompts), "-n", "48", "--lengths", "8"]
    modes = ["--modes", "ngram-simple,suffix+ngram-simple", "--repeat", "2", "--json"]
    assert main([*args, *modes]) == 0
    report = json.loads(capsys.readouterr().out)
    cells = {(m["mode"], m["prompt"]): m for m in report["measurements"]}
    assert set(cells) == {
        (mode, name)
        for mode in ("ngram-simple", "suffix+ngram-simple")
        for name in ("first", "again")
    }
    first = cells["suffix+ngram-simple", "first"], cells["ngram-simple", "first"]
    assert first[0]["acceptance_rate"] == pytest.approx(first[1]["acceptance_rate"])
    again = cells["suffix+ngram-simple", "again"]
    assert again["acceptance_rate"] > 0.9 and again["mean_acceptance_length"] > 6
    assert (
        again["mean_acceptance_length"] > cells["ngram-simple", "again"]["mean_acceptance_length"]
    )


def test_a_compute_bound_target_is_named_with_what_a_draft_may_cost() -> None:
    """The 1.5B target on a 2-core CPU (ceiling 1.6x, a 16-token batch 10 steps): compute-bound,
    a draft model's token must cost under a small share of a step; the 0.5B (a batch of 16
    for 3 steps) is not."""
    sizes = np.array([1, 2, 4, 8, 16])
    bound = VerifyCost(sizes, 0.05 * np.array([1, 1.9, 3.0, 5.5, 10.0]))
    note = compute_bound_note(bound)
    assert note is not None and "compute-bound" in note and "ngram-simple" in note
    assert 0.0 < bound.break_even_draft_cost() < 0.5
    assert compute_bound_note(VerifyCost(sizes, 0.02 * np.array([1, 1.1, 1.3, 1.9, 3.0]))) is None
    flat_cpu = VerifyCost(sizes, 0.02 * sizes.astype(float))  # a batch costs its tokens
    assert flat_cpu.break_even_draft_cost() == 0.0
