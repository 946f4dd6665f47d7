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
import re
from dataclasses import dataclass
from pathlib import Path

from localspec.derivation.gguf_info import gguf_info, read_header, truncation_problem
from localspec.derivation.layer_subset import subset_bytes, write_layer_subset
from localspec.derivation.quantize import FTYPES, requantize
from localspec.errors import LocalspecError
from localspec.fileops import built_file, intact_file, read_stamp, scratch_dir, stamped_sha256
from localspec.progress import byte_progress, status
from localspec.sources import cache_dir, clean_cache

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
            if hi < lo:
                raise LocalspecError(
                    f"{flag} '{spec}': '{part}' runs backwards",
                    f"write the lower layer first: {hi}-{lo}",
                )
            if hi >= n_layer:
                raise LocalspecError(
                    f"{flag} '{spec}': '{part}' is outside the target's layers 0-{n_layer - 1}",
                    f"the target has {n_layer} layers, numbered from 0",
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
    """Skip the second quarter of the layers (keep 0..n/4-1 and n/2..n-1).

    Of the layer sets tried (docs/benchmarks.md, "Measurements behind defaults"), this one
    drafted best: the last layers map the residual stream onto what the output head
    expects and cannot go; the early-middle layers are the most redundant."""
    quarter = max(1, n_layer // 4)
    return tuple(i for i in range(n_layer) if not quarter <= i < 2 * quarter)


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


QUANTS = ("auto", "none", *FTYPES)


# file types already as small as Q4_0 (or smaller): requantizing them gains nothing
_SMALL_TYPES = ("Q4_0", "Q4_1", "Q2_K", "Q3_K", "IQ", "TQ", "Q1")


def draft_quant(quant: str, target_file_type: str) -> str | None:
    """``--spec-self-quant``: the draft's weight type (None: the target's own types).

    auto requantizes the draft to plain Q4_0 for every tensor, head included, unless the
    target is already that small. The draft only proposes, the target verifies every token,
    so the draft's precision moves acceptance, never the output; and on a CPU, where a step
    costs what its weights weigh, speed is what a draft needs (a Q4_0 draft steps about
    twice as fast as a Q4_K_M one, whose Q6_K output head weighs much: docs/benchmarks.md)."""
    if quant not in QUANTS:
        raise LocalspecError(
            f"--spec-self-quant '{quant}' is not one of {', '.join(QUANTS)}",
            "auto is the usual choice",
        )
    if quant == "auto":
        return None if target_file_type.startswith(_SMALL_TYPES) else "Q4_0"
    return None if quant == "none" else quant


def ensure_self_draft(target: Path, spec: str | None = None, quant: str = "auto") -> SelfDraft:
    """The self-draft for ``target`` with the layers ``spec`` names (default: see
    ``default_layers``) and weights requantized per ``quant``, built on first use and
    verified on reuse."""
    clean_cache()
    info = gguf_info(target)
    ftype = draft_quant(quant, info.file_type)
    n_trunk = info.n_layer - info.n_layer_nextn
    if n_trunk < 2:
        raise LocalspecError(f"{target.name} has {n_trunk} layer(s): nothing to skip")
    layers = parse_layers(spec, n_trunk) if spec else default_layers(n_trunk)
    digest = target_checksum(target)
    name = f"{target.stem}-{digest[:16]}-L{label(layers).replace(',', '_')}-{ftype or 'same'}.gguf"
    dest = cache_dir() / "self-draft" / name
    stamp = dest.with_name(dest.name + ".verified")
    if not intact_file(dest, stamp):
        _build(target, dest, stamp, layers, digest, info.architecture, ftype)
    draft = SelfDraft(dest, layers, n_trunk, dest.stat().st_size)
    status(draft.describe())
    return draft


def _build(
    target: Path,
    dest: Path,
    stamp: Path,
    layers: tuple[int, ...],
    digest: str,
    arch: str,
    ftype: str | None,
) -> None:
    metadata = read_header(target).metadata
    positional = [k for k in _POSITIONAL_KEYS if f"{arch}.{k}" in metadata]
    if positional:
        status(f"note: {arch} sets layer kinds by position ({', '.join(positional)})")
    status(f"building the draft-self model from {target.name}, layers {label(layers)} (once)")
    extra = {
        "localspec.derivation.self_draft.layers": label(layers),
        "localspec.derivation.self_draft.source_sha256": digest,
    }
    with built_file(dest, stamp) as tmp, scratch_dir(dest) as work:
        subset = work / "subset.gguf"
        with byte_progress("writing the draft", subset_bytes(target, layers)) as advance:
            write_layer_subset(target, subset if ftype else tmp, layers, extra, advance)
        if ftype:
            status(f"requantizing the draft to {ftype}")
            requantize(subset, tmp, ftype, pure=True)
        problem = truncation_problem(tmp)
        if problem:
            raise LocalspecError(f"writing the draft-self model failed: {problem}")
