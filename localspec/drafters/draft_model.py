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
from localspec.engine.drafting import DecodeRequest, Draft, Steps, decode_directly
from localspec.engine.model_context import ModelContext, common_prefix_length

MIN_CATCH_UP_SAMPLE = 16


class DraftModelDrafter(NeuralDrafter[ModelContext]):
    name = "draft-model"
    # a schedule modelled from the calibration (``costs.ModelledTimes``) is told this rate
    # instead of the clock's: it must make the same choices whatever the machine is doing
    modelled_catch_up: float | None = None

    def begin(self, prompt: Sequence[int]) -> None:
        """Process the prompt, and measure what the draft pays per token to catch up with a
        stretch it did not follow (after a pause of the adaptive controller)."""
        kept = min(common_prefix_length(self.model.tokens, prompt), len(prompt) - 1)
        t0 = time.perf_counter()
        self.model.evaluate(prompt)
        processed = len(prompt) - kept
        if self.modelled_catch_up is not None:
            self.catch_up_per_token = self.modelled_catch_up
        elif processed >= MIN_CATCH_UP_SAMPLE:  # a few tokens do not show the batched rate
            self.catch_up_per_token = (time.perf_counter() - t0) / processed

    def propose(self, context: Sequence[int], n_max: int) -> Draft:
        return decode_directly(self.propose_steps(context, n_max))

    def propose_steps(self, context: Sequence[int], n_max: int) -> Steps[Draft]:
        """Catch the draft's cache up with ``context`` (what it does not hold yet: the
        target's last token, or a stretch skipped while paused), then draft a token per
        decode."""
        n_max = min(n_max, self.model.n_ctx - len(context))
        if n_max <= 0:
            return Draft()
        keep, row = self.model.reuse_prefix(context, reproducible=False)
        if row is None:
            row = yield DecodeRequest(self.model, list(context[keep:]))
            self.model.note_prefilled(context, keep, row, reproducible=False)
        drafting = self.draft_steps(row, n_max, context)
        try:
            token = next(drafting)
            while True:
                token = drafting.send((yield DecodeRequest(self.model, [token])))
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    def held(self, context: Sequence[int]) -> int:
        """How much of ``context`` the draft's cache holds (the rest is caught up)."""
        return common_prefix_length(self.model.tokens, context)

    def accepted(self, n_accepted: int) -> None:
        """Nothing to do: the next ``propose`` re-syncs the cache with the accepted context."""

    def close(self) -> None:
        """The draft backend belongs to the Engine, which frees it; nothing to release here."""
