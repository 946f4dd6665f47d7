"""Lookups that rest while a wide step cuts their drafts.

In a step shared by several generations the draft budget (``budget.py``) keeps only the
drafts that pay for the whole step; on a batch already as wide as pays it keeps none, step
after step. Each generation's lookup and the budget's pricing of what it found then cost a
few milliseconds a step for nothing (docs/benchmarks.md: about 3% of an 8-client step on a
2-core CPU, load-aware speculation under plain batching). Once every draft of UNPAID_STEPS
shared steps in a row was cut, the free drafters are not asked for REST_STEPS steps (a
paused controller's checks go on); then the budget prices their drafts again. A step of
another width ends the rest: the load changed.
"""

from __future__ import annotations

from dataclasses import dataclass

UNPAID_STEPS = 4  # shared steps in a row whose wanted drafts were all cut
REST_STEPS = 8  # steps the lookups then rest: a copy that starts meanwhile waits as long


@dataclass
class LookupRest:
    unpaid: int = 0  # shared steps in a row that wanted drafts and verified none
    left: int = 0  # steps of rest left
    width: int = 0  # generations answering in the last step

    def resting(self, width: int) -> bool:
        """Whether this step's free drafters rest (``width``: the generations answering)."""
        if width != self.width or width < 2:
            self.width, self.unpaid, self.left = width, 0, 0
            return False
        if self.left:
            self.left -= 1
            return True
        return False

    def note(self, wanted: int, verified: int) -> None:
        """A shared step's draft tokens: those its generations wanted, those it verified."""
        if verified:
            self.unpaid = 0
        elif wanted:
            self.unpaid += 1
            if self.unpaid >= UNPAID_STEPS:
                self.unpaid, self.left = 0, REST_STEPS
