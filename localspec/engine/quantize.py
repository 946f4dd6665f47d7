"""Requantize a GGUF with llama.cpp's own quantizer (for derived catalog models)."""

from __future__ import annotations

from pathlib import Path

import llama_cpp

from localspec.engine.llama_lib import ensure_initialised, raise_deferred_interrupt, recent_log
from localspec.errors import LocalspecError
from localspec.hardware import default_threads

FTYPES = {
    "F16": llama_cpp.LLAMA_FTYPE_MOSTLY_F16,
    "Q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0,
    "Q4_K_M": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M,
    "Q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0,
}


def requantize(source: Path, dest: Path, ftype: str, pure: bool = False) -> None:
    """Write ``source`` requantized to ``ftype`` into ``dest`` (the caller makes it atomic).
    ``pure``: every tensor gets ``ftype`` (no higher-precision output head or mixes)."""
    ensure_initialised()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[ftype]
    params.allow_requantize = True
    params.pure = pure
    params.nthread = default_threads()
    rc = llama_cpp.llama_model_quantize(str(source).encode(), str(dest).encode(), params)
    raise_deferred_interrupt()  # the caller's atomic write removes the partial file
    if rc != 0:
        raise LocalspecError(
            f"llama.cpp could not requantize {source} to {ftype} (code {rc}): {recent_log()}",
            "check that the source file is a complete GGUF and that the disk has room",
        )
