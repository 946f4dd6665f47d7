"""``draft-self``: the target with some of its layers skipped drafts for the target.

The draft is a GGUF derived from the target (``engine/layer_subset.py``): the kept blocks,
renumbered, plus the target's own embedding, final norm and output head. It is built once
into the localspec cache, keyed by the target's SHA-256 and the layer set, and checked
against the checksum recorded when it was built before every reuse (a damaged file is
rebuilt).

Why a copy and not shared memory: llama.cpp maps each model's tensors from that model's
own files and finds a block's tensors by the name ``blk.<i>.*``; a draft whose blocks are
renumbered cannot point into the target's file, and the kernel's page cache is per file, so
the two mappings cannot share pages. The draft's file (its size is printed) is therefore
extra disk and, once mapped and read, extra RAM the OS can reclaim under pressure.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from localspec.engine.layer_subset import subset_bytes, write_layer_subset
from localspec.errors import LocalspecError
from localspec.fileops import atomic_path, read_stamp, sha256_file, stamped_sha256, write_stamp
from localspec.gguf_info import gguf_info, read_header, truncation_problem
from localspec.progress import byte_progress, status
from localspec.sources import cache_dir

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
# metadata that fixes a layer's kind by its position: skipping layers shifts the pattern
_POSITIONAL_KEYS = ("attention.sliding_window_pattern", "full_attention_interval")


def parse_layers(spec: str, n_layer: int) -> tuple[int, ...]:
    """``--spec-self-layers``: ``0-11``, ``0-5,18-23`` or ``skip-every=K`` (drop every K-th
    layer, counting from 1, but never the first or the last) -> the kept layer indices."""
    spec = spec.strip()
    flag = "--spec-self-layers"
    if spec.startswith("skip-every="):
        value = spec.removeprefix("skip-every=")
        if not value.isdigit() or int(value) < 2:
            raise LocalspecError(
                f"{flag} {spec}: K must be an integer >= 2",
                "e.g. skip-every=2 drops every 2nd layer",
            )
        k = int(value)
        kept = [i for i in range(n_layer) if (i + 1) % k or i in (0, n_layer - 1)]
    else:
        kept = []
        for part in spec.split(","):
            match = _RANGE.match(part.strip())
            if match is None:
                raise LocalspecError(
                    f"{flag} '{spec}': cannot read '{part}'",
                    "use ranges and indices like 0-11 or 0-5,18-23, or skip-every=2",
                )
            lo = int(match.group(1))
            hi = int(match.group(2) or lo)
            if hi < lo or hi >= n_layer:
                raise LocalspecError(
                    f"{flag} '{spec}': '{part}' is outside the target's layers 0-{n_layer - 1}"
                )
            kept.extend(range(lo, hi + 1))
    layers = tuple(sorted(set(kept)))
    if len(layers) >= n_layer:
        raise LocalspecError(
            f"{flag} '{spec}' keeps all {n_layer} layers: the draft would be the target itself",
            "keep fewer layers, e.g. the first half",
        )
    return layers


def default_layers(n_layer: int) -> tuple[int, ...]:
    """The first half of the layers plus the last one: early layers carry most of what a
    next token needs, and the last layer maps the residual stream back onto the output
    head's expectations (measured on qwen2.5-coder-0.5b; see README)."""
    return tuple(sorted({*range(max(1, n_layer // 2)), n_layer - 1}))


def label(layers: tuple[int, ...]) -> str:
    """Compact ranges: (0, 1, 2, 5) -> '0-2,5'."""
    parts: list[str] = []
    start = prev = layers[0]
    for i in (*layers[1:], None):
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(f"{start}-{prev}" if prev > start else f"{start}")
        if i is not None:
            start = prev = i
    return ",".join(parts)


@dataclass(frozen=True)
class SelfDraft:
    path: Path
    layers: tuple[int, ...]
    n_layer: int
    extra_bytes: int

    def describe(self) -> str:
        return (
            f"draft-self: keeping {len(self.layers)} of {self.n_layer} layers "
            f"({label(self.layers)}); "
            f"extra {self.extra_bytes / 2**20:.0f} MiB on disk and in RAM once mapped"
        )


def target_checksum(target: Path) -> str:
    key = hashlib.sha1(str(target.resolve()).encode()).hexdigest()[:20]
    stamp = cache_dir() / "checksums" / f"{key}.json"
    stamp.parent.mkdir(parents=True, exist_ok=True)
    if read_stamp(target, stamp) is None:
        status(f"hashing {target.name} (once, to key its derived draft)")
    with byte_progress(f"hashing {target.name}", target.stat().st_size) as advance:
        return stamped_sha256(target, stamp, advance)


def ensure_self_draft(target: Path, spec: str | None = None) -> SelfDraft:
    """The self-draft for ``target`` with the layers ``spec`` names (default: see
    ``default_layers``), built on first use and verified on reuse."""
    info = gguf_info(target)
    n_trunk = info.n_layer - info.n_layer_nextn
    if n_trunk < 2:
        raise LocalspecError(f"{target.name} has {n_trunk} layer(s): nothing to skip")
    layers = parse_layers(spec, n_trunk) if spec else default_layers(n_trunk)
    digest = target_checksum(target)
    name = f"{target.stem}-{digest[:16]}-L{label(layers).replace(',', '_')}.gguf"
    dest = cache_dir() / "self-draft" / name
    stamp = dest.with_name(dest.name + ".verified")
    if not _intact(dest, stamp):
        _build(target, dest, stamp, layers, digest, info.architecture)
    draft = SelfDraft(dest, layers, n_trunk, subset_bytes(target, layers))
    status(draft.describe())
    return draft


def _intact(dest: Path, stamp: Path) -> bool:
    """The derived file exists and still has the checksum recorded when it was built."""
    if not dest.exists():
        return False
    if read_stamp(dest, stamp) is not None:
        return True
    try:
        recorded = json.loads(stamp.read_text())["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        recorded = None
    intact = recorded is not None and truncation_problem(dest) is None
    if intact and sha256_file(dest) == recorded:
        write_stamp(dest, recorded, stamp)
        return True
    status(f"{dest.name} is damaged (it no longer matches its recorded checksum); rebuilding it")
    return False


def _build(
    target: Path, dest: Path, stamp: Path, layers: tuple[int, ...], digest: str, arch: str
) -> None:
    metadata = read_header(target).metadata
    positional = [k for k in _POSITIONAL_KEYS if f"{arch}.{k}" in metadata]
    if positional:
        status(f"note: {arch} sets layer kinds by position ({', '.join(positional)})")
    status(f"building the draft-self model from {target.name}, layers {label(layers)} (once)")
    stamp.unlink(missing_ok=True)
    extra = {
        "localspec.self_draft.layers": label(layers),
        "localspec.self_draft.source_sha256": digest,
    }
    with atomic_path(dest) as tmp:
        with byte_progress("writing the draft", subset_bytes(target, layers)) as advance:
            write_layer_subset(target, tmp, layers, extra, advance)
        problem = truncation_problem(tmp)
        if problem:
            raise LocalspecError(f"writing the draft-self model failed: {problem}")
        built = sha256_file(tmp)
    write_stamp(dest, built, stamp)
