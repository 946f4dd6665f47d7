"""The suffix drafter's memories, one per partition, and their file.

A server with several API keys keeps one memory per key (a user's earlier prompts must not
draft, and so leak into timing, another user's answers); everything else uses the default
partition. Partitions are named by a digest of their key: the file never holds a key.

``--spec-memory PATH`` keeps the memories across runs in one ``.npz`` file (numpy arrays, no
pickles), written atomically: at most every SAVE_EVERY_S while generating, and at close. A
damaged file is refused with a warning and replaced at the next save; a file written for
another model (token ids mean nothing across vocabularies) is refused with an error.
"""

from __future__ import annotations

import hashlib
import time
import zipfile
from pathlib import Path

import numpy as np

from localspec.engine.spec_memory import SpecMemory
from localspec.errors import LocalspecError
from localspec.fileops import atomic_path
from localspec.progress import status
from localspec.sources import cache_dir

FORMAT = "localspec-spec-memory-1"
SAVE_EVERY_S = 60.0
DEFAULT_PARTITION = ""
DEFAULT_MEMORY_MB = 50.0


def partition_for_key(api_key: str) -> str:
    """The partition of an API key's requests: a digest, so the key is never stored."""
    return hashlib.sha256(api_key.encode()).hexdigest()[:16]


def default_memory_file(target: Path) -> Path:
    """Where ``--spec-memory`` without a path keeps a target's memory."""
    return cache_dir() / "spec-memory" / f"{target.stem}.npz"


class MemoryBank:
    """``max_mb``: the cap of each partition (0: remember nothing); ``path``: the file kept
    (None: memory lives as long as the process); ``model``: what the token ids belong to."""

    def __init__(self, max_mb: float, path: Path | None = None, model: str = "") -> None:
        self.max_mb, self.path, self.model = max_mb, path, model
        self._memories: dict[str, SpecMemory] = {}
        self._dirty = False
        self._saved_at = time.monotonic()
        if path is not None and path.exists():
            self._load(path)

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
        except OSError as exc:  # a full disk must not cost the answer being served
            status(f"localspec: warning: cannot save --spec-memory {self.path}: {exc}")
        self._dirty, self._saved_at = False, time.monotonic()

    def _load(self, path: Path) -> None:
        try:
            with np.load(path, allow_pickle=False) as data:
                arrays = {k: data[k] for k in data.files}
            parts = _documents(arrays, self.model, path)
        except (OSError, ValueError, KeyError, IndexError, zipfile.BadZipFile, EOFError) as exc:
            status(
                f"localspec: warning: --spec-memory {path} is damaged ({exc}); starting an "
                "empty memory (the file is rewritten at the next save)"
            )
            self._dirty = True  # replace the damaged file even if nothing is generated
            return
        for name, doc in parts:
            self.partition(name).add(doc)


def _documents(
    arrays: dict[str, np.ndarray], model: str, path: Path
) -> list[tuple[str, np.ndarray]]:
    """(partition, tokens) of each remembered generation, oldest first; ValueError or
    KeyError when the file is not one localspec wrote whole."""
    if str(arrays["format"]) != FORMAT:
        raise ValueError(f"not a localspec memory file (format {str(arrays['format'])!r})")
    if str(arrays["model"]) != model:
        raise LocalspecError(
            f"--spec-memory {path} holds the memory of another model ({arrays['model']})",
            "give each model its own file (or --spec-memory without a path: one per model)",
        )
    names, owner, lengths = arrays["partitions"], arrays["partition"], arrays["lengths"]
    tokens = arrays["tokens"]
    whole = owner.shape == lengths.shape and int(lengths.sum()) == tokens.size
    if not whole or lengths.min(initial=1) < 1:
        raise ValueError("its documents do not add up")
    if owner.size and not 0 <= int(owner.min()) <= int(owner.max()) < names.size:
        raise ValueError("a document names no partition")
    ends = np.cumsum(lengths)
    return [
        (str(names[p]), tokens[end - n : end])
        for p, n, end in zip(owner.tolist(), lengths.tolist(), ends.tolist(), strict=True)
    ]
