"""Is this draft usable with this target, and why not? (``localspec pairs``)

Hard rules are llama.cpp's (``common_speculative_are_compatible``): same vocabulary type, same
BOS/EOS where they are added, vocabulary sizes within 128, identical token text from id 5 on.
Then advice: a different family drafts poorly (the seeds' first lesson), a draft that is not
much smaller than the target cannot pay, and target + draft + KV caches must fit in memory.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass, field
from pathlib import Path

from localspec.derivation.gguf_info import GGUFInfo, gguf_info
from localspec.hardware import available_memory
from localspec.vocab import Vocab

VOCAB_MAX_SIZE_DIFFERENCE = 128  # llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE
VOCAB_CHECK_START_TOKEN_ID = 5  # llama.cpp's SPEC_VOCAB_CHECK_START_TOKEN_ID
MAX_USEFUL_SIZE_RATIO = 0.5  # a draft over half the target's size rarely pays
# Weight types llama.cpp's x86 CPU backend repacks into interleaved blocks for its fast
# AVX2/AVX-512 matrix kernels (ggml-cpu/repack.cpp); others run the generic dot products.
X86_REPACKED = {"Q4_0", "Q4_K", "IQ4_NL", "MXFP4"}
SLOW_DRAFT_SHARE = 0.5  # advise a requantization when more of the draft is not repacked
GIB = 1 << 30
VOCAB_TYPES = {0: "none", 1: "SPM", 2: "BPE", 3: "WPM", 4: "UGM", 5: "RWKV", 6: "PLaMo-2"}


@dataclass(frozen=True)
class Verdict:
    target: GGUFInfo
    draft: GGUFInfo
    reasons: list[str] = field(default_factory=list)  # why it cannot be used (empty: it can)
    warnings: list[str] = field(default_factory=list)  # why it may not pay

    @property
    def compatible(self) -> bool:
        return not self.reasons

    @property
    def size_ratio(self) -> float:
        return self.draft.file_size / self.target.file_size

    def to_dict(self) -> dict[str, object]:
        return {
            "draft": str(self.draft.path),
            "compatible": self.compatible,
            "reasons": self.reasons,
            "warnings": self.warnings,
            "size_ratio": round(self.size_ratio, 3),
            "family": self.draft.family,
        }


def vocab_problems(target: Vocab, draft: Vocab) -> list[str]:
    """llama.cpp's compatibility rules; each failure says which rule and the values."""
    if target.type != draft.type:
        d_type, t_type = VOCAB_TYPES.get(draft.type, draft.type), VOCAB_TYPES.get(target.type)
        return [f"vocabulary types differ (draft {d_type}, target {t_type})"]
    problems = []
    if target.add_bos != draft.add_bos or (target.add_bos and target.bos != draft.bos):
        problems.append(
            f"BOS differs (draft: added={draft.add_bos} id={draft.bos}; "
            f"target: added={target.add_bos} id={target.bos})"
        )
    if target.add_eos != draft.add_eos or (target.add_eos and target.eos != draft.eos):
        problems.append(
            f"EOS differs (draft: added={draft.add_eos} id={draft.eos}; "
            f"target: added={target.add_eos} id={target.eos})"
        )
    diff = abs(target.n_tokens - draft.n_tokens)
    if diff > VOCAB_MAX_SIZE_DIFFERENCE:
        problems.append(
            f"vocabulary sizes differ by {diff} (draft {draft.n_tokens}, target "
            f"{target.n_tokens}; at most {VOCAB_MAX_SIZE_DIFFERENCE} allowed)"
        )
        return problems
    for token in range(VOCAB_CHECK_START_TOKEN_ID, min(target.n_tokens, draft.n_tokens)):
        if target.text(token) != draft.text(token):
            problems.append(
                f"token {token} differs (draft {draft.text(token)!r}, "
                f"target {target.text(token)!r})"
            )
            break
    return problems


def memory_needed(target: GGUFInfo, draft: GGUFInfo | None, n_ctx: int) -> int:
    """Weights + KV caches; ``n_ctx`` 0 is the target's trained length (as ``-c 0`` in
    llama.cpp)."""
    n_ctx = n_ctx or target.context_length
    total = target.file_size + target.kv_cache_bytes(n_ctx)
    if draft is not None:
        total += draft.file_size + draft.kv_cache_bytes(n_ctx)
    return total


def check(
    target: Path, draft: Path, n_ctx: int = 4096, target_vocab: Vocab | None = None
) -> Verdict:
    """The full verdict for one candidate (``target_vocab`` may be reused across candidates)."""
    t_info, d_info = gguf_info(target), gguf_info(draft)
    own = target_vocab is None
    t_vocab = target_vocab or Vocab.load(target)
    try:
        with Vocab.load(draft) as d_vocab:
            reasons = vocab_problems(t_vocab, d_vocab)
    finally:
        if own:
            t_vocab.close()
    warnings = advice(t_info, d_info) if not reasons else []
    need, have = memory_needed(t_info, d_info, n_ctx), available_memory()
    if need > have:
        reasons.append(
            f"target + draft + KV caches need {need / GIB:.1f} GiB at context "
            f"{n_ctx or t_info.context_length}, "
            f"{have / GIB:.1f} GiB is available"
        )
    return Verdict(t_info, d_info, reasons, warnings)


def advice(target: GGUFInfo, draft: GGUFInfo, machine: str | None = None) -> list[str]:
    warnings = []
    slow_draft = _slow_cpu_draft(draft, machine or platform.machine())
    if slow_draft:
        warnings.append(slow_draft)
    if target.family != draft.family:
        warnings.append(
            f"different families ({draft.family} vs {target.family}): cross-family "
            "drafts accept poorly even with a shared tokenizer"
        )
    ratio = draft.file_size / target.file_size
    if ratio >= MAX_USEFUL_SIZE_RATIO:
        warnings.append(
            f"the draft is {100 * ratio:.0f}% of the target's size: each drafted "
            "token costs nearly as much as a target step, so it rarely pays"
        )
    return warnings


def _slow_cpu_draft(draft: GGUFInfo, machine: str) -> str | None:
    """On x86, a draft mostly in types without a repacked kernel drafts slower than it
    could: a pure Q4_0 requantization of it does (a "Q4_K_M" file can be mostly Q5_0 when
    its rows are not a multiple of 256; figures in docs/benchmarks.md)."""
    if machine.lower() not in ("x86_64", "amd64") or not draft.matrix_types:
        return None
    if draft.matrix_share(X86_REPACKED) >= 1 - SLOW_DRAFT_SHARE:
        return None
    main, _ = draft.matrix_types[0]
    return (
        f"mostly {main}, which llama.cpp does not repack for x86 CPUs: a pure Q4_0 "
        'requantization drafts faster (catalog derive = {..., ftype = "Q4_0", pure = true})'
    )


def draftless_modes(target: GGUFInfo) -> list[tuple[str, bool, str]]:
    """(mode, usable with this target, why) for the modes that need no second model."""
    nextn = target.n_layer_nextn
    return [
        ("ngram-simple", True, "drafts from the prompt and output history; any model"),
        (
            "suffix+ngram-simple",
            True,
            "earlier prompts and answers (the speculation memory), then as ngram-simple",
        ),
        ("draft-self", True, f"the target with some of its {target.n_layer} layers skipped"),
        (
            "draft-mtp",
            nextn > 0,
            f"{nextn} NextN head(s)" if nextn else "no NextN (MTP) layers in this GGUF",
        ),
    ]
