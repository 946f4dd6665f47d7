"""Acceptance maths of speculative decoding, in pure numpy (no llama.cpp here).

Greedy (temperature 0): a drafted token is accepted while it equals the target's argmax; the
first mismatch is replaced by the target's argmax; after a full accept the target's next
argmax is a bonus token. Output is exactly what greedy decoding of the target would give.

Sampling: speculative sampling (Leviathan et al. 2023; Chen et al. 2023). Drafted token x with
draft probability q(x) is accepted with probability min(1, p(x)/q(x)); on rejection the token
is drawn from the residual max(0, p - q), renormalised. p and q are both the *processed*
distributions (same temperature, top-k, top-p, min-p), so the output follows the target's
processed distribution exactly. A drafter that gives no probabilities (a lookup) is one-hot
q (q(x) = 1): acceptance is then p(x), and the residual is p without x. That is done by
drawing the target's own token by inverse CDF and accepting the draft when they agree
(probability p(x); otherwise the draw is p without x): with the draw's uniform number fixed
by the seed and the output position (``TokenDraws``), a seed gives the same text as plain
decoding whatever was drafted, even by a drafter whose drafts depend on earlier requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from localspec.engine.logit_bias import NO_BIAS, LogitBias
from localspec.engine.penalties import NO_PENALTIES, Penalties

TOP_K_WINDOWS = (8.0, 16.0, 32.0)  # logit windows under the maximum that top-k partitions
TOP_P_THRESHOLDS = (1e-4, 1e-6, 1e-8, 0.0)  # candidate sets {p >= tau} that top-p sorts
SAMPLE_BLOCK = 2048  # the inverse CDF is found block by block (see ``sample``)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1.0: off
    min_p: float = 0.0  # 0.0: off
    seed: int | None = None
    # applied to the logits before all of the above (the bias first), by the loop, which
    # knows the context
    penalties: Penalties = NO_PENALTIES
    logit_bias: LogitBias = NO_BIAS

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


class TokenDraws:
    """The uniform numbers that pick sampled tokens: one per output position and purpose,
    from (seed, position, purpose) alone, not from how many were used before, so that what
    was drafted does not change what a seed gives (a SeedSequence hash: ~20 us a token)."""

    PICK, ACCEPT, RESIDUAL = 0, 1, 2

    def __init__(self, seed: int | None) -> None:
        entropy = np.random.SeedSequence().entropy if seed is None else seed
        self.seed = int(entropy)  # type: ignore[arg-type]

    def uniform(self, position: int, purpose: int = PICK) -> float:
        seq = np.random.SeedSequence([self.seed, position, purpose])
        return float(seq.generate_state(1, np.uint64)[0] >> np.uint64(11)) * 2.0**-53


def probabilities(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The processed distribution for one logits row: temperature, then top-k, top-p, min-p
    truncation (llama.cpp's usual order), renormalised. Returns float64 summing to 1.

    Runs once per verified position and per drafted token at temperature > 0, so it works in
    place on one fresh array: a 150k vocabulary costs ~0.3 ms instead of ~2 ms with a
    temporary per step (each new 1 MiB array is page faults first), which on a small CPU is a
    tenth of a decoding step. With top-k the work is done on the k candidates only."""
    inv_t = 1.0 / max(params.temperature, 1e-6)
    if not 0 < params.top_k < logits.size:
        return _truncate(_softmax(logits.astype(np.float64), inv_t), params)
    kept = _top_k(logits, params.top_k)
    probs = np.zeros(logits.size)
    probs[kept] = _truncate(_softmax(logits[kept].astype(np.float64), inv_t), params)
    return probs


def _truncate(probs: np.ndarray, params: SamplingParams) -> np.ndarray:
    """top-p then min-p on a normalised distribution, renormalised (in place when possible)."""
    if params.top_p < 1.0:
        probs = _top_p(probs, params.top_p)
    if params.min_p > 0.0:
        probs[probs < params.min_p * probs.max()] = 0.0
    if params.top_p < 1.0 or params.min_p > 0.0:
        probs /= probs.sum()
    return probs


def _top_k(logits: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k largest logits (and any tied with the k-th). A partition of the whole
    vocabulary costs ~1 ms: partition only the logits within a window under the maximum,
    widened until it holds k of them."""
    top = float(logits.max())
    for window in TOP_K_WINDOWS:
        candidates = np.flatnonzero(logits >= top - window)
        if candidates.size >= k:
            break
    else:
        candidates = np.arange(logits.size)
    kth = np.partition(logits[candidates], -k)[-k]
    return candidates[logits[candidates] >= kth]


def _softmax(scaled: np.ndarray, inv_t: float) -> np.ndarray:
    """softmax(x / T), computed in place in ``scaled`` (float64)."""
    scaled *= inv_t
    scaled -= scaled.max()
    np.exp(scaled, out=scaled)
    scaled /= scaled.sum()
    return scaled


def _top_p(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Keep the smallest set of most likely tokens whose mass reaches ``top_p``.

    Sorting a 150k vocabulary costs ~10 ms. Any set {p >= tau} whose mass reaches ``top_p``
    holds the kept set (it is a prefix of the sorted order), and for small tau it is a few
    hundred tokens: sort those only, lowering tau until the mass is there (tau = 0 is all)."""
    for tau in TOP_P_THRESHOLDS:
        candidates = np.flatnonzero(probs >= tau)
        if probs[candidates].sum() >= top_p or tau == 0.0:
            break
    order = candidates[np.argsort(-probs[candidates], kind="stable")]
    cumulative = np.cumsum(probs[order])
    keep_n = min(int(np.searchsorted(cumulative, top_p)) + 1, order.size)
    kept = np.zeros_like(probs)
    kept[order[:keep_n]] = probs[order[:keep_n]]
    return kept


def sample(probs: np.ndarray, u: float) -> int:
    """The token id at ``u`` (uniform in [0, 1)) of the inverse CDF; never an id >= size or
    of probability 0.

    A cumulative sum over 150k ids is a sequential 0.5 ms loop: the block holding the draw is
    found from the blocks' sums, then the id inside that block only."""
    starts = np.arange(0, probs.size, SAMPLE_BLOCK)
    edges = np.concatenate(([0.0], np.cumsum(np.add.reduceat(probs, starts))))
    u = u * edges[-1]
    block = min(int(np.searchsorted(edges, u, side="right")) - 1, starts.size - 1)
    while edges[block + 1] <= edges[block]:
        block -= 1  # rounding landed u on an empty block: its left neighbour holds mass
    chunk = probs[starts[block] : starts[block] + SAMPLE_BLOCK]
    index = int(np.searchsorted(np.cumsum(chunk), u - edges[block], side="right"))
    if index >= chunk.size or chunk[index] <= 0.0:  # rounding at the block's end
        index = int(np.flatnonzero(chunk > 0.0)[-1])
    return int(starts[block]) + index


def draw_margin(probs: np.ndarray, u: float) -> tuple[float, int]:
    """How close the draw at ``u`` came to picking another token: the probability mass
    between the draw and the nearer edge of the drawn token's interval of the inverse CDF,
    and the token beyond that edge (the drawn token itself, with an infinite margin, when it
    is the only one). The sampled counterpart of a top-2 logit gap, for tie-aware checks: a
    batched pass that rounds the row differently moves the edges by about its rounding."""
    chosen = sample(probs, u)
    kept = np.flatnonzero(probs > 0.0)
    cdf = np.cumsum(probs[kept])
    at = u * cdf[-1]
    i = int(np.searchsorted(kept, chosen))
    below = at - cdf[i - 1] if i > 0 else np.inf
    above = cdf[i] - at if i + 1 < kept.size else np.inf
    if below == above == np.inf:
        return float("inf"), chosen
    if below <= above:
        return float(max(below, 0.0)), int(kept[i - 1])
    return float(max(above, 0.0)), int(kept[i + 1])


def accept_greedy(draft: Sequence[int], target_rows: Sequence[np.ndarray]) -> tuple[int, int]:
    """Return (number of drafted tokens accepted, the target's token that follows them).

    ``target_rows[i]`` are the target's logits after the context plus ``draft[:i]``; there are
    ``len(draft) + 1`` rows, read in order and only up to the first mismatch."""
    n = 0
    while n < len(draft) and draft[n] == int(target_rows[n].argmax()):
        n += 1
    return n, int(target_rows[n].argmax())


def accept_sampling(
    draft: Sequence[int],
    draft_probs: Sequence[np.ndarray] | None,
    target_rows: Sequence[np.ndarray],
    params: SamplingParams,
    draws: TokenDraws,
    position: int,
    odds: list[float] | None = None,
) -> tuple[int, int]:
    """Speculative sampling over one draft; same contract as ``accept_greedy``.

    ``draft_probs[i]`` is the drafter's processed distribution at position i (None: one-hot);
    ``position``: the output position of the draft's first token. ``odds``, when given,
    receives the chance each position reached had of being accepted (``acceptance_odds``)."""
    for i, token in enumerate(draft):
        p = probabilities(target_rows[i], params)
        at = position + i
        q = None if draft_probs is None else draft_probs[i]
        if odds is not None:
            odds.append(acceptance_odds(p, q, token))
        if q is None:  # one-hot q: the target's own draw decides
            chosen = sample(p, draws.uniform(at))
            if chosen == token:
                continue
            return i, chosen
        q_x = float(q[token])
        if q_x > 0.0 and draws.uniform(at, draws.ACCEPT) * q_x < p[token]:  # min(1, p/q)
            continue
        return i, sample(residual(p, q, token), draws.uniform(at, draws.RESIDUAL))
    end = position + len(draft)
    return len(draft), sample_row(target_rows[len(draft)], params, draws.uniform(end))[0]


def acceptance_odds(p: np.ndarray, q: np.ndarray | None, token: int) -> float:
    """The chance that a drafted position is accepted, over the drafter's draws:
    sum(min(p, q)) (one-hot q: p of the drafted token). The outcome of one verification is
    this chance's coin flip; the chance itself says as much with less noise, which matters
    to a controller judging drafts at temperature > 0 from a handful of rounds."""
    if q is None:
        return float(p[token])
    return float(np.minimum(p, q).sum())


def sample_row(row: np.ndarray, params: SamplingParams, u: float) -> tuple[int, np.ndarray]:
    """Sample the target's token from one logits row at ``u``; also return the processed
    distribution it was drawn from (the loop scores a shadow guess against it)."""
    p = probabilities(row, params)
    return sample(p, u), p


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


def token_logprobs(
    row: np.ndarray, token: int, n_top: int
) -> tuple[float, tuple[tuple[int, float], ...]]:
    """The log-probability of ``token`` under the model's own distribution for this row
    (softmax of the raw logits, as OpenAI and llama-server report it; sampling settings
    do not change it), and the ``n_top`` most likely tokens with theirs."""
    x = row.astype(np.float64)
    top = float(x.max())
    log_total = top + float(np.log(np.exp(x - top).sum()))
    best: tuple[tuple[int, float], ...] = ()
    if n_top > 0:
        n_top = min(n_top, x.size)
        idx = np.argpartition(-x, n_top - 1)[:n_top]
        idx = idx[np.argsort(-x[idx], kind="stable")]
        best = tuple((int(i), float(x[i] - log_total)) for i in idx)
    return float(x[token] - log_total), best
