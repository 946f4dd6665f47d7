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

import signal
import threading
from collections.abc import Callable
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


def install_interrupt_handler() -> None:
    """For the command line, where Ctrl-C is handled as usual: a program started with
    SIGINT ignored (nohup, a background job of a non-interactive shell) keeps ignoring it."""
    if (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    ):
        signal.signal(signal.SIGINT, on_sigint)
