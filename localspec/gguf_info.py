"""What a GGUF file says about itself, read with the ``gguf`` package (no weights loaded)."""

from __future__ import annotations

from pathlib import Path


def truncation_problem(path: Path) -> str | None:
    """Say why ``path`` is not a complete GGUF, or None when its layout is whole."""
    from gguf import GGUFReader

    size = path.stat().st_size
    try:
        reader = GGUFReader(path)
    except Exception as exc:  # the reader fails in many ways on damaged files
        return f"{path} is not a readable GGUF ({type(exc).__name__}: {exc}); it may be truncated"
    if not reader.tensors:
        return None
    end = max(int(t.data_offset) + int(t.n_bytes) for t in reader.tensors)
    if end > size:
        return f"{path} is truncated: it has {size} bytes but its tensors need {end}"
    return None
