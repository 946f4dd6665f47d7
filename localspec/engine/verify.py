"""Acceptance maths of speculative decoding, in pure numpy (no llama.cpp here).

Greedy (temperature 0): a drafted token is accepted while it equals the target's argmax; the
first mismatch is replaced by the target's argmax; after a full accept the target's next
argmax is a bonus token. Output is exactly what greedy decoding of the target would give.

Sampling: speculative sampling (Leviathan et al. 2023; Chen et al. 2023). Drafted token x with
draft probability q(x) is accepted with probability min(1, p(x)/q(x)); on rejection the token
is drawn from the residual max(0, p - q), renormalised. p and q are both the *processed*
distributions (same temperature, top-k, top-p, min-p), so the output follows the target's
processed distribution exactly. A drafter that gives no probabilities is treated as one-hot
q (q(x) = 1): acceptance is then p(x), and the residual is p without x.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1.0: off
    min_p: float = 0.0  # 0.0: off
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def probabilities(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The processed distribution for one logits row: temperature, then top-k, top-p, min-p
    truncation (llama.cpp's usual order), renormalised. Returns float64 summing to 1."""
    scaled = logits.astype(np.float64) / max(params.temperature, 1e-6)
    if 0 < params.top_k < scaled.size:
        kth = np.partition(scaled, -params.top_k)[-params.top_k]
        scaled = np.where(scaled >= kth, scaled, -np.inf)
    scaled -= scaled.max()
    probs = np.exp(scaled)
    probs /= probs.sum()
    if params.top_p < 1.0:
        probs = _top_p(probs, params.top_p)
    if params.min_p > 0.0:
        probs = np.where(probs >= params.min_p * probs.max(), probs, 0.0)
    return probs / probs.sum()


def _top_p(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Keep the smallest set of most likely tokens whose mass reaches ``top_p``.

    Sorting a 150k vocabulary costs ~10 ms; the kept set is almost always among the few
    hundred most likely tokens, so sort those first and fall back on a full sort."""
    head = min(probs.size, 512)
    while True:
        order = np.argpartition(-probs, head - 1)[:head] if head < probs.size else np.arange(head)
        order = order[np.argsort(-probs[order], kind="stable")]
        cumulative = np.cumsum(probs[order])
        if cumulative[-1] >= top_p or head == probs.size:
            break
        head = probs.size
    keep_n = min(int(np.searchsorted(cumulative, top_p)) + 1, order.size)
    kept = np.zeros_like(probs)
    kept[order[:keep_n]] = probs[order[:keep_n]]
    return kept


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token id; inverse-CDF on the cumulative sum (never returns an id >= size)."""
    cumulative = np.cumsum(probs)
    index = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
    return min(index, probs.size - 1)


def accept_greedy(draft: Sequence[int], target_rows: np.ndarray) -> tuple[int, int]:
    """Return (number of drafted tokens accepted, the target's token that follows them).

    ``target_rows[i]`` are the target's logits after the context plus ``draft[:i]``; there are
    ``len(draft) + 1`` rows."""
    choices = target_rows.argmax(axis=1)
    n = 0
    while n < len(draft) and draft[n] == choices[n]:
        n += 1
    return n, int(choices[n])


def accept_sampling(
    draft: Sequence[int],
    draft_probs: Sequence[np.ndarray] | None,
    target_rows: np.ndarray,
    params: SamplingParams,
    rng: np.random.Generator,
) -> tuple[int, int]:
    """Speculative sampling over one draft; same contract as ``accept_greedy``.

    ``draft_probs[i]`` is the drafter's processed distribution at position i (None: one-hot)."""
    for i, token in enumerate(draft):
        p = probabilities(target_rows[i], params)
        q = draft_probs[i] if draft_probs is not None else None
        q_x = 1.0 if q is None else float(q[token])
        if q_x > 0.0 and rng.random() * q_x < p[token]:  # accept with prob min(1, p/q)
            continue
        return i, sample(residual(p, q, token), rng)
    bonus = probabilities(target_rows[len(draft)], params)
    return len(draft), sample(bonus, rng)


def residual(p: np.ndarray, q: np.ndarray | None, rejected: int) -> np.ndarray:
    """max(0, p - q) renormalised; for one-hot q that is p with the rejected token removed."""
    if q is None:
        r = p.copy()
        r[rejected] = 0.0
    else:
        r = np.maximum(p - q, 0.0)
    total = r.sum()
    # total is 0 only if p == q up to rounding, where rejection has probability ~0: fall back on p.
    return r / total if total > 1e-12 else p
