"""Prompts kept in host memory after their slot moved on: a request whose prompt starts as an
earlier one did (a chat UI switching back to a conversation, an agent's loop, a batch of
records under one instruction) gets that cache back instead of reading it again, as
llama-server's ``--cache-ram`` does. A sequence's cache costs its tokens times the model's
KV width (about 12 KiB a token for a 0.5B model): the cache holds at most ``max_bytes``,
least recently used first out.
"""

from __future__ import annotations

from collections.abc import Sequence

from localspec.engine.model_context import ModelContext, SavedSequence, common_prefix_length

DEFAULT_MAX_BYTES = 1 << 30
MIN_TOKENS = 64  # shorter caches are read again faster than they are worth keeping


class PromptCache:
    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._saved: list[SavedSequence] = []  # least recently used first
        self.restored = 0  # caches given back (for tests and the log)

    @property
    def size(self) -> int:
        return sum(s.size for s in self._saved)

    def __len__(self) -> int:
        return len(self._saved)

    def swap_in(self, view: ModelContext, prompt: Sequence[int]) -> None:
        """Before ``view`` is given ``prompt``: keep what it holds that the prompt would cut
        (when long enough), and give it back a kept cache that starts like the prompt for at
        least ``MIN_TOKENS`` more than it holds."""
        here = common_prefix_length(view.tokens, prompt)
        if len(view.tokens) - here >= MIN_TOKENS:
            self._keep(view.save())
        best, there = self._best(prompt)
        if best is None or there < here + MIN_TOKENS:
            return
        self._saved.remove(best)
        self._saved.append(best)  # the most recently used now
        if view.restore(best):
            self.restored += 1

    def longest(self, prompt: Sequence[int]) -> int:
        """How many of the prompt's first tokens a kept cache holds."""
        return self._best(prompt)[1]

    def _best(self, prompt: Sequence[int]) -> tuple[SavedSequence | None, int]:
        best, length = None, 0
        for saved in self._saved:
            n = common_prefix_length(saved.tokens, prompt)
            if n > length:
                best, length = saved, n
        return best, length

    def _keep(self, saved: SavedSequence) -> None:
        """Keep ``saved``, unless a kept one extends it; drop the kept ones it extends."""
        n = len(saved.tokens)
        for other in self._saved:
            if len(other.tokens) >= n and other.tokens[:n] == saved.tokens:
                return
        self._saved = [s for s in self._saved if saved.tokens[: len(s.tokens)] != s.tokens]
        if saved.size > self.max_bytes:
            return
        self._saved.append(saved)
        while self.size > self.max_bytes:
            self._saved.pop(0)
