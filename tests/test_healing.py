"""Token healing: a prompt's last token given back to the model to write again."""

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from localspec.api import Engine
from localspec.engine.fim import FimPrompt
from localspec.engine.healing import HealedStart, PieceIndex, healed_end
from localspec.engine.output import OutputAssembler
from localspec.lossless import compare

EOS = 0
PIECES = [b"<eos>", b" ", b"  ", b"   ", b"    ", b"     ", b" return", b"return", b"x", b"\xe2"]


class FakeVocab:
    n_vocab = len(PIECES)

    def piece(self, token: int) -> bytes:
        return PIECES[token]

    def is_eog(self, token: int) -> bool:
        return token == EOS


def test_the_tokens_that_may_write_a_healed_text() -> None:
    index = PieceIndex(FakeVocab())
    # those that start with four spaces, and those that are a part of them (never the end)
    assert sorted(index.fitting(b"    ").tolist()) == [1, 2, 3, 4, 5]
    assert sorted(index.fitting(b" ret").tolist()) == [1, 6]


def test_only_a_whole_last_token_past_the_kept_ones_is_healed() -> None:
    vocab = FakeVocab()
    assert healed_end(vocab, [8, 4], keep=1) == ([8], "    ")
    assert healed_end(vocab, [8, 4], keep=2) == ([8, 4], "")  # nothing typed
    assert healed_end(vocab, [8, 9], keep=1) == ([8, 9], "")  # part of a character
    assert healed_end(vocab, [8, EOS], keep=1) == ([8, EOS], "")


def test_the_constraint_holds_until_the_text_is_written() -> None:
    state = HealedStart(PieceIndex(FakeVocab()), b"    ")
    assert not state.allows(6) and not state.allows(EOS) and state.allows(3)
    # "   " then " return" writes it: the draft is valid whole; "return" after it is free
    assert state.valid_prefix([3, 6, 7, 7]) == 4
    assert state.valid_prefix([7, 3]) == 0
    row = np.arange(len(PIECES), dtype=np.float32)
    assert int(state.masked(row).argmax()) == 5  # the best token that starts with it
    probe = state.clone()
    probe.accept(3)
    assert probe.left == b" " and state.left == b"    "  # clones are independent
    assert int(probe.masked(row).argmax()) == 6  # " return" covers what is left
    probe.accept(6)
    assert probe.masked(row) is row and probe.allows(EOS)  # nothing left: no cost


def test_the_given_text_is_not_emitted_again() -> None:
    out = OutputAssembler(FakeVocab().piece, FakeVocab().is_eog, given="    ")
    out.push(3)
    assert out.take_text() == ""
    out.push(6)
    assert out.take_text() == "return"


# ----- the real model ----------------------------------------------------------------------

PREFIX = 'def mul(a, b):\n    """Multiply two numbers."""\n'
SUFFIX = "\n\n\nprint(mul(2, 3))\n"


@pytest.fixture(scope="module")
def engine(qwen_path: Path) -> Iterator[Engine]:
    with Engine.load(qwen_path, n_ctx=1024) as engine:
        yield engine


@pytest.mark.parametrize(
    ("typed", "healed", "starts"), [("    ", "    ", "return"), ("    ret", " ret", "urn")]
)
def test_a_line_typed_up_to_its_indentation_is_not_indented_twice(
    engine: Engine, typed: str, healed: str, starts: str
) -> None:
    """Without healing the model wrote " return" after four typed spaces (a fifth space)
    and took "ret" for a variable ("ret = a * b")."""
    fim = FimPrompt(PREFIX, SUFFIX, (), typed)
    plain = engine.generate(fim, max_tokens=12, mode="none", record_margins=True)
    assert plain.text.startswith(starts), plain.text
    pieces = b"".join(engine.target.piece(t) for t in plain.tokens).decode()
    assert pieces == healed + plain.text  # the typed line's last token written again
    for mode in ("ngram-simple", "suffix+ngram-simple"):
        spec = engine.generate(fim, max_tokens=12, mode=mode)
        report = compare(plain.tokens, plain.margins, spec.tokens, plain.runners_up)
        assert report.identical or report.near_tie, (mode, report)


def test_a_sampled_middle_writes_the_healed_text_first(engine: Engine) -> None:
    fim = FimPrompt(PREFIX, SUFFIX, (), "    ")
    for seed in range(6):
        got = engine.generate(fim, max_tokens=3, temperature=1.0, seed=seed, mode="ngram-simple")
        written = b"".join(engine.target.piece(t) for t in got.tokens)
        assert written.startswith(b"    ") and not got.text.startswith("    "), (seed, written)


def test_a_request_with_a_grammar_is_not_healed(engine: Engine) -> None:
    """Its grammar alone says what the first tokens may be: the typed text stays in the
    prompt, whole, and the middle follows it."""
    fim = FimPrompt(PREFIX, SUFFIX, (), "    ")
    got = engine.generate(fim, max_tokens=4, mode="none", grammar="root ::= [a-z ]+")
    assert got.stats.n_prompt == len(engine.tokenize_prompt(fim)) + 1
