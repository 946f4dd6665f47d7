"""Tiny ``qwen35`` / ``qwen35moe`` GGUFs with one NextN (MTP) block, and tiny ``hy_v3`` ones
with several chained NextN blocks (:func:`build_hy_v3_mtp`), for draft-mtp tests.

Layout follows llama.cpp's ``src/models/qwen35.cpp`` / ``qwen35moe.cpp`` exactly:

* ``{arch}.block_count = n_layer + 1`` and ``{arch}.nextn_predict_layers = 1``: the MTP
  block is the extra block ``blk.{n_layer}``; ``hparams.n_layer()`` is ``block_count - 1``.
* trunk layer ``il`` is Gated-DeltaNet (recurrent) unless
  ``(il + 1) % full_attention_interval == 0`` (then gated full attention); the MTP block is
  always full attention.
* the MTP block = a full-attention decoder block + ``nextn.eh_proj`` ``{2*n_embd, n_embd}``,
  ``nextn.enorm``, ``nextn.hnorm`` (+ optional ``nextn.shared_head_norm`` /
  ``nextn.shared_head_head`` / ``nextn.embed_tokens``; we omit them, so the MTP head uses
  the model's ``output_norm`` / ``output`` / ``token_embd``).
* MTP graph: ``x = eh_proj @ concat(enorm*rms(emb(x_{p+1})), hnorm*rms(h_p))`` (embedding half
  FIRST), block, then ``output_norm`` -> ``h_nextn`` -> ``output``.  The target's ``h_nextn``
  is its final hidden state *after* ``output_norm``.

Variants
--------
``agree``: every trunk layer and the MTP block write zero into the residual stream
(``attn_output`` / ``ssm_out`` / ``ffn_down`` (and the MoE down projections) are zero).  The
target then predicts ``f(t) = argmax(output @ (w * rms(emb[t])))`` after token ``t`` no matter
the history, and ``eh_proj = [I | 0]`` makes the MTP head compute ``rms(rms(emb[x_{p+1}]))``
(``enorm = 1``, ``output_norm = 1``) and so predict ``f(x_{p+1})``: exactly the token the
target will produce after ``x_{p+1}``.  Greedy MTP drafts are therefore always accepted,
including autoregressive multi-token drafts.
``random``: random weights everywhere (trunk included), so drafts are mostly rejected and the
trunk's recurrent state genuinely depends on history (exercises rollback).

Run ``python tests/mtp_gguf.py`` to build both and check them end to end through
llama-cpp-python's low-level API and ``localspec.engine.nextn_ext``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Literal

import gguf
import numpy as np

DEFAULT_TOKENIZER = Path.home() / ".cache/localspec/models/SmolLM2-135M-Instruct.Q4_1.gguf"

_TYPE = gguf.GGUFValueType


# --------------------------------------------------------------------------- tokenizer


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "localspec" / "test-tokenizers"


def tokenizer_metadata(src: str | os.PathLike[str]) -> list[tuple[str, Any, int, int | None]]:
    """``tokenizer.*`` keys of ``src`` as (key, value, vtype, subtype), cached as JSON."""
    src = Path(src)
    st = src.stat()
    cache = _cache_dir() / f"{src.name}.{st.st_size}.{int(st.st_mtime)}.json"
    if cache.exists():
        try:
            return [tuple(x) for x in json.loads(cache.read_text())]  # type: ignore[misc]
        except (OSError, ValueError):
            pass
    reader = gguf.GGUFReader(str(src))
    out: list[tuple[str, Any, int, int | None]] = []
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == _TYPE.ARRAY and len(field.types) > 1 else None
        val = field.contents()
        if isinstance(val, np.generic):
            val = val.item()
        out.append((key, val, int(vtype), int(sub) if sub is not None else None))
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(".tmp")
        tmp.write_text(json.dumps(out))
        tmp.replace(cache)
    except OSError:
        pass
    return out


# --------------------------------------------------------------------------- builder


def build_qwen35_mtp(
    path: str | os.PathLike[str],
    *,
    variant: Literal["agree", "random"],
    n_layer: int = 4,
    n_embd: int = 64,
    n_ff: int = 128,
    n_head: int = 2,
    n_head_kv: int = 1,
    head_dim: int = 32,
    full_attention_interval: int = 4,
    moe: bool = False,
    n_expert: int = 4,
    n_expert_used: int = 2,
    seed: int = 0,
    tokenizer_from: str | os.PathLike[str] | None = None,
) -> Path:
    """Write a tiny qwen35 (``moe=True``: qwen35moe) GGUF with one NextN block; return its path."""
    if variant not in ("agree", "random"):
        raise ValueError(f"variant must be 'agree' or 'random', not {variant!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    arch = "qwen35moe" if moe else "qwen35"
    agree = variant == "agree"

    tok_meta = tokenizer_metadata(tokenizer_from or DEFAULT_TOKENIZER)
    n_vocab = next(len(v) for k, v, _, _ in tok_meta if k == "tokenizer.ggml.tokens")

    # Gated DeltaNet dims (head_v_dim must equal ssm.state_size: ssm_norm is {state_size}).
    d_state, n_group, dt_rank, d_conv = 16, 2, 4, 4
    d_inner = d_state * dt_rank
    key_dim, value_dim = d_state * n_group, d_state * dt_rank
    conv_dim = 2 * key_dim + value_dim
    n_rot = head_dim // 2
    sections = [n_rot // 2 - 2 * (n_rot // 6), n_rot // 6, n_rot // 6, 0]  # sums to n_rot / 2
    n_ff_exp = n_ff // 2
    n_ff_shexp = n_ff // 2

    w = gguf.GGUFWriter(str(path), arch)
    a = arch
    w.add_name(f"tiny-{arch}-mtp-{variant}")
    w.add_uint32(f"{a}.context_length", 4096)
    w.add_uint32(f"{a}.embedding_length", n_embd)
    w.add_uint32(f"{a}.block_count", n_layer + 1)
    w.add_uint32(f"{a}.nextn_predict_layers", 1)
    w.add_uint32(f"{a}.feed_forward_length", n_ff)
    w.add_uint32(f"{a}.attention.head_count", n_head)
    w.add_uint32(f"{a}.attention.head_count_kv", n_head_kv)
    w.add_uint32(f"{a}.attention.key_length", head_dim)
    w.add_uint32(f"{a}.attention.value_length", head_dim)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32(f"{a}.rope.freq_base", 10000000.0)
    w.add_uint32(f"{a}.rope.dimension_count", n_rot)
    w.add_array(f"{a}.rope.dimension_sections", sections)
    w.add_uint32(f"{a}.ssm.conv_kernel", d_conv)
    w.add_uint32(f"{a}.ssm.inner_size", d_inner)
    w.add_uint32(f"{a}.ssm.state_size", d_state)
    w.add_uint32(f"{a}.ssm.time_step_rank", dt_rank)
    w.add_uint32(f"{a}.ssm.group_count", n_group)
    w.add_uint32(f"{a}.full_attention_interval", full_attention_interval)
    if moe:
        w.add_uint32(f"{a}.expert_count", n_expert)
        w.add_uint32(f"{a}.expert_used_count", n_expert_used)
        w.add_uint32(f"{a}.expert_feed_forward_length", n_ff_exp)
        w.add_uint32(f"{a}.expert_shared_feed_forward_length", n_ff_shexp)
    wt = _Weights(rng, agree)
    rnd, ones, out_proj = wt.rnd, wt.ones, wt.out_proj
    _add_tokenizer_and_head(w, tok_meta, n_vocab, n_embd, wt)

    def attn_block(il: int) -> None:
        p = f"blk.{il}"
        w.add_tensor(f"{p}.attn_q.weight", rnd(head_dim * n_head * 2, n_embd))  # query + gate
        w.add_tensor(f"{p}.attn_k.weight", rnd(head_dim * n_head_kv, n_embd))
        w.add_tensor(f"{p}.attn_v.weight", rnd(head_dim * n_head_kv, n_embd))
        w.add_tensor(f"{p}.attn_output.weight", out_proj(n_embd, head_dim * n_head))
        w.add_tensor(f"{p}.attn_q_norm.weight", ones(head_dim))
        w.add_tensor(f"{p}.attn_k_norm.weight", ones(head_dim))

    def ffn_block(il: int) -> None:
        p = f"blk.{il}"
        if not moe:
            w.add_tensor(f"{p}.ffn_gate.weight", rnd(n_ff, n_embd))
            w.add_tensor(f"{p}.ffn_up.weight", rnd(n_ff, n_embd))
            w.add_tensor(f"{p}.ffn_down.weight", out_proj(n_embd, n_ff))
            return
        w.add_tensor(f"{p}.ffn_gate_inp.weight", rnd(n_expert, n_embd, std=0.5))
        w.add_tensor(f"{p}.ffn_gate_exps.weight", rnd(n_expert, n_ff_exp, n_embd))
        w.add_tensor(f"{p}.ffn_up_exps.weight", rnd(n_expert, n_ff_exp, n_embd))
        w.add_tensor(f"{p}.ffn_down_exps.weight", out_proj(n_expert, n_embd, n_ff_exp))
        w.add_tensor(f"{p}.ffn_gate_inp_shexp.weight", rnd(n_embd, std=0.5))
        w.add_tensor(f"{p}.ffn_gate_shexp.weight", rnd(n_ff_shexp, n_embd))
        w.add_tensor(f"{p}.ffn_up_shexp.weight", rnd(n_ff_shexp, n_embd))
        w.add_tensor(f"{p}.ffn_down_shexp.weight", out_proj(n_embd, n_ff_shexp))

    for il in range(n_layer):
        p = f"blk.{il}"
        w.add_tensor(f"{p}.attn_norm.weight", ones(n_embd))
        w.add_tensor(f"{p}.post_attention_norm.weight", ones(n_embd))
        if (il + 1) % full_attention_interval == 0:
            attn_block(il)
        else:
            w.add_tensor(f"{p}.attn_qkv.weight", rnd(conv_dim, n_embd))
            w.add_tensor(f"{p}.attn_gate.weight", rnd(value_dim, n_embd))
            w.add_tensor(f"{p}.ssm_conv1d.weight", rnd(conv_dim, d_conv, std=0.2))
            w.add_tensor(f"{p}.ssm_dt.bias", rnd(dt_rank, std=0.1))
            w.add_tensor(f"{p}.ssm_a", -np.exp(rng.uniform(-1.0, 0.5, dt_rank)).astype(np.float32))
            w.add_tensor(f"{p}.ssm_beta.weight", rnd(dt_rank, n_embd))
            w.add_tensor(f"{p}.ssm_alpha.weight", rnd(dt_rank, n_embd))
            w.add_tensor(f"{p}.ssm_norm.weight", ones(d_state))
            w.add_tensor(f"{p}.ssm_out.weight", out_proj(n_embd, value_dim))
        ffn_block(il)

    # the NextN / MTP block
    il = n_layer
    p = f"blk.{il}"
    w.add_tensor(f"{p}.attn_norm.weight", ones(n_embd))
    w.add_tensor(f"{p}.post_attention_norm.weight", ones(n_embd))
    attn_block(il)
    ffn_block(il)
    w.add_tensor(f"{p}.nextn.eh_proj.weight", _eh_proj(n_embd, agree, rnd))
    w.add_tensor(f"{p}.nextn.enorm.weight", ones(n_embd))
    w.add_tensor(f"{p}.nextn.hnorm.weight", ones(n_embd))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def build_hy_v3_mtp(
    path: str | os.PathLike[str],
    *,
    variant: Literal["agree", "random"],
    n_nextn: int = 3,
    n_layer: int = 2,
    n_embd: int = 64,
    n_ff: int = 128,
    n_head: int = 2,
    n_head_kv: int = 1,
    head_dim: int = 32,
    seed: int = 0,
    tokenizer_from: str | os.PathLike[str] | None = None,
) -> Path:
    """Write a tiny ``hy_v3`` GGUF with ``n_nextn`` chained NextN heads; return its path.

    ``hy_v3`` is the simplest architecture whose MTP graph accepts several NextN blocks
    (``src/models/hy-v3.cpp``: ``il = n_layer + nextn_layer_offset``): plain full attention
    with per-head q/k RMS norms, a plain KV cache, and a dense SiLU FFN wherever a block has no
    ``ffn_gate_inp`` (so no MoE tensors are needed).  Blocks ``n_layer .. n_layer+n_nextn-1``
    are the heads: a decoder block + ``nextn.eh_proj`` / ``enorm`` / ``hnorm``; without
    ``nextn.shared_head_norm`` the head's final norm is ``output_norm``, which also gives
    the target's ``h_nextn`` (post-norm).  ``agree``: the same zero-residual construction as
    :func:`build_qwen35_mtp`, in every head, so each head predicts ``f(x)`` from its token
    ``x`` -- what the trunk predicts after ``x`` -- and chained greedy drafts are all accepted.
    """
    if variant not in ("agree", "random"):
        raise ValueError(f"variant must be 'agree' or 'random', not {variant!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    agree = variant == "agree"
    tok_meta = tokenizer_metadata(tokenizer_from or DEFAULT_TOKENIZER)
    n_vocab = next(len(v) for k, v, _, _ in tok_meta if k == "tokenizer.ggml.tokens")

    a = "hy_v3"
    w = gguf.GGUFWriter(str(path), a)
    w.add_name(f"tiny-{a}-mtp{n_nextn}-{variant}")
    for key, val in (
        ("context_length", 4096),
        ("embedding_length", n_embd),
        ("block_count", n_layer + n_nextn),
        ("nextn_predict_layers", n_nextn),
        ("feed_forward_length", n_ff),
        ("expert_feed_forward_length", n_ff),  # read unconditionally by hy_v3's loader
        ("attention.head_count", n_head),
        ("attention.head_count_kv", n_head_kv),
        ("attention.key_length", head_dim),
        ("attention.value_length", head_dim),
        ("rope.dimension_count", head_dim),  # hy_v3 asserts n_rot == head size
    ):
        w.add_uint32(f"{a}.{key}", val)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32(f"{a}.rope.freq_base", 10000.0)
    wt = _Weights(rng, agree)
    rnd, ones, out_proj = wt.rnd, wt.ones, wt.out_proj
    _add_tokenizer_and_head(w, tok_meta, n_vocab, n_embd, wt)
    for il in range(n_layer + n_nextn):
        p = f"blk.{il}"
        w.add_tensor(f"{p}.attn_norm.weight", ones(n_embd))
        w.add_tensor(f"{p}.attn_q.weight", rnd(head_dim * n_head, n_embd))
        w.add_tensor(f"{p}.attn_k.weight", rnd(head_dim * n_head_kv, n_embd))
        w.add_tensor(f"{p}.attn_v.weight", rnd(head_dim * n_head_kv, n_embd))
        w.add_tensor(f"{p}.attn_output.weight", out_proj(n_embd, head_dim * n_head))
        w.add_tensor(f"{p}.attn_q_norm.weight", ones(head_dim))
        w.add_tensor(f"{p}.attn_k_norm.weight", ones(head_dim))
        w.add_tensor(f"{p}.ffn_norm.weight", ones(n_embd))
        w.add_tensor(f"{p}.ffn_gate.weight", rnd(n_ff, n_embd))
        w.add_tensor(f"{p}.ffn_up.weight", rnd(n_ff, n_embd))
        w.add_tensor(f"{p}.ffn_down.weight", out_proj(n_embd, n_ff))
        if il >= n_layer:
            w.add_tensor(f"{p}.nextn.eh_proj.weight", _eh_proj(n_embd, agree, rnd))
            w.add_tensor(f"{p}.nextn.enorm.weight", ones(n_embd))
            w.add_tensor(f"{p}.nextn.hnorm.weight", ones(n_embd))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


class _Weights:
    """Seeded random weights of one variant: ``agree`` zeroes every projection that writes
    into the residual stream and makes every norm weight 1."""

    def __init__(self, rng: np.random.Generator, agree: bool) -> None:
        self.rng, self.agree = rng, agree

    def rnd(self, *shape: int, std: float = 0.05) -> np.ndarray:
        return self.rng.normal(0.0, std, size=shape).astype(np.float32)

    def ones(self, n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32) if self.agree else (1.0 + self.rnd(n, std=0.05))

    def out_proj(self, *shape: int) -> np.ndarray:
        """A projection that writes into the residual stream: zero for 'agree'."""
        return np.zeros(shape, dtype=np.float32) if self.agree else self.rnd(*shape)


def _add_tokenizer_and_head(
    w: gguf.GGUFWriter,
    tok_meta: list[tuple[str, Any, int, int | None]],
    n_vocab: int,
    n_embd: int,
    wt: _Weights,
) -> None:
    """File type, the copied tokenizer, and the embedding / final norm / output head."""
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for key, val, vtype, sub in tok_meta:
        w.add_key_value(key, val, _TYPE(vtype), _TYPE(sub) if sub is not None else None)
    # numpy shapes are the reverse of ggml's {ne0, ne1, ...}
    w.add_tensor("token_embd.weight", wt.rnd(n_vocab, n_embd, std=1.0).astype(np.float16))
    w.add_tensor("output_norm.weight", wt.ones(n_embd))
    w.add_tensor("output.weight", wt.rnd(n_vocab, n_embd, std=0.5).astype(np.float16))


def _eh_proj(n_embd: int, agree: bool, rnd: Any) -> np.ndarray:
    """``eh_proj`` {2*n_embd, n_embd}: ``[I | 0]`` (keep the embedding half, drop h) for
    'agree', random otherwise."""
    if not agree:
        return rnd(n_embd, 2 * n_embd, std=0.1)
    eh = np.zeros((n_embd, 2 * n_embd), dtype=np.float32)
    eh[:, :n_embd] = np.eye(n_embd, dtype=np.float32)
    return eh


# --------------------------------------------------------------------------- self-check


def _check(path: Path, variant: str, n_draft: int = 4) -> dict[str, Any]:
    """Load ``path``, decode a prompt, run MTP drafts; returns the observations."""
    import ctypes

    import llama_cpp as L

    from localspec.engine import nextn_ext as X

    mp = L.llama_model_default_params()
    mp.load_mtp = True
    model = L.llama_model_load_from_file(str(path).encode(), mp)
    assert model, f"failed to load {path}"
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    n_embd = L.llama_model_n_embd_out(model)
    res: dict[str, Any] = {
        "n_layer": L.llama_model_n_layer(model),
        "n_layer_nextn": L.llama_model_n_layer_nextn(model),
        "n_embd": n_embd,
    }
    assert res["n_layer_nextn"] > 0

    def new_ctx(mtp: bool, n_rs_seq: int, other: Any = None) -> Any:
        cp = L.llama_context_default_params()
        cp.n_ctx = 512
        cp.n_batch = 64
        cp.n_ubatch = 64
        cp.n_seq_max = 1
        cp.n_threads = cp.n_threads_batch = 4
        cp.n_rs_seq = n_rs_seq
        if mtp:
            cp.ctx_type = L.LLAMA_CONTEXT_TYPE_MTP
            cp.ctx_other = other
        ctx = L.llama_init_from_model(model, cp)
        assert ctx, "context creation failed"
        return ctx

    ctx_t = new_ctx(False, n_draft)
    ctx_d = new_ctx(True, 0, ctx_t)
    res["n_rs_seq_target"] = L.llama_n_rs_seq(ctx_t)
    res["ctx_other_of_mtp"] = X.llama_get_ctx_other(ctx_d)
    X.llama_set_embeddings_nextn(ctx_t, True, False)  # unmasked: a row per batch token
    X.llama_set_embeddings_nextn(ctx_d, True, True)  # masked: rows for outputs only

    def logits_of(ctx: Any, i: int) -> np.ndarray:
        return np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), shape=(n_vocab,)).copy()

    def argmax(ctx: Any, i: int) -> int:
        return int(np.argmax(logits_of(ctx, i)))

    def tgt_decode(tokens: list[int], pos0: int, ctx: Any = None) -> None:
        ctx = ctx_t if ctx is None else ctx
        b = L.llama_batch_init(len(tokens), 0, 1)
        for k, t in enumerate(tokens):
            b.token[k] = t
            b.pos[k] = pos0 + k
            b.n_seq_id[k] = 1
            b.seq_id[k][0] = 0
            b.logits[k] = True
        b.n_tokens = len(tokens)
        rc = L.llama_decode(ctx, b)
        L.llama_batch_free(b)
        assert rc == 0, f"target decode rc={rc}"

    text = b"The quick brown fox jumps over the lazy dog"
    buf = (L.llama_token * 64)()
    n = L.llama_tokenize(vocab, text, len(text), buf, 64, True, False)
    prompt = list(buf[:n])
    N = len(prompt)

    # 1. target prefill, all rows output; h_p for every prompt position
    tgt_decode(prompt, 0)
    h = X.nextn_rows(ctx_t, N, n_embd)
    x_next = argmax(ctx_t, N - 1)  # the token the target samples after the prompt

    # 2. MTP catch-up over the prompt: pairs (h_{p-1}, x_p) at pos p for p = 1..N-1, then
    #    the draft step pairs (h_{N-1}, x_N = sampled) at pos N (llama.cpp: pending_h for p=0)
    mb = X.MtpBatch(ctx_d, n_embd)
    mb.add(prompt[0], 0, np.zeros(n_embd, np.float32))
    for p_ in range(1, N):
        mb.add(prompt[p_], p_, h[p_ - 1])
    assert mb.decode() == 0
    mb.clear()

    # 3. autoregressive draft: one head reused, its own h_nextn fed back
    draft: list[int] = []
    tok, pos, hrow = x_next, N, h[N - 1]
    for _ in range(n_draft):
        idx = mb.add(tok, pos, hrow, output=True)
        assert mb.decode() == 0
        mb.clear()
        tok = argmax(ctx_d, idx)
        hrow = X.nextn_row(ctx_d, idx, n_embd)
        draft.append(tok)
        pos += 1
    # 4. verify on the target: batch [x_next, d1..dk] at N..N+k
    tgt_decode([x_next, *draft], N)
    tgt_pred = [argmax(ctx_t, i) for i in range(len(draft) + 1)]
    n_acc = 0
    while n_acc < len(draft) and draft[n_acc] == tgt_pred[n_acc]:
        n_acc += 1
    res.update(draft=draft, target=tgt_pred[:-1], accepted=n_acc)

    def piece(t: int) -> str:
        out = ctypes.create_string_buffer(64)
        k = L.llama_token_to_piece(vocab, t, out, 64, 0, True)
        return out.raw[: max(k, 0)].decode("utf-8", "replace")

    res["draft_text"] = [piece(t) for t in draft]

    # 5. roll back the rejected tail (or, when all accepted, the last one for the test)
    mem_t = L.llama_get_memory(ctx_t)
    keep = N + 1 + n_acc if n_acc < len(draft) else N + len(draft)
    res["seq_rm_partial_target"] = bool(L.llama_memory_seq_rm(mem_t, 0, keep, -1))
    res["seq_rm_again_before_decode"] = bool(L.llama_memory_seq_rm(mem_t, 0, keep - 1, -1))
    res["pos_max_after_rm"] = L.llama_memory_seq_pos_max(mem_t, 0)
    res["seq_rm_partial_mtp"] = bool(L.llama_memory_seq_rm(L.llama_get_memory(ctx_d), 0, keep, -1))

    # 6. rollback correctness: continue after the rollback with token y and compare with a
    #    fresh context that decoded the same accepted history without any speculation
    y = prompt[1]
    tgt_decode([y], keep)
    logits_rb = logits_of(ctx_t, 0)
    history = prompt + [x_next, *draft][: keep - N] + [y]
    ctx_f = new_ctx(False, 0)
    tgt_decode(history, 0, ctx_f)
    logits_f = logits_of(ctx_f, len(history) - 1)
    res["rollback_max_abs_logit_diff"] = float(np.max(np.abs(logits_rb - logits_f)))
    # sensitivity of that comparison: same, had one rejected token stayed in the history
    L.llama_memory_clear(L.llama_get_memory(ctx_f), True)
    polluted = [*history[:-1], draft[-1], y]
    tgt_decode(polluted, 0, ctx_f)
    logits_p = logits_of(ctx_f, len(polluted) - 1)
    res["history_sensitivity_max_abs_logit_diff"] = float(np.max(np.abs(logits_p - logits_f)))

    # without snapshots (n_rs_seq = 0) partial removal on the hybrid target fails
    L.llama_memory_clear(L.llama_get_memory(ctx_f), True)
    tgt_decode(prompt, 0, ctx_f)
    res["seq_rm_partial_target_n_rs_seq_0"] = bool(
        L.llama_memory_seq_rm(L.llama_get_memory(ctx_f), 0, N - 1, -1)
    )
    L.llama_free(ctx_f)

    mb.close()
    for c in (ctx_d, ctx_t):
        L.llama_free(c)
    L.llama_model_free(model)
    return res


def main() -> int:
    import tempfile
    import time

    import llama_cpp as L

    L.llama_backend_init()
    if os.environ.get("MTP_GGUF_QUIET", "1") == "1":
        _cb = L.llama_log_callback(lambda level, text, user: None)
        L.llama_log_set(_cb, None)
        globals()["_keep_cb"] = _cb
    out_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="mtp-gguf-"))
    ok = True
    for moe in (False, True):
        for variant in ("agree", "random"):
            t0 = time.time()
            name = f"tiny-{'qwen35moe' if moe else 'qwen35'}-mtp-{variant}.gguf"
            path = build_qwen35_mtp(out_dir / name, variant=variant, moe=moe)  # type: ignore[arg-type]
            t1 = time.time()
            res = _check(path, variant)
            t2 = time.time()
            size = path.stat().st_size / 1e6
            print(f"{name}: {size:.1f} MB, build {t1 - t0:.1f}s, check {t2 - t1:.1f}s")
            for k, v in res.items():
                print(f"  {k} = {v}")
            if variant == "agree":
                ok &= res["accepted"] == len(res["draft"])
            else:
                ok &= res["accepted"] < len(res["draft"])
            ok &= res["seq_rm_partial_target"] and not res["seq_rm_partial_target_n_rs_seq_0"]
            ok &= res["rollback_max_abs_logit_diff"] < 1e-2
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    raise SystemExit(main())
