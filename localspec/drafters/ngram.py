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

A key found at several earlier places is drafted by what they agree on. A short key whose
places agree on a long continuation is copied text too: the same line written twice already
(the `return` of two reducer cases, the body of two handlers) is written a third time. Where
two of the key's places are followed by the same AGREED_STRONG tokens or more, the draft is
what they agree on and says it matched a strong key (the controller verifies it at once, as
a twelve-token match); a phrase of prose that recurs by chance is followed by two different
texts, and stays a weak match. And where every other place parts from the one drafted from
(the second reducer case ends where the first went on to the next), the draft stops there:
past it, it is one place's word against another's, and a long draft verified on a strong key
would be rejected whole half the time; the target's next token says which place goes on,
and the next round's key, holding it, matches that one alone. Off with ``min_n = size_n`` too.

In a fill-in-the-middle prompt (``[PRE] prefix [SUF] suffix [MID]``) the middle continues
the prefix, not the suffix before it: the lookup reads the prompt as ``[SUF] suffix [MID]
[PRE] prefix`` (given the model's FIM tokens), so that the first tokens of the middle
extend the prefix's last line as a key. A function started below its sibling then drafts
the sibling's body from its first token (the line ``...r *http.Request) {`` that both
share), where the suffix's end and ``[MID]`` match nothing and a few tokens had to be
written plainly before a key formed.

A re-alignment also says what was renamed: the source tokens the output skipped and what it
wrote in their place (``customers`` where it now writes ``orders``). The sibling uses the new
name again further on, where every copy would break anew; so, for the rest of the answer,
drafts copied from the history write the new name where the source has the old one. A rename
the output then does not follow (it wrote the old name after all) is forgotten. Numbers are
values, not names: a table's row copied with another value (``750`` for ``400``) is picked
back up after the number, not on one of its digits (the source's digits after a shared ``0``
are the old value's rest), and one number written for another is not learnt as a rename
(the next row's ``400`` stays ``400``).

A key's line can say what was renamed before any copy breaks: a function declared below
its sibling under another name (``handleGetUser(w http...`` above, ``handleGetInvoice(w
http...`` at the end) matches the sibling's line on a short key whose earlier tokens differ
by one span and then agree again: that span is a rename, learnt before the body is copied.
Given the model's tokenizer, a rename is also learnt as a word and written in each
spelling the tokenizer gives it (``renames.py``): ``user`` to ``invoice`` rewrites
``\tuser``, ``.User`` and ``(user`` alike, each one token the new name needs two for.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from localspec.drafters.field_lines import MAX_BACK, FieldOrder, next_lines
from localspec.drafters.fim_layout import first_suffix_line, middle_after_prefix, until_line
from localspec.drafters.renames import (
    RENAME_TOKENS,
    WordRenames,
    WordVocab,
    numeral,
    renamed_before_key,
)
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
# Tokens two earlier places of a short key must agree on for its draft to count as a strong
# match, and the match length it then says (``adaptive.STRONG_MATCH``); at most this many of
# the key's most recent places are compared with the one drafted from.
AGREED_STRONG = 12
STRONG_KEY = 12
AGREEING_PLACES = 8
# the most tokens at the history's end read back for the lines a field list drafts from
FIELD_TAIL = 256
# a FIM middle's lookup whose key holds fewer of the middle's own tokens than this is a weak
# match however long: the prefix's end recurs at every block's end, and which block comes
# next is the model's choice
MIDDLE_OWN = 2


@dataclass(frozen=True)
class CopyPlace:
    """Where a draft came from: the history index its first token was copied from, how long
    the history was when it was made, its tokens, for each the source index after it (a
    rename's tokens stand for the whole span they replace), and the renames it made
    (draft positions ``[start, end)`` and the source span replaced)."""

    source: int
    made_at: int
    tokens: list[int]
    ends: list[int]
    renamed: tuple[tuple[int, int, tuple[int, ...]], ...] = ()

    def followed(self, history: np.ndarray) -> int:
        """How many of its tokens the output wrote since it was made."""
        since = history[self.made_at :]
        n = 0
        while n < min(len(self.tokens), since.size) and since[n] == self.tokens[n]:
            n += 1
        return n

    def source_after(self, n: int) -> int:
        """The source index the copy stood at after its first ``n`` tokens."""
        return self.ends[n - 1] if n else self.source


@dataclass(frozen=True)
class Realignment:
    """Where a copy resumes, and the rename that made the output leave it: the source
    tokens skipped and what the output wrote instead (either may be empty)."""

    resume: int
    old: tuple[int, ...] = ()
    new: tuple[int, ...] = ()


@dataclass(frozen=True)
class NgramParams:
    size_n: int = 12
    size_m: int = 48
    min_hits: int = 1
    min_n: int = 4  # as --spec-ngram-simple-min-n: shorter keys mostly recur by chance


class NgramDrafter:
    name = "ngram-simple"
    catch_up_per_token: float | None = None  # follows the context for free

    def __init__(
        self,
        params: NgramParams | None = None,
        fim: tuple[int, int, int] | None = None,
        vocab: WordVocab | None = None,
    ) -> None:
        """``fim``: the model's FIM prefix, suffix and middle tokens; ``vocab``: the model's
        tokenizer, to learn renames as words (see the module's note)."""
        self.params = params or NgramParams()
        self.fim = fim
        self._vocab = vocab
        self._words = WordRenames(vocab) if vocab is not None else None
        self._fields = FieldOrder() if vocab is not None else None
        self._suffix_line = b""  # a FIM prompt's suffix's first line, where a middle ends
        self._middle_at = 0  # where a FIM prompt's middle starts in the history (0: none)
        self._history = np.zeros(0, dtype=np.int32)
        self._known: list[int] = []  # the context the history array was built from
        self._copy: CopyPlace | None = None  # the last draft's place (re-alignment)
        self._renames: dict[int, dict[tuple[int, ...], tuple[int, ...]]] = {}  # by first token
        self._forgotten: set[tuple[tuple[int, ...], tuple[int, ...] | None]] = set()
        self._digits: dict[int, bool] = {}

    def begin(self, prompt: Sequence[int]) -> None:
        self._sync(prompt)
        if self._fields is not None:
            self._fields.learn(self._text(prompt))

    def propose(self, context: Sequence[int], n_max: int) -> Draft:
        history = self._sync(context)
        self._forget_unfollowed_rename(history)
        size_m = min(self.params.size_m, n_max)
        if size_m <= 0:
            return Draft()
        draft = self._lookup(history, size_m)
        if draft.match < STRONG_KEY and (listed := self._field_lines(history, size_m)).tokens:
            draft = listed
        if self._middle_at and history.size - self._middle_at < MIDDLE_OWN:
            # the prefix alone says how the middle starts: a new case, another function...
            draft = replace(draft, match=min(draft.match, STRONG_KEY - 1))
        return self._before_suffix(history, draft) if self._suffix_line else draft

    @property
    def _exact(self) -> bool:
        """Whether the lookup is llama.cpp's own: the full key only, nothing else drafted."""
        return self.params.min_n >= self.params.size_n

    def _field_lines(self, history: np.ndarray, size_m: int) -> Draft:
        """The next lines of a field-by-field list the history ends in (``field_lines.py``),
        where the prompt declared the fields' order; no draft elsewhere."""
        if self._fields is None or not self._fields.after or self._exact:
            return Draft()
        following = next_lines(self._fields, self._last_lines(history, MAX_BACK + 1))
        if not following:
            return Draft()
        assert self._vocab is not None
        self._copy = None  # no copy to re-align with
        return Draft(self._vocab.tokenize(following, False, False)[:size_m])

    def _last_lines(self, history: np.ndarray, lines: int) -> str:
        """The text of the history's last ``lines`` whole lines and the line after them, read
        back token by token (at most FIELD_TAIL): it runs every step."""
        assert self._vocab is not None
        pieces: list[bytes] = []
        breaks = 0
        for token in history[::-1][:FIELD_TAIL].tolist():
            piece = self._vocab.piece(int(token))
            breaks += piece.count(b"\n")
            if breaks > lines:
                pieces.append(piece[piece.rfind(b"\n") + 1 :])
                break
            pieces.append(piece)
        return b"".join(reversed(pieces)).decode("utf-8", "replace")

    def _text(self, tokens: Sequence[int]) -> str:
        assert self._vocab is not None
        return b"".join(self._vocab.piece(int(t)) for t in tokens).decode("utf-8", "replace")

    def _lookup(self, history: np.ndarray, size_m: int) -> Draft:
        # one backward scan serves every key length (the drafter runs on every plain step
        # while speculation is paused, for shadow checks: it must cost microseconds)
        occurrences = tail_occurrences(history, self.params.size_n)
        exact = self._exact
        for n in self._key_lengths():
            want = size_m if n >= self.params.size_n else min(size_m, SHORT_KEY_FACTOR * n)
            start = find_last_match(history, n, self.params.min_hits, want, occurrences)
            if start is None:
                continue
            if exact:
                return self._copied(history, start + n, want, n)
            agreed, parted = agreement(history, occurrences, n, start, size_m)
            short = n < self.params.size_n
            if short and (renamed := renamed_before_key(history, n, start)) is not None:
                self._learn_rename(*renamed)
            if short and agreed >= AGREED_STRONG:
                return self._copied(history, start + n, agreed, STRONG_KEY)
            if parted and agreed:  # past it, the draft is one place's word against another's
                want = min(want, agreed)
            return self._copied(history, start + n, want, n)
        found = None if exact else realigned(history, self._copy, self._is_digit)
        if found is None:
            return Draft()
        self._learn_rename(found.old, found.new)
        return self._copied(history, found.resume, min(size_m, REALIGN_DRAFT), 1)

    def _before_suffix(self, history: np.ndarray, draft: Draft) -> Draft:
        """A middle's draft stops before a line that is the suffix's first: a copy of a
        sibling runs on past its end (``}`` and the next function) where the middle ends
        and the model writes its end token instead."""
        assert self._vocab is not None
        at_line_start = history.size > 0 and self._vocab.piece(int(history[-1])).endswith(b"\n")
        pieces = [self._vocab.piece(t) for t in draft.tokens]
        kept = until_line(pieces, self._suffix_line, at_line_start)
        return draft if kept == len(pieces) else Draft(draft.tokens[:kept], match=draft.match)

    def _copied(self, history: np.ndarray, source: int, want: int, match: int) -> Draft:
        if not self._renames and not (self._words and self._words.words):  # the common case
            tokens = history[source : source + want].tolist()
            ends = list(range(source + 1, source + 1 + len(tokens)))
            self._copy = CopyPlace(source, history.size, tokens, ends)
            return Draft(tokens, match=match)
        tokens, ends, renamed = [], [], []
        at = source
        while len(tokens) < want and at < history.size:
            old, new = self._rename_at(history, at)
            if not old and self._words and (rewritten := self._words.rewrite(int(history[at]))):
                old, new = (int(history[at]),), rewritten
                self._renames.setdefault(old[0], {})[old] = new
            if old:
                renamed.append((len(tokens), len(tokens) + len(new), old))
            else:
                old = new = (int(history[at]),)
            tokens.extend(new)
            ends.extend([at + len(old)] * len(new))
            at += len(old)
        tokens, ends = tokens[:want], ends[:want]
        self._copy = CopyPlace(source, history.size, tokens, ends, tuple(renamed))
        return Draft(tokens, match=match)

    def _rename_at(self, history: np.ndarray, at: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The rename whose old tokens start at ``at`` (the longest), or two empty spans."""
        best: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())
        for old, new in self._renames.get(int(history[at]), {}).items():
            if len(old) > len(best[0]) and tuple(history[at : at + len(old)].tolist()) == old:
                best = (old, new)
        return best

    def _learn_rename(self, old: tuple[int, ...], new: tuple[int, ...]) -> None:
        if (old, new) in self._forgotten:  # the output has since written the old name
            return
        if self._vocab is not None and numeral(self._text(old)) and numeral(self._text(new)):
            return  # a value, not a name: the sibling's other numbers differ otherwise
        if old and new and old != new and max(len(old), len(new)) <= RENAME_TOKENS:
            self._renames.setdefault(old[0], {})[old] = new
            if self._words is not None:
                self._words.learn(old, new)

    def _forget_unfollowed_rename(self, history: np.ndarray) -> None:
        """A rename the output did not write where the last draft put it is forgotten."""
        copy = self._copy
        if copy is None or not copy.renamed or history.size <= copy.made_at:
            return
        followed = copy.followed(history)
        if followed >= len(copy.tokens) or history.size - copy.made_at <= followed:
            return  # the whole draft written, or nothing written yet past what it followed
        for start, end, old in copy.renamed:
            if start <= followed < end:
                new = self._renames.get(old[0], {}).pop(old, None)
                self._forgotten.add((old, new))
                if self._words is not None and len(old) == 1:
                    self._words.forget(old[0])

    def _is_digit(self, token: int) -> bool:
        """Whether ``token`` is digits (a number's whole or part); False without a vocab."""
        if self._vocab is None:
            return False
        digit = self._digits.get(token)
        if digit is None:
            digit = self._digits[token] = self._vocab.piece(token).strip().isdigit()
        return digit

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
            self._renames, self._forgotten = {}, set()
            self._suffix_line, self._middle_at = b"", 0
            if self._words is not None:
                self._words.clear()
        if new:
            read = new
            if not self._known and self.fim is not None:
                read = middle_after_prefix(new, self.fim)
                if self._vocab is not None:
                    self._suffix_line = first_suffix_line(new, self.fim, self._vocab.piece)
                self._middle_at = new.index(self.fim[2]) + 1 if read is not new else 0
            self._known.extend(new)
            self._history = np.concatenate([self._history, np.asarray(read, dtype=np.int32)])
        return self._history

    def accepted(self, n_accepted: int) -> None:
        """Stateless between rounds: the history is re-synced from the context."""

    def close(self) -> None:
        self._history = np.zeros(0, dtype=np.int32)
        self._known = []
        self._copy = None
        self._renames, self._forgotten = {}, set()
        self._suffix_line, self._middle_at = b"", 0
        if self._words is not None:
            self._words.clear()


def realigned(
    history: np.ndarray,
    copy: CopyPlace | None,
    is_digit: Callable[[int], bool] = lambda token: False,
) -> Realignment | None:
    """Where the copy ``copy`` was taken from resumes, given the output since it was made
    (the end of ``history``): past the tokens the output followed, at the first of the next
    REALIGN_WINDOW source tokens that holds the output's last token; None if the output
    left the copy more than REALIGN_AFTER tokens ago, or nothing there matches.

    Not on a digit (``is_digit``) of the output's own: where it writes another number than
    the source (``750`` for ``400``), a digit it shares with the old one is as often the
    new number's middle as its end, and the source's digits after it are the old value's
    rest; the token after the number aligns the copy without doubt."""
    if copy is None or history.size <= copy.made_at:
        return None
    followed = copy.followed(history)
    departure = copy.source_after(followed)
    own = history.size - copy.made_at - followed  # the output's tokens since it left the copy
    if own == 0:
        return Realignment(departure) if departure < copy.made_at else None
    if own > REALIGN_AFTER or is_digit(int(history[-1])):
        return None
    window = history[departure : min(departure + REALIGN_WINDOW, copy.made_at - 1)]
    hits = np.flatnonzero(window == history[-1])
    if not hits.size:
        return None
    hit = int(hits[0])
    old = tuple(history[departure : departure + hit].tolist())
    new = tuple(history[copy.made_at + followed : -1].tolist())
    return Realignment(departure + hit + 1, old, new)


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


def agreement(
    history: np.ndarray,
    occurrences: tuple[np.ndarray, np.ndarray],
    n: int,
    start: int,
    most: int,
) -> tuple[int, bool]:
    """How the other earlier places of the ``n``-token key at ``start`` (the AGREEING_PLACES
    most recent) go on, against the ``most`` tokens after it: the longest stretch one of
    them repeats, and whether every one of them parts from it (a token differs before their
    text or ours runs out)."""
    ends, lengths = occurrences
    others = ends[lengths >= n] - (n - 1)
    others = others[others != start][-AGREEING_PLACES:]
    ours = history[start + n : start + n + most]
    agreed, parted = 0, bool(others.size)
    for other in others.tolist():
        theirs = history[other + n : other + n + ours.size]
        differ = np.flatnonzero(theirs != ours[: theirs.size])
        same = int(differ[0]) if differ.size else theirs.size
        agreed = max(agreed, same)
        parted = parted and bool(differ.size)
    return agreed, parted


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
