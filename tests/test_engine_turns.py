"""An Engine used as scripts use it, on the real SmolLM2-135M: from two threads at once, with
a stream left suspended while another call runs, after ``close``, and after a Ctrl-C that
landed between a decode and its bookkeeping. Never a crash, never another call's text."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import llama_cpp
import pytest

from localspec import Engine, LocalspecError
from localspec.errors import GenerationCancelled

CODE = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n"
PROSE = "The three primary colours are"


@pytest.fixture
def engine(smollm_path: Path) -> Iterator[Engine]:
    with Engine.load(smollm_path, n_ctx=1024) as engine:
        yield engine


def answer(engine: Engine, prompt: str) -> list[int]:
    # reproducible: which thread ran first (what it left cached, how the clock went) must
    # not tip a near tie, so that any other answer is another call's text
    return engine.generate(prompt, max_tokens=24, temperature=0, reproducible=True).tokens


@pytest.mark.slow
def test_two_threads_are_served_in_turn(engine: Engine) -> None:
    """Two threads decoding in one llama.cpp context at once abort the process."""
    expected = {CODE: answer(engine, CODE), PROSE: answer(engine, PROSE)}
    for _ in range(3):
        got: dict[str, list[int]] = {}

        def ask(prompt: str, into: dict[str, list[int]] = got) -> None:
            into[prompt] = answer(engine, prompt)

        threads = [threading.Thread(target=ask, args=(p,)) for p in expected]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert got == expected


@pytest.mark.slow
def test_a_suspended_stream_is_ended_by_a_later_call(engine: Engine) -> None:
    """Resumed, it would continue from the cache the other call left: another text."""
    expected = answer(engine, CODE)
    stream = engine.stream(PROSE, max_tokens=24, temperature=0)
    next(stream)
    assert answer(engine, CODE) == expected
    with pytest.raises(LocalspecError, match="ended by a later call"):
        next(stream)
    assert answer(engine, PROSE) == answer(engine, PROSE)  # and the engine goes on


def test_an_engine_refuses_every_call_once_closed(smollm_path: Path) -> None:
    engine = Engine.load(smollm_path, n_ctx=256)
    stream = engine.stream(PROSE, max_tokens=20)
    next(stream)
    engine.close()
    engine.close()  # twice: nothing more
    for call in (
        lambda: next(stream),  # freed under it: a segfault
        lambda: engine.generate("Hello", max_tokens=4),
        lambda: engine.tokenize_prompt("Hello"),
        lambda: engine.verify_cost(),
    ):
        with pytest.raises(LocalspecError, match="this Engine is closed"):
            call()


@pytest.mark.slow
def test_a_decode_whose_bookkeeping_was_interrupted_is_forgotten(engine: Engine) -> None:
    """Ctrl-C can land right after ``llama_decode`` returns, before the token list is
    updated: the cache then holds tokens the engine does not know, and llama.cpp refuses
    the next batch. The next decode forgets them first."""
    expected = answer(engine, PROSE)
    target = engine.target
    target._batch.fill([1, 2, 3], target.n_past, 1)  # what _decode_chunk does...
    assert llama_cpp.llama_decode(target.ctx, target._batch.batch) == 0  # ...interrupted here
    assert answer(engine, PROSE) == expected


@pytest.mark.slow
def test_a_long_prompt_stops_being_read_when_its_caller_cancels(engine: Engine) -> None:
    """A server whose client went away asks between the prompt's chunks: it stops after the
    first (512 tokens) instead of reading the rest, and the next generation goes on."""
    prompt = " ".join(f"w{i}" for i in range(220))  # about 800 tokens: two chunks
    asked: list[int] = []

    engine.verify_cost()  # measured first (a cancellation stops that too: test below)

    def cancelled() -> bool:
        asked.append(engine.target.n_past)
        return True

    with pytest.raises(GenerationCancelled, match="cancelled while the prompt was being read"):
        next(engine.stream(prompt, max_tokens=4, cancelled=cancelled))
    assert asked == [engine.target.n_batch] and engine.target.n_past == engine.target.n_batch
    assert engine.target.cancelled is None  # not left for the next caller
    assert answer(engine, CODE) == answer(engine, CODE)
    with pytest.raises(LocalspecError, match="cancelled must be a function"):
        next(engine.stream(PROSE, cancelled=True))


@pytest.mark.slow
def test_the_first_calibration_stops_when_its_caller_cancels(smollm_path: Path) -> None:
    """The first speculative generation measures the verify costs (seconds on a large model):
    a chat's quit or a client's leaving stops that too, between two batch sizes, and the next
    generation measures them whole."""
    with Engine.load(smollm_path, mode="ngram-simple") as engine:
        with pytest.raises(GenerationCancelled, match="while the verify costs were measured"):
            next(engine.stream(PROSE, max_tokens=4, cancelled=lambda: True))
        assert engine.target.n_past == 0  # measured before the prompt; its filler trimmed
        assert answer(engine, CODE) == answer(engine, CODE)
        assert engine.verify_cost().sizes.size > 2
