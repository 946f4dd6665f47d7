"""Requantize a GGUF with llama.cpp's own quantizer (derived catalog models, self-drafts).

The quantizer runs in a child process: ``llama_model_quantize`` takes seconds to minutes,
offers no way to stop it, and calls back into Python only to log. In a child, Ctrl-C stops
it at once (the parent kills the child and removes the partial file), and a crash of the
quantizer cannot take the caller with it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import llama_cpp

from localspec.errors import LocalspecError

FTYPES = {
    "F16": llama_cpp.LLAMA_FTYPE_MOSTLY_F16,
    "Q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0,
    "Q4_K_M": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M,
    "Q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0,
}


def requantize(source: Path, dest: Path, ftype: str, pure: bool = False) -> None:
    """Write ``source`` requantized to ``ftype`` into ``dest`` (the caller makes it atomic).
    ``pure``: every tensor gets ``ftype`` (no higher-precision output head or mixes)."""
    cmd = [sys.executable, "-m", "localspec.derivation.quantize", str(source), str(dest), ftype]
    child = subprocess.Popen(
        [*cmd, *(["--pure"] if pure else [])],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _, errors = child.communicate()
    except BaseException:  # Ctrl-C above all: stop the quantizer now, not when it is done
        child.kill()
        child.wait()
        raise
    if child.returncode != 0:
        last = errors.strip().splitlines()[-3:] or [f"exit status {child.returncode}"]
        raise LocalspecError(
            f"llama.cpp could not requantize {source} to {ftype}: {' | '.join(last)}",
            "check that the source file is a complete GGUF and that the disk has room",
        )


def _quantize_here(source: str, dest: str, ftype: str, pure: bool) -> int:
    from localspec.engine.llama_lib import ensure_initialised, recent_log
    from localspec.hardware import default_threads

    ensure_initialised()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[ftype]
    params.allow_requantize = True
    params.pure = pure
    params.nthread = default_threads()
    rc = llama_cpp.llama_model_quantize(source.encode(), dest.encode(), params)
    if rc != 0:
        print(f"code {rc}: {recent_log()}", file=sys.stderr)
    return 0 if rc == 0 else 2


if __name__ == "__main__":  # the child process of ``requantize``
    *paths, kind = [a for a in sys.argv[1:] if a != "--pure"]
    sys.exit(_quantize_here(*paths, kind, "--pure" in sys.argv))
