"""`localspec pull` against a local Hugging Face endpoint (HF_ENDPOINT): the real
huggingface_hub download path (HEAD, ranged GET, cache layout, resume), no network."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

COMMIT = "c0ffee" + "0" * 34
REPO = "localspec-test/tiny-GGUF"
FILES = {"tiny-q4.gguf": b"GGUF" + bytes(range(256)) * 64, "README.md": b"# tiny\n"}


class HubHandler(BaseHTTPRequestHandler):
    files: dict[str, bytes] = FILES
    drop_next_download = False  # cut the next file download half-way (a broken connection)
    stall_next_download = False  # send half the next download, then hang (to kill the client)
    requests: list[str] = []

    def log_message(self, *args: object) -> None:
        pass

    def _file(self) -> tuple[str, bytes] | None:
        m = re.match(rf"^/{re.escape(REPO)}/resolve/[^/]+/(.+)$", self.path.split("?")[0])
        if m and m.group(1) in self.files:
            return m.group(1), self.files[m.group(1)]
        return None

    def _headers(self, data: bytes, status: int = 200, length: int | None = None) -> None:
        self.send_response(status)
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        self.send_header("Content-Length", str(len(data) if length is None else length))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()

    def do_HEAD(self) -> None:
        self.requests.append(f"HEAD {self.path}")
        found = self._file()
        if found is None:
            self.send_response(404)
            self.end_headers()
            return
        self._headers(found[1])

    def do_GET(self) -> None:
        self.requests.append(f"GET {self.path} range={self.headers.get('Range')}")
        if self.path.startswith(f"/api/models/{REPO}/tree/"):
            body = json.dumps(
                [
                    {
                        "type": "file",
                        "path": name,
                        "size": len(data),
                        "oid": hashlib.sha1(data).hexdigest(),
                    }
                    for name, data in self.files.items()
                ]
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        found = self._file()
        if found is None:
            self.send_response(404)
            self.end_headers()
            return
        data = found[1]
        start = 0
        if rng := self.headers.get("Range"):
            start = int(re.match(r"bytes=(\d+)-", rng).group(1))
        part = data[start:]
        self.send_response(206 if start else 200)
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        self.send_header("Content-Length", str(len(part)))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        if HubHandler.stall_next_download and not start:
            HubHandler.stall_next_download = False
            self.wfile.write(part[: len(part) // 2])
            self.wfile.flush()
            time.sleep(20)
            return
        if HubHandler.drop_next_download and not start:
            HubHandler.drop_next_download = False
            self.wfile.write(part[: len(part) // 2])
            self.wfile.flush()
            self.connection.shutdown(2)
            self.close_connection = True
            return
        self.wfile.write(part)


@pytest.fixture
def hub() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), HubHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    HubHandler.requests.clear()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def hub_env(tmp_path: Path, endpoint: str, **env: str) -> dict[str, str]:
    return {
        **os.environ,
        "HF_ENDPOINT": endpoint,
        "HF_HUB_CACHE": str(tmp_path / "hf"),
        "LOCALSPEC_CACHE": str(tmp_path / "cache"),
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_OFFLINE": "0",
        **env,
    }


def pull(tmp_path: Path, endpoint: str, ref: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "localspec", "pull", ref],
        capture_output=True,
        text=True,
        env=hub_env(tmp_path, endpoint, **env),
        timeout=120,
    )


def test_pull_repo_file_downloads_into_the_hf_cache(tmp_path: Path, hub: str) -> None:
    done = pull(tmp_path, hub, f"{REPO}:tiny-q4.gguf")
    assert done.returncode == 0, done.stderr
    path = Path(done.stdout.strip())
    assert path.read_bytes() == FILES["tiny-q4.gguf"]
    assert "models--localspec-test--tiny-GGUF" in str(path)
    assert path.with_name(path.name + ".verified").exists()  # hub SHA-256 checked


@pytest.mark.slow
def test_pull_repo_alone_finds_its_only_gguf(tmp_path: Path, hub: str) -> None:
    done = pull(tmp_path, hub, REPO)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).name == "tiny-q4.gguf"


@pytest.mark.slow
def test_offline_pull_uses_the_cache_or_says_why(tmp_path: Path, hub: str) -> None:
    missing = pull(tmp_path, hub, f"{REPO}:tiny-q4.gguf", HF_HUB_OFFLINE="1")
    assert missing.returncode == 2 and "no network and not in the cache" in missing.stderr
    assert pull(tmp_path, hub, f"{REPO}:tiny-q4.gguf").returncode == 0
    HubHandler.requests.clear()
    again = pull(tmp_path, hub, f"{REPO}:tiny-q4.gguf", HF_HUB_OFFLINE="1")
    assert again.returncode == 0 and "using the cached" in again.stderr
    assert HubHandler.requests == []
    # no file named, no network: said at once (listing the repo would retry for 30 s)
    unnamed = pull(tmp_path, hub, REPO, HF_HUB_OFFLINE="1")
    assert unnamed.returncode == 2 and f"cannot list the files of {REPO}: no network" in (
        unnamed.stderr
    )
    assert HubHandler.requests == []


@pytest.mark.slow
def test_pull_survives_a_broken_download(tmp_path: Path, hub: str) -> None:
    """The connection breaks half-way: the download resumes with a range request."""
    data = FILES["tiny-q4.gguf"]
    HubHandler.drop_next_download = True
    done = pull(tmp_path, hub, f"{REPO}:tiny-q4.gguf")
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).read_bytes() == data
    downloads = [r for r in HubHandler.requests if r.startswith("GET") and "tiny-q4" in r]
    assert len(downloads) == 2
    assert downloads[0].endswith("range=None")
    assert downloads[1].endswith(f"range=bytes={len(data) // 2}-")  # resumed, not restarted


def test_pull_killed_mid_download_resumes_in_the_next_process(tmp_path: Path, hub: str) -> None:
    data = FILES["tiny-q4.gguf"]
    HubHandler.stall_next_download = True
    proc = subprocess.Popen(
        [sys.executable, "-m", "localspec", "pull", f"{REPO}:tiny-q4.gguf"],
        env=hub_env(tmp_path, hub),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    partial: list[Path] = []
    while time.monotonic() < deadline:
        partial = [p for p in (tmp_path / "hf").rglob("*.localspec-partial") if p.stat().st_size]
        if partial and partial[0].stat().st_size >= len(data) // 2:
            break
        time.sleep(0.05)
    proc.kill()  # as a closed laptop lid or a second Ctrl-C would
    proc.wait()
    assert partial and partial[0].stat().st_size == len(data) // 2
    assert not list((tmp_path / "hf").rglob("snapshots/*/*"))  # nothing looks complete

    done = pull(tmp_path, hub, f"{REPO}:tiny-q4.gguf")
    assert done.returncode == 0, done.stderr
    assert "resuming" in done.stderr
    assert Path(done.stdout.strip()).read_bytes() == data
    downloads = [r for r in HubHandler.requests if r.startswith("GET") and "tiny-q4" in r]
    assert downloads[-1].endswith(f"range=bytes={len(data) // 2}-")
    assert not list((tmp_path / "hf").rglob("*.localspec-partial"))


@pytest.mark.slow
def test_pull_unknown_file_is_a_clear_error(tmp_path: Path, hub: str) -> None:
    done = pull(tmp_path, hub, f"{REPO}:nope.gguf")
    assert done.returncode == 2 and "cannot download" in done.stderr
