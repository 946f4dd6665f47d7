"""Ctrl-C that always works, also while llama.cpp is running.

Python runs a signal handler at the next bytecode. During a long C call (a model load, a
requantization) the next bytecode is often the first line of a Python callback that
llama.cpp calls (its log lines, load progress), and an exception raised there, before any
``try`` in the callback, is printed and dropped by ctypes: the interrupt would be lost and
the command would run on. ``on_sigint`` therefore records an interrupt that lands inside
such a callback instead of raising it; the load-progress callback then stops the load, and
``raise_deferred_interrupt`` raises it as soon as the C call returns. Anywhere else, Ctrl-C
raises KeyboardInterrupt as usual. No heavy import here: the CLI installs the handler first.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import CodeType, FrameType
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_interrupted = False
_CALLBACKS: set[CodeType] = set()  # the code of every Python function llama.cpp calls back


def llama_callback(function: F) -> F:
    """Mark ``function`` as called from inside llama.cpp."""
    _CALLBACKS.add(function.__code__)
    return function


def defer_interrupt() -> None:
    global _interrupted
    _interrupted = True


def interrupt_pending() -> bool:
    return _interrupted


def raise_deferred_interrupt() -> None:
    """Raise a Ctrl-C that arrived inside a llama.cpp callback (call after the C call)."""
    global _interrupted
    if _interrupted:
        _interrupted = False
        raise KeyboardInterrupt


def _inside_callback(frame: FrameType | None) -> bool:
    while frame is not None:
        if frame.f_code in _CALLBACKS:
            return True
        frame = frame.f_back
    return False


def on_sigint(_signum: int, frame: FrameType | None) -> None:
    if _inside_callback(frame):
        defer_interrupt()
        return
    raise KeyboardInterrupt


def _python_handles_ctrl_c() -> bool:
    """Python's own handler is in place (a program started with SIGINT ignored, nohup or a
    background job of a non-interactive shell, keeps ignoring it; a program's own handler is
    its own)."""
    return (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    )


def install_interrupt_handler() -> None:
    """For the command line, where Ctrl-C is handled as usual."""
    if _python_handles_ctrl_c():
        signal.signal(signal.SIGINT, on_sigint)


@contextlib.contextmanager
def interrupts_kept() -> Iterator[None]:
    """For the Python API: ``on_sigint`` while a block that calls into llama.cpp runs (a
    model load), then Python's handler again, so a script's Ctrl-C during a load stops it."""
    if not _python_handles_ctrl_c():
        yield
        return
    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
