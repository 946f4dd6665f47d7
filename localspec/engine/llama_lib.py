"""Process-wide llama.cpp set-up: backend initialisation and its log output.

llama.cpp logs a great deal on stderr. We keep the recent lines in memory (they explain
load failures in our error messages) and print them only when ``LOCALSPEC_VERBOSE`` is set.
"""

from __future__ import annotations

import collections
import ctypes
import os
import sys

import llama_cpp

from localspec.interrupts import defer_interrupt, llama_callback

_recent: collections.deque[str] = collections.deque(maxlen=40)
_initialised = False


@llama_cpp.llama_log_callback
@llama_callback
def _log_callback(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    try:
        line = text.decode("utf-8", errors="replace")
        _recent.append(line)
        if os.environ.get("LOCALSPEC_VERBOSE"):
            sys.stderr.write(line)
    except KeyboardInterrupt:
        defer_interrupt()


def ensure_initialised() -> None:
    global _initialised
    if not _initialised:
        llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        _initialised = True


def recent_log(n: int = 6) -> str:
    """The last few llama.cpp log lines that look like errors or warnings."""
    lines = [ln.strip() for ln in _recent if ln.strip()]
    errors = [ln for ln in lines if any(w in ln.lower() for w in ("error", "fail", "invalid"))]
    return " | ".join((errors or lines)[-n:])
