"""One engine, as many generations at once as it has slots; waiting requests in a bounded
FIFO.

A request takes one of the engine's slots (``Engine.parallel``; an asyncio.Semaphore, which
wakes waiters in FIFO order), handed to its generation thread and released by that thread
when the generation has really left the engine: a client that disconnects cannot let the
next request in while its generation is still finishing its step. With several slots the
engine's scheduler verifies every running generation in one batch per step.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

from localspec.api import Engine
from localspec.engine.loop import RoundEvent

_DONE = object()


class QueueFull(Exception):
    """More requests are waiting than ``--max-queue`` allows."""


class EngineRunner:
    def __init__(self, engine: Engine, max_queue: int) -> None:
        self.engine = engine
        self.max_queue = max_queue
        self.slots = engine.parallel
        self.waiting = 0
        self.running = 0  # generations holding a slot
        self.closing = False
        self._lock: asyncio.Semaphore | None = None
        self._gathering: asyncio.Lock | None = None  # one request takes several turns at a time
        self._threads: set[threading.Thread] = set()  # generations still running
        self._count = threading.Lock()  # both change on the event loop and on the threads

    def _turn(self) -> asyncio.Semaphore:
        if self._lock is None:
            self._lock = asyncio.Semaphore(self.slots)
        return self._lock

    @property
    def busy(self) -> bool:
        return self.running > 0

    @property
    def queue_depth(self) -> int:
        return self.waiting

    async def acquire(self, count: int = 1) -> None:
        """Wait for ``count`` slots (FIFO; at most ``slots``). Raise QueueFull at once when
        the queue is full; a request cancelled while waiting simply leaves the queue, giving
        back the slots it had taken."""
        turn = self._turn()
        if turn.locked() and self.waiting >= self.max_queue:
            raise QueueFull
        self.waiting += 1
        try:
            if count == 1:
                await turn.acquire()
                return
            if self._gathering is None:
                self._gathering = asyncio.Lock()
            # one request gathers its slots at a time: two holding some each, waiting for
            # the rest, would wait for each other
            async with self._gathering:
                taken = 0
                try:
                    for _ in range(count):
                        await turn.acquire()
                        taken += 1
                except BaseException:
                    self.release(taken)
                    raise
        finally:
            self.waiting -= 1

    def release(self, count: int = 1) -> None:
        """Give turns back without generating (a request that ended while queued)."""
        for _ in range(count):
            self._turn().release()

    def generate(self, **kwargs: Any) -> GenerationStream:
        """Start one generation now (the caller holds a slot, from ``acquire``) and return
        its events. The generation thread releases the slot when it ends."""
        stream = GenerationStream(asyncio.get_running_loop(), lambda: self.closing)
        turn = self._turn()

        def work() -> None:
            events = self.engine.stream(cancelled=stream.ended, **kwargs)
            try:
                for event in events:
                    stream.put(event)
                    if stream.ended():
                        break
            except BaseException as exc:  # handed to the request, which turns it into an error
                stream.put(exc)
            finally:
                events.close()
                with self._count:
                    self.running -= 1
                    self._threads.discard(threading.current_thread())
                stream.post(turn.release)
                stream.put(_DONE)

        thread = threading.Thread(target=work, name="localspec-generate", daemon=True)
        with self._count:
            self.running += 1
            self._threads.add(thread)
        thread.start()
        return stream

    def stop(self) -> None:
        """The server is stopping: the running generation ends after its current round
        (its request is told why), rather than holding the shutdown for minutes. Called from
        a signal handler, so it takes no lock (a second signal would find it held): the
        generation thread reads the flag after each round."""
        self.closing = True

    def wait_idle(self, timeout: float) -> bool:
        """Wait for the generation threads to leave the engine (before the engine is freed);
        False if one is still running after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._count:
            threads = list(self._threads)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in threads)


class GenerationStream:
    """Async iterator over a generation's events. Closing it, or dropping it unread (a client
    gone before its response started), stops the generation within one step."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, closing: Callable[[], bool] = lambda: False
    ) -> None:
        self.loop = loop
        self.stopped = threading.Event()
        self._closing = closing
        self._events: asyncio.Queue[object] = asyncio.Queue()

    def ended(self) -> bool:
        """Whether the generation should stop: its client went away, or the server stops
        (asked after each round, and between the chunks of a long prompt)."""
        return self.stopped.is_set() or self._closing()

    def put(self, item: object) -> None:
        self.post(self._events.put_nowait, item)

    def post(self, call: Callable[..., object], *args: object) -> None:
        """Run ``call`` on the server's event loop. Once the loop is closed (the server
        stopped, Ctrl-C) nobody reads the events any more: the generation stops instead."""
        try:
            self.loop.call_soon_threadsafe(call, *args)
        except RuntimeError:
            if not self.loop.is_closed():
                raise
            self.stopped.set()

    def __aiter__(self) -> GenerationStream:
        return self

    async def __anext__(self) -> RoundEvent:
        try:
            item = await self._events.get()
        except BaseException:
            self.stopped.set()
            raise
        if item is _DONE:
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            self.stopped.set()
            raise item
        assert isinstance(item, RoundEvent)
        return item

    async def aclose(self) -> None:
        self.stopped.set()

    def __del__(self) -> None:
        self.stopped.set()


_END = object()  # a choice's stream has ended (``ChoiceStreams``)


class ChoiceStreams:
    """The events of one request's generations (its ``n`` choices, run side by side in the
    slots) as they come, each with its choice's index. A generation's error is raised here;
    closing it stops them all."""

    def __init__(self, streams: list[GenerationStream]) -> None:
        self.streams = streams
        self._merged: asyncio.Queue[object] = asyncio.Queue()
        self._pumps: list[asyncio.Task[None]] = []
        self._running = len(streams)

    def __aiter__(self) -> ChoiceStreams:
        return self

    async def __anext__(self) -> tuple[int, RoundEvent]:
        if len(self.streams) == 1:  # one choice: its own events, nothing to interleave
            return 0, await self.streams[0].__anext__()
        if not self._pumps:
            self._pumps = [
                asyncio.create_task(self._pump(i, stream)) for i, stream in enumerate(self.streams)
            ]
        while self._running:
            item = await self._merged.get()
            if item is _END:
                self._running -= 1
                continue
            assert isinstance(item, tuple)
            if isinstance(item[1], BaseException):
                raise item[1]
            return item
        raise StopAsyncIteration

    async def _pump(self, index: int, stream: GenerationStream) -> None:
        try:
            async for event in stream:
                self._merged.put_nowait((index, event))
        except Exception as exc:  # raised in the reader's task, by ``__anext__``
            self._merged.put_nowait((index, exc))
        finally:
            self._merged.put_nowait(_END)

    async def aclose(self) -> None:
        for stream in self.streams:
            await stream.aclose()
        for pump in self._pumps:
            pump.cancel()
