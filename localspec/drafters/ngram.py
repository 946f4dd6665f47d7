"""``ngram-simple``: draft the tokens that followed the last earlier occurrence of the current
n-gram in the prompt and output (prompt lookup decoding).

llama.cpp semantics (``common/ngram-map.cpp``, ``common_ngram_simple_draft``): the lookup key is
the last ``size_n`` tokens, the search runs backwards from the end and takes the most recent
earlier match, the draft is the ``size_m`` tokens after it. ``min_hits`` is the number of
earlier occurrences the key needs before it is trusted. Where the most recent match cannot
supply a full draft (it lies just behind the end, in repetitive text), the most recent one
that can is used (``find_last_match``); llama.cpp drafts nothing there.

Two additions, off with ``min_n = size_n``. When the full key has no match, shorter keys
(down to ``min_n``) are tried, with drafts of at most twice the key's length. After the
output departs from the text it copies (a renamed identifier, say), llama.cpp needs
``size_n`` fresh tokens before it can draft again; the shorter keys pick the copy back up
after a couple of tokens. The adaptive controller bounds what a poor short-key draft costs.

And where no key matches, the copy is picked back up where it was left (re-alignment).
A sibling function with renamed identifiers departs from its model for a token or three and
then goes on as it did; every key that holds the new name matches nowhere, but the place in
the source is known: the drafter remembers where its last draft came from, and looks for
the output's last token in the few source tokens after the point of departure. A draft from
there says ``match=1`` (one token of evidence, judged by the controller's odds per key
length like any weak match). ``min_n = size_n`` turns it off with the shorter keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from localspec.engine.drafting import Draft

# A match found with a shorter key than size_n is weaker evidence (a 4-token key recurs by
# chance in prose): its draft is capped at this many times the key length. When the copy
# really resumes, the next rounds have the full key again and draft size_m tokens.
SHORT_KEY_FACTOR = 2
# re-alignment: source tokens after the point of departure searched for the output's last
# token, output tokens after it within which a copy may resume, and the longest draft made
REALIGN_WINDOW = 16
REALIGN_AFTER = 8
REALIGN_DRAFT = 8


@dataclass(frozen=True)
class CopyPlace:
    """Where a draft came from: the history index its first token was copied from, how long
    the history was when it was made, and its tokens."""

    source: int
    made_at: int
    tokens: list[int]


@dataclass(frozen=True)
class NgramParams:
    size_n: int = 12
    size_m: int = 48
    min_hits: int = 1
    min_n: int = 4  # as --spec-ngram-simple-min-n: shorter keys mostly recur by chance


class NgramDrafter:
    name = "ngram-simple"
    catch_up_per_token: float | None = None  # follows the context for free

    def __init__(self, params: NgramParams | None = None) -> None:
        self.params = params or NgramParams()
        self._history = np.zeros(0, dtype=np.int32)
        self._known: list[int] = []  # the context the history array was built from
        self._copy: CopyPlace | None = None  # the last draft's place (re-alignment)

    def begin(self, prompt: Sequence[int]) -> None:
        self._sync(prompt)

    def propose(self, context: Sequence[int], n_max: int) -> Draft:
        history = self._sync(context)
        size_m = min(self.params.size_m, n_max)
        if size_m <= 0:
            return Draft()
        # one backward scan serves every key length (the drafter runs on every plain step
        # while speculation is paused, for shadow checks: it must cost microseconds)
        occurrences = tail_occurrences(history, self.params.size_n)
        for n in self._key_lengths():
            want = size_m if n >= self.params.size_n else min(size_m, SHORT_KEY_FACTOR * n)
            start = find_last_match(history, n, self.params.min_hits, want, occurrences)
            if start is not None:
                return self._copied(history, start + n, want, n)
        exact = self.params.min_n >= self.params.size_n  # llama.cpp's own behaviour
        resume = None if exact else realigned(history, self._copy)
        if resume is None:
            return Draft()
        return self._copied(history, resume, min(size_m, REALIGN_DRAFT), 1)

    def _copied(self, history: np.ndarray, source: int, want: int, match: int) -> Draft:
        tokens = history[source : source + want].tolist()
        self._copy = CopyPlace(source, history.size, tokens)
        return Draft(tokens, match=match)

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
            self._copy = None
        if new:
            self._known.extend(new)
            self._history = np.concatenate([self._history, np.asarray(new, dtype=np.int32)])
        return self._history

    def accepted(self, n_accepted: int) -> None:
        """Stateless between rounds: the history is re-synced from the context."""

    def close(self) -> None:
        self._history = np.zeros(0, dtype=np.int32)
        self._known = []
        self._copy = None


def realigned(history: np.ndarray, copy: CopyPlace | None) -> int | None:
    """Where the copy ``copy`` was taken from resumes, given the output since it was made
    (the end of ``history``): past the tokens the output followed, at the first of the next
    REALIGN_WINDOW source tokens that holds the output's last token; None if the output
    left the copy more than REALIGN_AFTER tokens ago, or nothing there matches."""
    if copy is None or history.size <= copy.made_at:
        return None
    since = history[copy.made_at :]
    followed = 0
    while followed < min(len(copy.tokens), since.size) and since[followed] == copy.tokens[followed]:
        followed += 1
    departure = copy.source + followed
    own = since.size - followed  # the output's tokens since it left the copy
    if own == 0:
        return departure if departure < copy.made_at else None
    if own > REALIGN_AFTER:
        return None
    window = history[departure : min(departure + REALIGN_WINDOW, copy.made_at - 1)]
    hits = np.flatnonzero(window == history[-1])
    return departure + int(hits[0]) + 1 if hits.size else None


def tail_occurrences(history: np.ndarray, max_n: int) -> tuple[np.ndarray, np.ndarray]:
    """Earlier occurrences of the history's tail: the positions ``ends`` (before the last)
    holding the last token, and for each how many tokens, up to ``max_n``, match backwards
    from there. An occurrence of the last n tokens is an end whose length is >= n."""
    last = history.size - 1
    if last < 1:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    ends = np.flatnonzero(history[:last] == history[last])
    lengths = np.zeros(ends.size, dtype=np.int64)
    alive = np.arange(ends.size)
    for j in range(max_n):
        at = ends[alive] - j
        alive = alive[(at >= 0) & (history[np.maximum(at, 0)] == history[last - j])]
        if alive.size == 0:
            break
        lengths[alive] += 1
    return ends, lengths


def find_last_match(
    history: np.ndarray,
    n: int,
    min_hits: int = 1,
    want: int = 1,
    occurrences: tuple[np.ndarray, np.ndarray] | None = None,
) -> int | None:
    """Start of the most recent earlier occurrence of the last ``n`` tokens that is followed
    by at least ``want`` tokens; if none is, the occurrence with the longest continuation (the
    earliest). None when the key occurs fewer than ``min_hits`` times before the end.
    ``occurrences``: ``tail_occurrences(history, m)`` for some m >= n, computed once.

    Why not simply the most recent occurrence: in repetitive text (a repeated line, a run of
    the same token) it lies just behind the end and can only offer a token or two, while an
    earlier occurrence of the same key offers the whole continuation."""
    length = history.size
    if length < n + 1:
        return None
    ends, lengths = occurrences if occurrences is not None else tail_occurrences(history, n)
    hits = ends[lengths >= n] - (n - 1)  # occurrence starts, in increasing order
    if hits.size < min_hits or hits.size == 0:
        return None
    full = hits[length - (hits + n) >= want]
    return int(full[-1]) if full.size else int(hits[0])
