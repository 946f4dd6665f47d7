"""Turning accepted tokens into emitted text: EOS, stop strings, max_tokens, UTF-8.

Tokens are pushed one at a time, in order, whatever their origin (draft or target), so a
stop inside an accepted draft ends generation exactly where plain decoding would have.
Text is decoded incrementally: a UTF-8 character split across tokens is held until it is
complete, and text that could be the start of a stop string is held until it is not.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence


class OutputAssembler:
    def __init__(
        self,
        piece: Callable[[int], bytes],
        is_eog: Callable[[int], bool],
        stop: Sequence[str] = (),
        max_tokens: int | None = None,
        given: str = "",
    ) -> None:
        """``given``: text the output starts with that is not emitted (the prompt's end a
        healed prompt gives back to the model to write again)."""
        self._piece = piece
        self._is_eog = is_eog
        self._stop = [s for s in stop if s]
        self._max_tokens = max_tokens
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.tokens: list[int] = []
        self.text = ""  # all text decoded so far (cut at a stop string once one is found)
        self._released = len(given)  # how much of ``text`` has been handed out
        self.finish_reason: str | None = None
        self.stop_word: str | None = None  # the stop string the text ended at

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def push(self, token: int) -> bool:
        """Add one generated token; return False if it was not emitted (EOS, or already done)."""
        if self.done:
            return False
        if self._is_eog(token):
            self.finish_reason = "stop"
            return False
        self.tokens.append(token)
        self.text += self._decoder.decode(self._piece(token))
        if self._stop and self._cut_at_stop():
            self.finish_reason = "stop"
        elif self._max_tokens is not None and len(self.tokens) >= self._max_tokens:
            self.finish("length")
        return True

    def finish(self, reason: str) -> None:
        """End generation (length, cancelled...): a character left incomplete shows as U+FFFD."""
        if not self.done:
            self.finish_reason = reason
            self.text += self._decoder.decode(b"", final=True)

    def _cut_at_stop(self) -> bool:
        window_start = max(0, self._released - max(map(len, self._stop)))
        hits = [(i, s) for s in self._stop if (i := self.text.find(s, window_start)) >= 0]
        if not hits:
            return False
        at, self.stop_word = min(hits, key=lambda hit: hit[0])
        self.text = self.text[:at]
        return True

    def take_text(self) -> str:
        """Text that is safe to show now (nothing that may still turn into a stop string)."""
        end = len(self.text)
        if not self.done:
            end -= self._held_back()
        out = self.text[self._released : end]
        self._released = max(self._released, end)
        return out

    def _held_back(self) -> int:
        """Length of the longest suffix of the text that is a proper prefix of a stop string."""
        longest = 0
        for s in self._stop:
            for n in range(min(len(s) - 1, len(self.text)), longest, -1):
                if self.text.endswith(s[:n]):
                    longest = n
                    break
        return longest
