"""``draft-model``: a second, smaller GGUF of the same tokenizer drafts autoregressively.

The draft's KV cache follows the target's accepted sequence through ``Backend.evaluate``:
each round it reuses the longest common prefix with what it already holds (everything the
target accepted) and decodes only the rest, so a rejection needs no separate bookkeeping.
Drafting stops early when the draft's top probability falls below ``p_min``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from localspec.drafters.base import Draft
from localspec.engine.backend import Backend
from localspec.engine.verify import SamplingParams, probabilities, sample


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

    def begin(self, prompt: Sequence[int]) -> None:
        self.backend.evaluate(prompt)

    def propose(self, context: Sequence[int], n_max: int) -> Draft:
        if n_max <= 0:
            return Draft()
        room = self.backend.n_ctx - len(context)
        n_max = min(n_max, room)
        row = self.backend.evaluate(context)
        tokens: list[int] = []
        probs: list[np.ndarray] | None = None if self.sampling.greedy else []
        while True:
            token, q, top = self._choose(row)
            if tokens and top < self.p_min:
                break
            tokens.append(token)
            if probs is not None:
                probs.append(q)
            if len(tokens) >= n_max:
                break
            row = self.backend.decode([token])[0]
        return Draft(tokens, probs)

    def _choose(self, row: np.ndarray) -> tuple[int, np.ndarray | None, float]:
        """The draft token, its distribution (sampling only) and its top probability."""
        if self.sampling.greedy:
            token = int(row.argmax())
            top = 1.0
            if self.p_min > 0.0:
                top = float(1.0 / np.exp(row.astype(np.float64) - row[token]).sum())
            return token, None, top
        q = probabilities(row, self.sampling)
        return sample(q, self.rng), q, float(q.max())

    def accepted(self, n_accepted: int) -> None:
        """Nothing to do: the next ``propose`` re-syncs the cache with the accepted context."""

    def close(self) -> None:
        """The draft backend belongs to the Engine, which frees it; nothing to release here."""
