"""draft-self: the layer-set syntax, the derived GGUF, its cache, and the mode on the real
Qwen2.5-Coder-0.5B (losslessness, statistics, reuse, damage)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import gguf
import numpy as np
import pytest

from localspec import Engine, SpecConfig
from localspec.derivation.gguf_info import read_header
from localspec.derivation.layer_subset import write_layer_subset
from localspec.derivation.self_draft import default_layers, ensure_self_draft, label, parse_layers
from localspec.errors import LocalspecError

from .test_lossless_real import assert_stats_consistent, check_mode


def test_layer_specs() -> None:
    assert parse_layers("0-11", 24) == tuple(range(12))
    assert parse_layers("0-5,18-23", 24) == (*range(6), *range(18, 24))
    assert parse_layers("3, 1, 2", 24) == (1, 2, 3)
    # skip-every=2 drops layers 1, 3, 5, ... but never the first or the last
    assert parse_layers("skip-every=2", 6) == (0, 2, 4, 5)
    assert label((0, 1, 2, 5, 7, 8)) == "0-2,5,7-8"
    assert default_layers(24) == parse_layers("0-5,12-23", 24)


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("0-24", "outside the target's layers 0-23"),
        ("5-2", "'5-2' runs backwards"),
        ("a-b", "cannot read 'a-b'"),
        ("skip-every=1", "K must be an integer >= 2"),
        ("0-23", "keeps all 24 layers"),
    ],
)
def test_bad_layer_specs(spec: str, words: str) -> None:
    with pytest.raises(LocalspecError) as err:
        parse_layers(spec, 24)
    assert words in err.value.message and "--spec-self-layers" in err.value.message


def _tiny_llama(path: Path, n_layer: int = 4) -> Path:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(n_layer)
    w.add_array("llama.attention.head_count_kv", [1, 2, 3, 4])  # per layer
    w.add_string("tokenizer.chat_template", "{{ x }}")
    w.add_tensor("token_embd.weight", np.ones((8, 4), np.float32))
    for i in range(n_layer):
        w.add_tensor(f"blk.{i}.attn_q.weight", np.full((4, 4), i, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_layer_subset_renumbers_blocks_and_slices_per_layer_metadata(tmp_path: Path) -> None:
    source = _tiny_llama(tmp_path / "src.gguf")
    dest = tmp_path / "sub.gguf"
    write_layer_subset(source, dest, (0, 3), {"localspec.derivation.self_draft.layers": "0,3"})
    reader = gguf.GGUFReader(str(dest))  # the reference reader accepts it
    fields = reader.fields
    assert int(fields["llama.block_count"].parts[-1][0]) == 2
    kv = fields["llama.attention.head_count_kv"]
    assert [int(kv.parts[i][0]) for i in kv.data] == [1, 4]
    assert bytes(fields["tokenizer.chat_template"].parts[-1]).decode() == "{{ x }}"
    tensors = {t.name: t for t in reader.tensors}
    assert sorted(tensors) == ["blk.0.attn_q.weight", "blk.1.attn_q.weight", "token_embd.weight"]
    assert float(tensors["blk.1.attn_q.weight"].data.flat[0]) == 3.0  # old block 3
    assert read_header(dest).metadata["localspec.derivation.self_draft.layers"] == "0,3"


@pytest.mark.slow
def test_self_draft_is_built_once_reused_and_rebuilt_when_damaged(
    qwen_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("LOCALSPEC_CACHE", str(tmp_path))
    first = ensure_self_draft(qwen_path, "0-5,12-23")
    assert first.path.is_relative_to(tmp_path) and first.layers == parse_layers("0-5,12-23", 24)
    assert "keeping 18 of 24 layers (0-5,12-23)" in capsys.readouterr().err
    header = read_header(first.path)
    assert header.metadata["qwen2.block_count"] == 18
    assert header.metadata["localspec.derivation.self_draft.layers"] == "0-5,12-23"
    stamp = json.loads(first.path.with_name(first.path.name + ".verified").read_text())
    mtime = first.path.stat().st_mtime_ns

    again = ensure_self_draft(qwen_path, "0-5,12-23")
    assert again.path == first.path and first.path.stat().st_mtime_ns == mtime
    assert "building" not in capsys.readouterr().err

    with first.path.open("r+b") as f:  # flip bytes inside the tensor data
        f.seek(first.path.stat().st_size // 2)
        f.write(b"\xff" * 64)
    rebuilt = ensure_self_draft(qwen_path, "0-5,12-23")
    err = capsys.readouterr().err
    assert "damaged" in err and "building" in err
    fresh = json.loads(rebuilt.path.with_name(rebuilt.path.name + ".verified").read_text())
    assert fresh["sha256"] == stamp["sha256"]  # the same bytes again
    assert not [p for p in rebuilt.path.parent.iterdir() if p.name.endswith(".part")]

    os.truncate(rebuilt.path, 1000)
    ensure_self_draft(qwen_path, "0-5,12-23")
    assert "damaged" in capsys.readouterr().err


@pytest.fixture(scope="module")
def qwen_draft_self(qwen_path: Path):  # type: ignore[no-untyped-def]
    with Engine.load(qwen_path, mode="draft-self") as engine:
        yield engine


@pytest.mark.slow
def test_draft_self_is_lossless(qwen_draft_self: Engine) -> None:
    check_mode(qwen_draft_self, "draft-self", SpecConfig(n_max=4, adaptive=False))


def test_chain_ngram_then_draft_self_keeps_stats_per_drafter(qwen_draft_self: Engine) -> None:
    from localspec.prompts import select_prompts

    case = select_prompts("code-edit")[0]
    r = qwen_draft_self.generate(
        case.text,
        chat=True,
        max_tokens=96,
        mode="ngram-simple,draft-self",
        spec=SpecConfig(n_max=8, adaptive=False),
    )
    assert_stats_consistent(r)
    by = {name: (d, a, v) for name, d, a, v in r.stats.by_drafter}
    assert set(by) == {"ngram-simple", "draft-self"}, by  # both drafted on this prompt
    assert sum(d for d, _, _ in by.values()) == r.stats.drafted
    assert sum(a for _, a, _ in by.values()) == r.stats.accepted
    assert sum(v for _, _, v in by.values()) == r.stats.verifications
    assert r.stats.to_dict()["by_drafter"]["draft-self"]["drafted"] == by["draft-self"][0]


def test_self_layers_need_draft_self(qwen_path: Path) -> None:
    with pytest.raises(LocalspecError, match="--spec-self-layers applies to --mode draft-self"):
        Engine.load(qwen_path, mode="ngram-simple", self_layers="0-5")
