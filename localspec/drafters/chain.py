"""Chained drafters (``--mode ngram-simple+draft-model``): the first that has a draft wins.

llama.cpp's precedence rule: the lookup drafter is asked first; only when it has nothing is
the neural drafter run. One refinement: a draft its own controller would not verify (a weak
match while that drafter is paused) does not take the round from the drafters after it, so a
remembered phrase the memory is unsure of does not hide the copy ngram-simple found in the
prompt. Each draft is tagged with the drafter that made it, so statistics are kept per
drafter as well as in total.

Each drafter of a chain also has its own adaptive controller (``ChainController``): an
n-gram lookup that copies a file earns 48-token drafts while the neural drafter, between
two copies, may earn 3 or none, and one shared estimate would serve both badly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace

import numpy as np

from localspec.engine.adaptive import AdaptiveController, FixedLengthController, ShadowCheck
from localspec.engine.drafting import Draft, Drafter
from localspec.modes import LOOKUP_MODES


class ChainedDrafter:
    """``limits[i]``: the most tokens drafter i may draft this round (None: the loop's
    limit; 0: skip it). A ``ChainController`` rewrites them every round, and sets ``judge``
    (how many tokens of drafter i's draft would be verified) while a round's draft, not a
    shadow guess, is asked for."""

    def __init__(self, drafters: Sequence[Drafter], limits: Sequence[int | None]) -> None:
        self.drafters = list(drafters)
        self.limits = list(limits)
        self.name = ",".join(d.name for d in self.drafters)
        self.catch_up_per_token: float | None = None  # each link's own: ChainController
        self.last_source: int | None = None  # index of the drafter of the last draft
        self.judge: Callable[[int, Draft], int] | None = None

    def begin(self, prompt: Sequence[int]) -> None:
        for drafter in self.drafters:
            drafter.begin(prompt)

    def propose(self, context: Sequence[int], n_max: int) -> Draft:
        """The first draft the judge would verify some of; if none, the first draft (its
        controller then checks it, as a shadow guess). Without a judge, a shadow guess."""
        self.last_source = None
        if self.judge is None:
            return self._shadow_guess(context, n_max)
        first: tuple[int, Draft] | None = None
        for i, draft in self._drafts(context, n_max):
            if self.judge(i, draft) > 0:
                self.last_source = i
                return draft
            first = first or (i, draft)
        return self._chosen(first)

    def _shadow_guess(self, context: Sequence[int], n_max: int) -> Draft:
        """The lookup draft on the longest key (the first on a tie): a memory that matches
        four tokens of nearly any context must not keep the prompt lookup's longer matches
        from ever being checked. Once a lookup's guess is in hand, a neural drafter is not
        asked (its guess would cost a draft step)."""
        chosen: tuple[int, Draft] | None = None

        def worth_asking(i: int) -> bool:
            return chosen is None or self.drafters[i].name in LOOKUP_MODES

        for i, draft in self._drafts(context, n_max, worth_asking):
            if chosen is None or draft.match > chosen[1].match:
                chosen = (i, draft)
        return self._chosen(chosen)

    def _drafts(
        self,
        context: Sequence[int],
        n_max: int,
        worth_asking: Callable[[int], bool] = lambda i: True,
    ) -> Iterator[tuple[int, Draft]]:
        """Each asked drafter's non-empty draft in chain order, tagged with its drafter."""
        for i, (drafter, limit) in enumerate(zip(self.drafters, self.limits, strict=True)):
            n = n_max if limit is None else min(n_max, limit)
            if n <= 0 or not worth_asking(i):
                continue
            draft = drafter.propose(context, n)
            if draft.tokens:
                yield i, replace(draft, source=drafter.name)

    def _chosen(self, chosen: tuple[int, Draft] | None) -> Draft:
        if chosen is None:
            return Draft()
        self.last_source = chosen[0]
        return chosen[1]

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
        self._fitted: dict[int, int] = {}  # this round's judgements: drafter -> length
        self.start()

    def start(self) -> None:
        for part in self.parts:
            part.start()

    def note_catch_up(self, seconds_per_token: float | None) -> None:
        """Each drafter's own catch-up cost (the loop only sees the chain's)."""
        for part, drafter in zip(self.parts, self.chain.drafters, strict=True):
            part.note_catch_up(drafter.catch_up_per_token)

    def note_prompt_read(self, seconds: float) -> None:
        """The chain reads prompts for every drafter: none sits an answer out alone."""

    sits_out = False

    def catch_up_pays(
        self, behind: int, left: int | None, saved_per_token: float | None = None
    ) -> bool:
        return True

    def proposal_length(self) -> int:
        # a probing draft model leaves no round to shadow checks, the only way a lookup's
        # controller learns that its drafts cost nothing (and is then asked for them)
        timed = all(part.timed for part in self.parts)
        for part in self.parts:
            part.may_probe = timed
        self.chain.limits = [part.proposal_length() for part in self.parts]
        self.chain.judge = self._judge
        self._fitted = {}
        return max(self.chain.limits)

    def _judge(self, source: int, draft: Draft) -> int:
        """Asked by the chain for each draft in turn: the drafter's own controller decides
        (once per round: its decision is remembered for ``fit``)."""
        self._fitted[source] = self.parts[source].fit(draft)
        return self._fitted[source]

    def fit(self, draft: Draft) -> int:
        """The drafter that made the draft decides how much of it is verified."""
        source = self.chain.last_source
        if source is None:
            return 0
        if source in self._fitted:
            return self._fitted[source]
        return self.parts[source].fit(draft)

    def verification_odds(self, draft: Draft) -> np.ndarray | None:
        """The estimates of the controller of the drafter that made ``draft``."""
        source = self.chain.last_source
        return None if source is None else self.parts[source].verification_odds(draft)

    def paid_draft(self) -> tuple[np.ndarray, float] | None:
        """None: a chain's draft is judged once made (its first drafter, a lookup, costs
        nothing; which drafter drafts is known only then)."""
        return None

    def note_draft_time(self, n_drafted: int, seconds: float) -> None:
        """To the controller of the drafter that made the draft."""
        source = self.chain.last_source
        if source is not None:
            self.parts[source].note_draft_time(n_drafted, seconds)

    def shadow_length(self) -> int:
        """Shadow checks go to the drafters whose controllers want one (each with its own
        guess length): the first of them with a guess makes it, as for a real draft."""
        self.chain.limits = [part.shadow_length() for part in self.parts]
        self.chain.judge = None  # a guess is only scored: no controller is asked to fit it
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

    def observe(
        self,
        n_drafted: int,
        n_accepted: int,
        draft_s: float,
        verify_s: float,
        odds: Sequence[float] | None = None,
        beyond: float | None = None,
    ) -> None:
        source = self.chain.last_source
        if n_drafted and source is not None:
            self.parts[source].observe(n_drafted, n_accepted, draft_s, verify_s, odds, beyond)
            return
        for part in self.parts:  # a plain round for each (a paused one counts it too)
            part.observe(0, 0, draft_s, verify_s)

    @property
    def draft_length(self) -> int:
        return max(part.draft_length for part in self.parts)

    @property
    def probing(self) -> bool:
        """A chain's probes are not turned into checks when a shared step cuts them (its
        guesses go to the link that asked): a cut probe only counts towards the opening."""
        return False

    @property
    def paused(self) -> bool:
        return all(part.paused for part in self.parts)

    @property
    def pauses(self) -> int:
        return sum(part.pauses for part in self.parts)
