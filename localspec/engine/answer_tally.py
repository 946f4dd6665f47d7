"""One answer's verified tokens, and how likely they make it that drafting pays.

The adaptive controller's per-position estimates decay and lean on a prior: right for
choosing a draft length round by round, too jumpy for a decision that cannot be taken back.
A draft model on a CPU cannot check once paused (it would first have to read the stretch it
skipped), so its pause ends drafting for the rest of the answer; on a compute-bound machine
such a drafter pays only above 90-95% acceptance per token, and one rejected draft after a
few right ones (nine of ten tokens kept) is as likely from a pair that agrees 98% of the time
as from one that agrees 85%. The tally answers the question that pause must ask: given every
token this answer verified or checked, how likely is it that the drafter's acceptance is one
at which drafting pays?
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

# Acceptance per token, on which the posterior is evaluated: fine enough to
# place break-even acceptances of 0.9-0.99 and cheap to weigh (the question is asked at a
# would-be pause, not every round).
GRID = np.linspace(0.0025, 0.9975, 200)


class AnswerTally:
    """Tokens kept out of tokens tried, this answer (at temperature > 0, a token counts its
    chance of acceptance, as the controller's estimates do). The prior is a Beta of
    ``prior_kept`` out of ``prior_tried``: the controller's optimistic start (a drafter the
    user chose is more often right than not, and right most of the time on code)."""

    def __init__(self, prior_kept: float, prior_tried: float) -> None:
        self.prior_kept, self.prior_missed = prior_kept, prior_tried - prior_kept
        self.kept = 0.0
        self.tried = 0.0

    def reset(self) -> None:
        self.kept = self.tried = 0.0

    def record(self, kept: float, tried: float) -> None:
        self.kept += kept
        self.tried += tried

    def chance(self, pays: Callable[[np.ndarray], np.ndarray]) -> float:
        """The posterior probability (the Beta prior, binomial evidence) that the acceptance
        per token is one where ``pays`` (vectorised over acceptances) holds."""
        kept = self.kept + self.prior_kept - 1
        missed = max(self.tried - self.kept, 0.0) + self.prior_missed - 1
        log_weight = kept * np.log(GRID) + missed * np.log1p(-GRID)
        weight = np.exp(log_weight - log_weight.max())
        return float(weight[pays(GRID)].sum() / weight.sum())
