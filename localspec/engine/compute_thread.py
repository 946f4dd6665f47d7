"""Work that decodes, run on a thread of its own that ends with it.

llama.cpp's CPU kernels are built with OpenMP, which keeps a team of worker threads for every
thread that has run a pass, for as long as that thread lives. With two such teams on a small
machine (the caller's, idle, and the one of the thread that decodes the generations), OpenMP
has more threads than cores and stops spinning between the kernels' steps: every pass on the
generating thread then runs 1.5-2.7x slower (docs/benchmarks.md, "One thread computes").
A caller that stays alive (a server's main thread, which then serves) must therefore not
decode itself: what it measures ahead of the generations runs here, on a thread whose team
goes with it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def run_apart(work: Callable[[threading.Event], T], name: str) -> T:
    """``work(stop)`` on a new thread; its result, or its exception, here. Ctrl-C while it
    runs sets ``stop`` (the work ends at its next check) and is raised once the thread has
    ended: the models are never freed under a running pass."""
    stop = threading.Event()
    outcome: list[tuple[bool, object]] = []

    def target() -> None:
        try:
            outcome.append((True, work(stop)))
        except BaseException as exc:  # raised below, in the caller's thread
            outcome.append((False, exc))

    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    try:
        thread.join()
    except KeyboardInterrupt:
        stop.set()
        thread.join()
        raise
    ok, value = outcome[0]
    if not ok:
        assert isinstance(value, BaseException)
        raise value
    return value  # type: ignore[return-value]
