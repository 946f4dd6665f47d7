"""Safe file writes: nothing half-written ever looks complete.

Downloads, chunk joins and requantizations all write to a temporary file next to the
destination and rename it into place only once it is whole (and verified). An interrupted
step removes its scratch file; a killed one (no cleanup runs) leaves it, named with the
writer's process id, and the next write into that folder removes it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil

from localspec.errors import LocalspecError
from localspec.progress import status

CHUNK = 8 << 20
GGUF_MAGIC = b"GGUF"


# Scratch files and folders carry their writer's process id: ``.NAME.pid<PID>-<random>.part``
# (or ``.work`` for a folder), so a later process can tell the leftovers of a killed writer
# (SIGKILL runs no cleanup) from the work of one still running, and remove them.
_SCRATCH = re.compile(r"^\..+\.pid(\d+)-[^./]+\.(part|work)$")
# names written before scratch files carried a process id: removed once old enough
_LEGACY_SCRATCH = re.compile(r"^(\..+\.[a-z0-9_]{8}\.part|tmp[a-z0-9_]{8})$")
LEGACY_STALE_S = 3600.0


def _scratch_prefix(dest: Path) -> str:
    return f".{dest.name}.pid{os.getpid()}-"


def remove_stale_scratch(directory: Path, legacy: bool = False) -> list[Path]:
    """Remove the scratch files and folders in ``directory`` whose writer is gone; with
    ``legacy``, also the unmarked ones of older versions once an hour old (only for
    folders that localspec alone writes into). Returns what was removed."""
    removed = []
    try:
        entries = list(directory.iterdir())
    except OSError:
        return removed
    now = time.time()
    for entry in entries:
        match = _SCRATCH.match(entry.name)
        if match:
            stale = not psutil.pid_exists(int(match.group(1)))
        elif legacy and _LEGACY_SCRATCH.match(entry.name):
            try:
                stale = now - entry.stat().st_mtime > LEGACY_STALE_S
            except OSError:
                continue
        else:
            continue
        if stale:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed


@contextlib.contextmanager
def atomic_path(dest: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``dest``; rename it onto ``dest`` if the block succeeds.
    A link is written through (the link stays); a device, a pipe or a folder is refused: a
    rename would replace it with a plain file."""
    dest = Path(os.path.realpath(dest))
    if dest.exists() and not dest.is_file():
        raise LocalspecError(
            f"{dest} is not a regular file (a device, a pipe or a folder): not replaced",
            "give the path of a file",
        )
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_scratch(dest.parent)
        tmp = _new_scratch_file(dest)
    except OSError as exc:  # a read-only place, /proc...: say where, not the scratch name
        raise LocalspecError(
            f"cannot write {dest}: {exc.strerror or exc}", "pick a writable place"
        ) from None
    try:
        yield tmp
        os.chmod(tmp, _mode_for(dest))  # mkstemp's files are private (0600)
        os.replace(tmp, dest)
    except OSError as exc:
        if exc.filename in (None, str(tmp)):  # a full disk...: say it of the file asked for
            exc.filename = str(dest)
        raise
    finally:
        tmp.unlink(missing_ok=True)


def _mode_for(dest: Path) -> int:
    """The permissions of the file replaced, or of a new file (the umask applied)."""
    try:
        return stat.S_IMODE(dest.stat().st_mode)
    except OSError:
        return 0o666 & ~_UMASK


def _read_umask() -> int:
    mask = os.umask(0)  # the only way to read it; read once, before any thread starts
    os.umask(mask)
    return mask


_UMASK = _read_umask()


def _new_scratch_file(dest: Path) -> Path:
    fd, name = tempfile.mkstemp(prefix=_scratch_prefix(dest), suffix=".part", dir=dest.parent)
    os.close(fd)
    return Path(name)


@contextlib.contextmanager
def built_file(dest: Path, stamp: Path) -> Iterator[Path]:
    """``atomic_path`` for a file localspec builds: once placed, its SHA-256 is recorded in
    ``stamp`` for ``intact_file`` (a killed build leaves no stamp, so it is rebuilt)."""
    stamp.unlink(missing_ok=True)
    with atomic_path(dest) as tmp:
        yield tmp
        digest = sha256_file(tmp)
    write_stamp(dest, digest, stamp)


@contextlib.contextmanager
def scratch_dir(dest: Path) -> Iterator[Path]:
    """A work folder beside ``dest`` (same file system, so results can be renamed into place),
    removed afterwards, and by a later process if this one is killed."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(
        prefix=_scratch_prefix(dest), suffix=".work", dir=dest.parent
    ) as work:
        yield Path(work)


def check_output_path(path: Path, flag: str) -> None:
    """Refuse an output path that cannot be written, before the work that fills it starts."""
    hint = f"give {flag} the path of a file in an existing, writable directory"
    if path.is_dir():
        raise LocalspecError(f"{flag} {path}: is a directory, not a file", hint)
    if path.is_symlink():  # written through: the link's target must be a place to write
        target = Path(os.path.realpath(path))
        if not target.parent.is_dir():
            raise LocalspecError(
                f"{flag} {path}: a link into {target.parent}, which does not exist", hint
            )
        path = target
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise LocalspecError(f"{flag} {path}: the directory {parent} does not exist", hint)
    if is_gguf(path):
        raise LocalspecError(f"{flag} {path}: is a model (GGUF), not overwritten", hint)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise LocalspecError(f"{flag} {path}: cannot write into {parent}", hint)
    if path.exists() and not path.is_file():
        raise LocalspecError(f"{flag} {path}: not a regular file (a device, a pipe...)", hint)
    if path.exists() and not os.access(path, os.W_OK):
        raise LocalspecError(f"{flag} {path}: the file is not writable", hint)
    try:  # what the permission bits do not say (root, /proc, a read-only mount): try it
        _new_scratch_file(path).unlink()
    except OSError as exc:
        # ENOENT for a file being created in a folder that exists: a file system such as
        # /proc that takes no new files (its "No such file" would read as a wrong path)
        why = "the file system there takes no new files" if exc.errno == errno.ENOENT else None
        raise LocalspecError(
            f"{flag} {path}: cannot write there ({why or exc.strerror})", hint
        ) from None


def is_gguf(path: Path) -> bool:
    """A file that starts as a GGUF model does."""
    try:
        with path.open("rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


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


def intact_file(path: Path, stamp: Path) -> bool:
    """``path`` exists and still has the SHA-256 recorded in ``stamp`` when it was written:
    for files localspec builds itself (derived models, self-drafts), which a truncation or
    a stray write would otherwise turn into a load error on every run. Hashed again only
    when the size or mtime changed; a size change alone fails at once."""
    if not path.is_file():
        return False
    if read_stamp(path, stamp) is not None:
        return True
    try:
        data = json.loads(stamp.read_text())
        recorded, size = str(data["sha256"]), int(data["size"])
    except (OSError, ValueError, KeyError, TypeError):
        recorded, size = None, -1
    if recorded is None:  # the file may be whole: its record is what was lost
        status(f"{path.name}: the record of its checksum is missing; rebuilding it", True)
        return False
    if path.stat().st_size != size or sha256_file(path) != recorded:
        status(
            f"{path.name} is damaged (it does not match the checksum recorded when it was "
            "built); rebuilding it",
            True,
        )
        return False
    write_stamp(path, recorded, stamp)  # same content, new mtime: remember the check
    return True


def stamped_sha256(path: Path, stamp: Path, progress: Callable[[int], None] | None = None) -> str:
    """SHA-256 of ``path``, hashed only when it changed since ``stamp`` was written: checking
    a multi-GB model on every load would cost seconds."""
    digest = read_stamp(path, stamp)
    if digest is None:
        digest = sha256_file(path, progress)
        write_stamp(path, digest, stamp)
    return digest
