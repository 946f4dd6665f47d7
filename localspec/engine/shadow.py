"""Shadow rounds: how a paused drafter keeps being judged without verify batches.

While the adaptive controller has paused speculation, each plain round may carry a *check*:
the drafter guesses, the target decodes plainly as it would anyway, and the guess is scored
against the token the target chose. A guess of several one-hot tokens (a lookup's, which
costs nothing) is followed over the next plain rounds, one position per round, while the
target keeps choosing the guessed token: a *shadow round*. For a one-hot draft this is
verification simulated exactly (plain decoding takes guessed token i with the probability
p_i(x_i) that verification would accept it; greedy: when it is the argmax), so the
controller learns every position's acceptance before it risks a batch. What the scores lead
to (resume, keep checking, give up) is the controller's business (``adaptive.py``); which
drafter of a chain a check belongs to, the chain controller's (``drafters/chain.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from localspec.engine.adaptive import ShadowCheck
from localspec.engine.drafting import Draft, Drafter


class ShadowControl(Protocol):
    paused: bool

    def shadow_length(self) -> int: ...
    def observe_shadow(self, check: ShadowCheck) -> None: ...


class ShadowRounds:
    def __init__(self, drafter: Drafter, control: ShadowControl) -> None:
        self.drafter = drafter
        self.control = control
        self._following: tuple[Draft, int] | None = None  # the guess, the position checked next

    def stop(self) -> None:
        """Speculation drafts again: the shadow round being followed is over."""
        self._following = None

    def check(self, context: Sequence[int], n: int | None = None) -> tuple[Draft, int] | None:
        """What this plain round checks: the next position of the shadow round being
        followed, or a new guess when the controller asks for one. Only one-hot guesses are
        followed past their first token: plain sampling then takes the guessed path exactly
        as often as verification would accept it."""
        if self._following is not None and self.control.paused:
            return self._following
        n = self.control.shadow_length() if n is None else n
        if n == 0:
            return None
        guess = self.drafter.propose(context, n)
        if guess.probs is not None:
            guess = guess.truncated(1)
        return guess, 0

    def score(
        self, shadow: tuple[Draft, int], p: np.ndarray | None, chosen: int, draft_s: float
    ) -> None:
        """Tell the controller how the checked position fared (``p``: the target's
        processed distribution when sampling, None when greedy); follow the round further
        while the target chose the guessed token."""
        guess, position = shadow
        self._following = None
        if not guess.tokens:
            self.control.observe_shadow(ShadowCheck(None, draft_s))
            return
        chance = acceptance_chance(guess, position, p, chosen)
        follow = guess.tokens[position] == chosen and position + 1 < len(guess)
        check = ShadowCheck(chance, draft_s, position, not follow, len(guess), guess.match)
        self.control.observe_shadow(check)
        if follow:
            self._following = (guess, position + 1)


def acceptance_chance(guess: Draft, position: int, p: np.ndarray | None, chosen: int) -> float:
    """The probability that a shadow guess would have been accepted had it been drafted:
    greedy (``p`` None), whether it is the target's choice; sampling, sum(min(p, q))
    (p(x) for a guess without probabilities): what rejection sampling accepts on average, a
    steadier signal than one accept/reject draw."""
    token = guess.tokens[position]
    if p is None:
        return float(token == chosen)
    if guess.probs is None:
        return float(p[token])
    return float(np.minimum(p, guess.probs[position]).sum())
