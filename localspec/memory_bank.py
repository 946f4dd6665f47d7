"""The suffix drafter's memories, one per partition, and their file.

A server with several API keys keeps one memory per key (a user's earlier prompts must not
draft, and so leak into timing, another user's answers); everything else uses the default
partition. Partitions are named by a digest of their key: the file never holds a key.

``--spec-memory PATH`` keeps the memories across runs in one ``.npz`` file (numpy arrays, no
pickles), written atomically: at most every SAVE_EVERY_S while generating, and at close
(through a symbolic link, the file it points to). A damaged memory file is refused with a
warning and replaced at the next save; a file written for another model (token ids mean
nothing across vocabularies), or any file that is not a memory file (a model, notes, a
device), is refused with an error and never overwritten.
"""

from __future__ import annotations

import hashlib
import os
import time
import zipfile
from pathlib import Path

import numpy as np
from filelock import FileLock, Timeout

from localspec.engine.spec_memory import SpecMemory
from localspec.errors import LocalspecError
from localspec.fileops import atomic_path
from localspec.progress import plural, status
from localspec.sources import cache_dir

FORMAT_FAMILY, FORMAT_VERSION = "localspec-spec-memory-", 1
FORMAT = f"{FORMAT_FAMILY}{FORMAT_VERSION}"
SAVE_EVERY_S = 60.0
DEFAULT_PARTITION = ""
DEFAULT_MEMORY_MB = 50.0
# How every memory file starts: a zip entry (numpy's .npz) whose first member is "format"
# (``save`` writes it first). A file that starts otherwise was not written by localspec.
ZIP_ENTRY = b"PK\x03\x04"
FIRST_MEMBER = b"format.npy"
FIRST_MEMBER_AT = 30  # after a zip entry's fixed header


class DamagedMemory(ValueError):
    """A memory file localspec wrote, no longer whole (its reason, in words)."""


def partition_for_key(api_key: str) -> str:
    """The partition of an API key's requests: a digest, so the key is never stored."""
    return hashlib.sha256(api_key.encode()).hexdigest()[:16]


def default_memory_file(target: Path) -> Path:
    """Where ``--spec-memory`` without a path keeps a target's memory."""
    return cache_dir() / "spec-memory" / f"{target.stem}.npz"


class MemoryBank:
    """``max_mb``: the cap of each partition (0: remember nothing); ``path``: the file kept
    (None: memory lives as long as the process); ``model``: what the token ids belong to;
    ``n_vocab``: how many ids there are (a file holding others is damaged)."""

    def __init__(
        self, max_mb: float, path: Path | None = None, model: str = "", n_vocab: int = 0
    ) -> None:
        self.max_mb, self.model, self.n_vocab = max_mb, model, n_vocab
        # a link stays a link: the file it points to is the one rewritten
        self.path = Path(os.path.realpath(path)) if path is not None else None
        self._memories: dict[str, SpecMemory] = {}
        self._dirty = False
        self._saved_at = time.monotonic()
        self._lock = self._hold(self.path) if self.path is not None else None
        try:
            if self.path is not None and self.path.exists():
                self._load(self.path)
        except BaseException:
            self.close()  # refused: the file is left as it is, and free
            raise

    @staticmethod
    def _hold(path: Path) -> FileLock | None:
        """One writer per file: two would each write only what they saw, the last one
        erasing the other's generations."""
        name = hashlib.sha256(str(path).encode()).hexdigest()[:16]
        try:
            folder = cache_dir() / "locks"  # not beside the user's file
            folder.mkdir(parents=True, exist_ok=True)
            lock = FileLock(str(folder / f"memory-{name}.lock"))
            lock.acquire(timeout=0)
        except Timeout:
            raise LocalspecError(
                f"the speculation memory {path} is in use by another Engine or localspec process",
                "give each its own file (--spec-memory PATH), or stop the other first",
            ) from None
        except OSError:
            return None  # a read-only folder: save() says so
        return lock

    def close(self) -> None:
        """Save, and let another process use the file."""
        self.save()
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    @property
    def enabled(self) -> bool:
        return self.max_mb > 0

    def partition(self, name: str = DEFAULT_PARTITION) -> SpecMemory:
        if name not in self._memories:
            self._memories[name] = SpecMemory(self.max_mb)
        return self._memories[name]

    def remember(self, tokens: list[int], partition: str = DEFAULT_PARTITION) -> None:
        """One generation's prompt and answer; saved now and then when a file is kept."""
        if not self.enabled:
            return
        self.partition(partition).add(tokens)
        self._dirty = True
        if self.path is not None and time.monotonic() - self._saved_at >= SAVE_EVERY_S:
            self.save()

    def save(self) -> None:
        """Write every partition to the file (atomically), if anything changed."""
        if self.path is None or not self._dirty:
            return
        names = sorted(self._memories)
        docs = [(i, d) for i, n in enumerate(names) for d in self._memories[n].documents()]
        arrays = {
            "format": np.array(FORMAT),
            "model": np.array(self.model),
            "partitions": np.array(names, dtype=str),
            "partition": np.array([i for i, _ in docs], dtype=np.int32),
            "lengths": np.array([d.size for _, d in docs], dtype=np.int64),
            "tokens": np.concatenate([d for _, d in docs]) if docs else np.zeros(0, np.int32),
        }
        try:
            with atomic_path(self.path) as tmp, tmp.open("wb") as f:
                np.savez(f, **arrays)
        except (OSError, LocalspecError) as exc:  # a full disk must not cost the answer
            status(f"localspec: warning: cannot save --spec-memory {self.path}: {exc}", True)
        self._dirty, self._saved_at = False, time.monotonic()

    def _load(self, path: Path) -> None:
        refuse_foreign_file(path)
        try:
            with np.load(path, allow_pickle=False) as data:
                arrays = {k: data[k] for k in data.files}
            parts = _documents(arrays, self.model, self.n_vocab, path)
        except DamagedMemory as exc:
            self._start_over(path, str(exc))
            return
        except (OSError, ValueError, KeyError, IndexError, TypeError, zipfile.BadZipFile, EOFError):
            self._start_over(path, "it cannot be read whole")
            return
        by_partition: dict[str, list[np.ndarray]] = {}
        for name, doc in parts:
            by_partition.setdefault(name, []).append(doc)
        kept = sum(self.partition(n).add_newest(docs) for n, docs in by_partition.items())
        if kept < len(parts):  # a lower cap than the file was written with: it shrinks
            status(
                f"localspec: speculation memory: the newest {kept} of "
                f"{plural(len(parts), 'earlier generation')} from {path} (the cap is "
                f"{self.max_mb:g} MB; the file keeps only these from the next save)"
            )
        elif parts:
            status(
                f"localspec: speculation memory: {plural(len(parts), 'earlier generation')} "
                f"from {path}"
            )

    def _start_over(self, path: Path, reason: str) -> None:
        status(
            f"localspec: warning: the speculation memory {path} is damaged ({reason}); "
            "starting an empty memory (the file is rewritten at the next save)"
        )
        self._dirty = True  # replace the damaged file even if nothing is generated


def refuse_foreign_file(path: Path) -> None:
    """Refuse a path that is not a memory file localspec wrote (an empty file aside):
    rewriting it would destroy whatever it is."""
    hint = "give --spec-memory (spec_memory_path) a new file name, or a memory file of localspec"
    if not path.is_file():
        raise LocalspecError(f"{path} is not a regular file: refusing to use it as memory", hint)
    try:
        with path.open("rb") as f:
            head = f.read(FIRST_MEMBER_AT + len(FIRST_MEMBER))
    except OSError as exc:
        raise LocalspecError(f"cannot read the speculation memory {path}: {exc}", hint) from None
    if head and (head[:4] != ZIP_ENTRY or head[FIRST_MEMBER_AT:] != FIRST_MEMBER):
        raise LocalspecError(
            f"{path} is not a localspec speculation-memory file: refusing to overwrite it", hint
        )


def _documents(
    arrays: dict[str, np.ndarray], model: str, n_vocab: int, path: Path
) -> list[tuple[str, np.ndarray]]:
    """(partition, tokens) of each remembered generation, oldest first; DamagedMemory (or
    KeyError: an array missing) when the file is not one localspec wrote whole."""
    written = _text(arrays["format"])
    version = written.removeprefix(FORMAT_FAMILY)
    if written.startswith(FORMAT_FAMILY) and version.isdigit() and int(version) > FORMAT_VERSION:
        raise LocalspecError(
            f"--spec-memory {path} was written by a newer localspec (format {written!r}): "
            "not read, and not overwritten",
            "upgrade localspec, or give this one another file",
        )
    if written != FORMAT:
        raise DamagedMemory(f"format {written!r}")
    if _text(arrays["model"]) != model:
        raise LocalspecError(
            f"--spec-memory {path} holds the memory of another model ({arrays['model']})",
            "give each model its own file (or --spec-memory without a path: one per model)",
        )
    names = arrays["partitions"]
    owner, lengths, tokens = (_integers(arrays, k) for k in ("partition", "lengths", "tokens"))
    if names.dtype.kind != "U" or names.ndim != 1:
        raise DamagedMemory("its partitions are not names")
    whole = owner.shape == lengths.shape and int(lengths.sum()) == tokens.size
    if not whole or lengths.min(initial=1) < 1:
        raise DamagedMemory("its documents do not add up")
    if owner.size and not 0 <= int(owner.min()) <= int(owner.max()) < names.size:
        raise DamagedMemory("a document names no partition")
    beyond = n_vocab if n_vocab > 0 else np.iinfo(np.int32).max
    if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= beyond):
        raise DamagedMemory("it holds token ids outside the model's vocabulary")
    ends = np.cumsum(lengths)
    return [
        (str(names[p]), tokens[end - n : end].astype(np.int32))
        for p, n, end in zip(owner.tolist(), lengths.tolist(), ends.tolist(), strict=True)
    ]


def _text(array: np.ndarray) -> str:
    if array.dtype.kind != "U" or array.ndim != 0:
        raise DamagedMemory("its header is not text")
    return str(array)


def _integers(arrays: dict[str, np.ndarray], name: str) -> np.ndarray:
    array = arrays[name]
    if array.dtype.kind not in "iu" or array.ndim != 1:
        raise DamagedMemory(f"its {name} are not a list of integers")
    return array
