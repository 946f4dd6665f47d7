"""Tie-aware comparison of a speculative output with plain decoding of the same target.

llama.cpp's batched pass (used to verify drafts) and its one-token pass round floats
differently, so the two can pick different tokens where the target's two best logits are
almost equal. Such a divergence is not a loss of quality; any other one is a bug. The plain
run records, at each token, the gap between its two best logits and its second-best token;
a divergence counts as a near tie when that gap is below ``NEAR_TIE_GAP`` *and* the other
run chose one of the plain run's runners-up: the tokens whose logits lie within
``NEAR_TIE_GAP`` of the best (with three logits that close, the rounding can put the third
first).

Sampling with a seed, where only lookups draft, is compared the same way: each token is the
target's own draw at a uniform number fixed by the seed and the output position, so the two
runs pick the same tokens unless a rounding moved an edge of the inverse CDF across the draw.
The plain run then records each draw's margin (the probability mass between the draw and the
nearer edge of its token's interval, ``verify.draw_margin``), bounded by ``NEAR_TIE_DRAW``.
Which token the other run drew is not checked: the rounding moves the cumulative sum by up to
a few hundredths, across as many of the vocabulary's tiny intervals as that spans.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

# Above every divergence between speculative and plain runs measured so far, and far below
# the typical top-2 gap (docs/benchmarks.md, "Measurements behind defaults").
NEAR_TIE_GAP = 0.25
# Above the largest move of the cumulative sum measured between a one-token and a batched
# pass (docs/benchmarks.md, "Sampled near ties"), and well below a typical draw's margin.
NEAR_TIE_DRAW = 0.04
ANY_TOKEN = -1  # among a position's runners-up: any token may be the other run's


@dataclass(frozen=True)
class LosslessReport:
    identical: bool
    first_divergence: int | None  # token index, None when identical
    margin: float | None  # plain run's top-2 logit gap (or draw margin) at the divergence
    near_tie: bool  # the divergence (if any) is at a near tie: acceptable
    matched: int  # tokens equal before the first divergence
    compared: int

    @property
    def ok(self) -> bool:
        return self.identical or self.near_tie

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def compare(
    plain: Sequence[int],
    plain_margins: Sequence[float],
    other: Sequence[int],
    plain_runners_up: Sequence[Sequence[int]] = (),
    bound: float = NEAR_TIE_GAP,
) -> LosslessReport:
    """Compare token sequences over their common length (one may have stopped earlier).
    ``plain_runners_up[i]``: the plain run's runners-up at token i (``ANY_TOKEN`` among
    them: any token may be the other run's, as for a sampled draw)."""
    n = min(len(plain), len(other))
    for i in range(n):
        if plain[i] != other[i]:
            gap = float(plain_margins[i]) if i < len(plain_margins) else None
            close = plain_runners_up[i] if i < len(plain_runners_up) else (ANY_TOKEN,)
            runner_up_ok = ANY_TOKEN in close or other[i] in close
            near = gap is not None and gap < bound and runner_up_ok
            return LosslessReport(False, i, gap, near, i, n)
    return LosslessReport(True, None, None, False, n, n)
