"""Ctrl-C as users press it, on real processes: during a model load (while llama.cpp logs),
during a derivation (llama.cpp's quantizer), during a bench, while a server streams. Each
child gets SIGINT back to its default first: a suite started from a background job would
otherwise hand every child an ignored SIGINT, and nothing here would be tested."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from localspec.server.runner import GenerationStream
from tests.conftest import derived_dir


def default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "localspec", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env or os.environ.copy(),
        preexec_fn=default_sigint,
    )


def interrupt(proc: subprocess.Popen[str]) -> tuple[int, str, float]:
    """SIGINT, then the exit status, the output and the seconds it took to exit."""
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out + err, time.monotonic() - t0


def test_ctrl_c_while_llama_cpp_loads_and_logs(qwen_f16_path: Path) -> None:
    env = {**os.environ, "LOCALSPEC_VERBOSE": "1"}  # llama.cpp's log lines, as they come
    proc = start("run", str(qwen_f16_path), "-p", "hi", "-n", "3000", "--mode", "none", env=env)
    assert proc.stderr is not None
    while "llama_model_loader" not in proc.stderr.readline():
        assert proc.poll() is None
    code, out, seconds = interrupt(proc)
    assert code == 130, out[-2000:]
    assert seconds < 5
    assert "Exception ignored" not in out and "Traceback" not in out
    assert "localspec: interrupted" in out


LOAD_SCRIPT = """
import sys, time
from localspec import Engine
print("loading", flush=True)
try:
    engine = Engine.load(sys.argv[1], mode="none")
except KeyboardInterrupt:
    print("stopped during the load", flush=True)
    sys.exit(3)
try:
    time.sleep(20)
except KeyboardInterrupt:
    print("stopped after the load", flush=True)
    sys.exit(4)
"""


@pytest.mark.slow
def test_ctrl_c_while_a_script_loads_a_model_stops_the_load(qwen_f16_path: Path) -> None:
    """The Python API: llama.cpp calls back into Python while it loads (log lines, progress),
    and an interrupt raised in a callback would be printed and dropped by ctypes, the load
    and the script going on as if no Ctrl-C had come."""
    outcomes = []
    for delay in (0.1, 0.3, 0.5, 0.7, 0.9, 1.2):
        proc = subprocess.Popen(
            [sys.executable, "-c", LOAD_SCRIPT, str(qwen_f16_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=default_sigint,
        )
        assert proc.stdout is not None
        assert proc.stdout.readline() == "loading\n"
        time.sleep(delay)
        code, out, seconds = interrupt(proc)
        assert code in (3, 4) and "Exception ignored" not in out, (delay, out[-2000:])
        assert seconds < 5
        outcomes.append(code)
    assert 3 in outcomes, outcomes  # some landed during the load


@pytest.mark.slow
def test_ctrl_c_during_a_derivation_stops_it_and_leaves_no_file(derived_env) -> None:  # type: ignore[no-untyped-def]
    proc = start("pull", "smol-q8", env=derived_env)
    folder = derived_dir(derived_env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        parts = list(folder.glob(".*.part")) if folder.exists() else []
        if parts and parts[0].stat().st_size > 1_000_000:  # the quantizer is writing
            break
        assert proc.poll() is None, "the derivation ended before it could be interrupted"
        time.sleep(0.01)
    code, out, seconds = interrupt(proc)
    assert code == 130, out
    assert seconds < 3, "Ctrl-C waited for the quantizer to finish"
    assert "Traceback" not in out
    assert not list(folder.iterdir()), list(folder.iterdir())  # no .part, no half model

    again = subprocess.run(
        [sys.executable, "-m", "localspec", "pull", "smol-q8"],
        capture_output=True,
        text=True,
        env=derived_env,
        timeout=600,
    )
    assert again.returncode == 0, again.stderr  # and the next run derives it whole


@pytest.mark.slow
def test_ctrl_c_during_a_bench_prints_the_runs_so_far(smollm_path: Path, tmp_path: Path) -> None:
    report = tmp_path / "bench.json"
    proc = start(
        "bench", str(smollm_path), "--prompts", "code-edit,qa", "-n", "48", "--repeat", "5",
        "--json", str(report),
    )  # fmt: skip
    assert proc.stderr is not None
    seen = []
    while True:
        line = proc.stderr.readline()
        seen.append(line)
        if "tok/s" in line and "[2/5]" in line:
            break
        assert line, "".join(seen)
    code, out, seconds = interrupt(proc)
    assert code == 130, out
    assert "interrupted: the runs so far follow" in out
    assert "ngram-simple" in out and "ceiling" in out  # the table of what was measured
    assert "interrupted: partial" in out and json.loads(report.read_text())["partial"] is True
    assert seconds < 10


@pytest.mark.slow
def test_ctrl_c_before_a_bench_measured_anything_keeps_the_last_report(
    smollm_path: Path, tmp_path: Path
) -> None:
    """A Ctrl-C while the bench still loads and calibrates writes no empty report over the
    one an earlier run left: it says so, and exits 130."""
    report, table = tmp_path / "c.json", tmp_path / "c.md"
    report.write_text('{"points": ["an earlier run"]}')
    table.write_text("an earlier table")
    proc = start(
        "bench", str(smollm_path), "--concurrency", "1,2", "-n", "64", "--repeat", "1",
        "--json", str(report), "--markdown", str(table),
    )  # fmt: skip
    assert proc.stderr is not None
    seen: list[str] = []
    while not seen or "cost curve" not in seen[-1]:
        line = proc.stderr.readline()
        assert line, "".join(seen)
        seen.append(line)
    code, out, _ = interrupt(proc)
    assert code == 130, out
    assert "[1/1]" not in "".join(seen) + out  # no batch was measured
    assert f"nothing measured: --json {report}, --markdown {table} left as they were" in out
    assert report.read_text() == '{"points": ["an earlier run"]}'
    assert table.read_text() == "an earlier table"


ENTRY_MODULES = ("localspec/__init__.py", "localspec/__main__.py", "localspec/launch.py")


def before_the_handler(out: str) -> bool:
    """A traceback whose every frame is the interpreter's or the entry modules' top level
    (which import nothing but ``sys``): the Ctrl-C came before any program code could catch
    it. A module imported on the way (``typing.py``, say) would be the program's fault."""
    frames = re.findall(r'File "([^"]+)", line \d+, in (\S+)', out)
    return bool(frames) and all(
        path.startswith("<frozen") or (path.endswith(ENTRY_MODULES) and where == "<module>")
        for path, where in frames
    )


@pytest.mark.slow
def test_ctrl_c_while_the_command_starts_is_not_a_traceback() -> None:
    """The first half second goes to importing numpy and llama.cpp, before any handler of
    the command's own, and the last to Python's shutdown (its clean-up callbacks): a Ctrl-C
    there is an interruption all the same, or nothing."""
    for delay in (0.05, 0.15, 0.25, 0.35, 0.5, 0.7, 0.9, 1.2):
        proc = start("models")
        time.sleep(delay)
        code, out, _ = interrupt(proc)
        if "init_import_site" in out or before_the_handler(out):
            # the interpreter's own start-up (its site module, its module runner), before the
            # handler's first line: CPython reports a Ctrl-C there, whatever the program
            continue
        assert "Traceback" not in out, (delay, out[-2000:])
        # before Python's own handler is in place, the signal ends the process quietly
        assert code in (130, -signal.SIGINT) or (code == 0 and "interrupted" not in out), out
        assert code != 130 or "localspec: interrupted" in out


def test_ctrl_c_while_a_server_answers_several_clients(qwen_path: Path) -> None:
    """Ctrl-C while the slots stream answers to several clients: the server stops with its
    one line, no traceback from a generation posting to the event loop that has closed."""
    port = _free_port()
    proc = start("serve", str(qwen_path), "--port", str(port), "--parallel", "2")
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    streaming = threading.Barrier(3)

    def client(n: int) -> None:
        body = {"prompt": f"Count to {n}00:", "max_tokens": 2000, "stream": True}
        try:
            with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=60) as r:
                lines = r.iter_lines()
                next(lines)
                streaming.wait(30)
                for _ in lines:
                    pass
        except (httpx.HTTPError, threading.BrokenBarrierError):
            pass

    threads = [threading.Thread(target=client, args=(n,)) for n in (1, 2)]
    for thread in threads:
        thread.start()
    streaming.wait(120)  # both answers are streaming
    _, out, _ = interrupt(proc)
    for thread in threads:
        thread.join(60)
    assert "Traceback" not in out and "Exception in thread" not in out, out[-3000:]
    assert "localspec: stopped" in out, out[-2000:]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_generation_outliving_the_servers_event_loop_stops_quietly() -> None:
    """A step longer than the server's wait for its connections (a calibration on a busy
    machine) ends after the event loop has closed: what it then posts to the loop must stop
    the generation, not raise in its thread."""
    loop = asyncio.new_event_loop()
    stream = GenerationStream(loop)
    loop.close()
    stream.put("a token")
    stream.post(print)
    assert stream.ended()
