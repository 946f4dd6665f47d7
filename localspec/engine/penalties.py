"""Repetition penalties, as llama.cpp's ``penalties`` sampler applies them, in pure numpy.

Over the last ``last_n`` tokens of the context (the prompt's included, as llama-server feeds
its sampler the prompt), each token seen ``c`` times has its logit divided by ``repeat``
(multiplied where it is negative, so that it still falls), then lowered by ``c * frequency
+ presence``. OpenAI's ``frequency_penalty`` and ``presence_penalty`` and Ollama's
``repeat_penalty`` are these.

A penalty changes the target's distribution, so it must change it the same way whether a
token is decoded plainly or verified in a draft: the row for a draft's i-th token is
penalized by the context *and the draft's tokens before it*, exactly the window plain
decoding would have had there (``PenalizedRows``). The acceptance rules then see the
penalized rows, and the output is what plain decoding with the same penalties writes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from localspec.errors import LocalspecError

WHOLE_CONTEXT = -1  # last_n: every token of the context (llama.cpp's -1)


@dataclass(frozen=True)
class Penalties:
    repeat: float = 1.0  # 1: off
    frequency: float = 0.0  # 0: off
    presence: float = 0.0  # 0: off
    last_n: int = 64  # 0: off; -1: the whole context (llama.cpp's and Ollama's default 64)

    @property
    def active(self) -> bool:
        return self.last_n != 0 and (
            self.repeat != 1.0 or self.frequency != 0.0 or self.presence != 0.0
        )

    def validate(self) -> None:
        for name, value in (("frequency", self.frequency), ("presence", self.presence)):
            if not math.isfinite(value):
                raise LocalspecError(f"the {name} penalty must be a number (got {value})")
        if not math.isfinite(self.repeat) or self.repeat <= 0:
            raise LocalspecError(
                f"the repeat penalty must be a number > 0 (got {self.repeat})", "1 turns it off"
            )
        if self.last_n < WHOLE_CONTEXT:
            raise LocalspecError(
                f"the penalty window (repeat_last_n) must be >= -1 (got {self.last_n})",
                "0 turns penalties off, -1 takes the whole context",
            )

    def window(self, context: Sequence[int]) -> Sequence[int]:
        """The tokens the penalties count: the context's last ``last_n``."""
        if self.last_n == WHOLE_CONTEXT:
            return context
        return context[-self.last_n :] if self.last_n > 0 else ()

    def apply(self, row: np.ndarray, window: Sequence[int]) -> np.ndarray:
        """A copy of the logits ``row`` penalized for the tokens in ``window``."""
        out = np.array(row, dtype=np.float32, copy=True)
        if not len(window):
            return out
        tokens, counts = np.unique(np.asarray(window, dtype=np.int64), return_counts=True)
        inside = tokens < out.size  # a draft model's vocabulary may be a little smaller
        tokens, counts = tokens[inside], counts[inside]
        seen = out[tokens]
        repeat = np.float32(self.repeat)
        seen = np.where(seen <= 0, seen * repeat, seen / repeat)
        seen -= counts.astype(np.float32) * np.float32(self.frequency) + np.float32(self.presence)
        out[tokens] = seen
        return out


NO_PENALTIES = Penalties()


class PenalizedRows:
    """The rows of one verified batch, row i penalized by the context plus the draft's first
    i tokens (the window plain decoding has there). Penalized on first access: the
    acceptance rules stop at the first rejection, so later rows cost nothing."""

    def __init__(
        self,
        rows: Sequence[np.ndarray],
        context: Sequence[int],
        draft: Sequence[int],
        penalties: Penalties,
    ) -> None:
        self.rows, self.penalties = rows, penalties
        # only the last tokens of the context can fall in any row's window
        reach = len(context) if penalties.last_n == WHOLE_CONTEXT else penalties.last_n
        self._tokens = [*context[len(context) - min(reach, len(context)) :], *draft]
        self._base = len(self._tokens) - len(draft)
        self._done: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> np.ndarray:
        if i not in self._done:
            seen = self._tokens[: self._base + i]
            self._done[i] = self.penalties.apply(self.rows[i], self.penalties.window(seen))
        return self._done[i]
