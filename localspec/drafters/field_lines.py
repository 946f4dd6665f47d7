"""The next lines of a field-by-field list, for a lookup drafter on code.

Code that maps one record to another writes a line per field, each in the same form
(``number=data["number"],``, ``invoiceId: row.invoice_id,``), in the order the fields are
declared elsewhere: a dataclass, an interface, another file's ``to_dict``. No earlier text
holds the next line, so a lookup has nothing to copy; but the line before gives its form and
the declarations give the next field's name. ``FieldOrder`` reads the declared orders from
the prompt (runs of lines at one indentation, each declaring a different name in the same
way) and writes the last line again with each declared name in it replaced by the next one.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from itertools import pairwise

# a line that declares a name: its first identifier (after indentation, an opening quote or
# a modifier), and what follows it, which every line of a run must share
DECLARED = re.compile(
    r"(?P<indent>[ \t]*)(?P<quote>[\"'])?(?:(?:pub|readonly|public|private|protected)\s+)?"
    r"(?P<name>[A-Za-z_]\w*)(?P<after>[\"']?\s*[:=,\"']|\s+\w)"
)
NAME = re.compile(r"[A-Za-z_]\w*")
# a line whose first name is padded to a column (gofmt's ``ID:         r.ID,``, aligned
# assignments): the name with its quotes and colon, then the padding
HEAD = re.compile(r"[ \t]*[\"']?[A-Za-z_]\w*[\"']?:?")
ALIGNED = re.compile(HEAD.pattern + r"(?=  +\S)")
# first words of statements, not of declarations
KEYWORDS = frozenset(
    NAME.findall(
        """return if elif else for while def class import from const let var function case break
        continue try except finally with pass raise throw await async yield assert print self
        this new delete type interface struct enum impl fn func switch default do in is not and
        or match use mod package export"""
    )
)
MIN_RUN = 3  # lines a run needs to declare an order
MAX_WORDS = 12  # a line with more words than this is prose, not a declaration
MAX_WORDS_SPACED = 4  # ... with a name and a space first (``Name string``, ``id INTEGER,``)
MAX_LINES = 8  # lines drafted ahead at most
MAX_BACK = 4  # lines before the one being written whose form it may take


class FieldOrder:
    """Declared names and the name declared after each."""

    def __init__(self) -> None:
        self.after: dict[str, str] = {}
        self._fields: set[str] = set()  # every name in an order (the keys and the values)

    def learn(self, text: str) -> None:
        """The orders declared in ``text`` (what was learnt before is forgotten)."""
        self.after, self._fields = {}, set()
        run: list[str] = []
        shape: tuple[str, str] | None = None
        for line in [*text.split("\n"), ""]:
            declared = _declared(line)
            if declared is not None and declared[1:] == shape and declared[0] not in run:
                run.append(declared[0])
                continue
            self._note(run)
            run, shape = ([declared[0]], declared[1:]) if declared else ([], None)

    def _note(self, run: list[str]) -> None:
        if len(run) >= MIN_RUN:
            self.after.update(pairwise(run))
            self._fields.update(run)

    def declares(self, line: str) -> bool:
        """Whether ``line`` is one of a list's lines: it names declared fields twice (its
        own name and the one it maps, ``profile.bio = form.cleaned_data["bio"]``)."""
        return self._maps(NAME.findall(line))

    def _maps(self, names: list[str]) -> bool:
        return sum(name in self._fields for name in names) >= 2

    def line_after(self, line: str, column_of: str | None = None) -> str | None:
        """``line`` (one of a list's lines) with each declared name in it replaced by the
        next one (padded to ``column_of``'s column, if that line is aligned: by default
        its own); None where none has a next one, or where the line names no field twice:
        a list that maps fields (``number=data["number"]``, ``invoiceId: row.invoice_id``),
        not one that gives each a value of its own (``image: postgres``)."""
        names = NAME.findall(line)
        if not self._maps(names) or not any(name in self.after for name in names):
            return None
        following = NAME.sub(lambda m: self.after.get(m.group(0), m.group(0)), line)
        return _aligned(following, column_of or line)

    def lines_after(self, line: str, column_of: str | None = None) -> Iterator[str]:
        """The lines that follow ``line`` in its list, as far as the orders go (padded as
        ``column_of`` is, by default ``line``)."""
        for _ in range(MAX_LINES + MAX_BACK):
            following = self.line_after(line, column_of or line)
            if following is None:
                return
            yield following
            line = following


def _declared(line: str) -> tuple[str, str, str] | None:
    """The name a line declares, its indentation and what follows the name (None: the line
    declares none: a statement, prose, a blank)."""
    found = DECLARED.match(line)
    if found is None or found["name"] in KEYWORDS:
        return None
    after = found["after"]
    separator = " " if NAME.match(after.lstrip()) else after.strip()[:1]
    if len(NAME.findall(line)) > (MAX_WORDS_SPACED if separator == " " else MAX_WORDS):
        return None
    return found["name"], found["indent"], (found["quote"] or "") + separator


def _aligned(line: str, model: str) -> str:
    """``line`` with what follows its first name starting at the column it starts at in
    ``model`` (the line it was made from), where that is padded to a column: a shorter or
    longer name keeps the alignment (at least one space)."""
    head, model_head = HEAD.match(line), ALIGNED.match(model)
    if head is None or model_head is None:
        return line
    column = len(model) - len(model[model_head.end() :].lstrip(" "))
    rest = line[head.end() :].lstrip(" ")
    return head.group(0) + " " * max(1, column - head.end()) + rest


def next_lines(order: FieldOrder, text: str) -> str:
    """What follows ``text`` (the end of what was written) where its last lines are a list's:
    the rest of the line being written and the lines after it, in the form most of the list's
    last lines that the line being written agrees with have, the nearest first (a list's lines
    differ: one writes ``date.fromisoformat(data["issued_on"])``, the others
    ``data["number"]``); "" where there is none."""
    *before, current = text.split("\n")
    listed: list[str] = []  # the list's last lines, the nearest first
    for line in reversed(before[-MAX_BACK:]):
        if not order.declares(line):
            break  # the list starts after this line
        listed.append(line)
    aligned = next((line for line in listed if ALIGNED.match(line)), None)
    candidates: list[list[str]] = []
    for back, line in enumerate(listed, start=1):
        lines = list(order.lines_after(line, aligned))
        if len(lines) < back:
            break
        if lines[back - 1].startswith(current):
            candidates.append(lines[back - 1 :])
    if not candidates:
        return ""
    firsts = [lines[0] for lines in candidates]
    chosen = max(candidates, key=lambda lines: firsts.count(lines[0]))
    return "\n".join(chosen)[len(current) :] + "\n"
