"""Chained drafters (``--mode ngram-simple,draft-model``): the first that has a draft wins.

llama.cpp's precedence rule: the lookup drafter is asked first; only when it has nothing is
the neural drafter run. Each draft is tagged with the drafter that made it, so statistics
are kept per drafter as well as in total.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from localspec.drafters.base import Draft, Drafter


class ChainedDrafter:
    """``limits[i]``: the most tokens drafter i may draft per round (None: the loop's limit).
    A lookup draft is nearly free to make and long when it copies; a neural draft costs a
    forward pass per token, so the neural drafter gets its own, shorter cap."""

    def __init__(self, drafters: Sequence[Drafter], limits: Sequence[int | None]) -> None:
        self.drafters = list(drafters)
        self.limits = list(limits)
        self.name = ",".join(d.name for d in self.drafters)

    def begin(self, prompt: Sequence[int]) -> None:
        for drafter in self.drafters:
            drafter.begin(prompt)

    def propose(self, context: Sequence[int], n_max: int) -> Draft:
        for drafter, limit in zip(self.drafters, self.limits, strict=True):
            draft = drafter.propose(context, n_max if limit is None else min(n_max, limit))
            if draft.tokens:
                return replace(draft, source=drafter.name)
        return Draft()

    def accepted(self, n_accepted: int) -> None:
        # every drafter follows the accepted text, whoever drafted it
        for drafter in self.drafters:
            drafter.accepted(n_accepted)

    def close(self) -> None:
        for drafter in self.drafters:
            drafter.close()
