"""Tie-aware comparison of a speculative output with plain decoding of the same target.

llama.cpp's batched pass (used to verify drafts) and its one-token pass round floats
differently, so the two can pick different tokens where the target's two best logits are
almost equal. Such a divergence is not a loss of quality; any other one is a bug. The plain
run records, at each token, the gap between its two best logits; a divergence counts as a
near tie when that gap at the divergence point is below ``NEAR_TIE_GAP``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

# Measured on Qwen2.5-0.5B: batched-vs-single divergences happen at gaps of 0.004-0.06;
# 0.1 logits leaves room for other CPUs while staying far below ordinary token gaps.
NEAR_TIE_GAP = 0.1


@dataclass(frozen=True)
class LosslessReport:
    identical: bool
    first_divergence: int | None  # token index, None when identical
    top2_gap: float | None  # plain run's top-2 logit gap at the divergence
    near_tie: bool  # the divergence (if any) is at a near tie: acceptable
    matched: int  # tokens equal before the first divergence
    compared: int

    @property
    def ok(self) -> bool:
        return self.identical or self.near_tie

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def compare(plain: Sequence[int], plain_margins: Sequence[float], other: Sequence[int],
            bound: float = NEAR_TIE_GAP) -> LosslessReport:
    """Compare token sequences; a length difference alone (one hit a stop earlier) counts as
    identical over the common part."""
    n = min(len(plain), len(other))
    for i in range(n):
        if plain[i] != other[i]:
            gap = float(plain_margins[i]) if i < len(plain_margins) else None
            return LosslessReport(False, i, gap, gap is not None and gap < bound, i, n)
    return LosslessReport(True, None, None, False, n, n)
