from localspec.engine.output import OutputAssembler

PIECES = {1: b"Hel", 2: b"lo", 3: b" wor", 4: b"ld", 5: b"\xc3", 6: b"\xa9", 7: b"!", 0: b""}


def assembler(stop=(), max_tokens=None) -> OutputAssembler:
    return OutputAssembler(PIECES.__getitem__, lambda t: t == 0, stop, max_tokens)


def test_stop_string_across_tokens_cuts_text_and_ends() -> None:
    out = assembler(stop=["o wo"])
    assert out.push(1) and out.push(2)
    assert out.take_text() == "Hell"  # the final "o" may start the stop string: held back
    assert out.push(3)
    assert out.done and out.finish_reason == "stop"
    assert out.take_text() == ""
    assert out.text == "Hell"
    assert not out.push(4)  # nothing after the stop is emitted
    assert out.tokens == [1, 2, 3]


def test_the_stop_string_that_ended_the_text_is_named() -> None:
    """The earliest in the text, whichever comes first in the list."""
    out = assembler(stop=["world", "lo w"])
    for token in (1, 2, 3, 4):
        out.push(token)
    assert out.stop_word == "lo w" and out.text == "Hel"


def test_eos_is_not_emitted() -> None:
    out = assembler()
    out.push(1)
    assert not out.push(0)
    assert out.finish_reason == "stop" and out.tokens == [1]
    assert out.stop_word is None


def test_max_tokens() -> None:
    out = assembler(max_tokens=2)
    out.push(1)
    out.push(2)
    assert out.finish_reason == "length"
    assert not out.push(3)


def test_utf8_split_across_tokens_is_not_garbled() -> None:
    out = assembler()
    out.push(5)
    assert out.take_text() == ""  # half a character: nothing to show yet
    out.push(6)
    assert out.take_text() == "é"


def test_incomplete_character_at_the_end_becomes_replacement() -> None:
    out = assembler(max_tokens=1)
    out.push(5)
    assert out.take_text() == "\ufffd"
