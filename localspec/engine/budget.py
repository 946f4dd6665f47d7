"""How many tokens each active generation drafts in a step where all of them are verified in
one batch: the load-aware draft budget.

A step decodes ``base_rows`` (one row per generation, plus any prompt chunk) and every
drafted token. Generation i emits ``1 + E_i(k_i)`` tokens, where ``E_i(k)`` is the number of
drafted tokens it expects accepted out of k (from its per-position acceptance estimates),
and the step takes ``cost(base_rows + sum k) + sum d_i k_i`` seconds (the calibrated batch
cost curve, and each drafter's own time per token). The budget maximises tokens per second
of the whole step: draft tokens go where they add the most, and none are given once the
next would not pay. With one generation this is the adaptive controller's choice of length
(``AdaptiveController._best_length``); with many on a compute-bound machine, the batch is
already as wide as pays and the budget is usually zero: plain batched decoding.

Pure numpy: no llama.cpp, so it is tested on hand-built cost curves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from localspec.engine.adaptive import MARGIN

# a generation that did not draft last step starts only past the gain a lone generation's
# controller asks of a draft length (and keeps drafting while it gains at all: hysteresis)
ADD_MARGIN = MARGIN


@dataclass(frozen=True)
class DraftDemand:
    """One generation's case for draft tokens this step. ``acceptance[j]``: the chance that
    drafted token j+1 is accepted given the ones before it were; ``cap``: the most it may
    draft now (its drafter's and controller's limits, the room left in its context);
    ``seconds_per_token``: what drafting one token costs it (0 for lookups); ``drafting``:
    whether it drafted last step (hysteresis); ``pinned``: a fixed length (a request with
    adaptive drafting off, or plain decoding: 0)."""

    acceptance: np.ndarray
    cap: int
    seconds_per_token: float = 0.0
    drafting: bool = False
    pinned: int | None = None
    n_min: int = 1

    def expected_tokens(self) -> np.ndarray:
        """Tokens emitted for each draft length k = 0..cap: the target's own plus the
        drafted ones expected to be accepted."""
        odds = np.zeros(self.cap)  # positions without an estimate: no chance counted
        given = np.asarray(self.acceptance, dtype=float)[: self.cap]
        odds[: given.size] = given
        kept = np.cumprod(odds)
        return 1.0 + np.concatenate([[0.0], np.cumsum(kept)])


def allocate(
    demands: Sequence[DraftDemand],
    base_rows: int,
    cost: Callable[[np.ndarray], np.ndarray],
    max_rows: int | None = None,
    add_margin: float = ADD_MARGIN,
    step_margin: float = 0.0,
    step_seconds: Callable[[Sequence[int]], float] | None = None,
    draft_seconds: Callable[[Sequence[int]], float] | None = None,
) -> list[int]:
    """Draft lengths, one per demand, that maximise the step's predicted tokens per second.

    Every token a generation could draft has a chance of being accepted (the product of the
    acceptances up to it, falling along a draft). The candidate tokens of all generations are
    ranked by that chance per second they add (their drafter's time, and a row's share of the
    batch), and the step's throughput is predicted for every prefix of that ranking: a whole
    prefix, not token by token, because the cost curve is a staircase on a CPU (one token more
    can cost a step while the next three cost nothing). The best prefix wins; a generation
    that was not drafting joins it only if it adds ``add_margin`` to the throughput, and a step
    drafts at all only if it is predicted ``step_margin`` faster than without its drafts.

    ``step_seconds(lengths)``: what the step costs with those draft lengths, where that is
    not the curve at the total row count (llama.cpp running a step as several passes). Such
    a step is cheapest with drafts of equal lengths, which a ranking of single tokens may
    step over: every common length is tried too. ``draft_seconds(lengths)``: what drafting
    those lengths costs, where the drafters' per-token seconds do not add up (one draft
    model drafting for several generations in one batch per position)."""
    lengths = [d.pinned if d.pinned is not None else 0 for d in demands]
    free = [i for i, d in enumerate(demands) if d.pinned is None]
    room = max(0, max_rows - base_rows - sum(lengths)) if max_rows is not None else None
    predict = _Throughput(demands, base_rows, cost, step_seconds, draft_seconds)
    best, best_speed = list(lengths), predict(lengths)
    plain = (predict.tokens(lengths), best_speed * (1 + step_margin))
    rows = base_rows + sum(lengths)
    if not _may_pay(demands, free, rows, cost, room, *plain):
        return best
    ranking = _ranked_tokens(demands, free, rows, cost, room)
    ceiling = _Ceiling(cost, rows, sum(demands[i].cap for i in free) + 1)

    def consider(trial: list[int]) -> None:
        nonlocal best, best_speed
        if room is not None and sum(trial[i] for i in free) > room:
            return
        if all(trial[i] == 0 or trial[i] >= demands[i].n_min for i in free):
            speed = predict(trial)
            if speed > best_speed:
                best, best_speed = list(trial), speed

    # each trial is priced only while it or a later one could beat the best so far: its
    # tokens over the cheapest one pass of its rows (``_Ceiling``)
    tokens = plain[0] + np.cumsum([chance for _, chance in ranking])
    reach = ceiling.reach(tokens, rows + 1 + np.arange(len(ranking)))
    trial = list(lengths)
    for (slot, _), could in zip(ranking, reach, strict=True):
        if could < best_speed:
            break
        trial[slot] += 1
        consider(trial)
    if step_seconds is not None:
        levels = [  # every free generation drafting the same length (or its cap)
            [
                k if d.pinned is not None else min(d.cap, level)
                for k, d in zip(lengths, demands, strict=True)
            ]
            for level in range(1, max((demands[i].cap for i in free), default=0) + 1)
        ]
        reach = ceiling.reach(
            np.array([predict.tokens(t) for t in levels]),
            np.array([sum(t) for t in levels]) + base_rows,
        )
        for trial, could in zip(levels, reach, strict=True):
            if could < best_speed:
                break
            consider(trial)
    for i in free:  # hysteresis: a generation starts drafting only for a clear gain
        if best[i] and not demands[i].drafting:
            without = [*best[:i], 0, *best[i + 1 :]]
            if best_speed <= predict(without) * (1 + add_margin):
                best = without
                best_speed = predict(best)
    # hysteresis may take a generation's drafts out of a prefix that only paid with them (a
    # staircase curve): the step is then checked against plain batching once more
    if best != lengths and best_speed < predict(lengths) * (1 + step_margin):
        return list(lengths)
    return best


def predicted_gain(
    demands: Sequence[DraftDemand],
    base_rows: int,
    cost: Callable[[np.ndarray], np.ndarray],
    lengths: Sequence[int],
    step_seconds: Callable[[Sequence[int]], float] | None = None,
    draft_seconds: Callable[[Sequence[int]], float] | None = None,
) -> float:
    """How many times the tokens per second of plain batched decoding a step with these
    draft lengths is predicted to give (``allocate``'s arithmetic)."""
    predict = _Throughput(demands, base_rows, cost, step_seconds, draft_seconds)
    plain = predict([0] * len(demands))
    return predict(lengths) / plain if plain > 0 else 1.0


class _Throughput:
    """Predicted tokens per second of a step with the given draft lengths."""

    def __init__(
        self,
        demands: Sequence[DraftDemand],
        base_rows: int,
        cost: Callable[[np.ndarray], np.ndarray],
        step_seconds: Callable[[Sequence[int]], float] | None = None,
        draft_seconds: Callable[[Sequence[int]], float] | None = None,
    ) -> None:
        self.expected = [d.expected_tokens() for d in demands]
        self.draft_seconds = draft_seconds
        self.per_token = np.array([d.seconds_per_token for d in demands])
        self.base_rows = base_rows
        self.step_seconds = step_seconds
        # the curve at every row count a step can reach, once: it is asked for each prefix
        most = base_rows + sum(max(d.cap, d.pinned or 0) for d in demands)
        self.by_rows = cost(np.arange(most + 1)).tolist() if step_seconds is None else []

    def tokens(self, lengths: Sequence[int]) -> float:
        return sum(float(e[k]) for e, k in zip(self.expected, lengths, strict=True))

    def __call__(self, lengths: Sequence[int]) -> float:
        tokens = self.tokens(lengths)
        if self.step_seconds is not None:
            step = self.step_seconds(lengths)
        else:
            step = self.by_rows[self.base_rows + sum(lengths)]
        if self.draft_seconds is not None:
            return tokens / (step + self.draft_seconds(lengths))
        return tokens / (step + float(self.per_token @ lengths))


def _may_pay(
    demands: Sequence[DraftDemand],
    free: Sequence[int],
    rows: int,
    cost: Callable[[np.ndarray], np.ndarray],
    room: int | None,
    plain_tokens: float,
    to_beat: float,
) -> bool:
    """Whether any drafts could make the step emit ``to_beat`` tokens a second or more
    (``plain_tokens`` without them), by a bound that prices no step: D drafted tokens add at
    most the D best chances of acceptance, and cost at least what the curve asks for the
    rows (a step run as several passes, or padded, costs more; drafting costs more still).
    With many generations and drafts of little promise, the step is then plain without the
    hundreds of trial steps the ranking would price."""
    chances = [_chances(demands[i]) for i in free]
    best = -np.sort(-np.concatenate(chances)) if chances else np.zeros(0)
    best = best[:room] if room is not None else best
    if not best.size:
        return False
    first = rows + 1
    reach = _Ceiling(cost, first, best.size - 1).reach(
        plain_tokens + np.cumsum(best), first + np.arange(best.size)
    )
    return float(reach[0]) >= to_beat


def _chances(demand: DraftDemand) -> np.ndarray:
    """The chance that each token of a whole draft is accepted (every one before it was)."""
    return np.cumprod(np.asarray(demand.acceptance, dtype=float)[: demand.cap])


class _Ceiling:
    """The most tokens per second a step of at least so many rows can give: what it emits
    over the cheapest one pass of that many rows or more (a step run as several passes, or
    padded, costs more, and drafting more still)."""

    def __init__(self, cost: Callable[[np.ndarray], np.ndarray], rows: int, most: int) -> None:
        curve = np.asarray(cost(np.arange(rows, rows + most + 1)), dtype=float)
        self.cheapest = np.minimum.accumulate(curve[::-1])[::-1]  # a noisy curve: not monotone
        self.rows = rows

    def reach(self, tokens: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """For trials in order (their expected tokens and rows): the most tokens per second
        that trial or any after it could give."""
        at = np.clip(rows - self.rows, 0, self.cheapest.size - 1)
        # a hair above: the bound can be the very speed a trial is priced at (a flat stretch
        # of the curve), summed in another order
        speeds = tokens / np.maximum(self.cheapest[at], 1e-12) * (1 + 1e-9)
        return np.maximum.accumulate(speeds[::-1])[::-1]


def _ranked_tokens(
    demands: Sequence[DraftDemand],
    free: Sequence[int],
    rows: int,
    cost: Callable[[np.ndarray], np.ndarray],
    room: int | None,
) -> list[tuple[int, float]]:
    """The candidate draft tokens, best first, as (generation, chance of acceptance): by
    that chance per second the token adds (its drafter's, and a batch row's average share
    over the rows the step could hold)."""
    width = max(1, sum(demands[i].cap for i in free) if room is None else room)
    span = np.array([rows, rows + width])
    row_s = max(float(np.diff(cost(span))[0]) / width, 1e-12)
    candidates = []
    for i in free:
        per_s = row_s + demands[i].seconds_per_token
        candidates += [(-c / per_s, i, j, c) for j, c in enumerate(_chances(demands[i]))]
    candidates.sort()
    return [(i, float(c)) for _, i, _, c in candidates[:room]]
