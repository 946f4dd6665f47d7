"""Chained drafters (``--mode ngram-simple+draft-model``): the first that has a draft wins.

llama.cpp's precedence rule: the lookup drafter is asked first; only when it has nothing is
the neural drafter run. Each draft is tagged with the drafter that made it, so statistics
are kept per drafter as well as in total.

Each drafter of a chain also has its own adaptive controller (``ChainController``): an
n-gram lookup that copies a file earns 48-token drafts while the neural drafter, between
two copies, may earn 3 or none, and one shared estimate would serve both badly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from localspec.engine.adaptive import AdaptiveController, FixedLengthController, ShadowCheck
from localspec.engine.drafting import Draft, Drafter


class ChainedDrafter:
    """``limits[i]``: the most tokens drafter i may draft this round (None: the loop's
    limit; 0: skip it). A ``ChainController`` rewrites them every round."""

    def __init__(self, drafters: Sequence[Drafter], limits: Sequence[int | None]) -> None:
        self.drafters = list(drafters)
        self.limits = list(limits)
        self.name = ",".join(d.name for d in self.drafters)
        self.catch_up_per_token: float | None = None  # each link's own: ChainController
        self.last_source: int | None = None  # index of the drafter of the last draft

    def begin(self, prompt: Sequence[int]) -> None:
        for drafter in self.drafters:
            drafter.begin(prompt)

    def propose(self, context: Sequence[int], n_max: int) -> Draft:
        self.last_source = None
        for i, (drafter, limit) in enumerate(zip(self.drafters, self.limits, strict=True)):
            n = n_max if limit is None else min(n_max, limit)
            if n <= 0:
                continue
            draft = drafter.propose(context, n)
            if draft.tokens:
                self.last_source = i
                return replace(draft, source=drafter.name)
        return Draft()

    def accepted(self, n_accepted: int) -> None:
        # every drafter follows the accepted text, whoever drafted it
        for drafter in self.drafters:
            drafter.accepted(n_accepted)

    def close(self) -> None:
        for drafter in self.drafters:
            drafter.close()


class ChainController:
    """The loop's controller for a chain: one ``AdaptiveController`` per drafter, each fed
    only the rounds its drafter drafted; the loop's draft length is the longest allowed."""

    def __init__(
        self, chain: ChainedDrafter, parts: Sequence[AdaptiveController | FixedLengthController]
    ) -> None:
        self.chain = chain
        self.parts = list(parts)
        self._shadow_source: int | None = None  # the drafter whose shadow round is followed
        self.start()

    def start(self) -> None:
        for part in self.parts:
            part.start()

    def note_catch_up(self, seconds_per_token: float | None) -> None:
        """Each drafter's own catch-up cost (the loop only sees the chain's)."""
        for part, drafter in zip(self.parts, self.chain.drafters, strict=True):
            part.note_catch_up(drafter.catch_up_per_token)

    def proposal_length(self) -> int:
        self.chain.limits = [part.proposal_length() for part in self.parts]
        return max(self.chain.limits)

    def fit(self, draft: Draft) -> int:
        """The drafter that made the draft decides how much of it is verified."""
        source = self.chain.last_source
        return 0 if source is None else self.parts[source].fit(draft)

    def shadow_length(self) -> int:
        """Shadow checks go to the drafters whose controllers want one (each with its own
        guess length): the first of them with a guess makes it, as for a real draft."""
        self.chain.limits = [part.shadow_length() for part in self.parts]
        return max(self.chain.limits)

    def observe_shadow(self, check: ShadowCheck) -> None:
        """Position 0 goes to the drafter that guessed (the others asked are told they had
        no guess); the rest of its shadow round goes to it too."""
        if check.position > 0:
            if self._shadow_source is not None:
                self.parts[self._shadow_source].observe_shadow(check)
            return
        self._shadow_source = source = self.chain.last_source
        for i, (part, limit) in enumerate(zip(self.parts, self.chain.limits, strict=True)):
            if i == source:
                part.observe_shadow(check)
            elif limit:  # asked, but had no guess
                part.observe_shadow(ShadowCheck(None))

    @property
    def shadow_checks(self) -> int:
        return sum(part.shadow_checks for part in self.parts)

    def observe(self, n_drafted: int, n_accepted: int, draft_s: float, verify_s: float) -> None:
        source = self.chain.last_source
        if n_drafted and source is not None:
            self.parts[source].observe(n_drafted, n_accepted, draft_s, verify_s)
            return
        for part in self.parts:  # a plain round for each (a paused one counts it too)
            part.observe(0, 0, draft_s, verify_s)

    @property
    def draft_length(self) -> int:
        return max(part.draft_length for part in self.parts)

    @property
    def paused(self) -> bool:
        return all(part.paused for part in self.parts)

    @property
    def pauses(self) -> int:
        return sum(part.pauses for part in self.parts)
