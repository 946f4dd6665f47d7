"""Renamed words, for a lookup drafter that copies renamed code.

A copy of a sibling function renames an identifier (``user`` to ``invoice``), and the new
name comes back in forms the tokenizer spells differently each time: ``\\tuser``, ``.User``
and ``(user`` are one token each, ``\\tin voice``, ``.In voice`` and ``(in voice`` two. A
rename learnt as tokens only replaces the one spelling it was seen in; learnt as a word,
it rewrites every source token whose text holds the old word (in its case forms), and the
rewritten text is tokenized as the model would write it."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

import numpy as np

RENAME_TOKENS = 6  # the longest span, old or new, a learnt rename replaces
RENAME_ANCHOR = 3  # tokens alike before a key's renamed span, for the rename to be learnt
# the lengths (old, new) a key's renamed span is looked for with, shortest first
RENAME_SPANS = sorted(
    ((old, new) for old in range(1, RENAME_TOKENS + 1) for new in range(1, RENAME_TOKENS + 1)),
    key=sum,
)
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
PARTS = re.compile(r"\w+|\W")
NOT_AFTER = r"(?<![A-Za-z0-9])"  # a word starts a token's text or follows a non-letter
NUMERAL = re.compile(r"[\s_.]*\d[\d\s_.]*")


class WordVocab(Protocol):
    def piece(self, token: int) -> bytes: ...

    def tokenize(
        self, text: str, add_special: bool = False, parse_special: bool = False
    ) -> list[int]: ...


class WordRenames:
    """Old words and their new names, learnt from token spans, applied to single tokens."""

    def __init__(self, vocab: WordVocab) -> None:
        self.vocab = vocab
        self.words: dict[str, str] = {}
        self._rewritten: dict[int, tuple[int, ...] | None] = {}

    def learn(self, old: Sequence[int], new: Sequence[int]) -> bool:
        """Learn the rename two token spans differ by, if it is one identifier for another
        (``\\tuser`` / ``\\tinvoice``); True if one was learnt."""
        renamed = renamed_word(self._text(old), self._text(new))
        if renamed is None:
            return False
        for before, after in case_forms(*renamed):
            self.words.setdefault(before, after)
        self._rewritten.clear()
        return True

    def rewrite(self, token: int) -> tuple[int, ...] | None:
        """The tokens of ``token``'s text with the learnt names, or None if it holds none."""
        if not self.words:
            return None
        if token in self._rewritten:
            return self._rewritten[token]
        text = self._text((token,))
        new = self._pattern().sub(lambda m: self.words[m.group(0)], text) if text else text
        tokens = tuple(self.vocab.tokenize(new, False, False)) if new != text else None
        self._rewritten[token] = tokens
        return tokens

    def forget(self, token: int) -> None:
        """The output did not write the rename of ``token``: drop the words that made it."""
        text = self._text((token,))
        for word in [w for w in self.words if re.search(NOT_AFTER + re.escape(w), text)]:
            del self.words[word]
        self._rewritten.clear()

    def clear(self) -> None:
        self.words.clear()
        self._rewritten.clear()

    def _pattern(self) -> re.Pattern[str]:
        longest_first = sorted(self.words, key=len, reverse=True)
        return re.compile(NOT_AFTER + "(?:" + "|".join(map(re.escape, longest_first)) + ")")

    def _text(self, tokens: Sequence[int]) -> str:
        try:
            return b"".join(self.vocab.piece(int(t)) for t in tokens).decode("utf-8")
        except UnicodeDecodeError:  # a character split across tokens: no word to read
            return ""


def renamed_word(old: str, new: str) -> tuple[str, str] | None:
    """The one identifier ``old`` has where ``new`` has another, the rest of the two texts
    alike (split into words and single other characters); None otherwise."""
    a, b = PARTS.findall(old), PARTS.findall(new)
    while a and b and a[0] == b[0]:
        a, b = a[1:], b[1:]
    while a and b and a[-1] == b[-1]:
        a, b = a[:-1], b[:-1]
    if len(a) != 1 or len(b) != 1:
        return None
    if not (IDENTIFIER.fullmatch(a[0]) and IDENTIFIER.fullmatch(b[0])):
        return None
    return a[0], b[0]


def numeral(text: str) -> bool:
    """Whether ``text`` is (part of) a number: digits, with spaces, points or separators."""
    return NUMERAL.fullmatch(text) is not None


def case_forms(old: str, new: str) -> list[tuple[str, str]]:
    """The rename as written, and in the other cases an identifier takes: ``User`` /
    ``Invoice`` also renames ``user`` and ``USER``."""
    forms = [
        (old, new),
        (old[0].lower() + old[1:], new[0].lower() + new[1:]),
        (old[0].upper() + old[1:], new[0].upper() + new[1:]),
        (old.upper(), new.upper()),
    ]
    return [(a, b) for a, b in dict(forms).items() if a != b]


def renamed_before_key(
    history: np.ndarray, n: int, start: int
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """What the line before a key renamed: the last ``n`` tokens occur at ``start`` but the
    token before them differs, and RENAME_ANCHOR tokens before that the two places are
    alike again (``handleGetUser(w http...`` and ``handleGetInvoice(w http...``): the
    source's span between is renamed to the output's: the shortest such pair (old, new)."""
    reach = RENAME_TOKENS + RENAME_ANCHOR
    end = history.size - n  # the output's span ends here, the source's at ``start``
    source = history[max(0, start - reach) : start].tolist()
    output = history[max(start, end - reach) : end].tolist()
    for old_len, new_len in RENAME_SPANS:
        if old_len + RENAME_ANCHOR > len(source) or new_len + RENAME_ANCHOR > len(output):
            continue
        anchor = source[-old_len - RENAME_ANCHOR : -old_len]
        if anchor == output[-new_len - RENAME_ANCHOR : -new_len]:
            old, new = tuple(source[-old_len:]), tuple(output[-new_len:])
            return (old, new) if old != new else None
    return None
