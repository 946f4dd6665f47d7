"""One thread computes: what the engine decodes outside a generation (the warm-up's batch
costs) runs where the generations decode, never on the caller's long-lived thread (whose
OpenMP team would slow every pass of the generating thread: docs/benchmarks.md)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import llama_cpp
import pytest

from localspec.api import Engine
from localspec.engine.compute_thread import run_apart


@pytest.fixture
def decoding_threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[threading.Thread]]:
    """The thread of every ``llama_decode`` call from here on."""
    threads: list[threading.Thread] = []
    decode = llama_cpp.llama_decode

    def recorded(ctx: object, batch: object) -> int:
        threads.append(threading.current_thread())
        return decode(ctx, batch)  # type: ignore[arg-type]

    monkeypatch.setattr(llama_cpp, "llama_decode", recorded)
    yield threads


def test_run_apart_returns_raises_and_leaves_no_thread() -> None:
    seen: list[threading.Thread] = []

    def work(stop: threading.Event) -> int:
        seen.append(threading.current_thread())
        return 7

    assert run_apart(work, "t") == 7
    assert seen[0] is not threading.current_thread() and not seen[0].is_alive()

    def fails(stop: threading.Event) -> None:
        raise ValueError("bad")

    with pytest.raises(ValueError, match="bad"):
        run_apart(fails, "t")


@pytest.mark.parametrize("parallel", [1, 2])
def test_a_warm_up_decodes_off_the_callers_thread(
    smollm_path: Path, parallel: int, decoding_threads: list[threading.Thread]
) -> None:
    with Engine.load(smollm_path, mode="ngram-simple", n_ctx=512, parallel=parallel) as engine:
        engine.warm_up()
        assert decoding_threads, "the warm-up measured nothing"
        assert threading.current_thread() not in decoding_threads
        if parallel > 1:  # the slots' own thread, which decodes every generation
            assert {t.name for t in decoding_threads} == {"localspec-slots"}
            assert engine.generate("Once upon a time", max_tokens=4).tokens
            assert {t.name for t in decoding_threads} == {"localspec-slots"}
        else:  # a thread that ended with it
            assert not any(t.is_alive() for t in decoding_threads)


def test_generate_many_on_one_slot_decodes_on_the_callers_thread(
    smollm_path: Path, decoding_threads: list[threading.Thread]
) -> None:
    with Engine.load(smollm_path, n_ctx=512) as engine:
        results = engine.generate_many(["Hello", "Once upon a time"], max_tokens=3)
        assert len(results) == 2
        assert set(decoding_threads) == {threading.current_thread()}
