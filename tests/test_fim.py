"""Fill-in-the-middle: the prompt made from the model's FIM tokens, where a middle ends, and
llama-server's /infill and /completion plus OpenAI's ``suffix`` over real HTTP on the real
Qwen2.5-Coder-0.5B (which has FIM tokens), shaped as llama.vim and Tabby send them."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st

from localspec import Engine, ExtraFile, FimPrompt
from localspec.engine.fim import MiddleEnd, fim_tokens, suffix_anchor
from localspec.engine.loop import RoundEvent
from localspec.engine.stats import Stats
from localspec.errors import LocalspecError
from localspec.lossless import compare
from localspec.server.app import ServerSettings
from localspec.server.fim_stream import ended_at_suffix
from tests.test_server import LiveServer, health, post, requests_counted, wait_for

# ----- where a middle ends (pure) -----------------------------------------------------------

FIB_SUFFIX = "\n\nprint(fibonacci(10))\n"
FIB_MIDDLE = " <= 1:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n"


def fed(end: MiddleEnd, text: str, sizes: list[int]) -> str:
    """``text`` fed in pieces of these sizes (then one piece each), and what came out."""
    out, at = "", 0
    for size in sizes:
        if end.ended or at >= len(text):
            break
        out += end.feed(text[at : at + size])
        at += size
    while not end.ended and at < len(text):
        out += end.feed(text[at])
        at += 1
    return out + end.finish()


def test_a_middle_that_rejoins_the_suffix_ends_before_it() -> None:
    end = MiddleEnd(FIB_SUFFIX)
    out = fed(end, FIB_MIDDLE + "\nprint(fibonacci(10))\n# more\n", [3])
    assert end.ended and out == FIB_MIDDLE.rstrip("\n")  # the suffix's own blank line dropped
    assert suffix_anchor(FIB_SUFFIX) == (["print(fibonacci(10))"], "\n\n")


def test_a_middle_at_the_file_s_end_leaves_no_blank_lines_after_it() -> None:
    """Nothing but blanks after the cursor (the file's end): blank lines after the middle's
    last line would stay in the file, whether a rule ends the middle or the model does; a
    suffix that starts with a new line ends the middle's last line itself."""
    cursor = "def add(a, b):\n    "
    for suffix, middle in (
        ("", "return a + b\n"),
        ("\n", "return a + b"),
        ("\n\n", "return a + b"),
    ):
        for written in ("return a + b\n\n\ndef sub(a, b):\n", "return a + b\n\n"):
            for sizes in ([], [13], [len(written)]):
                end = MiddleEnd.of(FimPrompt.at_cursor(cursor, suffix, ()))
                assert fed(end, written, sizes) == middle, (suffix, written, sizes)
    # a suffix with text keeps the blank line the file has before it
    sibling = FimPrompt(SIBLING, "    def balance(self):\n        return 0\n")
    assert fed(MiddleEnd.of(sibling), "        return 2\n\n    def x(self):\n", []) == (
        "        return 2\n\n"
    )


def test_a_common_short_line_is_not_taken_for_the_suffix() -> None:
    """``}`` alone is everywhere: the anchor takes lines until it is distinctive."""
    anchor, _ = suffix_anchor("\n}\n}\n\nint main() {\n")
    assert anchor == ["}", "}", "int main() {"]
    end = MiddleEnd("\n}\n}\n\nint main() {\n")
    body = "x += 1;\n}\n}\n"  # closes like the suffix, then goes on differently
    assert fed(end, body + "void other() {\n", [5]) == body + "void other() {\n"
    assert not end.ended


QUOTED_TEST = '  it("keeps commas inside quoted fields", () => {'
LINES_OF_A_BLOCK = ["", "  });", '    expect(parse("a,b")).toEqual(["a", "b"]);', "    x = 1"]
LINES_OF_A_BLOCK += ['  it("splits", () => {', "# Example usage:", "\t}", QUOTED_TEST]
HANDLER = "func (s *Server) handleGetInvoice(w http.ResponseWriter, r *http.Request) {\n"
IF_BLOCK = "def f(a):\n    if a:\n"
TEST_CASE = 'describe("parse", () => {\n  it("keeps commas", () => {\n'
SIBLING = "class Ledger:\n    def paid(self):\n        return 1\n\n    def refunded(self):\n"


def test_a_middle_that_closes_the_block_the_suffix_closes_ends_before_it() -> None:
    """The model finished the function at the cursor and closed it, or went on to the next
    test or method, or the statement after the block: the suffix already closes the block
    (no doubled ``}``) or goes on after it."""
    body = "\tinvoice := s.store.Invoice(id)\n\tif invoice == nil {\n\t\treturn\n\t}\n"
    end = MiddleEnd.of(FimPrompt(HANDLER, "}\n"))
    assert fed(end, body + "}\n\nfunc (s *Server) other() {\n", [4]) == body and end.ended
    test = '    const f = parse(\'"a,b",c\');\n    expect(f).toEqual(["a,b", "c"]);\n'
    more = '  });\n\n  it("trims", () => {\n    expect(parse(" a")).toEqual(["a"]);\n'
    assert fed(MiddleEnd.of(FimPrompt(TEST_CASE, "  });\n});\n")), test + more, [3]) == test
    method = "        return 2\n\n"  # a blank line between methods, as the file has
    written = method + "    def pending(self):\n        return 3\n"
    sibling = FimPrompt(SIBLING, "    def balance(self):\n        return 0\n")
    assert fed(MiddleEnd.of(sibling), written, [2]) == method
    after = "    y = 2\n"  # a statement after the method, where the suffix goes on
    assert fed(MiddleEnd.of(FimPrompt(SIBLING, "    z = 3\n")), "        x = 1\n" + after, []) == (
        "        x = 1\n"
    )
    at_cursor = FimPrompt("def add(a, b):\n    ", "\n\nprint(add(1, 2))\n")
    assert fed(MiddleEnd.of(at_cursor), "return a + b\n\nprint(add(5, 3))\n", [3]) == "return a + b"


def test_a_middle_without_the_body_of_the_block_above_the_cursor_is_empty() -> None:
    """The cursor at column 0 under ``def add(a, b):``: a middle whose first code line is
    not indented under it (a call like the suffix's: the 0.5B's greedy answer) would not
    run, and nothing of it is sent, however it comes, nor of a sibling method written in
    place of the body; a body (one level short too: an editor re-indents it), a comment
    first, a deeper line after blank ones, and a cursor under no block opener are kept."""
    no_body = FimPrompt("def add(a, b):\n", "\nprint(add(1, 2))\n")
    for written in ("print(add(3, 4))\n```\n", "\nprint(add(3, 4))\nprint(add(5, 6))\n"):
        for sizes in ([], [1], [3], [len(written)]):
            end = MiddleEnd.of(no_body)
            assert fed(end, written, sizes) == "" and end.ended, (written, sizes)
    end = MiddleEnd.of(FimPrompt("class A:\n    def f(self):  # why\n", "\n    def g(self):\n"))
    assert fed(end, "    # the body next\n    pass\n", [2]) == ""  # at the suffix's level
    skipped = '    def __str__(self):\n        return "Ledger"\n'  # refunded's body skipped
    assert fed(MiddleEnd.of(FimPrompt(SIBLING, "\n")), skipped, []) == ""
    short = "    if not self.items:\n        return None\n    return self.items.pop()\n"
    stack = FimPrompt("class Stack:\n    def pop(self):\n", "\n\ndef make_stack():\n")
    assert fed(MiddleEnd.of(stack), short, [3]) == short  # the body, one level short
    for prefix, written in (
        ("def add(a, b):\n", "    return a + b\n"),
        ("def add(a, b):\n", "# note\n    return a + b\n"),
        ("if ready:\n", "\n    go()\n"),
        ("x = 1\n", "y = 2\n"),
    ):
        assert fed(MiddleEnd.of(FimPrompt(prefix, "\nprint(add(1, 2))\n")), written, [2]) == (
            written
        ), prefix


def test_a_middle_keeps_its_own_closing_lines_and_text_at_the_suffix_s_level() -> None:
    """What closes the middle's own brackets, a file's end written by the middle itself,
    text at another level than the suffix's, and a string's lines are no block's end."""
    own = "\tif ok {\n\t\treturn\n\t}\n\tdone()\n"
    assert fed(MiddleEnd.of(FimPrompt(HANDLER, "}\n")), own, [2]) == own
    closed = "\treturn nil\n}\n"  # nothing after the cursor: the middle closes the function
    assert fed(MiddleEnd.of(FimPrompt(HANDLER, "")), closed, []) == closed
    query = '    rows = db.run("""\nSELECT id\nFROM t\n""")\n    return rows\n'
    assert fed(MiddleEnd.of(FimPrompt("def load(db):\n", "\nprint(1)\n")), query, [3]) == query
    branch = "        a = 1\n    else:\n        a = 2\n"  # at the suffix's level, continuing
    assert fed(MiddleEnd.of(FimPrompt(IF_BLOCK, "    return a\n")), branch, [2]) == branch


def test_a_middle_that_goes_below_the_block_the_suffix_is_in_ends_before_it() -> None:
    """Code at column 0 after a method, where the suffix goes on inside the class (a small
    model's example usage), or a function closed where the suffix goes on in it: the model
    left the block the suffix is in. A branch that leads back into it, a label, a directive
    and a string's text are kept."""
    method = '    def __str__(self):\n        return "Ledger"\n\n'
    usage = "# Example usage:\nledger = Ledger()\nprint(ledger)\n"
    after_body = FimPrompt(SIBLING + "        return 2\n\n", "\n    def balance(self):\n")
    assert fed(MiddleEnd.of(after_body), method + usage, [3]) == method
    closed = "    a += 1;\n  }\n"  # the suffix returns from the function the middle closed
    nested = FimPrompt("function f(a) {\n  if (a) {\n", "  return a;\n}\n")
    assert fed(MiddleEnd.of(nested), closed + "}\n\nf(2);\n", [2]) == closed
    branch = FimPrompt("def f(a):\n    if a:\n", "        return 2\n")
    kept = "        a += 1\n        return a\n    else:\n"
    assert fed(MiddleEnd.of(branch), kept, [4]) == kept
    directive = "        x = 1;\n#endif\nagain:\n        y = 2;\n"
    assert fed(MiddleEnd.of(FimPrompt("int f() {\n", "        return x;\n")), directive, []) == (
        directive
    )
    query = '        rows = db.run("""\nSELECT id\nFROM t\n""")\n'
    method_body = FimPrompt("class Store:\n    def load(self, db):\n", "        return rows\n")
    assert fed(MiddleEnd.of(method_body), query, [5]) == query


def test_a_block_written_twice_in_a_row_ends_the_middle_after_its_first_copy() -> None:
    """A small model writing the same test case again and again to its token limit; a block
    too small to say so (a closing ``}`` pair) is kept."""
    case = '  it("splits", () => {\n    expect(parse("a,b")).toEqual(["a", "b"]);\n  });\n\n'
    end = MiddleEnd.of(FimPrompt(TEST_CASE, "  });\n});\n"))
    assert fed(end, case * 3 + '  it("sp', [7]) == case and end.ended
    closing = "    }\n  }\n    }\n  }\n"
    assert fed(MiddleEnd.of(FimPrompt("", "x\n")), closing, [3]) == closing


def test_a_middle_that_opens_its_first_block_again_ends_before_it() -> None:
    """A small model that began by writing the cursor's ``it(`` line again, closed the test
    and opens it once more: the middle ends as soon as that line is whole, not after the
    second copy. The line written again inside the block, before the block has closed, or a
    first line that opens no block, is kept."""
    body = '    expect(parseCsvLine("a,b")).toEqual(["a", "b"]);\n  });\n\n'
    test = QUOTED_TEST + "\n" + body
    end = MiddleEnd.of(FimPrompt(TEST_CASE, "  });\n});\n"))
    assert fed(end, test + QUOTED_TEST + "\n", [4]) == test and end.ended
    inside = QUOTED_TEST + "\n  " + QUOTED_TEST + "\n"
    assert fed(MiddleEnd.of(FimPrompt(TEST_CASE, "x\n")), inside, [4]) == inside
    unclosed = QUOTED_TEST + "\n    x = 1;\n" + QUOTED_TEST + "\n"
    assert fed(MiddleEnd.of(FimPrompt(TEST_CASE, "x\n")), unclosed, [4]) == unclosed
    statement = '  total = sum(row["amount"] for row in rows)\n  rows = []\n'
    twice = statement + statement.split("\n")[0] + "\n"
    assert fed(MiddleEnd.of(FimPrompt("def f(rows):\n", "x\n")), twice, [4]) == twice


@given(
    st.lists(st.integers(1, 9), max_size=40),
    st.lists(st.sampled_from(LINES_OF_A_BLOCK), min_size=1, max_size=4),
    st.integers(1, 3),
    st.sampled_from(["", "  it(", "  });\n", "x = 1"]),
    st.sampled_from(["", "def f(x):\n", SIBLING, TEST_CASE + "    x"]),
)
def test_a_block_s_copies_do_not_depend_on_how_the_text_is_cut(
    sizes: list[int], block: list[str], copies: int, tail: str, prefix: str
) -> None:
    """However the copies of a block come, the same middle as fed one character at a time."""
    text = "\n".join(block) + "\n"
    text = text * copies + tail
    for suffix in ("  });\n});\n", "\n    def balance(self):\n", "x"):
        one_by_one = fed(MiddleEnd(suffix, prefix=prefix), text, [])
        assert fed(MiddleEnd(suffix, prefix=prefix), text, sizes) == one_by_one


def test_a_line_indented_less_than_n_indent_ends_the_middle() -> None:
    end = MiddleEnd(n_indent=4)
    out = fed(end, "x = 1\n    y = 2\n\ndef other():\n    pass\n", [2])
    assert end.ended and out == "x = 1\n    y = 2\n"  # at the file's end: no blank line kept


def test_past_the_time_limit_the_middle_ends_at_a_new_line() -> None:
    end = MiddleEnd(time_limit_s=0.5)
    assert end.feed("a = 1", 0.1) == "a = 1"
    assert end.feed(" + 2", 0.6) == " + 2" and not end.ended  # no new line yet
    assert end.feed("\n", 0.7) == "\n" and end.ended
    assert end.feed("b = 3\n", 0.8) == ""


def test_a_middle_that_opens_a_code_fence_ends_before_it() -> None:
    """A chat-tuned model that closed the code and goes on to explain it in Markdown."""
    fim = FimPrompt("function f(a) {\n  if (a) {\n", "\nf(1);\n")
    end = MiddleEnd.of(fim)
    out = fed(end, "    a += 1;\n  }\n}\n```\n\nThis function adds one.", [4])
    assert end.ended and out == "    a += 1;\n  }\n}\n"
    assert fed(MiddleEnd.of(fim), "x\n  ```js\nprose", [1]) == "x\n"  # indented, or named
    # the token limit ends the text on a fence's first backticks: not sent as code
    assert fed(MiddleEnd.of(fim), "    a += 1;\n``", [2]) == "    a += 1;\n"


def test_a_file_that_has_fences_keeps_them_in_the_middle() -> None:
    """Markdown, or a docstring with an example block: a fence is the file's own text."""
    written = "usage:\n```python\nparse('1x2')\n```\n"
    doc = FimPrompt('def parse(text):\n    """Parse.\n\n    ```python\n', "")
    assert fed(MiddleEnd.of(doc), written, [3]) == written
    assert fed(MiddleEnd.of(FimPrompt("# Notes\n", "```sh\nmake\n```\n")), written, []) == written


DEBOUNCE_SUFFIX = "  };\n}\n\nexport function throttle(fn, ms) {\n  let last = 0;\n"
DEBOUNCE_BODY = "    clearTimeout(timer);\n    timer = setTimeout(() => fn(...args), ms);\n"
AREA_SUFFIX = '\n\ndef main():\n    print(area(2.0))\n\n\nif __name__ == "__main__":\n    main()\n'
AREA_MAIN = '\n\n\nif __name__ == "__main__":\n    main()\n'


def test_a_middle_that_ends_on_the_suffix_s_first_lines_leaves_them_out() -> None:
    """The model closed the function and stopped: the suffix already closes it."""
    end = MiddleEnd(DEBOUNCE_SUFFIX)
    assert fed(end, DEBOUNCE_BODY + "  };\n}\n", [4]) == DEBOUNCE_BODY
    assert fed(MiddleEnd(DEBOUNCE_SUFFIX), DEBOUNCE_BODY + "  };\n}", []) == DEBOUNCE_BODY
    # going on after the closing lines, it still closed what the suffix closes
    more = DEBOUNCE_BODY + "  };\n}\n\nexport const wait = 1;\n"
    assert fed(MiddleEnd(DEBOUNCE_SUFFIX), more, [3]) == DEBOUNCE_BODY


def test_a_middle_that_ends_on_the_suffix_s_last_lines_leaves_them_out() -> None:
    """The model skipped ``main`` and wrote the file's end: the suffix has it."""
    body = "    return math.pi * radius ** 2"
    # (the statement at the suffix's level after the body ends it too, keeping one newline)
    assert fed(MiddleEnd(AREA_SUFFIX), body + AREA_MAIN, [5]).rstrip("\n") == body
    # one common closing line is no file's end: a function may well end as the suffix's does
    common = "\n\ndef g(x):\n    y = x + 1\n    return result\n"
    middle = "    result = 2 * x\n    return result\n"
    assert fed(MiddleEnd(common), middle, []) == middle


LOADERS = "def load_customers(path):\n    return read(path, Customer)\n\n\ndef load_orders(path):\n"
TOTALS = "\n\n\ndef total_spent(orders):\n    return sum(o.amount for o in orders)\n"
ORDERS_BODY = "    rows = json.loads(path.read_text())\n    return [Order(**row) for row in rows]\n"


def test_a_middle_that_goes_on_to_a_new_definition_ends_before_it() -> None:
    """The model filled the function at the cursor, then invented the next one."""
    more = ORDERS_BODY + "\n\ndef export_customers(customers, path):\n    pass\n"
    end = MiddleEnd.of(FimPrompt(LOADERS, TOTALS))
    assert fed(end, more, [3]) == ORDERS_BODY.rstrip("\n") and end.ended  # the suffix's \n\n\n
    for invented in ("@dataclass\nclass Line:\n", "async def later():\n", "class Line:\n"):
        assert fed(MiddleEnd.of(FimPrompt(LOADERS, "")), ORDERS_BODY + invented, []) == ORDERS_BODY
    js = FimPrompt("export function add(a, b) {\n", "\nexport function sub(a, b) {\n}\n")
    body = "  return a + b;\n}\n"  # the blank line after it is the suffix's own
    assert fed(MiddleEnd.of(js), body + "\nexport function mul(a, b) {\n", [2]) == body


def test_a_definition_is_kept_where_it_is_the_middle_s_own_start_or_the_file_has_none() -> None:
    """A cursor between two functions: the middle may be one whole function (not two); a
    file with no definition at a line's start (prose, a config) keeps such lines."""
    one = "def export_orders(orders, path):\n    write(path, orders)\n"
    top = FimPrompt(LOADERS + "    return read(path, Order)\n\n\n", TOTALS)
    written = fed(MiddleEnd.of(top), "\n" + one + "\n\ndef more():\n", [4])
    assert written == "\n" + one.rstrip("\n")  # the new lines after it are the suffix's
    notes = "The importer:\nclass names come from the header.\n"
    assert fed(MiddleEnd.of(FimPrompt("# Notes\n", "")), notes, [1]) == notes
    calls = "print(load_orders(PATH))\nfunctional = True\n"  # no ``function`` keyword
    assert fed(MiddleEnd.of(top), calls, [2]) == calls


def test_a_middle_that_loops_on_one_line_ends_after_its_first_copy() -> None:
    """A small model writes one assert to its token limit: the editor gets it once. Two
    copies in a row may be meant (``stack.pop()`` twice), and lines blank or partly written
    are no loop."""
    fim = FimPrompt('def test_slugify():\n    assert slugify("a b") == "a-b"\n', "")
    line = '    assert slugify("é") == "e"\n'
    end = MiddleEnd.of(fim)
    assert fed(end, line * 9, [5]) == line and end.ended
    twice = "    stack.pop()\n" * 2 + "    return stack\n"
    assert fed(MiddleEnd.of(fim), twice, [3]) == twice
    assert fed(MiddleEnd.of(fim), "x\n\n\n\ny\n", [1]) == "x\n\n\n\ny\n"
    typed = FimPrompt("def f():\n", "", typed="    g()")  # the first line is the typed one's end
    assert fed(MiddleEnd.of(typed), "\n    g()\n    g()\n", []) == "\n    g()\n    g()\n"


FENCED = "a\n``\n`x\n```js"
MIDDLES = [FIB_MIDDLE + "\nprint(fibonacci(10))\nx\n", "a\n  b\nc\n", "q\n\n\npr", FENCED]


@given(
    st.lists(st.integers(1, 7), max_size=40),
    st.sampled_from(
        [
            (DEBOUNCE_SUFFIX, DEBOUNCE_BODY + "  };\n}\n"),
            (DEBOUNCE_SUFFIX, DEBOUNCE_BODY + "  };  \n \n}\n\n"),
            (DEBOUNCE_SUFFIX, "x\n  };\n}\n\nexport function throttle(fn, ms) {\n  y"),
            (AREA_SUFFIX, "    return 1" + AREA_MAIN),
            (AREA_SUFFIX, "    return 1  \n\nif __name__ == x\n\n" + AREA_MAIN + "  "),
            (AREA_SUFFIX, "r\ndef main():\n    print(area(2.0))\n\n\nif __name__"),
        ]
    ),
)
def test_a_repeated_end_does_not_depend_on_how_the_text_is_cut(
    sizes: list[int], case: tuple[str, str]
) -> None:
    """What a finished middle leaves out of its end was never sent, however it came."""
    suffix, text = case
    assert fed(MiddleEnd(suffix), text, sizes) == fed(MiddleEnd(suffix), text, [])


LINES = ["  };", "}", "", "  ", "    x = 1;  ", "export function throttle(fn, ms) {", "```"]
LINES += ['if __name__ == "__main__":', "    main()", "def main():", "    print(area(2.0))"]
LINES += ["    if (timer) {", "\t", "x", "    main()  ", "def other(x):", "@cache", "de", "class"]
LINES += ["print(x)", "async function later() {", "  });", "    def g(self):", "\t}"]
LINES += ["# Example usage:", "else:", "#endif", 's = """', "        deep = 1", QUOTED_TEST]


@given(
    st.lists(st.integers(1, 9), max_size=30),
    st.lists(st.tuples(st.sampled_from(LINES), st.integers(1, 3)), min_size=1, max_size=8).map(
        lambda runs: [line for line, times in runs for _ in range(times)]  # loops too
    ),
    st.booleans(),
    st.sampled_from(
        [DEBOUNCE_SUFFIX, AREA_SUFFIX, FIB_SUFFIX, "  };\n}\n", "\n\n  };\n", "x", "}\n", "  });\n"]
    ),
    st.sampled_from(["", "def f(x):\n", "def f(x):\n    y =", HANDLER, TEST_CASE + "    x"]),
    st.integers(0, 4),
)
def test_every_end_rule_together_does_not_depend_on_how_the_text_is_cut(
    sizes: list[int], lines: list[str], newline: bool, suffix: str, prefix: str, n_indent: int
) -> None:
    """Lines of the suffix, blanks, fences, definitions, repeated lines and code in any order,
    streamed in any pieces: the same middle as fed one character at a time (nothing sent is
    ever taken back)."""
    text = "\n".join(lines) + ("\n" if newline else "")
    for before, after in ((prefix, suffix), (SIBLING, "\n    def balance(self):\n")):
        one_by_one = fed(MiddleEnd(after, n_indent, prefix=before), text, [])
        assert fed(MiddleEnd(after, n_indent, prefix=before), text, sizes) == one_by_one


@given(
    st.lists(st.integers(1, 7), max_size=40),
    st.sampled_from(MIDDLES),
    st.integers(0, 4),
)
def test_what_comes_out_does_not_depend_on_how_the_text_is_cut(
    sizes: list[int], text: str, n_indent: int
) -> None:
    """Streamed in any pieces, the middle is the same as fed one character at a time, and
    nothing sent is ever taken back."""
    one_by_one = fed(MiddleEnd(FIB_SUFFIX, n_indent), text, [])
    assert fed(MiddleEnd(FIB_SUFFIX, n_indent), text, sizes) == one_by_one
    assert text.startswith(one_by_one) or one_by_one == FIB_MIDDLE.rstrip("\n")


# ----- the prompt ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(qwen_path: Path) -> Iterator[Engine]:
    with Engine.load(qwen_path, mode="ngram-simple", n_ctx=2048, parallel=2) as engine:
        yield engine


def test_the_prompt_puts_other_files_first_and_what_is_typed_after_the_middle_token(
    engine: Engine,
) -> None:
    target = engine.target
    fim = FimPrompt("def f():\n", "\nf()\n", (ExtraFile("X = 1\n", "a.py"),), "    return")
    text = b"".join(target.piece(t) for t in fim_tokens(target, fim)).decode()
    repository = "<|repo_name|>myproject\n<|file_sep|>a.py\nX = 1\n<|file_sep|>filename\n"
    assert text.startswith(repository)
    assert text.endswith("<|fim_prefix|>def f():\n<|fim_suffix|>\nf()\n<|fim_middle|>    return")
    # a file holding a FIM token's text does not open a middle of its own
    tricky = fim_tokens(target, FimPrompt("a<|fim_middle|>", "b"))
    assert tricky.count(target.fim_tokens["mid"]) == 1
    assert FimPrompt.at_cursor("x = 1\ny = ", "\nz") == FimPrompt("x = 1\n", "\nz", (), "y = ")


def test_a_model_without_fim_tokens_is_refused_with_a_clear_error(smollm_path: Path) -> None:
    with (
        Engine.load(smollm_path, n_ctx=512) as small,
        pytest.raises(LocalspecError, match="cannot fill in the middle"),
    ):
        small.generate(FimPrompt("def f(", "):"), max_tokens=4)


# ----- over HTTP ----------------------------------------------------------------------------

HELPERS = """def parse_point(text):
    x, y = text.split(",")
    return Point(float(x), float(y))


def parse_size(text):
    w, h = text.split("x")
    return Size(float(w), float(h))
"""
PREFIX = "from geometry import Point, Size, Rect\n\n\ndef parse_rect(text):\n"
SUFFIX = "\n\n\ndef area(rect):\n    return rect.size.w * rect.size.h\n"


def vim_request(typed: str = "    x", **changes: object) -> dict[str, object]:
    """An /infill request as llama.vim sends it."""
    body: dict[str, object] = {
        "input_prefix": PREFIX,
        "input_suffix": SUFFIX,
        "input_extra": [{"filename": "parsing.py", "text": HELPERS}],
        "prompt": typed,
        "n_predict": 64,
        "n_indent": 4,
        "top_k": 40,
        "top_p": 0.99,
        "temperature": 0,
        "stream": False,
        "samplers": ["top_k", "top_p", "infill"],
        "cache_prompt": True,
        "t_max_prompt_ms": 500,
        "t_max_predict_ms": 3000,
        "return_tokens": True,
    }
    return {**body, **changes}


@pytest.fixture(scope="module")
def base(engine: Engine) -> Iterator[str]:
    with LiveServer(engine, ServerSettings()) as url:
        yield url


def test_infill_fills_the_gap_as_plain_decoding_would(base: str, engine: Engine) -> None:
    r = post(base, "/infill", vim_request())
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["stop"] is True and got["stop_type"] in ("eos", "limit")
    assert got["content"].strip() and "def area" not in got["content"]
    fim = FimPrompt(PREFIX, SUFFIX, (ExtraFile(HELPERS, "parsing.py"),), "    x")
    plain = engine.generate(fim, max_tokens=64, mode="none", record_margins=True)
    report = compare(plain.tokens, plain.margins, got["tokens"], plain.runners_up)
    assert report.identical or report.near_tie, report
    assert got["timings"]["predicted_n"] == got["tokens_predicted"] == len(got["tokens"])


def test_a_renamed_sibling_is_drafted_from_the_middle_s_first_tokens(engine: Engine) -> None:
    """A Go handler below its sibling under another name (``handleGetUser`` above,
    ``handleGetInvoice`` at the cursor): the lookup reads the middle as the prefix's
    continuation and learns the rename from that line, so the sibling's body is drafted
    with ``invoice`` for ``user`` in each spelling the tokenizer gives it (``\\tinvoice``,
    ``.Invoice``, ``(invoice``: two tokens each, one for the old name); the answer is plain
    decoding's."""
    from localspec.commands.bench_fim import fim_cases

    case = next(c for c in fim_cases() if c.name == "go-sibling-handler")
    plain = engine.generate(case.prompt, max_tokens=110, mode="none", record_margins=True)
    spec = engine.generate(case.prompt, max_tokens=110, mode="ngram-simple")
    report = compare(plain.tokens, plain.margins, spec.tokens, plain.runners_up)
    assert report.identical or report.near_tie, report
    assert "invoice, err := s.store.Invoice(" in spec.text and "Encode(invoice)" in spec.text
    piece = engine.target.piece
    renamed = [d for t, d in zip(spec.tokens, spec.from_draft, strict=True) if piece(t) == b"voice"]
    # drafted at its uses (a round may end between "in" and "voice": that one is the target's)
    assert len(renamed) >= 3 and sum(renamed) >= len(renamed) - 1, renamed
    assert sum(spec.from_draft) >= 0.8 * len(spec.tokens)


def test_keystrokes_reread_only_what_was_typed(base: str) -> None:
    """llama.vim after each word: the prefix, the suffix and the other files stay cached
    (``n_predict: 0`` warms the cache first, as llama.vim does)."""
    generated = generated_tokens(base)
    warm = post(base, "/infill", vim_request(n_predict=0))
    assert warm.status_code == 200, warm.text
    assert warm.json()["content"] == "" and warm.json()["tokens_predicted"] == 0
    assert generated_tokens(base) == generated  # nor in the metrics (and the log)
    for typed in ("    x, y,", "    x, y, w,", "    x, y, w, h = "):
        got = post(base, "/infill", vim_request(typed, n_predict=8)).json()
        timings = got["timings"]
        assert timings["prompt_n"] <= 8, timings
        assert timings["cache_n"] == got["tokens_evaluated"] - timings["prompt_n"] > 80


def generated_tokens(base: str) -> float:
    name = "localspec_generated_tokens_total "
    lines = httpx.get(f"{base}/metrics").text.splitlines()
    return next(float(line.removeprefix(name)) for line in lines if line.startswith(name))


@pytest.mark.parametrize("stream", [False, True])
def test_a_keystroke_after_a_middle_cut_short_lands_on_its_cache(base: str, stream: bool) -> None:
    """A middle cut by the server (here its time limit) leaves its slot at once: the next
    keystroke, sent as soon as the answer came, finds its prefix cached there rather than
    in a free slot that must read the whole prompt again."""
    for i, typed in enumerate(("    a,", "    a, b,", "    a, b, c,", "    a, b, c, d =")):
        body = vim_request(typed, n_predict=64, t_max_predict_ms=1, stream=stream)
        with httpx.stream("POST", f"{base}/infill", json=body, timeout=120) as r:
            lines = [line for line in r.iter_lines() if line]
        got = json.loads(lines[-1].removeprefix("data: "))
        assert got["stop_type"] in ("limit", "eos", "word"), got
        if i:
            assert got["timings"]["prompt_n"] <= 8, (typed, got["timings"])


def test_response_fields_pick_what_llama_vim_reads(base: str) -> None:
    """The fields llama.vim asks for (its info line shows them): every one answered."""
    fields = [
        "content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms",
        "timings/prompt_per_second", "timings/predicted_n", "timings/predicted_ms",
        "timings/predicted_per_token_ms", "timings/predicted_per_second", "truncated",
        "tokens_cached",
    ]  # fmt: skip
    got = post(base, "/infill", vim_request(n_predict=4, response_fields=fields)).json()
    assert set(got) == set(fields)
    assert 0 < got["timings/predicted_n"] <= 4
    per_token = got["timings/predicted_ms"] / got["timings/predicted_n"]
    assert got["timings/predicted_per_token_ms"] == pytest.approx(per_token, abs=1e-3)
    assert got["timings/prompt_per_second"] >= 0 and got["timings/prompt_per_token_ms"] >= 0


def test_completion_streams_llama_server_events_without_done(base: str) -> None:
    """``/completion`` as Tabby and Continue's llama.cpp provider call it."""
    body = {"prompt": "def add(a, b):\n", "n_predict": 24, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{base}/completion", json=body, timeout=120) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line]
    events = [json.loads(line.removeprefix("data: ")) for line in lines]
    assert all(line.startswith("data: ") for line in lines) and "[DONE]" not in lines[-1]
    assert [e["stop"] for e in events] == [False] * (len(events) - 1) + [True]
    last = events[-1]
    assert last["stop_type"] in ("eos", "limit") and last["timings"]["predicted_n"] > 0
    whole = post(base, "/completion", {**body, "stream": False}).json()
    assert "".join(e["content"] for e in events) == whole["content"]
    cut = post(base, "/completion", {**body, "stream": False, "stop": [whole["content"][4:8]]})
    assert cut.json()["stop_type"] == "word"
    assert cut.json()["stopping_word"] == whole["content"][4:8]


@pytest.mark.parametrize("path", ["/completion", "/infill"])
def test_a_client_that_leaves_a_stream_is_counted_and_logged(
    base: str, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Its generation stops, its slot is freed, and it is counted as 499 and logged as the
    other APIs' are (it was neither: the cancelled stream skipped its end)."""
    long_middle = {  # a list that takes many lines to fill
        "input_prefix": "# The 50 US states, one per line\nSTATES = [\n",
        "input_suffix": "",
        "prompt": "    ",
        "n_predict": 400,
        "temperature": 0,
        "stream": True,
    }
    body = long_middle if path == "/infill" else {
        "prompt": "Write a long essay about the history of computing.\n",
        "n_predict": 400, "temperature": 0, "ignore_eos": True, "stream": True,
    }  # fmt: skip
    left_before = requests_counted(base, path, 499)
    with caplog.at_level(logging.INFO, logger="localspec"):
        with httpx.stream("POST", f"{base}{path}", json=body, timeout=120) as r:
            assert r.status_code == 200
            next(line for line in r.iter_lines() if line)  # one event, then leave
        wait_for(lambda: health(base)["slots_busy"] == 0, seconds=10)  # within a step
        wait_for(lambda: requests_counted(base, path, 499) == left_before + 1, seconds=10)
    assert any(f"{path} " in m and "client went away" in m for m in caplog.messages)


@pytest.mark.parametrize("n_predict", [-1, None])
def test_no_n_predict_or_minus_one_writes_until_the_answer_ends(
    base: str, n_predict: int | None
) -> None:
    """llama-server's default: no token limit (OpenAI's completions default of 16 is not)."""
    body = {"prompt": "def fibonacci(n):\n", "temperature": 0, "stop": ["\n\n"]}
    if n_predict is not None:
        body["n_predict"] = n_predict
    got = post(base, "/completion", body).json()
    assert got["tokens_predicted"] > 16 and got["stop_type"] in ("word", "eos"), got
    infill = {"input_prefix": "def fibonacci(n):\n", "input_suffix": FIB_SUFFIX, "prompt": ""}
    infill |= {k: v for k, v in body.items() if k in ("temperature", "n_predict")}
    middle = post(base, "/infill", infill).json()
    assert middle["tokens_predicted"] > 16, middle  # ended by the model or a middle's rule


def test_a_middle_that_leaves_the_code_for_prose_ends_at_the_fence(base: str) -> None:
    """The 0.5B instruct model closes this function and explains it in Markdown (a fence,
    then prose): every route that fills a middle sends the code only."""
    prefix = "export function cartReducer(state, action) {\n  switch (action.type) {\n"
    prefix += '    case "add": {\n'
    prefix += "      return { ...state, items: [...state.items, action.item] };\n    }\n"
    suffix = '    case "clear": {\n      return { ...state, items: [] };\n    }\n'
    suffix += "    default:\n      return state;\n  }\n}\n"
    plain = post(base, "/completion", {"prompt": "x", "n_predict": 1}).json()  # warm
    assert plain["tokens_predicted"] == 1
    body = {"input_prefix": prefix, "input_suffix": suffix, "n_predict": 96, "temperature": 0}
    infill = post(base, "/infill", body).json()
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="none")
    suffixed = client.completions.create(
        model="m", prompt=prefix, suffix=suffix, max_tokens=96, temperature=0
    )
    for content in (infill["content"], suffixed.choices[0].text):
        assert content.strip() and "```" not in content, content


def test_a_middle_that_goes_on_to_invent_functions_ends_before_them(base: str) -> None:
    """The 0.5B instruct model fills ``pop`` and goes on with ``peek``, ``is_empty``, ``size``
    and ``main`` of its own: every route that fills a middle sends ``pop``'s body only."""
    prefix = "class Stack:\n    def __init__(self):\n        self.items = []\n\n"
    prefix += "    def push(self, item):\n        self.items.append(item)\n\n    def pop(self):\n"
    suffix = "\n\n\ndef make_stack():\n    return Stack()\n"
    body = {"input_prefix": prefix, "input_suffix": suffix, "n_predict": 96, "temperature": 0}
    infill = post(base, "/infill", body).json()
    with httpx.stream("POST", f"{base}/infill", json={**body, "stream": True}, timeout=120) as r:
        events = [json.loads(line.removeprefix("data: ")) for line in r.iter_lines() if line]
    streamed = "".join(event["content"] for event in events)
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="none")
    suffixed = client.completions.create(
        model="m", prompt=prefix, suffix=suffix, max_tokens=96, temperature=0
    )
    assert infill["stop_type"] == "limit" and infill["tokens_predicted"] < 64, infill  # of 96
    for content in (infill["content"], streamed, suffixed.choices[0].text):
        assert "return self.items.pop()" in content and "def " not in content, content


GET_USER = "package api\n\n"
GET_USER += "func (s *Server) handleGetUser(w http.ResponseWriter, r *http.Request) {\n"
GET_USER += '\tuser, err := s.store.User(r.Context(), r.URL.Query().Get("id"))\n'
GET_USER += "\tif err != nil {\n\t\thttp.Error(w, err.Error(), http.StatusNotFound)\n"
GET_USER += "\t\treturn\n\t}\n"
GET_USER += "\tjson.NewEncoder(w).Encode(user)\n}\n\n"


def test_a_middle_that_closes_the_function_leaves_the_suffix_s_brace_alone(base: str) -> None:
    """The 0.5B instruct model writes the handler's body, its closing ``}`` and another
    handler of its own: the suffix has that ``}``, the editor gets the body alone."""
    prefix = GET_USER + HANDLER
    body = {"input_prefix": prefix, "input_suffix": "}\n", "n_predict": 96, "temperature": 0}
    infill = post(base, "/infill", body).json()
    with httpx.stream("POST", f"{base}/infill", json={**body, "stream": True}, timeout=120) as r:
        events = [json.loads(line.removeprefix("data: ")) for line in r.iter_lines() if line]
    assert infill["stop_type"] == "limit" and infill["tokens_predicted"] < 80, infill  # of 96
    for content in (infill["content"], "".join(event["content"] for event in events)):
        assert "Encode(invoice)" in content and "func " not in content, content
        assert content.rstrip().split("\n")[-1] != "}", content


INITIALS_PREFIX = "import pytest\n\nfrom names import initials\n\n\n"
INITIALS_PREFIX += (
    'def test_initials_of_two_names():\n    assert initials("Ada Lovelace") == "AL"\n\n\n'
)
INITIALS_PREFIX += "def test_initials_ignore_accents():\n"
INITIALS_SUFFIX = '\n\n\ndef test_initials_of_one_name():\n    assert initials("Plato") == "P"\n'
INITIALS = "import unicodedata\n\n\ndef initials(name: str) -> str:\n"
INITIALS += '    """The first letter of each word, upper case, accents dropped."""\n'
INITIALS += '    plain = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()\n'
INITIALS += '    return "".join(word[0].upper() for word in plain.split())\n'


def test_a_middle_that_skips_the_body_at_the_cursor_is_empty(base: str) -> None:
    """The cursor at column 0 under a test's ``def`` line: the 0.5B instruct model skips the
    body and writes a test of its own (then one assert over and over). Inserted, it would
    leave the test at the cursor without a body: every route sends nothing, soon."""
    extra = [{"filename": "names.py", "text": INITIALS}]
    body = {"input_prefix": INITIALS_PREFIX, "input_suffix": INITIALS_SUFFIX, "input_extra": extra}
    body |= {"n_predict": 96, "temperature": 0}
    infill = post(base, "/infill", body).json()
    with httpx.stream("POST", f"{base}/infill", json={**body, "stream": True}, timeout=120) as r:
        events = [json.loads(line.removeprefix("data: ")) for line in r.iter_lines() if line]
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="none")
    suffixed = client.completions.create(
        model="m", prompt=INITIALS_PREFIX, suffix=INITIALS_SUFFIX, max_tokens=96, temperature=0
    )
    assert infill["stop_type"] == "limit" and infill["tokens_predicted"] < 48, infill  # of 96
    assert infill["content"] == "".join(event["content"] for event in events) == "", events
    assert suffixed.choices[0].text == "" and suffixed.choices[0].finish_reason == "stop"


def test_a_prefix_that_ends_inside_the_cursor_s_line_is_typed_text(base: str) -> None:
    """An /infill whose ``input_prefix`` ends on the cursor's indentation (no ``prompt``,
    nothing after the cursor: the file's end): the indentation is healed as typed text is,
    and the middle does not indent its first line a second time."""
    body = {"input_prefix": "def f():\n    ", "input_suffix": "", "n_predict": 8}
    r = post(base, "/infill", {**body, "temperature": 0})
    assert r.status_code == 200, r.text
    content = r.json()["content"]
    assert content.strip() and not content[0].isspace(), content


def test_openai_suffix_is_the_same_middle(base: str) -> None:
    """OpenAI-style editors: ``prompt`` is all the text before the cursor, ``suffix`` after."""
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="none")
    before = "def greet(name):\n    "
    after = "\n\ngreet('Ada')\n"
    got = client.completions.create(
        model="m", prompt=before, suffix=after, max_tokens=24, temperature=0
    )
    infill = post(
        base,
        "/infill",
        {"input_prefix": "def greet(name):\n", "input_suffix": after, "prompt": "    "}
        | {"n_predict": 24, "temperature": 0},
    ).json()
    assert got.choices[0].text.startswith(infill["content"].rstrip())


@pytest.mark.parametrize(
    ("path", "body", "needle"),
    [
        ("/infill", {"input_prefix": "a"}, "input_suffix"),
        ("/infill", {"input_prefix": "a", "input_suffix": "b", "input_extra": "x"}, "input_extra"),
        ("/infill", {"input_prefix": "a", "input_suffix": "b", "input_extra": [{}]}, "text"),
        ("/infill", {"input_prefix": "", "input_suffix": "", "repeat_penalty": 0}, "penalty"),
        ("/infill", {"input_prefix": "", "input_suffix": "", "n_probs": 3}, "n_probs"),
        ("/infill", {"input_prefix": "", "input_suffix": "", "prompt": [1, 2]}, "prompt is text"),
        ("/completion", {"prompt": ""}, "prompt is empty"),
        ("/completion", {"prompt": "x", "n_predict": -3}, "n_predict"),
        ("/completion", {"prompt": "x", "logit_bias": [[1, "a"]]}, "logit_bias"),
        ("/completion", {"prompt": "x", "logit_bias": {"999999999": 1}}, "vocabulary"),
        ("/completion", {"prompt": "x", "json_schema": {"type": "nope"}}, "json_schema"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(base: str, path: str, body: dict, needle: str) -> None:  # type: ignore[type-arg]
    r = post(base, path, body)
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"]


# ----- the bench ----------------------------------------------------------------------------


def test_the_fim_cases_are_editor_requests_with_the_cursor_on_an_empty_line() -> None:
    from localspec.commands.bench_fim import fim_cases

    cases = fim_cases()
    assert {c.kind for c in cases} == {"copying", "ordinary"}
    assert all(c.prompt.typed == "" and c.prompt.prefix.endswith("\n") for c in cases)
    chosen = fim_cases("py-from-dict, debounce")  # --prompts with --fim: in the order given
    assert [c.name for c in chosen] == ["py-from-dict", "debounce"]


def test_the_fim_bench_refuses_what_does_not_apply(capsys) -> None:  # type: ignore[no-untyped-def]
    from localspec.cli import main

    for extra, expected in [
        (["--concurrency", "1,2"], "--fim and --concurrency"),
        (["--prompts", "reducer-case,nope"], "no completion named nope"),
        (["--modes", "none"], "give the one speculative mode"),
        (["--plot", "fim.png"], "--plot does not apply to --fim"),
    ]:
        code = main(["bench", "/nope/model.gguf", "--fim", *extra])
        err = capsys.readouterr().err
        assert code == 2 and expected in err and "Traceback" not in err, (extra, err)


def test_the_fim_bench_counts_the_middle_not_what_a_round_ran_past(engine: Engine) -> None:
    """A round of drafts kept whole runs past where the loop rule cuts this middle (55-58
    tokens written against plain decoding's 53): the same middle counts the same, and the
    two are compared by their times, not per token."""
    from argparse import Namespace

    from localspec.commands import bench_fim as fim

    extra = (ExtraFile(INITIALS, "names.py"),)
    prompt = FimPrompt(INITIALS_PREFIX, INITIALS_SUFFIX, extra, typed="    ")
    case = fim.FimCase("loop", "copying", "python", prompt)
    got = fim.time_case(engine, {}, case, "ngram-simple", Namespace(n_predict=96, repeat=1))
    assert set(got) == {fim.PLAIN, fim.SPEC}
    plain, spec = got[fim.PLAIN], got[fim.SPEC]
    assert plain.counts == [plain.tokens] and spec.counts == [spec.tokens], got
    if plain.text != spec.text:  # the verify batches tipped a near tie (a CPU's kernels)
        one = engine.generate(prompt, max_tokens=96, mode="none", record_margins=True)
        drafted = engine.generate(prompt, max_tokens=96, mode="ngram-simple")
        report = compare(one.tokens, one.margins, drafted.tokens, one.runners_up)
        assert report.near_tie, (report, got)
    else:
        assert plain.counts == spec.counts and fim.speedup(plain, spec)[1] is False
    # the loop's copies that showed it are plain decoding's work, which llama-server is asked for
    assert got[fim.PLAIN].decoded > got[fim.PLAIN].tokens + 10


def test_the_fim_bench_times_every_configuration_in_turn(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """localspec's configurations and llama-server's are timed one after the other in every
    repeat, not one configuration's repeats after another's: a machine whose speed drifts
    during the bench moves them all alike. A middle that ended sooner also asks llama-server
    for as many tokens as plain decoding wrote, in the same turns."""
    from argparse import Namespace

    from localspec import native_server as ns
    from localspec.commands import bench_fim as fim
    from tests.test_bench_concurrency import stand_in, stand_in_settings

    settings = stand_in_settings(tmp_path, stand_in(body_checks='assert body["cache_prompt"]'))
    log = tmp_path / (ns.SERVER + ".log")

    def engine_answer(engine, prompt, n_predict, mode):  # type: ignore[no-untyped-def]
        with log.open("a") as f:
            f.write(f"localspec {mode} {n_predict}\n")
        return fim.Answer(0.01, "x", 5, 7, 0.001)

    monkeypatch.setattr(fim, "engine_answer", engine_answer)
    monkeypatch.setattr(fim, "SETTLE_S", 0.0)
    case = fim.fim_cases()[0]
    with (
        ns.running_server(settings, 1, "none") as plain,
        ns.running_server(settings, 1, "ngram-simple") as spec,
    ):
        urls = {fim.NATIVE_PLAIN: plain, fim.NATIVE_SPEC: spec}
        got = fim.time_case(None, urls, case, "ngram-simple", Namespace(n_predict=128, repeat=3))
    turn = [
        "localspec none 128",
        "localspec ngram-simple 128",
        "server none 128",
        "server ngram-simple 128",
        "server none 7",  # as many tokens as plain decoding wrote (the middle ended sooner)
        "server ngram-simple 7",
    ]
    lines = log.read_text().splitlines()
    assert lines[:4] == turn[:4]  # the warm-ups
    assert lines[4:6] == turn[4:]  # the as-many warm-ups, once it is known the middle ended sooner
    assert lines[6:] == turn * 3
    assert all(len(timings.seconds) == 3 for timings in got.values())
    assert got[fim.NATIVE_PLAIN + fim.AS_MANY].length == 7


def test_a_short_fim_bench_reports_every_case(qwen_path: Path, tmp_path: Path) -> None:
    from localspec.cli import main
    from localspec.commands.bench_fim import fim_cases

    out = tmp_path / "fim.json"
    table = tmp_path / "fim.md"
    argv = ["bench", str(qwen_path), "--fim", "-n", "4", "--repeat", "1", "--json", str(out)]
    assert main([*argv, "--markdown", str(table)]) == 0
    n_cases = len(fim_cases())
    assert table.read_text().count("\n| ") == 1 + 1 + n_cases  # header, rule, a row per case
    data = json.loads(out.read_text())
    assert len(data["cases"]) == n_cases and len(data["summary"]) >= 3
    assert len(data["keystrokes"]["first_token_s"]) >= 4
    for case in data["cases"].values():
        assert len(case["plain"]["seconds"]) == len(case["speculative"]["seconds"]) == 1
        # a middle may be empty (the 0.5B skips test-from-helper's body: nothing to insert)
        assert case["plain"]["tokens"][0] == case["speculative"]["tokens"][0] <= 4
    assert sum(case["plain"]["tokens"][0] >= 1 for case in data["cases"].values()) > n_cases / 2


def test_answers_that_parted_at_a_near_tie_are_compared_per_token() -> None:
    from localspec.commands.bench_fim import Timings, speedup

    plain = Timings(seconds=[8.0, 8.1, 8.2], counts=[97, 97, 97])
    same = Timings(seconds=[4.0, 4.1, 4.2], counts=[97, 97, 97])
    longer = Timings(seconds=[10.0, 10.0, 10.0], counts=[128, 128, 128])
    assert speedup(plain, same) == (8.1 / 4.1, False)
    ratio, per_token = speedup(plain, longer)  # 31 more tokens: not 0.81x slower
    assert per_token and ratio == pytest.approx((8.1 / 97) / (10.0 / 128))


def test_a_middle_ended_sooner_than_llama_servers_is_marked() -> None:
    """A ratio against llama-server that comes from where the middle ends, not from
    speculation, says so (a case, and the report's line)."""
    from localspec.commands import bench_fim as fim

    cases = fim.fim_cases()[:2]
    short = {fim.SPEC: fim.Timings([0.2], [5]), fim.NATIVE_PLAIN: fim.Timings([1.6], [44])}
    level = {fim.SPEC: fim.Timings([4.0], [128]), fim.NATIVE_PLAIN: fim.Timings([4.6], [128])}
    assert fim.ended_sooner(short) and not fim.ended_sooner(level)
    assert not fim.ended_sooner({**level, fim.SPEC: fim.Timings([4.0], [120])})  # a near tie
    one = {fim.SPEC: fim.Timings([0.07], [1]), fim.NATIVE_PLAIN: fim.Timings([0.07], [2])}
    assert not fim.ended_sooner(one)  # the end token, which llama-server counts
    for got in (short, level):
        got[fim.PLAIN], got[fim.NATIVE_SPEC] = got[fim.SPEC], got[fim.NATIVE_PLAIN]
    results = {cases[0].name: short, cases[1].name: level}
    lines = fim.summary(cases, results, fim.ratios(cases, results), {})
    assert any(line.endswith(f"plain decoding wrote: {cases[0].name}") for line in lines), lines
    # what speculation gains apart from the cut: llama-server asked for as many tokens
    short[fim.NATIVE_PLAIN + fim.AS_MANY] = fim.Timings([0.19], [5])
    short[fim.NATIVE_SPEC + fim.AS_MANY] = fim.Timings([0.18], [5])
    versus, alone = fim.ratios(cases, results), fim.speculation_alone(cases, results)
    assert alone == {cases[0].name: pytest.approx(0.9), cases[1].name: pytest.approx(1.15)}
    assert fim.vs_native(cases[0].name, versus, alone, True) == "8.00x+ (0.90x)"
    assert fim.vs_native(cases[1].name, versus, alone, False) == "1.15x"
    lines = fim.summary(cases, results, versus, alone)
    assert "on as many tokens (speculation alone), geometric mean 1.02x" in lines[0], lines


class Events:
    """A generation's events as a server route reads them (a ``GenerationStream``'s
    interface), from a fixed list of texts."""

    def __init__(self, texts: list[str]) -> None:
        last = len(texts) - 1
        self.events = [
            RoundEvent(t, (i,), (False,), Stats(n_tokens=i + 1), "length" if i == last else None)
            for i, t in enumerate(texts)
        ]
        self.closed = False

    def __aiter__(self) -> Events:
        return self

    async def __anext__(self) -> RoundEvent:
        if self.closed or not self.events:
            raise StopAsyncIteration
        return self.events.pop(0)

    async def aclose(self) -> None:
        self.closed = True


SUFFIX = "\n\n\ndef div(a, b):\n    if b == 0:\n        raise ZeroDivisionError('b is zero')\n"


async def read_all(stream: object) -> list[RoundEvent]:
    return [event async for event in stream]  # type: ignore[attr-defined]


@pytest.mark.parametrize("cut", [1, 5, 17])
def test_a_suffix_request_ends_where_the_middle_rejoins_the_suffix(cut: int) -> None:
    """/v1/completions and /api/generate with a suffix: a middle that goes on into the
    suffix's code is cut before it (however the stream is split), the answer says stop,
    and the generation is stopped."""
    written = "    return a * b\n\n\ndef div(a, b):\n    if b == 0:\n        raise Zero"
    pieces = [written[i : i + cut] for i in range(0, len(written), cut)]
    events = Events(pieces)
    out = asyncio.run(read_all(ended_at_suffix(events, FimPrompt("def mul(a, b):\n", SUFFIX))))  # type: ignore[arg-type]
    assert "".join(e.text for e in out) == "    return a * b"
    assert out[-1].finish_reason == "stop" and events.closed


def test_a_middle_that_does_not_rejoin_the_suffix_is_sent_whole() -> None:
    written = ["    return a * b\n", "\n", "# done", "\n"]
    out = asyncio.run(read_all(ended_at_suffix(Events(written), FimPrompt("x", SUFFIX))))  # type: ignore[arg-type]
    assert "".join(e.text for e in out) == "".join(written)
    assert out[-1].finish_reason == "length"
    plain = Events(written)
    assert ended_at_suffix(plain, "text") is plain  # type: ignore[arg-type]


def test_a_suffix_request_at_the_file_s_end_has_the_end_rules_too() -> None:
    """``suffix: ""`` on /v1/completions: the cursor at the end of the file, a middle
    still, which ends before a definition of its own and without blank lines after it."""
    written = ["    return a * b\n", "\n\n", "def sub(a, b):\n", "    return a - b\n"]
    events = Events(written)
    prompt = FimPrompt("def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n", "")
    out = asyncio.run(read_all(ended_at_suffix(events, prompt)))  # type: ignore[arg-type]
    assert "".join(e.text for e in out) == "    return a * b\n"
    assert out[-1].finish_reason == "stop" and events.closed
