"""ctypes bindings for llama.cpp's NextN / MTP staging API (``src/llama-ext.h``).

Why this module exists
----------------------
The ``draft-mtp`` speculative mode drafts with a model's own multi-token-prediction
(NextN) head.  The calls it needs are declared in llama.cpp's *staging* header
``src/llama-ext.h``::

    void    llama_set_embeddings_nextn    (llama_context * ctx, bool value, bool masked);
    void    llama_set_nextn_layer_offset  (llama_context * ctx, int32_t offset);
    float * llama_get_embeddings_nextn    (llama_context * ctx);
    float * llama_get_embeddings_nextn_ith(llama_context * ctx, int32_t i);
    void    llama_set_embeddings_layer_inp(llama_context * ctx, uint32_t lid, bool value);
    float * llama_get_embeddings_layer_inp(llama_context * ctx, uint32_t lid);
    llama_context * llama_get_ctx_other   (llama_context * ctx);

That header is C++ and is *not* wrapped in ``extern "C"``, so libllama exports these
functions under Itanium-mangled names (``_Z26llama_set_embeddings_nextnP13llama_contextbb``
and so on; MSVC-mangled on Windows).  llama-cpp-python's public ``llama_cpp`` module does
not bind them (0.3.36 ships a private, import-time-failing ``llama_cpp_ext`` that its docs
say downstream code must not use), so we bind them ourselves against the very library
object llama-cpp-python loaded (``llama_cpp.llama_cpp._lib``), so that pointers to
contexts and models are interchangeable with ``llama_cpp``'s own bindings.

Symbol resolution is lazy and per function: importing this module never touches the
library.  The first call of a binding looks the symbol up by its C name, then by its
computed mangled names, then (ELF only) by scanning the library's dynamic symbol table
once for any ``_Z<len><name>`` export.  A symbol that cannot be found raises
:class:`NextnSymbolError` naming it; :func:`missing_symbols` reports all of them at once
without raising.

The C batch-ext API (``llama_batch_ext_*``, ``llama_process``, ``struct llama_embd``) is
plain C in ``llama.h`` and is bound by llama-cpp-python 0.3.36; :class:`MtpBatch` below is
a thin helper over it (with our own fallback bindings should a llama-cpp-python release lack
them).  All function objects here are obtained with ``CDLL[name]`` (a fresh object, never
the cached attribute), so our argtypes never clobber llama-cpp-python's.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import struct
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = [
    "LLAMA_PROCESS_TYPE_DECODE",
    "LlamaEmbd",
    "MtpBatch",
    "NextnSymbolError",
    "library",
    "llama_get_ctx_other",
    "llama_get_embeddings_layer_inp",
    "llama_get_embeddings_nextn",
    "llama_get_embeddings_nextn_ith",
    "llama_set_embeddings_layer_inp",
    "llama_set_embeddings_nextn",
    "llama_set_nextn_layer_offset",
    "missing_symbols",
    "nextn_row",
    "nextn_rows",
]

LLAMA_PROCESS_TYPE_DECODE = 1


class NextnSymbolError(AttributeError):
    """A NextN/MTP entry point is not exported by the loaded libllama."""

    def __init__(self, name: str, tried: Sequence[str], lib_path: str) -> None:
        self.symbol = name
        self.tried = tuple(tried)
        super().__init__(
            f"libllama at {lib_path!r} does not export {name!r} (tried: {', '.join(tried)}); "
            "this llama.cpp build has no NextN/MTP staging API - draft-mtp is unavailable"
        )


_lib_cache: ctypes.CDLL | None = None


def library() -> ctypes.CDLL:
    """The libllama ``CDLL`` that llama-cpp-python loaded (imported lazily)."""
    global _lib_cache
    if _lib_cache is None:
        from llama_cpp import llama_cpp as _llama_cpp

        _lib_cache = _llama_cpp._lib
    return _lib_cache


def _lib_path(lib: ctypes.CDLL) -> str:
    return str(getattr(lib, "_name", "?"))


# --------------------------------------------------------------------------- mangling

# Itanium codes for the parameter types we use.
_ITANIUM = {
    "ctx": "P13llama_context",
    "bool": "b",
    "i32": "i",
    "u32": "j",
}
# MSVC (x64) codes for the same parameter types, and for the return types.
_MSVC_ARG = {"ctx": "PEAUllama_context@@", "bool": "_N", "i32": "H", "u32": "I"}
_MSVC_RET = {"void": "X", "float*": "PEAM", "ctx": "PEAUllama_context@@"}


def _itanium(name: str, params: Sequence[str]) -> str:
    return f"_Z{len(name)}{name}" + "".join(_ITANIUM[p] for p in params)


def _msvc(name: str, ret: str, params: Sequence[str]) -> str:
    # repeated identical argument types use back-references (0-9) in MSVC mangling;
    # only the two-bool case matters here.
    # (and "llama_context" becomes name back-reference 1 once the return type spelled it).
    codes: list[str] = []
    seen: list[str] = []
    for p in params:
        c = _MSVC_ARG[p]
        if p == "ctx" and ret == "ctx":
            c = "PEAU1@"
        if len(c) > 1 and c in seen:
            codes.append(str(seen.index(c)))
        else:
            codes.append(c)
            if len(c) > 1:
                seen.append(c)
    return f"?{name}@@YA{_MSVC_RET[ret]}{''.join(codes)}@Z"


_dynsym_cache: dict[str, list[str]] = {}


def _elf_dynamic_symbols(path: str) -> list[str]:
    """Names in an ELF64 little-endian shared object's ``.dynsym`` (empty if unreadable)."""
    if path in _dynsym_cache:
        return _dynsym_cache[path]
    names: list[str] = []
    try:
        with open(path, "rb") as f:
            data = f.read()
        if data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1:
            (e_shoff,) = struct.unpack_from("<Q", data, 0x28)
            e_shentsize, e_shnum = struct.unpack_from("<HH", data, 0x3A)
            sections = [
                struct.unpack_from("<IIQQQQIIQQ", data, e_shoff + i * e_shentsize)
                for i in range(e_shnum)
            ]
            for sh in sections:
                if sh[1] != 11:  # SHT_DYNSYM
                    continue
                off, size, link, entsize = sh[4], sh[5], sh[6], sh[9]
                str_off = sections[link][4]
                for j in range(size // (entsize or 24)):
                    (st_name,) = struct.unpack_from("<I", data, off + j * entsize)
                    end = data.index(b"\0", str_off + st_name)
                    names.append(data[str_off + st_name : end].decode("ascii", "replace"))
    except (OSError, ValueError, struct.error, IndexError):
        names = []
    _dynsym_cache[path] = names
    return names


def _resolve(name: str, ret: str, params: Sequence[str]) -> Any:
    lib = library()
    candidates = [name, _itanium(name, params), _msvc(name, ret, params)]
    for cand in candidates:
        try:
            return lib[cand]
        except AttributeError:
            continue
    # last resort: any exported Itanium overload of that name
    path = _lib_path(lib)
    if sys.platform.startswith("linux") and os.path.exists(path):
        prefix = f"_Z{len(name)}{name}"
        for sym in _elf_dynamic_symbols(path):
            if sym.startswith(prefix):
                try:
                    return lib[sym]
                except AttributeError:
                    pass
    raise NextnSymbolError(name, candidates, path)


class _Binding:
    """A lazily resolved libllama function with fixed argtypes/restype."""

    def __init__(self, name: str, ret: str, params: Sequence[str], restype: Any) -> None:
        self.name = name
        self._ret = ret
        self._params = tuple(params)
        self._restype = restype
        self._fn: Any = None

    def _argtypes(self) -> list[Any]:
        table = {
            "ctx": ctypes.c_void_p,
            "bool": ctypes.c_bool,
            "i32": ctypes.c_int32,
            "u32": ctypes.c_uint32,
        }
        return [table[p] for p in self._params]

    def resolve(self) -> Any:
        if self._fn is None:
            fn = _resolve(self.name, self._ret, self._params)
            fn.argtypes = self._argtypes()
            fn.restype = self._restype
            self._fn = fn
        return self._fn

    def available(self) -> bool:
        try:
            self.resolve()
        except NextnSymbolError:
            return False
        return True

    def __call__(self, *args: Any) -> Any:
        return self.resolve()(*args)


_FLOAT_P = ctypes.POINTER(ctypes.c_float)

_set_embeddings_nextn = _Binding(
    "llama_set_embeddings_nextn", "void", ("ctx", "bool", "bool"), None
)
_set_nextn_layer_offset = _Binding("llama_set_nextn_layer_offset", "void", ("ctx", "i32"), None)
_get_embeddings_nextn = _Binding("llama_get_embeddings_nextn", "float*", ("ctx",), _FLOAT_P)
_get_embeddings_nextn_ith = _Binding(
    "llama_get_embeddings_nextn_ith", "float*", ("ctx", "i32"), _FLOAT_P
)
_set_embeddings_layer_inp = _Binding(
    "llama_set_embeddings_layer_inp", "void", ("ctx", "u32", "bool"), None
)
_get_embeddings_layer_inp = _Binding(
    "llama_get_embeddings_layer_inp", "float*", ("ctx", "u32"), _FLOAT_P
)
_get_ctx_other = _Binding("llama_get_ctx_other", "ctx", ("ctx",), ctypes.c_void_p)

_ALL: tuple[_Binding, ...] = (
    _set_embeddings_nextn,
    _set_nextn_layer_offset,
    _get_embeddings_nextn,
    _get_embeddings_nextn_ith,
    _set_embeddings_layer_inp,
    _get_embeddings_layer_inp,
    _get_ctx_other,
)


def missing_symbols() -> list[str]:
    """Names of the staging functions the loaded libllama does not export."""
    return [b.name for b in _ALL if not b.available()]


def _ptr(ctx: Any) -> int | None:
    """Accept a ctypes c_void_p, an int, or llama-cpp-python's context handle."""
    if isinstance(ctx, ctypes.c_void_p):
        return ctx.value
    return ctx


# --------------------------------------------------------------------------- public API


def llama_set_embeddings_nextn(ctx: Any, value: bool, masked: bool) -> None:
    """Make ``ctx`` output NextN hidden states (``h_nextn``) on every decode.

    ``masked=False``: one row per batch token, indexed by raw batch position (target).
    ``masked=True``: one row per output token only, indexed like logits (MTP draft ctx).
    Call before the first decode so the output buffer is sized for it.
    """
    _set_embeddings_nextn(_ptr(ctx), bool(value), bool(masked))


def llama_set_nextn_layer_offset(ctx: Any, offset: int) -> None:
    """Select which NextN block (``il = n_layer + offset``) an MTP context runs (chained heads)."""
    _set_nextn_layer_offset(_ptr(ctx), int(offset))


def llama_get_embeddings_nextn(ctx: Any) -> ctypes._Pointer:  # type: ignore[type-arg]
    """Base pointer of the NextN rows of the last decode (``n_embd`` floats per row)."""
    return _get_embeddings_nextn(_ptr(ctx))


def llama_get_embeddings_nextn_ith(ctx: Any, i: int) -> ctypes._Pointer:  # type: ignore[type-arg]
    """Pointer to the NextN row of batch index ``i`` (NULL pointer on a bad index)."""
    return _get_embeddings_nextn_ith(_ptr(ctx), int(i))


def llama_set_embeddings_layer_inp(ctx: Any, lid: int, value: bool) -> None:
    """Make ``ctx`` output the input hidden state of layer ``lid`` (``n_layer`` = head input)."""
    _set_embeddings_layer_inp(_ptr(ctx), int(lid), bool(value))


def llama_get_embeddings_layer_inp(ctx: Any, lid: int) -> ctypes._Pointer:  # type: ignore[type-arg]
    """Pointer to the captured input rows of layer ``lid`` from the last decode."""
    return _get_embeddings_layer_inp(_ptr(ctx), int(lid))


def llama_get_ctx_other(ctx: Any) -> int | None:
    """The context retained from ``llama_context_params.ctx_other`` (None unless kept).

    llama.cpp keeps it only for gemma4-assistant / eagle3 / dflash; for qwen35 MTP it is
    NULL, i.e. the MTP context has its own KV cache (memory is not shared).
    """
    return _get_ctx_other(_ptr(ctx))


def nextn_row(ctx: Any, i: int, n_embd: int) -> np.ndarray:
    """Copy of the NextN row for batch index ``i`` as a float32 array (raises on NULL)."""
    p = llama_get_embeddings_nextn_ith(ctx, i)
    if not p:
        raise IndexError(
            f"no NextN embedding for batch index {i} (not an output, or nextn disabled)"
        )
    return np.ctypeslib.as_array(p, shape=(n_embd,)).copy()


def nextn_rows(ctx: Any, n_rows: int, n_embd: int) -> np.ndarray:
    """Copy of the first ``n_rows`` NextN rows of the last decode, shape (n_rows, n_embd)."""
    p = llama_get_embeddings_nextn(ctx)
    if not p:
        raise RuntimeError("no NextN embeddings (llama_set_embeddings_nextn not enabled?)")
    return np.ctypeslib.as_array(p, shape=(n_rows, n_embd)).copy()


# --------------------------------------------------------------------------- batch-ext


class LlamaEmbd(ctypes.Structure):
    """``struct llama_embd { const float * data; size_t n_rows; size_t n_embd; }`` (by value)."""

    _fields_ = [
        ("data", _FLOAT_P),
        ("n_rows", ctypes.c_size_t),
        ("n_embd", ctypes.c_size_t),
    ]


def _c(name: str, argtypes: list[Any], restype: Any) -> Callable[..., Any]:
    lib = library()
    try:
        fn = lib[name]
    except AttributeError as e:
        raise NextnSymbolError(name, [name], _lib_path(lib)) from e
    fn.argtypes = argtypes
    fn.restype = restype
    return fn


class _BatchExtApi:
    """Our own view of the C batch-ext API (independent of llama_cpp's function objects)."""

    def __init__(self) -> None:
        vp, i32, b = ctypes.c_void_p, ctypes.c_int32, ctypes.c_bool
        self.init = _c("llama_batch_ext_init", [vp], vp)
        self.free = _c("llama_batch_ext_free", [vp], None)
        self.clear = _c("llama_batch_ext_clear", [vp], None)
        self.add_token = _c("llama_batch_ext_add_token", [vp, i32, i32], i32)
        self.set_pos = _c("llama_batch_ext_set_pos", [vp, i32, ctypes.POINTER(i32)], b)
        self.set_embd_token = _c("llama_batch_ext_set_embd_token", [vp, i32, LlamaEmbd], b)
        self.set_output_logits = _c("llama_batch_ext_set_output_logits", [vp, i32, b], b)
        self.process = _c("llama_process", [vp, ctypes.c_int, vp], i32)


_batch_api: _BatchExtApi | None = None


def _api() -> _BatchExtApi:
    global _batch_api
    if _batch_api is None:
        _batch_api = _BatchExtApi()
    return _batch_api


class MtpBatch:
    """A ``llama_batch_ext`` of (token, position, hidden-state row) entries for an MTP context.

    Mirrors ``common_batch`` in common/speculative.cpp: every entry carries a token id
    (``llama_batch_ext_add_token``), one position (``llama_batch_ext_set_pos``; one value
    suffices for text tokens even on IMROPE models) and an ``n_embd`` float row attached
    with ``llama_batch_ext_set_embd_token`` - the MTP graph reads that row as ``h``.
    The row is copied into the batch, so the caller's buffer need not outlive ``add``.
    Capacity is the context's ``n_batch``.
    """

    def __init__(self, ctx: Any, n_embd: int) -> None:
        self._api = _api()
        self._ctx = _ptr(ctx)
        self.n_embd = int(n_embd)
        self._b = self._api.init(self._ctx)
        if not self._b:
            raise RuntimeError("llama_batch_ext_init returned NULL")
        self.n = 0

    def clear(self) -> None:
        self._api.clear(self._b)
        self.n = 0

    def add(
        self, token: int, pos: int, h: np.ndarray, *, seq_id: int = 0, output: bool = False
    ) -> int:
        row = np.ascontiguousarray(h, dtype=np.float32).reshape(-1)
        if row.size != self.n_embd:
            raise ValueError(f"hidden row has {row.size} floats, expected {self.n_embd}")
        idx = self._api.add_token(self._b, int(seq_id), int(token))
        if idx < 0:
            raise RuntimeError(
                f"llama_batch_ext_add_token failed ({idx}: -1 full, -2 bad token, -3 bad seq)"
            )
        p = (ctypes.c_int32 * 4)(int(pos), 0, 0, 0)
        if not self._api.set_pos(self._b, idx, p):
            raise RuntimeError("llama_batch_ext_set_pos failed")
        embd = LlamaEmbd(row.ctypes.data_as(_FLOAT_P), 1, self.n_embd)
        if not self._api.set_embd_token(self._b, idx, embd):
            raise RuntimeError(
                "llama_batch_ext_set_embd_token failed (row width must be n_embd_out)"
            )
        self._api.set_output_logits(self._b, idx, bool(output))
        self.n += 1
        return idx

    def decode(self) -> int:
        """``llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch)``; 0 on success."""
        return int(self._api.process(self._ctx, LLAMA_PROCESS_TYPE_DECODE, self._b))

    def close(self) -> None:
        if self._b:
            self._api.free(self._b)
            self._b = None

    def __enter__(self) -> MtpBatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        with contextlib.suppress(Exception):
            self.close()
