"""What a GGUF file says about itself, without loading weights.

``gguf.GGUFReader`` materialises every metadata array as numpy objects, which takes seconds on
a 150k-token vocabulary; scanning folders of models must take milliseconds. So the header is
read here directly (the format is small: typed key/values, then tensor descriptors), using
the ``gguf`` package's enums for value types, quantization types and file types. Large
arrays (token texts, merges) are skipped and only their length kept; token texts, when
needed, come from a vocab-only llama.cpp load (``vocab.py``), which is what llama.cpp itself
compares.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, LlamaFileType

from localspec.errors import LocalspecError

SCALAR_FORMATS = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}
SMALL_ARRAY = 1024  # arrays up to this length are kept (per-layer hyperparameters)


@dataclass(frozen=True)
class ArraySummary:
    """A long metadata array that was skipped: only its element type and length are kept."""

    type: GGUFValueType
    length: int


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    type: int
    offset: int

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def n_bytes(self) -> int:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(self.type)]
        return self.n_elements // block * size


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    metadata: dict[str, Any]
    tensors: list[TensorInfo]
    data_offset: int  # where tensor data begins
    # key -> (start, end) byte range of the whole key/value record, so a rewriter can copy
    # the records it does not change (token lists, merges) without decoding them
    kv_spans: dict[str, tuple[int, int]] = field(default_factory=dict)


class _Reader:
    def __init__(self, f: BinaryIO) -> None:
        self.f = f

    def unpack(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        data = self.f.read(size)
        if len(data) != size:
            raise EOFError("the file ends inside its header")
        return struct.unpack(fmt, data)[0]

    def string(self) -> str:
        n = self.unpack("<Q")
        if n > 1 << 28:
            raise ValueError(f"implausible string length {n}")
        data = self.f.read(n)
        if len(data) != n:
            raise EOFError("the file ends inside its header")
        return data.decode("utf-8", errors="replace")

    def value(self, vtype: GGUFValueType) -> Any:
        if vtype == GGUFValueType.STRING:
            return self.string()
        if vtype == GGUFValueType.ARRAY:
            item_type = GGUFValueType(self.unpack("<I"))
            n = self.unpack("<Q")
            if n <= SMALL_ARRAY:
                return [self.value(item_type) for _ in range(n)]
            self.skip_array(item_type, n)
            return ArraySummary(item_type, n)
        return self.unpack(SCALAR_FORMATS[vtype])

    def skip_array(self, item_type: GGUFValueType, n: int) -> None:
        if item_type in SCALAR_FORMATS:
            self.f.seek(struct.calcsize(SCALAR_FORMATS[item_type]) * n, 1)
        elif item_type == GGUFValueType.STRING:
            for _ in range(n):
                self.f.seek(self.unpack("<Q"), 1)
        else:
            for _ in range(n):
                self.value(item_type)


def read_header(path: Path) -> GGUFHeader:
    """Parse metadata and tensor descriptors; raise LocalspecError if this is not a GGUF."""
    try:
        with path.open("rb") as f:
            r = _Reader(f)
            if f.read(4) != b"GGUF":
                raise LocalspecError(
                    f"{path} is not a GGUF file (no GGUF magic)",
                    "give the path of a .gguf model file",
                )
            version = r.unpack("<I")
            n_tensors, n_kv = r.unpack("<Q"), r.unpack("<Q")
            metadata: dict[str, Any] = {}
            kv_spans: dict[str, tuple[int, int]] = {}
            for _ in range(n_kv):
                start = f.tell()
                key = r.string()
                metadata[key] = r.value(GGUFValueType(r.unpack("<I")))
                kv_spans[key] = (start, f.tell())
            tensors = []
            for _ in range(n_tensors):
                name = r.string()
                shape = tuple(r.unpack("<Q") for _ in range(r.unpack("<I")))
                tensors.append(TensorInfo(name, shape, r.unpack("<I"), r.unpack("<Q")))
            alignment = int(metadata.get("general.alignment", 32))
            data_offset = -(-f.tell() // alignment) * alignment
    except (EOFError, ValueError, KeyError, struct.error) as exc:
        raise LocalspecError(
            f"{path} has a damaged GGUF header ({exc}); it may be truncated",
            "download the file again",
        ) from None
    except OSError as exc:
        raise LocalspecError(f"cannot read {path}: {exc.strerror}") from None
    return GGUFHeader(version, metadata, tensors, data_offset, kv_spans)


def truncation_problem(path: Path) -> str | None:
    """Say why ``path`` is not a complete GGUF, or None when its layout is whole."""
    try:
        header = read_header(path)
    except LocalspecError as exc:
        return exc.message
    if not header.tensors:
        return None
    end = header.data_offset + max(t.offset + t.n_bytes for t in header.tensors)
    size = path.stat().st_size
    if end > size:
        return f"{path} is truncated: it has {size} bytes but its tensors need {end}"
    return None


@dataclass(frozen=True)
class GGUFInfo:
    """The facts the pair finder, `models` and `probe` need about one file."""

    path: Path
    architecture: str
    name: str
    basename: str
    size_label: str
    finetune: str
    n_params: int
    file_type: str
    n_layer: int
    n_layer_nextn: int
    context_length: int
    n_embd: int
    n_head_kv: int
    head_dim: int
    tokenizer_model: str
    tokenizer_pre: str
    vocab_size: int
    bos_token_id: int | None
    eos_token_id: int | None
    add_bos: bool | None
    add_eos: bool | None
    has_chat_template: bool
    file_size: int
    # (type name, elements) of the weight matrices, largest share first: what the CPU
    # kernels will run (a "Q4_K_M" file can be mostly Q5_0)
    matrix_types: tuple[tuple[str, int], ...] = ()
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def matrix_share(self, types: set[str]) -> float:
        """The share of the weight matrices' elements stored in one of ``types``."""
        total = sum(n for _, n in self.matrix_types)
        return sum(n for t, n in self.matrix_types if t in types) / total if total else 0.0

    @property
    def family(self) -> str:
        """What "same family" means for drafting: architecture plus base model name."""
        return f"{self.architecture}/{self.basename or self.name}".lower()

    def kv_cache_bytes(self, n_ctx: int) -> int:
        """F16 K and V for every layer at this context size."""
        return 2 * 2 * self.n_layer * n_ctx * self.n_head_kv * self.head_dim

    def to_dict(self) -> dict[str, Any]:
        data = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "extra"}
        data["path"] = str(self.path)
        data["family"] = self.family
        return data


def gguf_info(path: Path) -> GGUFInfo:
    header = read_header(path)
    md = header.metadata
    arch = str(md.get("general.architecture", "unknown"))

    def hp(key: str, default: Any = 0) -> Any:
        value = md.get(f"{arch}.{key}", default)
        return value[0] if isinstance(value, list) and value else value

    tokens = md.get("tokenizer.ggml.tokens")
    vocab = tokens.length if isinstance(tokens, ArraySummary) else len(tokens or [])
    n_embd, n_head = int(hp("embedding_length")), int(hp("attention.head_count", 1)) or 1
    try:
        file_type = LlamaFileType(int(md.get("general.file_type", -1))).name.replace("MOSTLY_", "")
    except ValueError:
        file_type = "unknown"
    return GGUFInfo(
        path=path,
        architecture=arch,
        name=str(md.get("general.name", path.stem)),
        basename=str(md.get("general.basename", "")),
        size_label=str(md.get("general.size_label", "")),
        finetune=str(md.get("general.finetune", "")),
        n_params=sum(t.n_elements for t in header.tensors),
        file_type=file_type,
        n_layer=int(hp("block_count")),
        n_layer_nextn=int(hp("nextn_predict_layers")),
        context_length=int(hp("context_length")),
        n_embd=n_embd,
        n_head_kv=int(hp("attention.head_count_kv", n_head)),
        head_dim=int(hp("attention.key_length", n_embd // n_head)),
        tokenizer_model=str(md.get("tokenizer.ggml.model", "")),
        tokenizer_pre=str(md.get("tokenizer.ggml.pre", "")),
        vocab_size=vocab,
        bos_token_id=md.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=md.get("tokenizer.ggml.eos_token_id"),
        add_bos=md.get("tokenizer.ggml.add_bos_token"),
        add_eos=md.get("tokenizer.ggml.add_eos_token"),
        has_chat_template="tokenizer.chat_template" in md,
        file_size=path.stat().st_size,
        matrix_types=_matrix_types(header.tensors),
    )


def _matrix_types(tensors: list[TensorInfo]) -> tuple[tuple[str, int], ...]:
    counts: dict[str, int] = {}
    for t in tensors:
        if len(t.shape) >= 2:
            name = GGMLQuantizationType(t.type).name
            counts[name] = counts.get(name, 0) + t.n_elements
    return tuple(sorted(counts.items(), key=lambda item: -item[1]))
