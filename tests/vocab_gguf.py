"""Tiny vocab-only GGUFs written with the ``gguf`` package, to hit each compatibility rule."""

from __future__ import annotations

from pathlib import Path

import gguf

BYTES = [chr(c) for c in range(ord("a"), ord("z") + 1)]


def vocab_tokens(n: int) -> list[str]:
    """Special tokens, letters, then letter pairs (each pair has a merge)."""
    tokens = ["<unk>", "<s>", "</s>", "<pad>", "<mask>", *BYTES]
    for a in BYTES:
        for b in BYTES:
            if len(tokens) >= n:
                return tokens
            tokens.append(a + b)
    return tokens


def write_vocab_gguf(
    path: Path,
    n_tokens: int = 300,
    *,
    model: str = "gpt2",
    bos: int = 1,
    eos: int = 2,
    add_bos: bool = False,
    add_eos: bool = False,
    rename: dict[int, str] | None = None,
) -> Path:
    tokens = vocab_tokens(n_tokens)
    for token_id, text in (rename or {}).items():
        tokens[token_id] = text
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model(model)
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if i < 5 else 1 for i in range(len(tokens))])
    if model == "llama":
        w.add_token_scores([0.0] * len(tokens))
    else:
        w.add_token_merges([f"{t[0]} {t[1]}" for t in tokens[5 + len(BYTES) :]])
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_add_bos_token(add_bos)
    w.add_add_eos_token(add_eos)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
