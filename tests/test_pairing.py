"""The pair finder: llama.cpp's hard rules on real GGUFs and on tiny vocab-only GGUFs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from localspec import probe
from localspec.cli import main
from localspec.derivation.gguf_info import gguf_info
from localspec.engine.costs import VerifyCost
from localspec.pairing import advice, check, draftless_modes
from localspec.probe import compute_bound_note
from tests.vocab_gguf import write_vocab_gguf


def test_gguf_info_reads_real_headers(qwen_path: Path, smollm_path: Path) -> None:
    q = gguf_info(qwen_path)
    assert (q.architecture, q.n_layer, q.vocab_size, q.tokenizer_model) == (
        "qwen2",
        24,
        151936,
        "gpt2",
    )
    assert q.file_type == "Q4_K_M" and q.has_chat_template and q.n_layer_nextn == 0
    assert q.bos_token_id == 151643 and q.add_bos is False
    s = gguf_info(smollm_path)
    assert s.architecture == "llama" and s.vocab_size == 49152
    assert [m for m, ok, _ in draftless_modes(q) if ok] == [
        "ngram-simple",
        "suffix+ngram-simple",
        "draft-self",
    ]


def test_three_families_are_incompatible_with_the_failing_rule(
    qwen_path, smollm_path, gemma_path
) -> None:  # type: ignore[no-untyped-def]
    v = check(qwen_path, smollm_path)
    assert not v.compatible and "vocabulary sizes differ by 102784" in v.reasons[0]
    v = check(qwen_path, gemma_path)
    assert not v.compatible and "vocabulary types differ (draft SPM, target BPE)" in v.reasons[0]
    v = check(gemma_path, smollm_path)
    assert not v.compatible


@pytest.mark.slow
def test_requantized_target_is_compatible(
    qwen_f16_path: Path, qwen_path: Path, qwen_q4_0_path: Path
) -> None:
    v = check(qwen_f16_path, qwen_path)
    assert v.compatible and v.reasons == []
    assert v.size_ratio < 0.5  # same family, much smaller
    # the "Q4_K_M" draft is 62% Q5_0, which x86 CPUs run without repacked kernels
    assert gguf_info(qwen_path).matrix_types[0][0] == "Q5_0"
    slow = [w for w in advice(v.target, v.draft, "x86_64") if "Q5_0" in w]
    assert slow and "pure Q4_0" in slow[0] and not advice(v.target, v.draft, "aarch64")
    v = check(qwen_f16_path, qwen_q4_0_path)
    assert v.compatible and not v.warnings and v.draft.matrix_share({"Q4_0"}) == 1.0


@pytest.mark.slow
def test_a_larger_model_of_the_family_is_a_real_target(qwen15_path, qwen_q4_0_path) -> None:  # type: ignore[no-untyped-def]
    """The 1.5B model: its own weights (28 layers), the 0.5B's tokenizer."""
    info = gguf_info(qwen15_path)
    assert (info.architecture, info.n_layer, info.vocab_size) == ("qwen2", 28, 151936)
    v = check(qwen15_path, qwen_q4_0_path)
    assert v.compatible and v.reasons == [] and v.size_ratio < 0.5


@pytest.mark.slow
def test_reverse_direction_warns_that_the_draft_is_not_smaller(qwen_f16_path, qwen_path) -> None:  # type: ignore[no-untyped-def]
    v = check(qwen_path, qwen_f16_path)
    assert v.compatible and any("size" in w for w in v.warnings)


@pytest.mark.parametrize(
    ("variant", "expected"),
    [
        ({"rename": {100: "zzz"}}, "token 100 differs (draft 'zzz', target 'cr')"),
        ({"n_tokens": 600}, "vocabulary sizes differ by 300"),
        ({"n_tokens": 400}, None),  # within 128: compatible
        ({"add_bos": True}, "BOS differs"),
        ({"add_eos": True}, "EOS differs"),
        ({"model": "llama"}, "vocabulary types differ (draft SPM, target BPE)"),
    ],
)
def test_each_vocab_rule(tmp_path: Path, variant: dict, expected: str | None) -> None:  # type: ignore[type-arg]
    target = write_vocab_gguf(tmp_path / "target.gguf", 300)
    draft = write_vocab_gguf(tmp_path / "draft.gguf", **{"n_tokens": 300, **variant})
    verdict = check(target, draft)
    if expected is None:
        assert verdict.compatible
    else:
        assert not verdict.compatible and expected in verdict.reasons[0]


def test_pairs_command_lists_every_candidate_with_reasons(
    capsys, tmp_path, qwen_f16_path, qwen_path, smollm_path
) -> None:  # type: ignore[no-untyped-def]
    scan = tmp_path / "models"
    scan.mkdir()
    (scan / "broken.gguf").write_text("not a model")
    write_vocab_gguf(scan / "tiny.gguf", 300)
    empty = tmp_path / "empty"
    empty.mkdir()
    code = main(
        [
            "pairs",
            str(qwen_f16_path),
            str(qwen_path),
            str(smollm_path),
            "--scan",
            str(scan),
            "--scan",
            str(empty),
            "--no-hf-cache",
            "--json",
        ]
    )
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    by_name = {Path(c["candidate"]).name: c for c in report["candidates"]}
    assert by_name[qwen_path.name]["compatible"] is True
    assert by_name[smollm_path.name]["compatible"] is False
    assert "not a GGUF" in by_name["broken.gguf"]["unreadable"]
    assert "vocabulary sizes differ" in by_name["tiny.gguf"]["reasons"][0]
    assert any("no .gguf files" in n for n in report["notes"])
    assert any("compatible is not faster" in n for n in report["notes"])  # nothing probed
    assert {m["mode"] for m in report["draftless_modes"]} == {
        "ngram-simple",
        "suffix+ngram-simple",
        "draft-self",
        "draft-mtp",
    }


def test_pairs_bad_input(capsys, tmp_path, qwen_path) -> None:  # type: ignore[no-untyped-def]
    assert main(["pairs", str(tmp_path / "missing.gguf")]) == 2
    assert main(["pairs", str(qwen_path), "--scan", str(tmp_path / "nope")]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert main(["pairs", str(qwen_path), "--scan", str(qwen_path)]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the candidates are optional: only the target is asked for
        main(["pairs"])
    assert "required: target\n" in capsys.readouterr().err


def test_pairs_says_what_a_saved_probe_measured_about_the_target(  # type: ignore[no-untyped-def]
    capsys, monkeypatch, tmp_path, qwen_path
) -> None:
    """A probe that found the target compute-bound here: pairs says so instead of the
    general advice to measure."""
    monkeypatch.setenv("LOCALSPEC_CACHE", str(tmp_path))
    sizes = np.array([1, 2, 4, 8, 16])
    note = compute_bound_note(VerifyCost(sizes, 0.05 * np.array([1, 1.9, 3.0, 5.5, 10.0])))
    assert note is not None
    probe.save(qwen_path, [], [], [note])
    assert main(["pairs", str(qwen_path), "--no-hf-cache", "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert f"measured by `localspec probe`: {note}" in notes
    assert not any("compatible is not faster" in n for n in notes)
