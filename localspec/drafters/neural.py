"""What every neural drafter shares (draft-model, draft-self, draft-mtp): sampling settings
processed as the target's are, the ``p_min`` cut-off, and the autoregressive drafting loop.
Subclasses say where the next logits come from (a second model, the MTP head)."""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import Generic, TypeVar

import numpy as np

from localspec.engine.drafting import Draft
from localspec.engine.verify import SamplingParams, sample_row

Model = TypeVar("Model")


class NeuralDrafter(Generic[Model]):
    """``model``: what computes the draft's logits (a ModelContext, an MtpContext)."""

    catch_up_per_token: float | None = None  # a drafter with a cache of its own measures it

    def __init__(
        self,
        model: Model,
        sampling: SamplingParams,
        p_min: float = 0.0,
        rng: np.random.Generator | None = None,
    ) -> None:
        self.model = model
        self.sampling = sampling
        self.p_min = p_min
        self.rng = rng or np.random.default_rng(sampling.seed)

    def draft_from(
        self,
        row: np.ndarray,
        next_row: Callable[[int, int], np.ndarray],
        n_max: int,
        context: Sequence[int] = (),
    ) -> Draft:
        """The drafting loop with the next logits from ``next_row(token, n_drafted)``."""
        steps = self.draft_steps(row, n_max, context)
        try:
            token, n_drafted = next(steps), 1
            while True:
                token = steps.send(next_row(token, n_drafted))
                n_drafted += 1
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    def draft_steps(
        self, row: np.ndarray, n_max: int, context: Sequence[int] = ()
    ) -> Generator[int, np.ndarray, Draft]:
        """The drafting loop: choose a token from ``row``, yield it and be sent the logits
        after it, until ``n_max`` tokens or the top probability falls below ``p_min``.
        ``context``: what the draft follows, for the repetition penalties (each row
        penalized as the target's row for that token will be: by the context and the
        draft's tokens before it)."""
        tokens: list[int] = []
        probs: list[np.ndarray] | None = None if self.sampling.greedy else []
        penalties = self.sampling.penalties
        seen = list(penalties.window(context)) if penalties.active else []
        bias = self.sampling.logit_bias
        while True:
            if bias.active:
                row = bias.apply(row)
            if penalties.active:
                row = penalties.apply(row, penalties.window([*seen, *tokens]))
            token, q, top = choose_draft_token(row, self.sampling, self.rng, self.p_min)
            if tokens and top < self.p_min:
                break
            tokens.append(token)
            if probs is not None:
                probs.append(q)
            if len(tokens) >= n_max:
                break
            row = yield token
        return Draft(tokens, probs)


def choose_draft_token(
    row: np.ndarray, sampling: SamplingParams, rng: np.random.Generator, p_min: float
) -> tuple[int, np.ndarray | None, float]:
    """A neural drafter's next token from its logits ``row``: the token, its processed
    distribution q (sampling only; greedy drafts are one-hot) and its top probability (for
    the ``p_min`` cut-off). q goes through the same temperature/top-k/top-p as the target's
    p, as rejection sampling requires."""
    if sampling.greedy:
        token = int(row.argmax())
        top = 1.0
        if p_min > 0.0:
            top = float(1.0 / np.exp(row.astype(np.float64) - row[token]).sum())
        return token, None, top
    token, q = sample_row(row, sampling, rng.random())
    return token, q, float(q.max())
