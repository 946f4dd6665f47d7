"""Downloads from the Hugging Face hub that resume across processes, into the standard HF cache.

``hf_hub_download`` (huggingface_hub 2.x) writes each attempt to a process-unique temporary
file and deletes it on failure, so a download interrupted by Ctrl-C, a crash or a closed
laptop lid starts from zero next time: painful for multi-GB GGUFs on a slow link. Here the
partial file has a stable name derived from the file's ETag
(``blobs/<etag>.localspec-partial``), the next attempt asks the server only for the missing
bytes (HTTP ``Range``), and the finished, checked file is placed exactly where
huggingface_hub itself would put it (``blobs/<etag>``, ``snapshots/<commit>/<file>`` -> blob,
``refs/<revision>``), so ``try_to_load_from_cache`` and every other HF tool find it.

huggingface_hub still does the rest: URL building, authentication headers, the metadata
request (which follows redirects and reports the commit, ETag and size) and its HTTP session.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from localspec.errors import LocalspecError
from localspec.fileops import sha256_file
from localspec.progress import byte_progress, status

PARTIAL_SUFFIX = ".localspec-partial"
CHUNK = 1 << 20
ATTEMPTS = 5


def resumable_hub_download(repo: str, file: str, revision: str = "main") -> Path:
    """The file's path in the HF cache, downloading (or finishing a download of) it first."""
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
    from huggingface_hub.file_download import repo_folder_name

    meta = get_hf_file_metadata(hf_hub_url(repo, file, revision=revision))
    etag = (meta.etag or "").strip('"').removeprefix("W/").strip('"')
    if not etag or not meta.commit_hash or meta.size is None:
        raise LocalspecError(
            f"the hub gave no ETag/commit/size for {repo}/{file}", "try again later"
        )
    storage = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo, repo_type="model")
    snapshot = storage / "snapshots" / meta.commit_hash / file
    blob = storage / "blobs" / etag
    downloaded = not blob.exists()
    if downloaded:
        _download_blob(meta.location, blob, meta.size, etag, f"{repo}/{file}")
    _link_snapshot(snapshot, blob)
    if downloaded and len(etag) == 64:  # checked while placing it: `pull` need not hash again
        snapshot.with_name(snapshot.name + ".verified").write_text(etag)
    (storage / "refs").mkdir(parents=True, exist_ok=True)
    if revision != meta.commit_hash:
        (storage / "refs" / revision).write_text(meta.commit_hash)
    return snapshot


def _download_blob(url: str, blob: Path, size: int, etag: str, label: str) -> None:
    """Fetch into ``<blob>.localspec-partial``, resuming where it stopped (also after a
    broken connection in this process), then check it and rename it into place."""
    blob.parent.mkdir(parents=True, exist_ok=True)
    partial = blob.with_name(blob.name + PARTIAL_SUFFIX)
    problem = "no attempt made"
    for _ in range(ATTEMPTS):
        try:
            _fetch_missing(url, partial, size, label)
        except LocalspecError:
            raise
        except Exception as exc:  # network errors of whatever HTTP stack: resume
            problem = f"{type(exc).__name__}: {exc}"
            status(f"the download of {label} broke ({problem}); resuming")
            continue
        if partial.stat().st_size >= size:
            break
        problem = "the connection closed early"
    _check_and_place(partial, blob, size, etag, label, problem)


def _fetch_missing(url: str, partial: Path, size: int, label: str) -> None:
    from huggingface_hub import get_session
    from huggingface_hub.utils import build_hf_headers

    have = partial.stat().st_size if partial.exists() else 0
    if have >= size:
        return
    headers = build_hf_headers()
    if have:
        status(f"resuming {label} at {have} of {size} bytes")
        headers["Range"] = f"bytes={have}-"
    with (
        get_session().stream("GET", url, headers=headers, follow_redirects=True) as response,
        byte_progress(f"downloading {label}", size) as advance,
    ):
        if response.status_code not in (200, 206):
            raise LocalspecError(f"downloading {label} failed: HTTP {response.status_code}")
        if response.status_code == 200:  # the server ignored the range: start over
            have = 0
        advance(have)
        with partial.open("r+b" if have else "wb") as out:
            out.seek(have)
            out.truncate()
            for chunk in response.iter_bytes():  # as it arrives: a break keeps it
                out.write(chunk)
                advance(len(chunk))


def _check_and_place(
    partial: Path, blob: Path, size: int, etag: str, label: str, problem: str
) -> None:
    got = partial.stat().st_size if partial.exists() else 0
    if got != size:
        raise LocalspecError(
            f"the download of {label} stopped at {got} of {size} bytes ({problem}); "
            "what arrived is kept",
            "run the same command again: it resumes from there",
        )
    if len(etag) == 64:  # an LFS file: its ETag is its SHA-256
        check_hub_sha256(partial, etag, label, "run the command again")
    os.replace(partial, blob)


def check_hub_sha256(path: Path, sha256: str, label: str, hint: str) -> None:
    """The file must have the SHA-256 the hub gives; a file that does not is removed."""
    digest = sha256_file(path)
    if digest != sha256:
        path.unlink()
        raise LocalspecError(
            f"checksum mismatch for {label}: got {digest}, the hub says {sha256}; "
            "the bad file was removed",
            hint,
        )


def _link_snapshot(snapshot: Path, blob: Path) -> None:
    """``snapshots/<commit>/<file>`` -> ``../../blobs/<etag>``, as huggingface_hub lays it out
    (a copy where the file system has no symbolic links)."""
    if snapshot.exists():
        return
    snapshot.parent.mkdir(parents=True, exist_ok=True)
    target = os.path.relpath(blob, snapshot.parent)
    try:
        snapshot.symlink_to(target)
    except OSError:
        import shutil

        with contextlib.suppress(FileExistsError):
            shutil.copyfile(blob, snapshot)
