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

# llama.cpp's AMX weight buffers crash (SIGSEGV in ggml_backend_amx_mul_mat, ggml-org/
# llama.cpp#20824) when llama.cpp was compiled by GCC 12 or 13: their `_tile_loadconfig`
# tells the optimiser it reads 8 bytes of the 64-byte tile configuration, so the stores of
# its rows and columns are dropped and `ldtilecfg` faults on an invalid one. Which compiler
# built the library cannot be asked, and a crash takes a whole server and its clients with
# it, so a build with AMX kernels loads weights without llama.cpp's extra buffer types
# unless this variable is set to 1 (a build by clang or GCC 14)
AMX_VARIABLE = "LOCALSPEC_AMX"

_recent: collections.deque[str] = collections.deque(maxlen=40)
_logged = 0  # lines logged so far: a mark from which a failure's own lines are told apart
_initialised = False


@llama_cpp.llama_log_callback
@llama_callback
def _log_callback(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    global _logged
    try:
        line = text.decode("utf-8", errors="replace")
        _recent.append(line)
        _logged += 1
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


def log_mark() -> int:
    """Where the log stands now (for ``recent_log(since=...)``)."""
    return _logged


def recent_log(n: int = 6, since: int | None = None) -> str:
    """The last few llama.cpp log lines that look like errors or warnings (``since``: only
    those logged after that ``log_mark``, so that an earlier failure's lines are not
    repeated as this one's)."""
    kept = list(_recent)
    if since is not None:
        kept = kept[max(len(kept) - (_logged - since), 0) :]
    lines = [ln.strip() for ln in kept if ln.strip()]
    errors = [ln for ln in lines if any(w in ln.lower() for w in ("error", "fail", "invalid"))]
    return " | ".join((errors or lines)[-n:])


def amx_built_in() -> bool:
    """Whether this llama.cpp was built with its AMX kernels (on an AMX CPU, natively)."""
    ensure_initialised()
    return "AMX_INT8 = 1" in llama_cpp.llama_print_system_info().decode(errors="replace")


def weight_repacking() -> bool:
    """Whether model weights may go to llama.cpp's extra CPU buffer types (repacked
    layouts, AMX tiles): not where AMX kernels are built in, unless ``LOCALSPEC_AMX=1``
    says they work on this machine (``AMX_VARIABLE``)."""
    return not amx_built_in() or os.environ.get(AMX_VARIABLE) == "1"
