"""The Drafter protocol, the one interface every drafting mode implements, and the Draft it
returns. It lives with the loop that consumes it; the drafters (``localspec/drafters/``)
implement it.

A drafter with a model of its own may also draft *in steps* (``SteppedDrafter``): a
generator that yields each decode it needs (``DecodeRequest``) and is sent the logits row
back. Alone, ``decode_directly`` runs the decodes one by one; parallel slots run every
slot's request of a step in one batch of the draft model (``engine/scheduler.py``).
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol, TypeGuard, TypeVar, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from localspec.engine.model_context import ModelContext


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
    # the drafter's token after a cut draft, and its probability row: not verified, but the
    # target's token after a draft kept whole scores it for free (``SpeculativeLoop.finish``)
    after: int | None = None
    after_probs: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.tokens)

    def truncated(self, n: int) -> Draft:
        if n >= len(self.tokens):
            return self
        probs = self.probs[:n] if self.probs is not None else None
        after_probs = self.probs[n] if self.probs is not None else None
        return replace(
            self, tokens=self.tokens[:n], probs=probs, after=self.tokens[n], after_probs=after_probs
        )


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


@dataclass(frozen=True)
class DecodeRequest:
    """``tokens`` to append to ``sequence``; the logits row after the last one is sent back."""

    sequence: ModelContext
    tokens: list[int]


Result = TypeVar("Result")
Steps = Generator[DecodeRequest, np.ndarray, Result]


@runtime_checkable
class SteppedDrafter(Protocol):
    def propose_steps(self, context: Sequence[int], n_max: int) -> Steps[Draft]:
        """``propose``, yielding each decode it needs instead of running it."""
        ...

    def held(self, context: Sequence[int]) -> int:
        """How much of ``context`` its own cache holds (the rest it catches up)."""
        ...


_STEPPED_TYPES: dict[type, bool] = {}


def is_stepped(drafter: object) -> TypeGuard[SteppedDrafter]:
    """``isinstance(drafter, SteppedDrafter)``, worked out once a class: a runtime protocol
    check looks up every member each time, and a shared step asks it of every slot."""
    kind = type(drafter)
    stepped = _STEPPED_TYPES.get(kind)
    if stepped is None:
        stepped = _STEPPED_TYPES[kind] = isinstance(drafter, SteppedDrafter)
    return stepped


def decode_directly(steps: Steps[Result]) -> Result:
    """Run ``steps`` on their own: each request decoded when it is made (one generation, or
    a decode no other slot shares)."""
    try:
        request = next(steps)
        while True:
            request = steps.send(request.sequence.decode(request.tokens)[0])
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
