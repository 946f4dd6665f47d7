"""``draft-model``: a second, smaller GGUF of the same tokenizer drafts autoregressively.

The draft's KV cache follows the target's accepted sequence through ``ModelContext.evaluate``:
each round it reuses the longest common prefix with what it already holds (everything the
target accepted) and decodes only the rest, so a rejection needs no separate bookkeeping.
Drafting stops early when the draft's top probability falls below ``p_min``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from localspec.drafters.neural import NeuralDrafter
from localspec.engine.drafting import Draft
from localspec.engine.model_context import ModelContext, common_prefix_length

MIN_CATCH_UP_SAMPLE = 16


class DraftModelDrafter(NeuralDrafter[ModelContext]):
    name = "draft-model"

    def begin(self, prompt: Sequence[int]) -> None:
        """Process the prompt, and measure what the draft pays per token to catch up with a
        stretch it did not follow (after a pause of the adaptive controller)."""
        kept = min(common_prefix_length(self.model.tokens, prompt), len(prompt) - 1)
        t0 = time.perf_counter()
        self.model.evaluate(prompt)
        processed = len(prompt) - kept
        if processed >= MIN_CATCH_UP_SAMPLE:  # a few tokens do not show the batched rate
            self.catch_up_per_token = (time.perf_counter() - t0) / processed

    def propose(self, context: Sequence[int], n_max: int) -> Draft:
        if n_max <= 0:
            return Draft()
        room = self.model.n_ctx - len(context)
        n_max = min(n_max, room)
        row = self.model.evaluate(context)
        return self.draft_from(row, lambda token, _i: self.model.decode([token])[0], n_max)

    def accepted(self, n_accepted: int) -> None:
        """Nothing to do: the next ``propose`` re-syncs the cache with the accepted context."""

    def close(self) -> None:
        """The draft backend belongs to the Engine, which frees it; nothing to release here."""
