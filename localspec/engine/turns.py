"""Who may use an Engine now. llama.cpp's context is one sequence of tokens and one thread's
at a time: two threads decoding in it at once abort the process, a stream resumed after
another call on the same engine would continue the other call's text, and a freed context
crashes whoever touches it next.

So an Engine runs one generation at a time. A generation started from another thread waits
until the running one is over (whole generations are served in turn); one started from the
same thread ends the one it left suspended (resuming that one raises ``LocalspecError``);
every step that decodes holds one lock (tokenizing only reads the vocabulary: it does not
wait); after ``close`` every call is refused.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import TypeVar

from localspec.errors import LocalspecError

T = TypeVar("T")


class Generation:
    """A generation's turn on the engine."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.over = False


class EngineTurns:
    def __init__(self) -> None:
        self._steps = threading.RLock()  # re-entrant: a step calls helpers that take it too
        self._changed = threading.Condition()
        self._owner: Generation | None = None
        self.closed = False

    @contextlib.contextmanager
    def step(self, generation: Generation | None = None) -> Iterator[None]:
        """Hold the engine for one piece of work (a round, a calibration, a tokenization)."""
        with self._steps:
            self.refuse_if_closed()
            if generation is not None and self._owner is not generation:
                raise LocalspecError(
                    "this stream was ended by a later call on the same Engine",
                    "an Engine runs one generation at a time: finish or close a stream "
                    "before starting another (or load a second Engine)",
                )
            yield

    def run(self, inner: Iterator[T]) -> Iterator[T]:
        """Yield what ``inner`` (a generation) yields, each step in its turn."""
        generation = self._begin()
        try:
            while True:
                with self.step(generation):
                    try:
                        item = next(inner)
                    except StopIteration:
                        return
                yield item
        finally:
            try:
                with self._steps:
                    inner.close()  # its own clean-up (the memory, the drafter) in turn too
            finally:
                self._end(generation)

    def close(self) -> bool:
        """Refuse every later call; False if it was closed already. Waits for a running step."""
        with self._steps, self._changed:
            was_open, self.closed = not self.closed, True
            self._changed.notify_all()
        return was_open

    def _begin(self) -> Generation:
        generation = Generation()
        with self._changed:
            while (
                self._owner is not None
                and not self._owner.over
                and self._owner.thread != generation.thread
                and not self.closed
            ):
                self._changed.wait()
            self.refuse_if_closed()
            self._owner = generation  # the same thread's suspended one, if any, is ended
        return generation

    def _end(self, generation: Generation) -> None:
        with self._changed:
            generation.over = True
            if self._owner is generation:
                self._owner = None
            self._changed.notify_all()

    def refuse_if_closed(self) -> None:
        if self.closed:
            raise LocalspecError("this Engine is closed", "load the model again: Engine.load(...)")
