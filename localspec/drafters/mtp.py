"""``draft-mtp``: the target's own multi-token-prediction (NextN) head drafts.

The head is run by llama.cpp in a second context of the target model (``engine/mtp.py``),
which follows the target's hidden states on its own; drafting is the head run
autoregressively from the last accepted position, stopping early below ``p_min`` (a model
with several chained heads drafts at most one token per head).
"""

from __future__ import annotations

from collections.abc import Sequence

from localspec.drafters.neural import NeuralDrafter
from localspec.engine.drafting import Draft
from localspec.engine.mtp import MtpContext


class MtpDrafter(NeuralDrafter[MtpContext]):
    name = "draft-mtp"  # follows the context for free: no catch-up cost

    def begin(self, prompt: Sequence[int]) -> None:
        """The MTP context mirrored the prompt while the target processed it."""

    def propose(self, context: Sequence[int], n_max: int) -> Draft:
        pos = len(context) - 1  # where the target's last chosen token goes
        n_max = min(n_max, self.model.target.n_ctx - len(context))
        if self.model.max_draft is not None:  # chained heads: one draft token per head
            n_max = min(n_max, self.model.max_draft)
        if n_max <= 0:
            return Draft()
        row = self.model.first_step(context[-1], pos)
        return self.draft_from(
            row,
            lambda token, n_drafted: self.model.next_step(token, pos + n_drafted),
            n_max,
            context,
        )

    def accepted(self, n_accepted: int) -> None:
        """Nothing to do: the target's next decode re-feeds the MTP cache from there."""

    def close(self) -> None:
        """The MTP context belongs to the Engine."""
