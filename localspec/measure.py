"""Speedups that hold on a busy machine: how probe and bench turn noisy timings into figures
a user can trust, and say when they cannot.

A desktop always has other work running, and on a small CPU another busy process moves
decoding speed by 2-10x within seconds. So:

- every speculative run is sandwiched between plain runs of the same prompt (P S P S P ...),
  and its speedup is taken against the mean of its two neighbours (a *pair*); a pair whose
  two plain runs differ by more than ``PLAIN_DRIFT`` saw the machine change under it and is
  set aside;
- a cell (one configuration on one prompt) is measured until a majority of at least
  ``MIN_PAIRS`` ratios agree within ``TIGHT_SPREAD`` (a busy spell slows single runs, so
  the agreeing majority is the figure, its median, reported with the min-max spread of all
  steady pairs), or until one steady pair agrees that closely with the prediction (an
  independent estimate that does not depend on the clock), or the budget runs out;
- a figure no drafting could reach (above the ceiling of this machine's measured cost
  curve), plain speeds that moved in every pair, repeats with no agreeing majority, or a
  figure more than ``DISAGREEMENT`` from the prediction mark the cell *noisy*: it is shown
  as such, ranked after every trusted cell, by its prediction (never by its noisy
  measurement), and ``--mode auto`` will not use it;
- a *predicted* speedup, from what does not depend on the wall clock (acceptance, the draft
  lengths used, the calibrated cost curves), is shown beside the measured one, and a noisy
  cell is ranked by it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from localspec.engine.costs import VerifyCost
from localspec.engine.stats import Stats
from localspec.modes import LOOKUP_MODES, parse_mode

PLAIN_DRIFT = 0.15  # plain tok/s before vs after a speculative run: beyond this, the pair is void
MIN_PAIRS = 2
TIGHT_SPREAD = 0.10  # ratios within this of one another agree
CEILING_SLACK = 1.10  # the ceiling itself is measured: allow it this much
# a lookup mode that drafted nothing, measured further than this from 1.0x: the machine drifted
UNDRAFTED_TOLERANCE = 0.05
# measured vs predicted, relative: beyond this the cell is re-measured, and noisy if it stays
# so (predictions were within 2-8% of quiet measurements on this CPU, see docs/benchmarks)
DISAGREEMENT = 0.25


@dataclass(frozen=True)
class Pair:
    """One speculative run and the plain runs on either side of it (tokens per second)."""

    plain_before: float
    speculative: float
    plain_after: float

    @property
    def plain(self) -> float:
        return (self.plain_before + self.plain_after) / 2

    @property
    def ratio(self) -> float:
        return self.speculative / self.plain if self.plain > 0 else 0.0

    @property
    def drift(self) -> float:
        """How much plain decoding moved within the pair, relative to its mean."""
        return abs(self.plain_before - self.plain_after) / self.plain if self.plain > 0 else 1.0


@dataclass(frozen=True)
class Verdict:
    """What a cell's pairs say: the figure, its spread, and whether it can be trusted."""

    measured: float  # median ratio of the steady pairs (all pairs if none was steady)
    low: float
    high: float
    predicted: float | None
    n_pairs: int
    reasons: tuple[str, ...] = ()  # why the cell is noisy (empty: trustworthy)

    @property
    def noisy(self) -> bool:
        return bool(self.reasons)

    @property
    def best(self) -> float:
        """The figure to rank by: the measurement when it can be trusted, else the
        prediction (when there is one)."""
        if self.noisy and self.predicted is not None:
            return self.predicted
        return self.measured

    def to_dict(self) -> dict[str, object]:
        return {
            "speedup": round(self.best, 3),
            "measured": round(self.measured, 3),
            "spread": [round(self.low, 3), round(self.high, 3)],
            "predicted": None if self.predicted is None else round(self.predicted, 3),
            "pairs": self.n_pairs,
            "noisy": self.noisy,
            "noise": list(self.reasons),
        }


def steady(pairs: Sequence[Pair]) -> list[Pair]:
    return [p for p in pairs if p.drift <= PLAIN_DRIFT]


def spread(ratios: Sequence[float]) -> float:
    return max(ratios) / min(ratios) - 1 if ratios and min(ratios) > 0 else float("inf")


def consensus(ratios: Sequence[float]) -> list[float]:
    """The largest group of ratios within TIGHT_SPREAD of one another's median: a busy spell
    slows one run, and its ratio falls outside the group instead of moving the figure."""
    best: list[float] = []
    for centre in ratios:
        group = [r for r in ratios if abs(r / centre - 1) <= TIGHT_SPREAD]
        if len(group) > len(best):
            best = group
    return best


def _agreed(ratios: Sequence[float]) -> list[float] | None:
    """The consensus when it holds at least MIN_PAIRS and more than half the ratios."""
    group = consensus(ratios)
    return group if len(group) >= MIN_PAIRS and 2 * len(group) > len(ratios) else None


def needs_more(pairs: Sequence[Pair], max_pairs: int, predicted: float | None = None) -> bool:
    """Whether another pair would make the cell's figure more trustworthy: no clear majority
    of agreeing steady pairs yet, or a figure far from the prediction (a busy spell that hit
    only the speculative runs leaves the plain runs steady)."""
    if len(pairs) >= max_pairs:
        return False
    ratios = [p.ratio for p in steady(pairs)]
    if (
        len(ratios) == 1
        and predicted is not None
        and abs(ratios[0] / predicted - 1) <= TIGHT_SPREAD
    ):
        return False  # one steady pair, confirmed by the clock-free prediction
    agreed = _agreed(ratios)
    if agreed is None:
        return True
    far = predicted is not None and abs(statistics.median(agreed) / predicted - 1) > DISAGREEMENT
    return far


def judge(pairs: Sequence[Pair], ceiling: float, predicted: float | None) -> Verdict:
    kept = steady(pairs) or list(pairs)
    ratios = [p.ratio for p in kept]
    agreed = _agreed(ratios)
    measured = statistics.median(agreed or ratios)
    reasons = []
    if not steady(pairs):
        worst = max(p.drift for p in pairs)
        reasons.append(f"plain decoding moved {100 * worst:.0f}% within every pair")
    if measured > ceiling * CEILING_SLACK:
        reasons.append(f"measured above this machine's {ceiling:.2f}x ceiling")
    if agreed is None and len(ratios) > 1:
        reasons.append(f"repeats disagree (spread {100 * spread(ratios):.0f}%)")
    if predicted is not None and abs(measured / predicted - 1) > DISAGREEMENT:
        # consistent runs that disagree with the prediction: the machine's speed changed
        # since the costs were calibrated (a burstable VM does), so no figure of this cell
        # compares with the others'
        reasons.append(f"measured {measured:.2f}x, far from the predicted {predicted:.2f}x")
    return Verdict(measured, min(ratios), max(ratios), predicted, len(pairs), tuple(reasons))


def unearned(measured: float, any_accepted: bool) -> str | None:
    """Why a speedup over plain decoding is noise when no drafted token was accepted (every
    token then costs at least a plain step): None when it is not."""
    if not any_accepted and measured > CEILING_SLACK:
        return f"measured {measured:.2f}x with no drafted token accepted"
    return None


def undrafted(measured: float, mode: str, any_drafted: bool) -> str | None:
    """Why a figure is noise when a lookup mode drafted nothing: it ran plain decoding's
    steps (a lookup costs microseconds), so a figure away from 1.0x is the machine's drift,
    not the mode's cost. None when it is not."""
    lookups = all(m in LOOKUP_MODES for m in parse_mode(mode))
    if lookups and not any_drafted and abs(measured - 1) > UNDRAFTED_TOLERANCE:
        return f"nothing drafted (plain decoding's steps) yet {measured:.2f}x"
    return None


def shown(measured: float, low: float, high: float, noisy: bool, ceiling: float) -> str:
    """A measured figure as printed: a number no drafting could reach is not printed."""
    if measured > ceiling * CEILING_SLACK:
        return f"noisy (above the {ceiling:.2f}x ceiling)"
    text = f"{measured:.2f}x"
    if high > low:
        text += f" ({low:.2f}-{high:.2f})"
    return text + (" noisy" if noisy else "")


# ----- the prediction ---------------------------------------------------------------------


def target_seconds(stats: Stats, cost: VerifyCost) -> float:
    """What the target's passes of this generation cost on the calibrated curve: one pass
    per round, of 1 + the tokens drafted that round (recovered from ``drafted_at``: the
    rounds that drafted at least i + 1 tokens)."""
    at = [*stats.drafted_at, 0]
    exactly = [at[k] - at[k + 1] for k in range(len(stats.drafted_at))]  # drafted k + 1
    counts = [stats.rounds - stats.verifications, *exactly]  # batches of 1, 2, 3 ...
    return float(np.dot(counts, cost(np.arange(1, len(counts) + 1))))


def predicted_speedup(stats: Stats, cost: VerifyCost, draft_step_s: float) -> float | None:
    """Plain decoding's cost for the same tokens over speculation's: the target's passes on
    the cost curve, plus, for a neural drafter, one draft step per drafted token and one
    per verification (the draft catching up with the accepted tokens)."""
    if stats.n_tokens < 2 or stats.rounds == 0:
        return None
    # the first token comes from the prompt's pass in both: plain decoding then takes a
    # one-token step for each of the others
    plain = (stats.n_tokens - 1) * float(cost(np.array([1]))[0])
    draft = draft_step_s * (stats.drafted + stats.verifications)
    return plain / (target_seconds(stats, cost) + draft)


def draft_step_for(mode: str, stats: Stats, calibrated: float | None) -> float:
    """Seconds per draft step: nothing for a lookup, the calibrated step of a draft model,
    else what the run itself measured."""
    if all(part in LOOKUP_MODES for part in parse_mode(mode)):
        return 0.0
    if calibrated is not None:
        return calibrated
    steps = stats.drafted + stats.verifications
    return stats.draft_ms / 1000 / steps if steps else 0.0


# ----- the time budget --------------------------------------------------------------------


class Budget:
    """Extra pairs are spent while the time used stays within the share of ``seconds`` due
    to the cells done so far (the first MIN_PAIRS of every cell are always measured)."""

    def __init__(self, seconds: float, n_cells: int) -> None:
        self.seconds, self.n_cells = seconds, max(1, n_cells)
        self.start = time.monotonic()
        self.cells_done = 0

    def allows_more(self) -> bool:
        due = self.seconds * (self.cells_done + 1) / self.n_cells
        return time.monotonic() - self.start < due

    def cell_done(self) -> None:
        self.cells_done += 1

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.start
