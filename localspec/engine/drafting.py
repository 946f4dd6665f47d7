"""The Drafter protocol, the one interface every drafting mode implements, and the Draft it
returns. It lives with the loop that consumes it; the drafters (``localspec/drafters/``)
implement it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class Draft:
    """Proposed tokens, and the drafter's processed distribution for each (None: one-hot).

    Deterministic drafters (n-gram lookup, greedy drafting) give no probabilities: the
    verifier then treats q as one-hot, where rejection sampling and "sample and compare"
    are the same rule."""

    tokens: list[int] = field(default_factory=list)
    probs: list[np.ndarray] | None = None
    source: str = ""  # which drafter of a chain made it ("": the drafter itself)
    # how many tokens of the context a lookup matched before the draft (0: not a lookup's):
    # the evidence a draft carries before any of it is verified
    match: int = 0

    def __len__(self) -> int:
        return len(self.tokens)

    def truncated(self, n: int) -> Draft:
        probs = self.probs[:n] if self.probs is not None else None
        return replace(self, tokens=self.tokens[:n], probs=probs)


class Drafter(Protocol):
    name: str
    # seconds per token this drafter pays to catch up with a stretch it did not follow
    # (a draft model decodes it; measured in ``begin``); None: nothing to catch up
    catch_up_per_token: float | None

    def begin(self, prompt: Sequence[int]) -> None:
        """A generation starts: process the prompt now (timed as prompt processing, so the
        per-round draft cost the adaptive controller sees is the cost of drafting)."""
        ...

    def propose(self, context: Sequence[int], n_max: int) -> Draft:
        """Draft up to ``n_max`` tokens that follow ``context`` (prompt + emitted tokens)."""
        ...

    def accepted(self, n_accepted: int) -> None:
        """The target kept ``n_accepted`` tokens of the last draft; sync internal state."""
        ...

    def close(self) -> None: ...
