"""``ngram-simple``: draft the tokens that followed the last earlier occurrence of the current
n-gram in the prompt and output (prompt lookup decoding).

llama.cpp semantics (``common/ngram-map.cpp``, ``common_ngram_simple_draft``): the lookup key is
the last ``size_n`` tokens, the search runs backwards from the end and takes the most recent
earlier match, the draft is the ``size_m`` tokens after it. ``min_hits`` is the number of
earlier occurrences the key needs before it is trusted. Where the most recent match cannot
supply a full draft (it lies just behind the end, in repetitive text), the most recent one
that can is used (``find_last_match``); llama.cpp drafts nothing there.

One addition, off with ``min_n = size_n``: when the full key has no match, shorter keys
(down to ``min_n``) are tried, with drafts of at most twice the key's length. After the
output departs from the text it copies (a renamed identifier, say), llama.cpp needs
``size_n`` fresh tokens before it can draft again; the shorter keys pick the copy back up
after a couple of tokens. The adaptive controller bounds what a poor short-key draft costs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from localspec.drafters.base import Draft

# A match found with a shorter key than size_n is weaker evidence (a 4-token key recurs by
# chance in prose): its draft is capped at this many times the key length. When the copy
# really resumes, the next rounds have the full key again and draft size_m tokens.
SHORT_KEY_FACTOR = 2


@dataclass(frozen=True)
class NgramParams:
    size_n: int = 12
    size_m: int = 48
    min_hits: int = 1
    min_n: int = 2


class NgramDrafter:
    name = "ngram-simple"

    def __init__(self, params: NgramParams | None = None) -> None:
        self.params = params or NgramParams()
        self._history = np.zeros(0, dtype=np.int32)
        self._known: list[int] = []  # the context the history array was built from

    def begin(self, prompt: Sequence[int]) -> None:
        self._sync(prompt)

    def propose(self, context: Sequence[int], n_max: int) -> Draft:
        history = self._sync(context)
        size_m = min(self.params.size_m, n_max)
        if size_m <= 0:
            return Draft()
        for n in self._key_lengths():
            want = size_m if n >= self.params.size_n else min(size_m, SHORT_KEY_FACTOR * n)
            start = find_last_match(history, n, self.params.min_hits, want)
            if start is not None:
                follow = history[start + n : start + n + want]
                return Draft(follow.tolist())
        return Draft()

    def _key_lengths(self) -> range:
        low = max(1, min(self.params.min_n, self.params.size_n))
        return range(self.params.size_n, low - 1, -1)

    def _sync(self, context: Sequence[int]) -> np.ndarray:
        """Extend the cached numpy history instead of converting the whole context each round
        (the context only grows within one generation; anything else rebuilds it)."""
        known = len(self._known)
        if known <= len(context) and list(context[:known]) == self._known:
            new = list(context[known:])
        else:
            self._known, new = [], list(context)
            self._history = np.zeros(0, dtype=np.int32)
        if new:
            self._known.extend(new)
            self._history = np.concatenate([self._history, np.asarray(new, dtype=np.int32)])
        return self._history

    def accepted(self, n_accepted: int) -> None:
        """Stateless between rounds: the history is re-synced from the context."""

    def close(self) -> None:
        self._history = np.zeros(0, dtype=np.int32)
        self._known = []


def find_last_match(history: np.ndarray, n: int, min_hits: int = 1, want: int = 1) -> int | None:
    """Start of the most recent earlier occurrence of the last ``n`` tokens that is followed
    by at least ``want`` tokens; if none is, the occurrence with the longest continuation (the
    earliest). None when the key occurs fewer than ``min_hits`` times before the end.

    Why not simply the most recent occurrence: in repetitive text (a repeated line, a run of
    the same token) it lies just behind the end and can only offer a token or two, while an
    earlier occurrence of the same key offers the whole continuation."""
    length = history.size
    if length < n + 1:
        return None
    key = history[length - n :]
    # Candidate starts 0 .. length-n-1 (the occurrence at length-n is the key itself).
    windows = np.lib.stride_tricks.sliding_window_view(history[: length - 1], n)
    hits = np.flatnonzero((windows == key).all(axis=1))
    if hits.size < min_hits or hits.size == 0:
        return None
    full = hits[length - (hits + n) >= want]
    return int(full[-1]) if full.size else int(hits[0])
