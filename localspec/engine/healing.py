"""Token healing: the end of a prompt given back to the model to write as it would.

A prompt cut in the middle of what the model would write as one token ends on a token the
model seldom wrote there: a code completion typed up to ``"    "`` ends on a four-space token
after which the model's own tokens (``"   "`` then ``" return"``) no longer fit, and it writes
``" return"``, one space too many. Healing takes the prompt's last token off and lets the
model write its text again, constrained: every token it writes until that text is covered
must be a piece of it (the text starts with the token) or cover what is left of it (the token
starts with it). The text given back is not emitted again (``OutputAssembler(given=...)``).

``HealedStart`` constrains rows the way a grammar state does (``grammar.GrammarState``:
``ConstrainedRows`` masks each verified row with the state after the draft before it), so
plain decoding and speculation choose from the same masked rows: lossless for it. Once the
text is covered it allows everything, at no cost.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Protocol

import numpy as np


class HealingVocab(Protocol):
    """What healing needs of a model (``ModelContext``)."""

    n_vocab: int

    def piece(self, token: int) -> bytes: ...
    def is_eog(self, token: int) -> bool: ...


class PieceIndex:
    """Every token's bytes, sorted, to find the tokens that start with some bytes (one
    contiguous run of the sorted pieces) and those that are a prefix of them (a lookup per
    prefix length). Built once per model, on the first healed prompt."""

    def __init__(self, vocab: HealingVocab) -> None:
        pieces = [vocab.piece(t) for t in range(vocab.n_vocab)]
        usable = [t for t, p in enumerate(pieces) if p and not vocab.is_eog(t)]
        order = sorted(usable, key=lambda t: pieces[t])
        self._sorted = [pieces[t] for t in order]
        self._ids = np.array(order, dtype=np.int64)
        self._by_piece: dict[bytes, list[int]] = {}
        for t in usable:
            self._by_piece.setdefault(pieces[t], []).append(t)
        self.pieces = pieces

    def fitting(self, text: bytes) -> np.ndarray:
        """Tokens that cover ``text`` (start with it) or are a proper prefix of it."""
        lo = bisect.bisect_left(self._sorted, text)
        hi = lo
        while hi < len(self._sorted) and self._sorted[hi].startswith(text):
            hi += 1
        parts = [self._ids[lo:hi]]
        parts += [
            np.array(self._by_piece.get(text[:n], []), dtype=np.int64) for n in range(1, len(text))
        ]
        return np.concatenate(parts)


def healed_end(vocab: HealingVocab, tokens: Sequence[int], keep: int) -> tuple[list[int], str]:
    """``tokens`` without their last one, and that token's text, for the model to write
    again; unchanged (and "") when there is nothing past ``keep`` tokens to heal or the
    last token is not whole text (part of a character, a special token)."""
    if len(tokens) <= keep or vocab.is_eog(tokens[-1]):
        return list(tokens), ""
    try:
        text = vocab.piece(tokens[-1]).decode("utf-8")
    except UnicodeDecodeError:
        return list(tokens), ""
    return (list(tokens[:-1]), text) if text else (list(tokens), "")


class HealedStart:
    """The text still to be written (``left``), as a constraint on the next tokens."""

    def __init__(self, index: PieceIndex, left: bytes) -> None:
        self.index = index
        self.left = left
        self._fitting: np.ndarray | None = None

    def clone(self) -> HealedStart:
        return HealedStart(self.index, self.left)

    def close(self) -> None:
        """Nothing held."""

    def allows(self, token: int) -> bool:
        if not self.left:
            return True
        piece = self.index.pieces[token] if 0 <= token < len(self.index.pieces) else b""
        return bool(piece) and (piece.startswith(self.left) or self.left.startswith(piece))

    def allowed(self, ids: np.ndarray) -> np.ndarray:
        if not self.left:
            return np.ones(len(ids), dtype=bool)
        return np.isin(ids, self._allowed_ids())

    def accept(self, token: int) -> None:
        piece = self.index.pieces[token]
        self.left = self.left[len(piece) :] if self.left.startswith(piece) else b""
        self._fitting = None

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        probe = self.clone()
        for i, token in enumerate(tokens):
            if not probe.left:
                return len(tokens)
            if not probe.allows(token):
                return i
            probe.accept(token)
        return len(tokens)

    def best(self, row: np.ndarray, near: float = 0.0) -> np.ndarray:
        """The row with only the allowed tokens (all of them, once the text is covered)."""
        return self.masked(row)

    def masked(self, row: np.ndarray, temperature: float | None = None) -> np.ndarray:
        if not self.left:
            return row
        keep = self._allowed_ids()
        if keep.size == 0:  # nothing writes the text on: the constraint gives way
            return row
        out = np.full(row.shape, -np.inf, dtype=row.dtype)
        out[keep] = row[keep]
        return out

    def _allowed_ids(self) -> np.ndarray:
        if self._fitting is None:
            self._fitting = self.index.fitting(self.left)
        return self._fitting
