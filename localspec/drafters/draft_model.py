"""``draft-model``: a second, smaller GGUF of the same tokenizer drafts autoregressively.

The draft's KV cache follows the target's accepted sequence through ``Backend.evaluate``:
each round it reuses the longest common prefix with what it already holds (everything the
target accepted) and decodes only the rest, so a rejection needs no separate bookkeeping.
Drafting stops early when the draft's top probability falls below ``p_min``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from localspec.engine.backend import Backend, common_prefix_length
from localspec.engine.drafting import Draft
from localspec.engine.verify import SamplingParams, sample_row

MIN_CATCH_UP_SAMPLE = 16


class DraftModelDrafter:
    name = "draft-model"

    def __init__(
        self,
        draft: Backend,
        sampling: SamplingParams,
        p_min: float = 0.0,
        rng: np.random.Generator | None = None,
    ) -> None:
        self.backend = draft
        self.sampling = sampling
        self.p_min = p_min
        self.rng = rng or np.random.default_rng(sampling.seed)
        self.catch_up_per_token: float | None = None

    def begin(self, prompt: Sequence[int]) -> None:
        """Process the prompt, and measure what the draft pays per token to catch up with a
        stretch it did not follow (after a pause of the adaptive controller)."""
        kept = min(common_prefix_length(self.backend.tokens, prompt), len(prompt) - 1)
        t0 = time.perf_counter()
        self.backend.evaluate(prompt)
        processed = len(prompt) - kept
        if processed >= MIN_CATCH_UP_SAMPLE:  # a few tokens do not show the batched rate
            self.catch_up_per_token = (time.perf_counter() - t0) / processed

    def propose(self, context: Sequence[int], n_max: int) -> Draft:
        if n_max <= 0:
            return Draft()
        room = self.backend.n_ctx - len(context)
        n_max = min(n_max, room)
        row = self.backend.evaluate(context)
        return draft_autoregressively(
            row, lambda token, _i: self.backend.decode([token])[0], n_max, self
        )

    def accepted(self, n_accepted: int) -> None:
        """Nothing to do: the next ``propose`` re-syncs the cache with the accepted context."""

    def close(self) -> None:
        """The draft backend belongs to the Engine, which frees it; nothing to release here."""


class _DraftSettings(Protocol):
    sampling: SamplingParams
    rng: np.random.Generator
    p_min: float


def draft_autoregressively(
    row: np.ndarray,
    next_row: Callable[[int, int], np.ndarray],
    n_max: int,
    settings: _DraftSettings,
) -> Draft:
    """The neural drafting loop: choose a token from ``row``, get the next logits with
    ``next_row(token, n_drafted)``, until ``n_max`` tokens or the top probability falls
    below ``p_min``. Shared by draft-model, draft-self and draft-mtp."""
    tokens: list[int] = []
    probs: list[np.ndarray] | None = None if settings.sampling.greedy else []
    while True:
        token, q, top = choose_draft_token(row, settings.sampling, settings.rng, settings.p_min)
        if tokens and top < settings.p_min:
            break
        tokens.append(token)
        if probs is not None:
            probs.append(q)
        if len(tokens) >= n_max:
            break
        row = next_row(token, len(tokens))
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
    token, q = sample_row(row, sampling, rng)
    return token, q, float(q.max())
