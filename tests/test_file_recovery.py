"""Files survive interruptions: a killed derivation leaves nothing the next run trips on, and a
damaged derived model is rebuilt, not reported forever. Real processes, real SIGKILL, the
real llama.cpp quantizer (on the small SmolLM2 model, through a catalog of its own)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from localspec.fileops import atomic_path, remove_stale_scratch, scratch_dir
from localspec.fileops import intact_file as intact
from tests.conftest import derived_dir


def localspec(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "localspec", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def test_a_killed_derivation_is_cleaned_up_and_redone(derived_env) -> None:  # type: ignore[no-untyped-def]
    writer = subprocess.Popen(
        [sys.executable, "-m", "localspec", "pull", "smol-q8"],
        env=derived_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    folder = derived_dir(derived_env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and writer.poll() is None:
        parts = list(folder.glob(".*.part")) if folder.exists() else []
        if parts and parts[0].stat().st_size > 1_000_000:  # the quantizer is writing
            break
        time.sleep(0.01)
    assert writer.poll() is None, "the derivation ended before it could be killed"
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    left = list(folder.glob(".*.part"))
    assert left, "a SIGKILL runs no cleanup: the scratch file must still be there"
    assert not list(folder.glob("*.gguf")), "nothing half-written may look complete"

    done = localspec(derived_env, "pull", "smol-q8")
    assert done.returncode == 0, done.stderr
    assert f"removed {left[0].name}, left by an interrupted earlier run" in done.stderr
    assert not list(folder.glob(".*")), list(folder.iterdir())
    (made,) = folder.glob("*.gguf")
    assert done.stdout.strip() == str(made)
    assert intact(made, made.with_name(made.name + ".verified"))


@pytest.mark.slow
def test_a_truncated_derived_model_is_rebuilt(derived_env) -> None:  # type: ignore[no-untyped-def]
    first = localspec(derived_env, "pull", "smol-q8")
    assert first.returncode == 0, first.stderr
    made = Path(first.stdout.strip())
    stamp = json.loads(made.with_name(made.name + ".verified").read_text())
    os.truncate(made, made.stat().st_size // 2)

    pulled = localspec(derived_env, "pull", "smol-q8")
    assert pulled.returncode == 0, pulled.stderr
    assert "is damaged" in pulled.stderr and "deriving 'smol-q8'" in pulled.stderr
    assert made.stat().st_size == stamp["size"]
    assert made.with_name(made.name + ".verified").exists()

    os.truncate(made, 1000)  # and `run` repairs it too, then runs
    ran = localspec(derived_env, "run", "smol-q8", "-p", "Hello", "-n", "4", "--mode", "none")
    assert ran.returncode == 0, ran.stderr
    assert "is damaged" in ran.stderr and "Traceback" not in ran.stderr


def test_scratch_files_of_live_writers_are_kept(tmp_path: Path) -> None:
    """Only a dead writer's leftovers go: a concurrent writer's file is left alone."""
    dest = tmp_path / "model.gguf"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = tmp_path / f".model.gguf.pid{sleeper.pid}-abc.part"
        live.write_bytes(b"x")
        dead_pid = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                                  capture_output=True, text=True).stdout.strip()  # fmt: skip
        dead = tmp_path / f".model.gguf.pid{dead_pid}-def.part"
        dead.write_bytes(b"x")
        (tmp_path / f".other.gguf.pid{dead_pid}-ghi.work").mkdir()
        legacy_old = tmp_path / ".model.gguf.abcd1234.part"
        legacy_old.write_bytes(b"x")
        os.utime(legacy_old, (time.time() - 7200, time.time() - 7200))
        legacy_new = tmp_path / ".model.gguf.efgh5678.part"
        legacy_new.write_bytes(b"x")
        user_file = tmp_path / "notes.part"
        user_file.write_bytes(b"x")

        with atomic_path(dest) as tmp:  # a write cleans the dead writers' files
            tmp.write_bytes(b"done")
        names = {p.name for p in tmp_path.iterdir()}
        assert dest.read_bytes() == b"done"
        assert live.name in names and dead.name not in names
        assert f".other.gguf.pid{dead_pid}-ghi.work" not in names
        assert {legacy_old.name, legacy_new.name, "notes.part"} <= names  # not ours to judge
        removed = remove_stale_scratch(tmp_path, legacy=True)  # in localspec's own cache
        assert removed == [legacy_old]
    finally:
        sleeper.kill()
        sleeper.wait()
    with scratch_dir(dest) as work:
        assert work.name.startswith(f".model.gguf.pid{os.getpid()}-")
    assert not work.exists()


def test_written_files_get_the_usual_permissions(tmp_path: Path) -> None:
    """A scratch file is private until it is complete; the file put in place is not: a
    new one as the umask says (a bench's results, a shared memory file), a replaced one as
    it was."""
    mask = os.umask(0)  # the process's, read as fileops reads it
    os.umask(mask)
    fresh = tmp_path / "results.md"
    with atomic_path(fresh) as tmp:
        tmp.write_text("new")
    assert fresh.stat().st_mode & 0o777 == 0o666 & ~mask != 0o600
    kept = tmp_path / "memory.npz"
    kept.write_text("old")
    kept.chmod(0o640)
    with atomic_path(kept) as tmp:
        tmp.write_text("newer")
    assert kept.stat().st_mode & 0o777 == 0o640 and kept.read_text() == "newer"
