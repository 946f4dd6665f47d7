"""A logit bias: fixed amounts added to chosen tokens' logits before anything else
(llama.cpp's ``logit_bias`` sampler, first in its chain). OpenAI's ``logit_bias``,
llama-server's (``false``: never that token) and its ``ignore_eos`` (every end-of-generation
token never) are this. The same for every row, plain or verified, target's or draft's: a
bias needs no window, unlike the penalties."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from localspec.errors import LocalspecError


@dataclass(frozen=True)
class LogitBias:
    entries: tuple[tuple[int, float], ...] = ()  # (token, bias); -inf: never that token

    @property
    def active(self) -> bool:
        return bool(self.entries)

    def validate(self, n_vocab: int | None = None) -> None:
        for token, bias in self.entries:
            if n_vocab is not None and not 0 <= token < n_vocab:
                raise LocalspecError(
                    f"logit_bias: token {token} is not in the model's vocabulary",
                    f"token ids run from 0 to {n_vocab - 1}",
                )
            if math.isnan(bias) or bias == math.inf:
                raise LocalspecError(
                    f"logit_bias: the bias of token {token} must be a number (got {bias})",
                    "-inf (or false) bans the token",
                )

    def apply(self, row: np.ndarray) -> np.ndarray:
        """A copy of the logits ``row`` with the biases added."""
        out = np.array(row, dtype=np.float32, copy=True)
        for token, bias in self.entries:
            if token < out.size:  # a draft model's vocabulary may be a little smaller
                out[token] += np.float32(bias)
        return out


NO_BIAS = LogitBias()


class BiasedRows:
    """The rows of one verified batch, each biased on first access."""

    def __init__(self, rows: Sequence[np.ndarray], bias: LogitBias) -> None:
        self.rows, self.bias = rows, bias
        self._done: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> np.ndarray:
        if i not in self._done:
            self._done[i] = self.bias.apply(self.rows[i])
        return self._done[i]
