"""Safe file writes: nothing half-written ever looks complete.

Downloads, chunk joins and requantizations all write to a temporary file next to the
destination and rename it into place only once it is whole (and verified), so an
interrupted step leaves at most a ``*.part`` file that the next attempt overwrites.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

CHUNK = 8 << 20


@contextlib.contextmanager
def atomic_path(dest: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``dest``; rename it onto ``dest`` if the block succeeds."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def sha256_file(path: Path, progress: Callable[[int], None] | None = None) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
            if progress:
                progress(len(block))
    return digest.hexdigest()
