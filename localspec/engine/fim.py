"""Fill-in-the-middle: the prompt a code model completes between a prefix and a suffix, made
from the model's own FIM tokens, and where the middle it writes should end.

Layout (the repository-level pattern that Qwen2.5-Coder and llama.cpp's ``/infill`` use)::

    [FIM_REP]myproject\\n [FIM_SEP]name\\n text ... [FIM_SEP]filename\\n   (other files)
    [FIM_PRE] prefix [FIM_SUF] suffix [FIM_MID] typed

``typed`` is the text of the cursor's line before the cursor. It goes after the middle
token, as the start of the middle the model writes, rather than at the end of the prefix
(where llama-server puts it): while someone types on one line only ``typed`` changes, so the
cached prefix, suffix and other files stay valid and a keystroke re-reads a few tokens, not
the whole suffix. The model sees the same text either way, in its own order."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from localspec.engine.healing import healed_end
from localspec.errors import LocalspecError

# the names llama-server's /infill gives the repository and the file being edited: the same
# request then reads the same tokens here and there
PROJECT_NAME = "myproject"
CURRENT_FILE = "filename"
# what opens a Markdown code block: a chat-tuned model that has closed the code often goes
# on with a fence and prose about it ("```\n\nThis function...")
FENCE = "```"
# a line that opens a definition at a line's start (Python, JavaScript/TypeScript, Go, Rust,
# Kotlin, a decorator): once the middle has written code, a new top-level definition is the
# model going on with code of its own invention, not the code at the cursor (completion
# servers such as Tabby stop there too). Taken as a rule only in a file that has such lines.
DEFINITION = re.compile(
    r"@[A-Za-z_]|(?:(?:export|default|pub|public|private|async|static|abstract)\s+)*"
    r"(?:def|class|function\*?|func|fn|fun|struct|interface|impl|trait|enum)\s+[A-Za-z_$(]"
)
# a line at a line's start that may still become one: words and spaces so far
MAY_BE_DEFINITION = re.compile(r"@|@?[A-Za-z_$][\w$ *]*")
DEFINITION_CHARS = 48  # a line this long with no definition in it is none
# a string literal on one line: brackets inside it are text, not code
STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
OPENERS, CLOSERS = "([{", ")]}"
# a line written this many times in a row is a loop, not code (editors' completion plugins
# such as Continue stop there too)
REPEATS = 3
# a block of lines (2 to LOOP_LINES, with LOOP_CHARS of text) written twice in a row is a
# loop too: a small model that writes the same test case again and again (Tabby drops
# repeated blocks as well)
LOOP_LINES, LOOP_CHARS = 12, 24
# a line below the block's and the suffix's indentation that may still lead into the suffix:
# a branch or a label that continues the block, a C preprocessor directive
CONTINUES = re.compile(
    r"(?:\}\s*)?(?:else|elif|except|finally|catch|case|default)\b|[A-Za-z_]\w*:\s*$"
    r"|#\s*(?:if|ifdef|ifndef|elif|else|endif|define|undef|include|pragma)\b"
)
# a Python line that opens a block (``def f(a):``, ``if x:  # why``): the next code line must
# be indented under it
OPENS_PYTHON_BLOCK = re.compile(
    r"(?:async\s+)?(?:def|class|if|elif|else|for|while|try|except|finally|with)\b.*:\s*(?:#.*)?"
)
# what opens or closes a string of several lines (Python, JavaScript's template literals)
LONG_STRING = re.compile(r'"""|\'\'\'|`')
# a line of the suffix shorter than this (``}``, ``end``, ``)``) is too common to say that
# the middle has rejoined the suffix: the next lines are compared with it
DISTINCT_CHARS = 12
ANCHOR_LINES = 3
# a middle that ends on the suffix's last lines has rewritten the file's end (a function's
# `return x` is common: two lines and this many characters are not)
TAIL_LINES, TAIL_CHARS = 2, 24


class FimVocab(Protocol):
    """What making a FIM prompt needs of a model (``ModelContext``)."""

    @property
    def fim_tokens(self) -> dict[str, int]: ...

    def tokenize(
        self, text: str, add_special: bool = False, parse_special: bool = False
    ) -> list[int]: ...

    def piece(self, token: int) -> bytes: ...
    def is_eog(self, token: int) -> bool: ...


@dataclass(frozen=True)
class ExtraFile:
    """Another file's text the completion may draw on (llama.vim's ``input_extra``)."""

    text: str
    filename: str = "tmp"


@dataclass(frozen=True)
class FimPrompt:
    """What to fill: the text before the cursor (``prefix`` then ``typed``, the cursor's
    line so far), the text after it, and other files for context."""

    prefix: str
    suffix: str
    extra: Sequence[ExtraFile] = field(default_factory=tuple)
    typed: str = ""

    @classmethod
    def at_cursor(cls, before: str, after: str, extra: Sequence[ExtraFile] = ()) -> FimPrompt:
        """A prompt from the whole text before the cursor (OpenAI's ``prompt`` with a
        ``suffix``, Ollama's ``/api/generate``): its last line is what is being typed."""
        cut = before.rfind("\n") + 1
        return cls(before[:cut], after, tuple(extra), before[cut:])


REQUIRED = ("pre", "suf", "mid")


def missing_fim_tokens(vocab: FimVocab) -> list[str]:
    return [name for name in REQUIRED if vocab.fim_tokens.get(name, -1) < 0]


def fim_order(vocab: FimVocab) -> tuple[int, int, int] | None:
    """The prefix, suffix and middle tokens (what a lookup drafter reorders), or None."""
    if missing_fim_tokens(vocab):
        return None
    ids = vocab.fim_tokens
    return ids["pre"], ids["suf"], ids["mid"]


def check_fim(vocab: FimVocab, model_name: str) -> None:
    missing = missing_fim_tokens(vocab)
    if missing:
        names = ", ".join(f"FIM {m.upper()}" for m in missing)
        raise LocalspecError(
            f"{model_name} cannot fill in the middle: its vocabulary has no {names} token",
            "use a code model trained for it (Qwen2.5-Coder, CodeLlama, StarCoder...)",
        )


def fim_tokens(vocab: FimVocab, fim: FimPrompt, model_name: str = "the model") -> list[int]:
    """The prompt's tokens. Texts are tokenized as text: a file holding ``<|fim_middle|>``
    does not open a middle of its own."""
    check_fim(vocab, model_name)
    ids = vocab.fim_tokens

    def text(s: str) -> list[int]:
        return vocab.tokenize(s, add_special=False, parse_special=False) if s else []

    # the BOS token where the model wants one (what the tokenizer adds to nothing)
    tokens = vocab.tokenize("", add_special=True, parse_special=False)
    tokens += _repository(vocab, fim.extra, text)
    tokens += [ids["pre"], *text(fim.prefix), ids["suf"], *text(fim.suffix), ids["mid"]]
    return tokens + text(fim.typed)


def healed_fim_tokens(
    vocab: FimVocab, fim: FimPrompt, model_name: str = "the model"
) -> tuple[list[int], str]:
    """``fim_tokens`` with the typed text's last token given back to the model to write
    again (token healing, ``healing.py``), and that token's text: a line typed up to its
    indentation ends on a whitespace token after which the model's own tokens no longer fit
    (it wrote ``" return"`` after four typed spaces)."""
    tokens = fim_tokens(vocab, fim, model_name)
    typed = vocab.tokenize(fim.typed, add_special=False, parse_special=False) if fim.typed else []
    return healed_end(vocab, tokens, keep=len(tokens) - len(typed))


def _repository(vocab: FimVocab, extra: Sequence[ExtraFile], text) -> list[int]:  # type: ignore[no-untyped-def]
    """Other files before the one being edited: the repository pattern where the model has
    its tokens (always, as llama-server writes it), else each file after a plain-text
    separator."""
    ids = vocab.fim_tokens
    tokens: list[int] = []
    if ids.get("rep", -1) >= 0:
        tokens += [ids["rep"], *text(f"{PROJECT_NAME}\n")]
    sep = ids.get("sep", -1)
    for file in extra:
        head = [sep, *text(f"{file.filename}\n")] if sep >= 0 else text("\n\n--- snippet ---\n\n")
        tokens += head + text(file.text)
    if sep >= 0:  # the file being edited comes last, unnamed
        tokens += [sep, *text(f"{CURRENT_FILE}\n")]
    return tokens


@dataclass
class MiddleEnd:
    """Where the middle ends, checked as it is written (llama-server's ``/infill`` rules
    and one of its own):

    - ``n_indent``: a new line indented less than this ends it, before that line (the
      completion left the block being written);
    - ``time_limit_s``: past this time since the first token, it ends at the next new line;
    - the suffix: whole lines that repeat the suffix's first distinctive lines mean the model
      has rejoined it; the middle ends before them (and before the blank lines the suffix
      already starts with);
    - a code fence: in a file whose text around the cursor (``prefix``, ``suffix``) holds no
      ``FENCE``, a line that opens one means the model has left the code to write about it
      (Markdown, as a chat answer); the middle ends before that line;
    - a new definition: in a file with ``DEFINITION`` lines at a line's start, such a line
      after the middle has written code ends it, before that line (the model finished the
      code at the cursor and invents the next function);
    - a block left: a line indented less than the middle's first line (the cursor's line
      when it is not at a line's start), at the level of the suffix's first line, ends the
      middle before it where it closes a bracket the middle did not open (``}``, ``});``)
      and the suffix's first line closes one too, where it opens a definition (a sibling
      method), or where it is a statement (``print(add(5, 3))`` after a function's body,
      above the suffix's ``print(add(1, 2))``): the model finished the block at the cursor,
      and the suffix closes it or goes on after it (Tabby's scope rule; a doubled ``}`` or
      a line like the suffix's next otherwise). A closing line of the middle's own
      brackets, a branch that continues the block (``else:``) and a string's text are kept;
    - a block below: a line indented less than both the middle's block and the suffix's
      first line ends the middle before it (example usage at column 0 after a method,
      where the suffix goes on inside the class), unless it may lead back into the suffix
      (``else:``, ``case``, a label, a preprocessor directive) or is text in a string;
    - a loop: a line written ``REPEATS`` times in a row ends the middle after its first
      copy (a small model that writes one ``assert`` over and over to its token limit), as
      does a block of lines written twice in a row (``LOOP_LINES``, ``LOOP_CHARS``), and a
      block the middle began with, opened again at its level once it has closed: the
      header line written again (``it("keeps commas", () => {`` after the test's ``});``)
      ends the middle before it, without waiting for the second copy;
    - no body: with the cursor at a line's start under a Python line that opens a block
      (``def add(a, b):``), a middle whose first code line is not indented under it and
      is at the suffix's level (a call like the suffix's, at column 0), or opens a
      definition (a sibling method), has skipped the block's body: it ends before that
      line, with nothing (what it holds would not run). A body written one level short is
      kept (its text is the body; an editor re-indents it);
    - once the model has ended: lines it ended on that the suffix starts with (a closing
      ``};`` the suffix already has), or that the suffix ends with (the file's last lines,
      written again after skipping what came before them), are dropped, with the blank lines
      before them (``repeated_end``).

    ``feed`` takes the text as it comes and returns what may be sent now: text that a rule
    might still cut is held back until it is decided. The first line is never cut but by
    the no-body rule."""

    suffix: str = ""
    n_indent: int = 0
    time_limit_s: float | None = None
    prefix: str = ""  # the text before the cursor (whether it holds a fence, ends a line)
    text: str = ""  # everything kept so far
    sent: int = 0  # how much of ``text`` was released
    ended: bool = False  # a rule ended the middle (llama-server's stop type "limit")
    _anchor: list[str] = field(default_factory=list)
    _lead: str = ""
    _tail: list[str] = field(default_factory=list)
    _fence_ends: bool = False
    _definitions_end: bool = False
    _at_line_start: bool = True
    _suffix_level: int | None = None  # the indentation of the suffix's first whole line
    _suffix_closes: bool = False  # that line closes a bracket opened before it
    _opener_level: int | None = None  # the indentation of a Python block opener above the cursor

    def __post_init__(self) -> None:
        at_line_start = self._at_line_start = not self.prefix or self.prefix.endswith("\n")
        self._anchor, self._lead = suffix_anchor(self.suffix, at_line_start)
        self._tail = suffix_tail(self.suffix)
        self._fence_ends = FENCE not in self.prefix and FENCE not in self.suffix
        self._definitions_end = any(
            DEFINITION.match(line) for line in (self.prefix + "\n" + self.suffix).split("\n")
        )
        opener = next((line for line in reversed(self.prefix.split("\n")) if line.strip()), "")
        if at_line_start and OPENS_PYTHON_BLOCK.fullmatch(opener.strip()):
            self._opener_level = _indent(opener)
        first = suffix_first_line(self.suffix, at_line_start)
        if first is not None:
            self._suffix_level, self._suffix_closes = _indent(first), _lowest_depth(first) < 0

    @classmethod
    def of(cls, fim: FimPrompt, n_indent: int = 0, time_limit_s: float | None = None) -> MiddleEnd:
        """The end rules of ``fim``'s middle."""
        return cls(fim.suffix, n_indent, time_limit_s, prefix=fim.prefix + fim.typed)

    def feed(self, piece: str, elapsed_s: float = 0.0) -> str:
        """``piece``, written ``elapsed_s`` after the first token: what can be sent now."""
        if self.ended:
            return ""
        self.text += piece
        self._apply_rules()
        late = self.time_limit_s is not None and elapsed_s > self.time_limit_s
        if late and "\n" in piece:
            self._end_at_file_end()
            self.ended = True
        return self._release(final=self.ended)

    def finish(self) -> str:
        """The generation ended by itself (its last line is whole): the rules applied once
        more, what repeats the suffix's start or end dropped, everything still held back."""
        if not self.ended:
            self._apply_rules(final=True)
        first = self._first_break()
        if not self.ended and self.suffix and first < len(self.text):
            start = repeated_end(self.text, self.suffix, self._tail, after=first + 1)
            if start is not None:  # the first line whole, the blank lines before ``start`` not
                kept = self.text[: max(len(self.text[:start].rstrip()), first)]
                kept += "" if self.suffix[0] == "\n" else "\n"
                self.text = kept if len(kept) >= self.sent else self.text
        if not self.ended:
            self._end_at_file_end()
        return self._release(final=True)

    def _end_at_file_end(self) -> None:
        """The text ends here: without blank lines after it at the file's end (what was
        sent stays)."""
        kept = self._at_file_end(self.text)
        self.text = kept if len(kept) >= self.sent else self.text[: self.sent]

    def _first_break(self) -> int:
        """Where the first line ends (the end of the text while there is one line)."""
        at = self.text.find("\n")
        return len(self.text) if at < 0 else at

    def _apply_rules(self, final: bool = False) -> None:
        lines = self.text.split("\n")
        if self._lacks_body(lines, final):
            self.text, self.ended = "", True
            return
        for i in range(1, len(lines)):
            line, whole = lines[i], final or i < len(lines) - 1
            # each cut leaves out the blank lines the suffix starts with (``_cut``)
            if self.n_indent and line.strip() and _indent(line) < self.n_indent:
                return self._cut(lines, i)
            if self._fence_ends and self._opens_fence(line, final and i == len(lines) - 1):
                return self._cut(lines, i)
            if self._opens_definition(lines, i):
                return self._cut(lines, i)
            if whole and (self._leaves_block(lines, i) or self._below_block(lines, i)):
                return self._cut(lines, i)
            if whole and lines[i].rstrip() == self._reopened_head(lines, i):
                return self._cut(lines, i)
            if whole and self._copies(lines, i) >= REPEATS:
                return self._cut(lines, i - REPEATS + 2)
            if whole and (copy := self._block_copy(lines, i)) is not None:
                return self._cut(lines, copy)
            if whole and self._rejoins(lines, i, final):
                return self._cut(lines, i)

    def _lacks_body(self, lines: list[str], final: bool) -> bool:
        """Whether the middle's first code line, once whole, is not indented under the block
        opener the cursor is below and skips its body (see the class docstring)."""
        if self._opener_level is None or self.sent:
            return False
        first = self._first_code_line(lines)
        if first is None or (first == len(lines) - 1 and not final):
            return False
        line = lines[first]
        if _indent(line) > self._opener_level:
            return False
        return _indent(line) == self._suffix_level or bool(DEFINITION.match(line.lstrip()))

    def _awaits_body(self) -> bool:
        """Whether the middle may still be cut whole: below a block opener, no code yet, or a
        first code line not yet whole that is not indented under the opener."""
        if self._opener_level is None or self.sent:
            return False
        lines = self.text.split("\n")
        first = self._first_code_line(lines)
        if first is None:
            return True
        return first == len(lines) - 1 and _indent(lines[first]) <= self._opener_level

    @staticmethod
    def _first_code_line(lines: list[str]) -> int | None:
        return next((i for i, line in enumerate(lines) if _is_code(line)), None)

    @staticmethod
    def _opens_fence(line: str, cut_short: bool) -> bool:
        """Whether ``line`` opens a code fence (``cut_short``: the token limit ended the
        text on it, and what it holds so far may only be the start of one: held back while
        streaming, it is not sent as the completion's last line)."""
        written = line.strip()
        return written.startswith(FENCE) or (
            cut_short and bool(written) and FENCE.startswith(written)
        )

    def _opens_definition(self, lines: list[str], i: int, begun: bool = False) -> bool:
        """Line ``i`` opens a definition (``begun``: may be opening one) after code."""
        if not self._definitions_end or not any(line.strip() for line in lines[:i]):
            return False
        line = lines[i]
        if DEFINITION.match(line):
            return True
        may_be = len(line) < DEFINITION_CHARS and MAY_BE_DEFINITION.fullmatch(line)
        return begun and (not line or bool(may_be))

    def _block_level(self, lines: list[str], i: int) -> int | None:
        """The indentation of the block the middle is written in, as seen before line
        ``i``: its first non-blank line's (the cursor's line's when the cursor is not at a
        line's start); None while there is none."""
        if not self._at_line_start:
            return _indent(self.prefix[self.prefix.rfind("\n") + 1 :])
        first = next((line for line in lines[:i] if line.strip()), None)
        return None if first is None else _indent(first)

    def _may_leave_block(self, lines: list[str], i: int) -> bool:
        """Whether line ``i`` (whole or not) is at the suffix's level, below the block's."""
        level = self._block_level(lines, i)
        if self._suffix_level is None or level is None or self._suffix_level >= level:
            return False
        line = lines[i]
        return not line.strip() or _indent(line) == self._suffix_level

    def _leaves_block(self, lines: list[str], i: int) -> bool:
        """Whole line ``i`` leaves the middle's block at the suffix's level (see the class
        docstring): it closes a bracket opened before the middle where the suffix closes
        one too, opens a definition, or is a statement after the block."""
        line = lines[i]
        if not line.strip() or not self._may_leave_block(lines, i):
            return False
        if DEFINITION.match(line.lstrip()):
            return True
        if _lowest_depth(line) < 0:  # a closing line: the block's own, or the middle's
            return _bracket_depth(lines[:i]) + _lowest_depth(line) < 0 and self._suffix_closes
        return not CONTINUES.match(line.lstrip()) and not self._in_long_string(lines, i)

    def _below_levels(self, lines: list[str], i: int) -> bool:
        """Whether line ``i`` (whole or not) is indented less than both the middle's block
        and the suffix's first line (a line of blanks so far: may still be)."""
        level = self._block_level(lines, i)
        if self._suffix_level is None or level is None:
            return False
        return _indent(lines[i]) < min(level, self._suffix_level)

    def _below_block(self, lines: list[str], i: int) -> bool:
        """Whole line ``i`` leaves the block the suffix goes on in, below it (see the class
        docstring)."""
        line = lines[i]
        if not line.strip() or not self._below_levels(lines, i) or CONTINUES.match(line.lstrip()):
            return False
        return not self._in_long_string(lines, i)

    def _in_long_string(self, lines: list[str], i: int) -> bool:
        """Whether line ``i`` is text inside a string of several lines (Python's triple
        quotes, a template literal) opened before it."""
        before = self.prefix + "\n".join(lines[:i])
        return len(LONG_STRING.findall(before)) % 2 == 1

    def _block_copy(self, lines: list[str], i: int) -> int | None:
        """Where a second copy in a row of a block of lines ending at whole line ``i``
        starts (None: there is none)."""
        first = 0 if self._at_line_start else 1
        for size in range(2, LOOP_LINES + 1):
            start = i - size + 1
            if start - size < first:
                break
            block = [line.rstrip() for line in lines[start - size : start]]
            if _is_block(block) and [line.rstrip() for line in lines[start : i + 1]] == block:
                return start
        return None

    def _may_copy_block(self, lines: list[str], last: int) -> int | None:
        """Where the lines from some line to the last one (being written) may be starting a
        second copy of the block before them (None: nowhere)."""
        first = 0 if self._at_line_start else 1
        current = lines[last].rstrip()
        earliest = None
        for size in range(2, LOOP_LINES + 1):
            for done in range(size):  # whole lines of the copy written so far
                start = last - done
                if start - size < first:
                    break
                block = [line.rstrip() for line in lines[start - size : start]]
                written = [line.rstrip() for line in lines[start:last]]
                copying = written == block[:done] and block[done].startswith(current)
                if copying and _is_block(block) and (earliest is None or start < earliest):
                    earliest = start
        return earliest

    def _reopened_head(self, lines: list[str], i: int) -> str | None:
        """The middle's first line if it opens a block (``LOOP_CHARS`` of text or more) that
        has closed before line ``i`` (a line at its level, none below it, between them):
        line ``i`` written as that line opens the block again (None: no such line)."""
        first = 0 if self._at_line_start else 1
        head = next((k for k in range(first, i) if lines[k].strip()), None)
        if head is None:
            return None
        line = lines[head].rstrip()
        opens = _bracket_depth([line]) > 0 or line.endswith(":")
        if len(line.strip()) < LOOP_CHARS or not opens:
            return None
        level = _indent(line)
        between = [_indent(text) for text in lines[head + 1 : i] if text.strip()]
        return line if level in between and min(between) >= level else None

    def _copies(self, lines: list[str], i: int) -> int:
        """How many copies in a row of line ``i`` end there (0 for a blank line; the first
        line counts when the cursor is at a line's start: it is then a whole line)."""
        first = 0 if self._at_line_start else 1
        line = lines[i].rstrip()
        if i < first or not line.strip():
            return 0
        k = i
        while k > first and lines[k - 1].rstrip() == line:
            k -= 1
        return i - k + 1

    def _rejoins(self, lines: list[str], i: int, final: bool = False) -> bool:
        """Whole lines from ``i`` on repeat the anchor (blank lines between them aside)."""
        if not self._anchor or lines[i].strip() != self._anchor[0]:
            return False
        whole = [line.strip() for line in (lines[i:] if final else lines[i:-1]) if line.strip()]
        return whole[: len(self._anchor)] == self._anchor

    def _cut(self, lines: list[str], i: int) -> None:
        kept = "\n".join(lines[:i]) + "\n"
        if self._lead and (kept + _indent_of(lines[i])).endswith(self._lead):
            kept = (kept + _indent_of(lines[i]))[: -len(self._lead)]
        kept = self._at_file_end(kept)
        self.text = kept if len(kept) >= self.sent else self.text[: self.sent]
        self.ended = True

    def _at_file_end(self, text: str) -> str:
        """``text`` without the blank lines after its last line where nothing but blanks
        follows the cursor: at a file's end they would stay in the file (a suffix that
        starts with a new line ends that line itself)."""
        if self.suffix.strip() or not text.strip():
            return text
        body = text.rstrip()
        ends_line = "\n" in text[len(body) :] and not self.suffix.startswith("\n")
        return body + ("\n" if ends_line else "")

    def _release(self, final: bool) -> str:
        end = len(self.text) if final else self._undecided_from()
        out = self.text[self.sent : end]
        self.sent = max(self.sent, end)
        return out

    def _undecided_from(self) -> int:
        """Where the text a rule may still cut begins: a last line whose indentation is not
        known yet, and lines that may be the start of the suffix's anchor (with the new
        line before them, which a rejoined suffix's own blank lines would take away)."""
        if self._awaits_body():
            return 0
        lines = self.text.split("\n")
        last = len(lines) - 1
        hold = last + 1
        if self.n_indent and last >= 1 and not lines[last].strip():
            hold = last
        if self._fence_ends and last >= 1 and FENCE.startswith(lines[last].strip()):
            hold = last  # a fence may be opening
        if last >= 1 and self._opens_definition(lines, last, begun=True):
            hold = last  # a definition may be opening
        if last >= 1 and (self._may_leave_block(lines, last) or self._below_levels(lines, last)):
            hold = last  # a line that may leave the block
        run = self._copies(lines, last - 1) if last >= 1 else 0
        if run and lines[last - 1].rstrip().startswith(lines[last].rstrip()):
            hold = min(hold, last - run + 1)  # a loop's second copy and on may be cut
        head = self._reopened_head(lines, last) if last >= 1 else None
        if head is not None and lines[last] and head.startswith(lines[last].rstrip()):
            hold = min(hold, last)  # the block the middle began with may be opening again
        copy = self._may_copy_block(lines, last) if last >= 1 else None
        if copy is not None:
            hold = min(hold, copy)  # a block's second copy may be being written
        if self._anchor:  # from the first line on which the rest may begin the anchor
            begins = (k for k in range(1, last + 1) if self._may_begin_anchor(lines[k:]))
            hold = min(hold, next(begins, last + 1))
        held = len(self.text)
        if hold <= last:
            held = sum(len(line) + 1 for line in lines[:hold]) - 1  # the new line before it too
        if not self.suffix.strip():  # at the file's end: trailing blank lines, maybe dropped
            held = len(self.text[:held].rstrip())
        first = self._first_break()
        if not self.ended and self.suffix and first < len(self.text):
            held = min(held, may_repeat_end(self.text, self.suffix, self._tail, first + 1))
            # with the blank lines before it, which a cut or a repeated end leaves out with
            # it (as the suffix's own); the first line's text is never held
            held = max(len(self.text[:held].rstrip()), first)
        return held

    def _may_begin_anchor(self, tail: list[str]) -> bool:
        """Whether these lines (the last one being written) may be the anchor's start."""
        *whole_lines, current = tail
        whole = [line.strip() for line in whole_lines if line.strip()]
        if whole != self._anchor[: len(whole)]:
            return False
        written = current.strip()
        return not written or (
            len(whole) < len(self._anchor) and self._anchor[len(whole)].startswith(written)
        )


def suffix_anchor(suffix: str, at_line_start: bool = False) -> tuple[list[str], str]:
    """The suffix's first distinctive whole lines (stripped), and the text of the suffix
    before them (what a middle rejoining it writes first: the new line that ends the
    cursor's line, blank lines, indentation). The suffix's first line is the rest of the
    cursor's line, whole only when the cursor is at a line's start (``at_line_start``)."""
    start = _whole_lines_start(suffix, at_line_start)
    if start is None:
        return [], ""
    anchor: list[str] = []
    lead_end = None
    offset = start
    for line in suffix[start:].split("\n"):
        if line.strip():
            if lead_end is None:
                lead_end = offset + len(line) - len(line.lstrip())
            anchor.append(line.strip())
            if sum(len(a) for a in anchor) >= DISTINCT_CHARS or len(anchor) == ANCHOR_LINES:
                break
        offset += len(line) + 1
    if not anchor or sum(len(a) for a in anchor) < DISTINCT_CHARS:
        return [], ""
    lead = suffix[max(start - 1, 0) : lead_end]
    return anchor, lead


def suffix_first_line(suffix: str, at_line_start: bool = False) -> str | None:
    """The suffix's first non-blank whole line (None: it has none)."""
    start = _whole_lines_start(suffix, at_line_start)
    if start is None:
        return None
    return next((line for line in suffix[start:].split("\n") if line.strip()), None)


def _whole_lines_start(suffix: str, at_line_start: bool) -> int | None:
    """Where the suffix's whole lines start: at once when the cursor is at a line's start,
    else after the rest of the cursor's line (None: the suffix is that rest alone)."""
    if at_line_start:
        return 0
    end = suffix.find("\n")
    return None if end < 0 else end + 1


def _is_code(line: str) -> bool:
    """Whether a Python line holds code (a comment may sit at any indentation)."""
    written = line.strip()
    return bool(written) and not written.startswith("#")


def _is_block(lines: list[str]) -> bool:
    """Whether these lines are enough of a block for two copies of it to be a loop."""
    written = [line.strip() for line in lines if line.strip()]
    return len(written) >= 2 and sum(len(line) for line in written) >= LOOP_CHARS


def _code(line: str) -> str:
    """A line without its one-line string literals."""
    return STRING.sub('""', line)


def _bracket_depth(lines: Sequence[str]) -> int:
    """Brackets opened less brackets closed in these lines."""
    code = "".join(_code(line) for line in lines)
    return sum(code.count(c) for c in OPENERS) - sum(code.count(c) for c in CLOSERS)


def _lowest_depth(line: str) -> int:
    """The lowest bracket depth reached along the line, from 0 at its start."""
    depth = lowest = 0
    for c in _code(line):
        depth += (c in OPENERS) - (c in CLOSERS)
        lowest = min(lowest, depth)
    return lowest


def suffix_tail(suffix: str) -> list[str]:
    """The suffix's last non-blank lines (stripped), as few as are distinctive (at least
    ``TAIL_LINES`` and ``TAIL_CHARS``), at most ``ANCHOR_LINES``; none where they are not."""
    lines = [line.strip() for line in suffix.split("\n") if line.strip()]
    for k in range(TAIL_LINES, min(ANCHOR_LINES, len(lines)) + 1):
        if sum(len(line) for line in lines[-k:]) >= TAIL_CHARS:
            return lines[-k:]
    return []


def _line_starts(text: str, after: int) -> list[int]:
    """Where the lines of ``text`` from position ``after`` (a line's start) on start."""
    return [after] + [i + 1 for i in range(after, len(text)) if text[i] == "\n"]


def _starts_suffix(written: str, suffix: str) -> bool:
    """Whether ``written`` (from a line's start) is the suffix's first whole lines, trailing
    blanks aside."""
    end = written.rstrip()
    return bool(end) and suffix.startswith(end) and suffix[len(end) : len(end) + 1] in ("", "\n")


def repeated_end(text: str, suffix: str, tail: list[str], after: int) -> int | None:
    """Where the lines that ``text`` (a finished middle) ends on start, if they repeat the
    suffix's first lines (whole) or its last ones (``tail``, blank lines aside); else None.
    Lines before ``after`` are never taken."""
    for start in _line_starts(text, after):
        if _starts_suffix(text[start:], suffix):
            return start
    lines = text[after:].split("\n")
    written = [i for i, line in enumerate(lines) if line.strip()]
    if tail and [lines[i].strip() for i in written[-len(tail) :]] == tail:
        return after + sum(len(line) + 1 for line in lines[: written[-len(tail)]])
    return None


def may_repeat_end(text: str, suffix: str, tail: list[str], after: int) -> int:
    """Where the text that ``repeated_end`` may take, once the middle has ended, starts: the
    suffix's start or its ``tail`` begun on the last lines written (the end of the text
    where neither is; the caller holds trailing blanks back too)."""
    starts = [len(text)]
    for start in _line_starts(text, after):
        written = text[start:]  # the suffix's start, begun or whole
        if written.strip() and (suffix.startswith(written) or _starts_suffix(written, suffix)):
            starts.append(start)
            break
    *whole, current = text[after:].split("\n")
    nonblank = [i for i, line in enumerate(whole) if line.strip()]
    for k in range(min(len(tail), len(nonblank)), 0, -1):
        if [whole[i].strip() for i in nonblank[-k:]] != tail[:k]:
            continue
        if not current.strip() or (k < len(tail) and tail[k].startswith(current.strip())):
            starts.append(after + sum(len(line) + 1 for line in whole[: nonblank[-k]]))
            break
    if tail and current.strip() and tail[0].startswith(current.strip()):
        starts.append(len(text) - len(current))
    return min(starts)


def _indent(line: str) -> int:
    return len(_indent_of(line))


def _indent_of(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]
