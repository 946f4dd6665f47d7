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
from localspec.errors import LocalspecError

VOCAB_MAX_SIZE_DIFFERENCE = 128  # llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE
VOCAB_CHECK_START_TOKEN_ID = 5  # llama.cpp's SPEC_VOCAB_CHECK_START_TOKEN_ID


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


def check_vocab_compatible(target: Backend, draft: Backend) -> None:
    """llama.cpp's rules for a draft model (``common_speculative_are_compatible``); raise
    naming the rule that failed."""
    where = f"draft {draft.path.name} vs target {target.path.name}"
    hint = "use a draft of the same model family and tokenizer (see `localspec pairs`)"
    if target.vocab_type != draft.vocab_type:
        raise LocalspecError(
            f"incompatible draft ({where}): vocabulary types differ "
            f"({draft.vocab_type} vs {target.vocab_type})",
            hint,
        )
    for what, get_add, get_tok in (
        ("BOS", "add_bos", "bos_token"),
        ("EOS", "add_eos", "eos_token"),
    ):
        t_add, d_add = getattr(target, get_add), getattr(draft, get_add)
        t_tok, d_tok = getattr(target, get_tok), getattr(draft, get_tok)
        if t_add != d_add or (t_add and t_tok != d_tok):
            raise LocalspecError(
                f"incompatible draft ({where}): {what} differs (added: {d_add} vs {t_add}, "
                f"token: {d_tok} vs {t_tok})",
                hint,
            )
    diff = abs(target.n_vocab - draft.n_vocab)
    if diff > VOCAB_MAX_SIZE_DIFFERENCE:
        raise LocalspecError(
            f"incompatible draft ({where}): vocabulary sizes differ by {diff} "
            f"({draft.n_vocab} vs {target.n_vocab}; at most {VOCAB_MAX_SIZE_DIFFERENCE} allowed)",
            hint,
        )
    for token in range(VOCAB_CHECK_START_TOKEN_ID, min(target.n_vocab, draft.n_vocab)):
        t_text, d_text = target.token_text(token), draft.token_text(token)
        if t_text != d_text:
            raise LocalspecError(
                f"incompatible draft ({where}): token {token} differs ({d_text!r} vs {t_text!r})",
                hint,
            )
