"""Write a GGUF that keeps only some of a model's transformer blocks (the ``draft-self`` draft).

The new file is the source file with the skipped blocks' tensors left out, the kept blocks
renumbered ``blk.0..`` in order, ``<arch>.block_count`` set to the number kept and every
per-layer metadata array sliced to the kept layers. The embedding, the final norm and the
output head are the source's own tensors, byte for byte. NextN/MTP blocks (appended after
the trunk) are dropped and ``<arch>.nextn_predict_layers`` set to 0: the draft is a plain
model.

It works on raw bytes: metadata records that do not change (token lists, merges, the chat
template) are copied verbatim using the byte spans ``gguf_info.read_header`` records, and
tensor data is copied block by block, so deriving a 1 GB model takes seconds, not the
minutes ``gguf.GGUFReader`` needs to decode a 150k-entry vocabulary.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

from gguf import GGUFValueType

from localspec.derivation.gguf_info import SCALAR_FORMATS, GGUFHeader, TensorInfo, read_header
from localspec.fileops import CHUNK

_BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def _scalar_record(key: str, vtype: GGUFValueType, value: object) -> bytes:
    return _string(key) + struct.pack("<I", vtype) + struct.pack(SCALAR_FORMATS[vtype], value)


def _string_record(key: str, value: str) -> bytes:
    return _string(key) + struct.pack("<I", GGUFValueType.STRING) + _string(value)


def _sliced_array_record(raw: bytes, key: str, keep: Sequence[int]) -> bytes:
    """Re-emit a per-layer array record (``raw``: the record's bytes) with only ``keep``."""
    body = raw[8 + len(key.encode()) :]
    vtype, item_type, n = struct.unpack_from("<IIQ", body)
    assert vtype == GGUFValueType.ARRAY
    size = struct.calcsize(SCALAR_FORMATS[GGUFValueType(item_type)])
    items = body[16 : 16 + n * size]
    kept = b"".join(items[i * size : (i + 1) * size] for i in keep)
    return _string(key) + struct.pack("<IIQ", vtype, item_type, len(keep)) + kept


def _scalar_type(raw: bytes, key: str) -> GGUFValueType:
    return GGUFValueType(struct.unpack_from("<I", raw, 8 + len(key.encode()))[0])


def is_per_layer_array(header: GGUFHeader, key: str, n_layer_all: int) -> bool:
    """A metadata array with one fixed-size entry per block (e.g. per-layer head counts)."""
    arch = header.metadata.get("general.architecture", "")
    value = header.metadata[key]
    return key.startswith(f"{arch}.") and isinstance(value, list) and len(value) == n_layer_all


def _metadata_records(
    f: BinaryIO, header: GGUFHeader, keep: Sequence[int], extra: dict[str, str]
) -> list[bytes]:
    md = header.metadata
    arch = md["general.architecture"]
    n_layer_all = int(md[f"{arch}.block_count"])
    records = []
    for key, (start, end) in header.kv_spans.items():
        if key in extra:
            continue
        f.seek(start)
        raw = f.read(end - start)
        if key == f"{arch}.block_count":
            records.append(_scalar_record(key, _scalar_type(raw, key), len(keep)))
        elif key == f"{arch}.nextn_predict_layers":
            records.append(_scalar_record(key, _scalar_type(raw, key), 0))
        elif is_per_layer_array(header, key, n_layer_all) and not isinstance(md[key][0], str):
            records.append(_sliced_array_record(raw, key, keep))
        else:
            records.append(raw)
    records.extend(_string_record(key, value) for key, value in extra.items())
    return records


def _kept_tensors(header: GGUFHeader, keep: Sequence[int]) -> list[tuple[str, TensorInfo]]:
    """(new name, source tensor) for every tensor of the draft, in source order."""
    new_index = {old: new for new, old in enumerate(keep)}
    kept = []
    for tensor in header.tensors:
        match = _BLOCK.match(tensor.name)
        if match is None:
            kept.append((tensor.name, tensor))
        elif int(match.group(1)) in new_index:
            kept.append((f"blk.{new_index[int(match.group(1))]}.{match.group(2)}", tensor))
    return kept


def _pad(n: int, alignment: int) -> int:
    return -n % alignment


def write_layer_subset(
    source: Path,
    dest: Path,
    keep: Sequence[int],
    extra_metadata: dict[str, str] | None = None,
    advance: Callable[[int], None] | None = None,
) -> None:
    """Write ``source`` with only the trunk blocks ``keep`` (sorted, 0-based) into ``dest``.
    ``extra_metadata``: string keys added to the new file (e.g. where it came from)."""
    header = read_header(source)
    extra = extra_metadata or {}
    alignment = int(header.metadata.get("general.alignment", 32))
    tensors = _kept_tensors(header, keep)
    with source.open("rb") as src, dest.open("wb") as out:
        records = _metadata_records(src, header, keep, extra)
        out.write(b"GGUF" + struct.pack("<IQQ", header.version, len(tensors), len(records)))
        out.writelines(records)
        offset = 0
        for name, tensor in tensors:
            out.write(_string(name) + struct.pack("<I", len(tensor.shape)))
            out.write(struct.pack(f"<{len(tensor.shape)}Q", *tensor.shape))
            out.write(struct.pack("<IQ", tensor.type, offset))
            offset += tensor.n_bytes + _pad(tensor.n_bytes, alignment)
        out.write(b"\0" * _pad(out.tell(), alignment))
        for _, tensor in tensors:
            _copy_range(src, out, header.data_offset + tensor.offset, tensor.n_bytes, advance)
            out.write(b"\0" * _pad(tensor.n_bytes, alignment))


def subset_bytes(source: Path, keep: Sequence[int]) -> int:
    """Size of the tensor data a subset file holds (what it adds on disk and, mapped, in RAM)."""
    return sum(t.n_bytes for _, t in _kept_tensors(read_header(source), keep))


def _copy_range(
    src: BinaryIO,
    out: BinaryIO,
    start: int,
    length: int,
    advance: Callable[[int], None] | None,
) -> None:
    src.seek(start)
    while length > 0:
        block = src.read(min(CHUNK, length))
        if not block:
            raise EOFError(f"the source ends {length} bytes early")
        out.write(block)
        length -= len(block)
        if advance:
            advance(len(block))
