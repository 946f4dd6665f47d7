"""What the model has already written, kept across generations: the prompts and answers of
earlier requests to the same target, for the suffix drafter (``drafters/suffix.py``).

Much of what a local model writes repeats text that is not in the current context: a
regenerated answer, the JSON skeleton of the 40th record of a batch, the file an agent
re-emits in a new request. The memory keeps every earlier generation in one token array
(generations apart by a separator no context holds) and indexes it by a hash of each KEY-token
n-gram, in sorted numpy segments merged as they grow (as a log-structured merge tree: a few
segments, each searched by bisection). A lookup hashes the context's last KEY tokens, takes
the most recent places they occurred, measures how far back each match goes (up to MAX_MATCH
tokens, vectorised: the cost is O(segments + candidates x match), whatever the history's size)
(``recall``). What followed the longest match is copied text when the match is long; when
it is short, the places found are counted instead, as SuffixDecoding scores its tree: the
continuation they agree on is the skeleton earlier answers share (``agreed``); where they
disagree, the suffix drafter offers the longest match's continuation as a weak draft, for
the adaptive controller to weigh (``drafters/suffix.py``).

Bounded: at most ``max_tokens`` tokens are kept (BYTES_PER_TOKEN each: the token, its hash
and its position), the oldest generations evicted first, in batches (the index is rebuilt
then, which a cap reached once in a while amortises).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

KEY = 4  # tokens a lookup must match to find candidates at all
MAX_MATCH = 32  # how far back a match is measured
MAX_CANDIDATES = 64  # most recent occurrences of the key examined per lookup
MIN_SUPPORT = 3  # earlier places that must continue alike for an agreed draft (see agreed)
MIN_SHARE = 0.8  # ... and the share of the places still followed they must be
BYTES_PER_TOKEN = 16  # the token (4), its n-gram hash (8) and position (4): what the cap counts
EVICT_TO = 0.9  # over the cap, the oldest generations go until this share of it is left
SEPARATOR = -1  # between generations: no context holds it, so no match crosses it
_MIX = np.uint64(0x9E3779B97F4A7C15)  # odd 64-bit constant (golden ratio) for the n-gram hash


def ngram_hashes(tokens: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each KEY-token window (windows ending before the last token: a
    position is indexed only if a token follows it). Collisions only cost a candidate that
    the backward match then measures at less than KEY."""
    t = tokens.astype(np.uint64)
    n = t.size - KEY
    h = np.zeros(max(n, 0), dtype=np.uint64)
    for i in range(KEY):
        h = (h ^ t[i : i + n]) * _MIX
    return h


@dataclass(frozen=True)
class Recall:
    """Where the context's tail occurred before (end positions in the memory's token array,
    most recent first) and how many tokens each place matched (at least KEY)."""

    ends: np.ndarray
    matches: np.ndarray

    @property
    def longest(self) -> int:
        return int(self.matches.max())

    @property
    def longest_end(self) -> int:
        """The most recent of the longest matches."""
        return int(self.ends[int(np.argmax(self.matches))])


class SpecMemory:
    def __init__(self, max_mb: float = 50.0) -> None:
        self.max_tokens = max(int(max_mb * 1e6 / BYTES_PER_TOKEN), 0)
        self.clear()

    def __len__(self) -> int:
        return len(self._docs)

    def clear(self) -> None:
        """Forget everything (a benchmark of single fresh requests starts each run so)."""
        self._docs: OrderedDict[int, np.ndarray] = OrderedDict()
        self._next_id = 0
        self.n_tokens = 0
        self._arena = np.zeros(0, dtype=np.int32)  # every generation, separator after each
        self._used = 0
        # sorted (hashes, end positions) pairs, largest first; an end position is where the
        # token that followed the n-gram sits in the arena
        self._segments: list[tuple[np.ndarray, np.ndarray]] = []

    def documents(self) -> list[np.ndarray]:
        """The remembered generations, oldest first (what a memory file keeps)."""
        return list(self._docs.values())

    def add(self, tokens: Sequence[int]) -> None:
        """Remember one generation (its prompt and its answer, as one token sequence)."""
        if len(tokens) <= KEY or len(tokens) > self.max_tokens:
            return
        doc = np.asarray(tokens, dtype=np.int32)
        self._docs[self._next_id] = doc
        self._next_id += 1
        self.n_tokens += doc.size
        if self.n_tokens > self.max_tokens:
            while self.n_tokens > EVICT_TO * self.max_tokens:
                _, old = self._docs.popitem(last=False)
                self.n_tokens -= old.size
            self._rebuild()
        else:
            self._append(doc)

    def add_newest(self, docs: Sequence[np.ndarray]) -> int:
        """Remember the newest of ``docs`` (oldest first) that fit under the cap together,
        in one pass (one ``add`` at a time would rebuild the index at each eviction).
        Returns how many were kept."""
        room, newest = self.max_tokens - self.n_tokens, []
        for doc in reversed(docs):
            if doc.size > room:
                break
            room -= doc.size
            newest.append(doc)
        for doc in reversed(newest):
            self.add(doc)
        return len(newest)

    def _append(self, doc: np.ndarray) -> None:
        start = self._used
        need = start + doc.size + 1
        if need > self._arena.size:  # grow by doubling: appends cost O(1) amortised
            grown = np.empty(max(need, 2 * self._arena.size), dtype=np.int32)
            grown[:start] = self._arena[:start]
            self._arena = grown
        self._arena[start : start + doc.size] = doc
        self._arena[start + doc.size] = SEPARATOR
        self._used = need
        hashes = ngram_hashes(doc)
        ends = np.arange(start + KEY, start + KEY + hashes.size, dtype=np.int32)
        order = np.argsort(hashes, kind="stable")
        self._segments.append((hashes[order], ends[order]))
        while (
            len(self._segments) > 1 and self._segments[-2][0].size <= 2 * self._segments[-1][0].size
        ):
            self._merge_last_two()

    def _merge_last_two(self) -> None:
        (h1, e1), (h2, e2) = self._segments[-2], self._segments[-1]
        hashes, ends = np.concatenate([h1, h2]), np.concatenate([e1, e2])
        order = np.lexsort((ends, hashes))  # by hash, then by position: most recent last
        self._segments[-2:] = [(hashes[order], ends[order])]

    def _rebuild(self) -> None:
        docs = list(self._docs.values())
        self._arena, self._used, self._segments = np.zeros(0, dtype=np.int32), 0, []
        for doc in docs:
            self._append(doc)

    def lookup(self, context: Sequence[int], n_max: int) -> tuple[list[int], int]:
        """What followed the longest earlier match of the context's tail (at most ``n_max``
        tokens), and how many tokens matched (0: nothing found)."""
        recall = self.recall(context) if n_max > 0 else None
        if recall is None:
            return [], 0
        return self.follow(recall.longest_end, n_max), recall.longest

    def recall(self, context: Sequence[int]) -> Recall | None:
        """The most recent earlier places the context's last KEY tokens occurred, and how far
        back each matches (None: nowhere, or hash collisions only)."""
        if len(context) < KEY or not self._segments:
            return None
        tail = np.asarray(context[-MAX_MATCH:], dtype=np.int32)
        key = ngram_hashes(np.append(tail[-KEY:], 0))[0]
        candidates = self._candidates(key)
        if not candidates:
            return None
        ends = np.array(candidates)
        matches = matched_backwards_many(tail[::-1], self._arena, ends)
        real = matches >= KEY  # shorter: a hash collision
        return Recall(ends[real], matches[real]) if real.any() else None

    def follow(self, end: int, n_max: int) -> list[int]:
        """Up to ``n_max`` tokens from ``end`` on, within its generation."""
        follow = self._arena[end : end + n_max]
        stop = np.flatnonzero(follow == SEPARATOR)
        return follow[: stop[0] if stop.size else follow.size].tolist()

    def same_generation(self, start: int, end: int) -> bool:
        """Whether positions ``start`` to ``end`` lie within one remembered generation."""
        return not np.any(self._arena[start:end] == SEPARATOR)

    def agreed(self, recall: Recall, n_max: int) -> tuple[list[int], int]:
        """The continuation most of the recalled places share, token by token, for as long
        as at least MIN_SUPPORT of them and MIN_SHARE of those still following agree; and how
        many places continue with the whole of it. Where the text of earlier answers
        differs (the values of two JSON records), they disagree and the draft stops."""
        if recall.ends.size < MIN_SUPPORT:  # most lookups: nothing to gather
            return [], 0
        steps = np.arange(n_max)
        rows = self._arena[np.minimum(recall.ends[:, None] + steps, self._used - 1)]
        depth = 0
        while rows.shape[0] >= MIN_SUPPORT:
            # the stretch every place still followed agrees on, in one step (most of a draft)
            ahead = rows[:, depth:]
            breaks = np.flatnonzero((ahead != ahead[0]).any(axis=0) | (ahead[0] == SEPARATOR))
            if not breaks.size:
                return rows[0].tolist(), rows.shape[0]
            depth += int(breaks[0])
            values, counts = np.unique(rows[:, depth], return_counts=True)
            best = int(np.argmax(counts))
            token, support = values[best], int(counts[best])
            if token == SEPARATOR or support < MIN_SUPPORT or support < MIN_SHARE * rows.shape[0]:
                break
            rows = rows[rows[:, depth] == token]
        return (rows[0, :depth].tolist(), rows.shape[0]) if depth else ([], 0)

    def _candidates(self, key: np.uint64) -> list[int]:
        """End positions of the key's most recent occurrences, most recent first (later
        segments hold later generations)."""
        found: list[int] = []
        for hashes, ends in reversed(self._segments):
            lo = int(hashes.searchsorted(key, "left"))
            if lo == hashes.size or hashes[lo] != key:
                continue  # most lookups: one bisection per segment
            hi = int(hashes.searchsorted(key, "right"))
            if hi > lo:
                found.extend(ends[max(lo, hi - (MAX_CANDIDATES - len(found))) : hi][::-1].tolist())
                if len(found) >= MAX_CANDIDATES:
                    break
        return found


def matched_backwards_many(
    reversed_tail: np.ndarray, arena: np.ndarray, ends: np.ndarray
) -> np.ndarray:
    """``matched_backwards`` for several end positions at once (one gather, one compare)."""
    steps = np.arange(1, reversed_tail.size + 1)
    positions = ends[:, None] - steps[None, :]
    inside = positions >= 0
    equal = (arena[np.where(inside, positions, 0)] == reversed_tail[None, :]) & inside
    return np.where(equal.all(axis=1), reversed_tail.size, np.argmin(equal, axis=1))


def matched_backwards(reversed_tail: np.ndarray, doc: np.ndarray, end: int) -> int:
    """How many tokens before ``end`` in ``doc`` equal the context's last ones."""
    return int(matched_backwards_many(reversed_tail, doc, np.array([end]))[0])
