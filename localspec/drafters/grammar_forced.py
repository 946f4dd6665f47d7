"""Grammar-forced drafting: where a grammar leaves one way to go on, draft it without a model.

In constrained output (a JSON schema, a tool call) much of the text is dictated: keys,
quotes, colons, commas, enum values, closing braces. This drafter walks the grammar one byte
at a time from where the output stands, as long as exactly one byte is allowed, and drafts
the tokenization of that text; the target verifies the whole span in one batch (SGLang's
"jump-forward decoding" does the same outside speculation).

Optional whitespace is the one common fork (``space ::= " "?`` after every JSON token): the
drafter takes the branch the output took the last time the same character was followed by
the same next character (``": "`` after the first key means a space after every colon), and
before anything has been seen, the whitespace of ``json.dumps`` (a space after ``:`` and
``,``, none elsewhere). A wrong guess costs a shorter accepted draft,
never a wrong token: the target checks every drafted token against the grammar's mask.

Where nothing is forced (inside a value), the value is often being copied from the prompt
(extraction: names, dates, amounts). The drafter then looks the value's text so far up in
the prompt's text and drafts what follows it there. Text, not tokens: inside JSON a name
is tokenized after a quote, in the prompt after a space (``"Maria`` vs `` Maria``), so a
token n-gram lookup misses the copy that a text lookup finds.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from localspec.engine.drafting import Draft
from localspec.engine.grammar import GrammarState
from localspec.engine.model_context import ModelContext

WHITESPACE = frozenset(b" \t\n\r")
MAX_FORCED_BYTES = 256  # one walk's length (a draft is also capped in tokens)
VALUE_START = re.compile(rb'["\[{:,]\s*')  # what opens a JSON value (or a string's text)
MIN_COPY_KEY = 2  # bytes of a value needed before it is looked up in the prompt (a digit will do)
WORD_START = rb"(?:(?<=[\s\"'(\[{:,])|^)"
# A copy stops where a value most likely ends: at punctuation before a space (not the dots
# of an e-mail or a number), or after one more word. A long wrong tail costs
# verification time for nothing (on two extraction prompts, one more word drafted the most
# per target pass: docs/benchmarks.md).
_WORD = rb'(?:[^\s.,;:!?()\[\]{}"]|[.,;:!?](?=[^\s"]))'
COPIED_VALUE = re.compile(_WORD + rb"*(?:\s" + _WORD + rb"+)?")
COPY_BYTES = 128
# how far back the value being written and the whitespace style are looked for: every
# proposal reads it, so its cost must not grow with the answer
RECENT_BYTES = 4096
VALUE_ENDS = b'",}]'  # how a copied value is guessed to end, in order of preference


class ByteTokens:
    """The token of each single byte the vocabulary spells on its own (byte-level BPE has all
    256; SentencePiece has byte-fallback tokens), for checking a grammar byte by byte."""

    def __init__(self, backend: ModelContext) -> None:
        ids, values = [], []
        for value in range(128):  # the forced text of a grammar is ASCII punctuation and names
            tokens = backend.tokenize(chr(value), add_special=False, parse_special=False)
            if len(tokens) == 1 and backend.piece(tokens[0]) == bytes([value]):
                ids.append(tokens[0])
                values.append(value)
        eog = np.flatnonzero(backend._eog)
        self.ids = np.asarray([*ids, *eog], dtype=np.int32)
        self.values = values  # byte values of the first len(values) ids; EOG tokens after
        self.token_of = dict(zip(values, ids, strict=True))


class GrammarForcedDrafter:
    name = "grammar"
    catch_up_per_token: float | None = None  # follows the context for free

    def __init__(self, backend: ModelContext, state: GrammarState, bytes_: ByteTokens) -> None:
        """``state``: the grammar state of the generation (the loop advances it; this
        drafter only reads it, through clones)."""
        self.backend = backend
        self.state = state
        self.bytes = bytes_
        self._prompt_text = b""
        self._written = bytearray()  # the output so far, for the whitespace style
        self._seen = 0  # context tokens already in ``_written``

    def begin(self, prompt: Sequence[int]) -> None:
        self._seen = len(prompt)
        self._prompt_text = b"".join(self.backend.piece(token) for token in prompt)
        self._written.clear()

    def propose(self, context: Sequence[int], n_max: int) -> Draft:
        self._catch_up(context)
        walk = self.state.clone()
        try:
            text = self._walk(walk)
        finally:
            walk.close()
        if not text:
            return Draft()
        tokens = self.backend.tokenize(
            text.decode("utf-8", errors="ignore"), add_special=False, parse_special=False
        )
        return Draft(tokens[:n_max])

    def _catch_up(self, context: Sequence[int]) -> None:
        for token in context[self._seen :]:
            self._written += self.backend.piece(token)
        self._seen = len(context)

    def _walk(self, walk: GrammarState) -> bytes:
        """The draft's text: what the grammar forces from here; else a copy of the current
        value from the prompt, the value's end, and what the grammar forces after it."""
        text = bytearray()
        self._forced(walk, text)
        if text:
            return bytes(text)
        copied = self._copied_text()
        if copied:  # as much of it as the grammar allows (an integer stops at "-year-old")
            self._take(walk, copied, text)
            if text and self._take_value_end(walk, text):
                self._forced(walk, text)
        return bytes(text)

    def _forced(self, walk: GrammarState, text: bytearray) -> None:
        """Extend ``text`` by the bytes the grammar dictates (optional whitespace as seen
        before), advancing ``walk``."""
        start = len(text)
        while len(text) - start < MAX_FORCED_BYTES:
            options = self._next_bytes(walk)
            if options is None:
                return
            step = self._choose(options, text)
            if not step or not self._take(walk, step, text):
                return

    def _copied_text(self) -> bytes:
        """What followed the current value's text in the prompt, the last time it appeared."""
        recent = bytes(self._written[-RECENT_BYTES:])  # a value is short; the answer may not be
        starts = list(VALUE_START.finditer(recent))
        key = recent[starts[-1].end() :] if starts else b""
        if len(key) < MIN_COPY_KEY and not key.isdigit():
            return b""
        # a value copied from the prompt starts a word there (not "mar" inside "-marine")
        found = re.search(WORD_START + re.escape(key), self._prompt_text)
        if found is None:
            return b""
        rest = self._prompt_text[found.end() : found.end() + COPY_BYTES]
        copied = COPIED_VALUE.match(rest)
        return copied.group() if copied else b""

    def _take_value_end(self, walk: GrammarState, text: bytearray) -> bool:
        """Guess that a copied value ends here: close the string, or the number's field."""
        options = self._next_bytes(walk) or []
        for end in VALUE_ENDS:
            if end in options:
                return self._take(walk, bytes([end]), text)
        return False

    def _take(self, walk: GrammarState, step: bytes, text: bytearray) -> bool:
        """Advance ``walk`` by ``step`` while the grammar allows it; False if it stopped."""
        for value in step:
            token = self.bytes.token_of.get(value)
            if token is None or not walk.allows(token):
                return False
            walk.accept(token)
            text.append(value)
        return True

    def _next_bytes(self, walk: GrammarState) -> list[int] | None:
        """The bytes the grammar allows next; None where it could also end."""
        ok = walk.allowed(self.bytes.ids)
        n = len(self.bytes.values)
        if ok[n:].any():
            return None
        return [value for value, allowed in zip(self.bytes.values, ok[:n], strict=True) if allowed]

    def _choose(self, options: list[int], drafted: bytearray) -> bytes | None:
        """One forced byte; or at a whitespace fork, the whitespace run the output used
        before the same pair of characters, then the character; None at a real fork."""
        if len(options) == 1:
            return bytes(options)
        solid = [value for value in options if value not in WHITESPACE]
        if len(solid) != 1:
            return None
        written = bytes(self._written[-RECENT_BYTES:] + drafted)
        stripped = written.rstrip(bytes(WHITESPACE))
        if len(stripped) < len(written):
            return None  # inside whitespace the output chose: its length is not forced
        run = self._style(written, stripped[-1], solid[0]) if stripped else None
        if run is None:  # not seen yet: as json.dumps writes it
            run = b" " if stripped[-1:] in (b":", b",") else b""
        return run + bytes(solid)

    @staticmethod
    def _style(written: bytes, before: int, after: int) -> bytes | None:
        """The whitespace between ``before`` and ``after`` the last time they met."""
        pattern = re.escape(bytes([before])) + rb"([ \t\n\r]*)" + re.escape(bytes([after]))
        runs = re.findall(pattern, written)
        return runs[-1] if runs else None

    def accepted(self, n_accepted: int) -> None:
        """Stateless between rounds: the output is re-read from the context."""

    def close(self) -> None:
        self._written.clear()
