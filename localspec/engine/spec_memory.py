"""What the model has already written, kept across generations: the prompts and answers of
earlier requests to the same target, for the suffix drafter (``drafters/suffix.py``).

Much of what a local model writes repeats text that is not in the current context: a
regenerated answer, the JSON skeleton of the 40th record of a batch, the file an agent
re-emits in a new request. The memory indexes every earlier generation by its KEY-token
n-grams; a lookup takes the context's last KEY tokens, looks at the most recent places they
occurred, measures how far back each match goes (up to MAX_MATCH tokens, vectorised: the cost
is O(candidates x match), whatever the history's size) and proposes what followed the longest
match (the most recent among equals).

Bounded: at most ``max_tokens`` tokens are kept (int32: 4 bytes each, plus the index), the
oldest generations evicted first; the index forgets them lazily and is rebuilt when the
forgotten entries outnumber the live ones.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

KEY = 4  # tokens a lookup must match to find candidates at all
MAX_MATCH = 32  # how far back a match is measured
MAX_CANDIDATES = 16  # most recent occurrences of the key examined per lookup
BYTES_PER_TOKEN = 16  # the token (4) and its index entry, roughly: what the MB cap counts


class SpecMemory:
    def __init__(self, max_mb: float = 50.0) -> None:
        self.max_tokens = max(int(max_mb * 1e6 / BYTES_PER_TOKEN), 0)
        self._docs: OrderedDict[int, np.ndarray] = OrderedDict()
        self._index: dict[tuple[int, ...], list[tuple[int, int]]] = {}
        self._next_id = 0
        self.n_tokens = 0
        self._dead_entries = 0

    def __len__(self) -> int:
        return len(self._docs)

    def clear(self) -> None:
        """Forget everything (a benchmark of single fresh requests starts each run so)."""
        self._docs.clear()
        self._index, self._dead_entries, self.n_tokens = {}, 0, 0

    def add(self, tokens: Sequence[int]) -> None:
        """Remember one generation (its prompt and its answer, as one token sequence)."""
        if len(tokens) <= KEY or len(tokens) > self.max_tokens:
            return
        doc = np.asarray(tokens, dtype=np.int32)
        doc_id, self._next_id = self._next_id, self._next_id + 1
        self._docs[doc_id] = doc
        self.n_tokens += doc.size
        self._index_doc(doc_id, doc)
        while self.n_tokens > self.max_tokens:
            _, old = self._docs.popitem(last=False)
            self.n_tokens -= old.size
            self._dead_entries += old.size - KEY
        if self._dead_entries > self.n_tokens:
            self._rebuild()

    def _index_doc(self, doc_id: int, doc: np.ndarray) -> None:
        listed = doc.tolist()
        for end in range(KEY, len(listed)):  # the key listed[end-KEY:end] is followed by end
            self._index.setdefault(tuple(listed[end - KEY : end]), []).append((doc_id, end))

    def _rebuild(self) -> None:
        self._index, self._dead_entries = {}, 0
        for doc_id, doc in self._docs.items():
            self._index_doc(doc_id, doc)

    def lookup(self, context: Sequence[int], n_max: int) -> tuple[list[int], int]:
        """What followed the longest earlier match of the context's tail (at most ``n_max``
        tokens), and how many tokens matched (0: nothing found)."""
        if len(context) < KEY or n_max <= 0:
            return [], 0
        occurrences = self._index.get(tuple(context[-KEY:]))
        if not occurrences:
            return [], 0
        tail = np.asarray(context[-MAX_MATCH:], dtype=np.int32)[::-1]
        best: tuple[int, np.ndarray, int] | None = None  # match length, doc, end
        for doc_id, end in reversed(occurrences[-MAX_CANDIDATES:]):
            doc = self._docs.get(doc_id)
            if doc is None:  # evicted; its entries go at the next rebuild
                continue
            match = matched_backwards(tail, doc, end)
            if best is None or match > best[0]:
                best = (match, doc, end)
            if match >= tail.size:
                break
        if best is None:
            return [], 0
        match, doc, end = best
        return doc[end : end + n_max].tolist(), match


def matched_backwards(reversed_tail: np.ndarray, doc: np.ndarray, end: int) -> int:
    """How many tokens before ``end`` in ``doc`` equal the context's last ones."""
    span = min(reversed_tail.size, end)
    before = doc[end - span : end][::-1]
    equal = before == reversed_tail[:span]
    return span if equal.all() else int(np.argmin(equal))
