"""Safe file writes: nothing half-written ever looks complete.

Downloads, chunk joins and requantizations all write to a temporary file next to the
destination and rename it into place only once it is whole (and verified), so an
interrupted step leaves at most a ``*.part`` file that the next attempt overwrites.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
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


def _fingerprint(path: Path) -> dict[str, int]:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def read_stamp(path: Path, stamp: Path) -> str | None:
    """The SHA-256 recorded in ``stamp`` if ``path`` has not changed (size, mtime) since."""
    try:
        data = json.loads(stamp.read_text())
        if {k: data[k] for k in ("size", "mtime_ns")} == _fingerprint(path):
            return str(data["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def write_stamp(path: Path, digest: str, stamp: Path) -> None:
    """Record that ``path``, as it is now, has SHA-256 ``digest`` (atomically)."""
    with atomic_path(stamp) as tmp:
        tmp.write_text(json.dumps({"sha256": digest, **_fingerprint(path)}))


def stamped_sha256(path: Path, stamp: Path, progress: Callable[[int], None] | None = None) -> str:
    """SHA-256 of ``path``, hashed only when it changed since ``stamp`` was written: checking
    a multi-GB model on every load would cost seconds."""
    digest = read_stamp(path, stamp)
    if digest is None:
        digest = sha256_file(path, progress)
        write_stamp(path, digest, stamp)
    return digest
