"""llama.cpp's own server (``llama-server``) under the load of `bench --concurrency`: the same
model, threads, context per slot, prompts (rendered by the same chat template), length and
temperature, sent over HTTP to its /completion endpoint, plain and with its own speculation.

The server is started for one concurrency and configuration (``-np N``, ``-c N*ctx``: its
slots share the context equally, as localspec's each have ``ctx``), waited for on /health,
and stopped in a ``finally``, whatever happened. HTTP goes through the standard library:
one request at a time per client thread needs no client library."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from localspec import native
from localspec.concurrency import Request, Sender
from localspec.engine.model_context import FlashAttn
from localspec.errors import LocalspecError
from localspec.modes import parse_mode

SERVER = "llama-server"
HEALTH_TIMEOUT_S = 180.0  # loading the model and its warm-up run
REQUEST_TIMEOUT_S = 1800.0
LOG_TAIL = 400  # characters of the server's log shown when it fails


@dataclass(frozen=True)
class ServerSettings:
    tool_dir: Path
    target: Path
    draft: Path | None
    threads: int
    n_ctx: int  # per slot
    n_max: int
    # as localspec's context has it: what is compared is batching and speculation, not the
    # attention kernel
    flash_attn: FlashAttn


def check_server(tool_dir: Path) -> None:
    """``--native DIR`` with ``--concurrency`` must hold an executable llama-server (checked
    before the bench starts)."""
    tool = tool_dir / SERVER
    if not tool.is_file() or not os.access(tool, os.X_OK):
        raise LocalspecError(
            f"--native {tool_dir}: no executable {SERVER} there",
            "build llama.cpp's server (cmake --build build --target llama-server) and give "
            "its bin directory, or drop --native",
        )


def server_command(s: ServerSettings, parallel: int, port: int, mode: str) -> list[str]:
    """The llama-server command line: ``mode`` "none" decodes plainly, any other mode is
    passed as llama.cpp's --spec-type (``native.spec_type``)."""
    cmd = [
        str(s.tool_dir / SERVER),
        "-m",
        str(s.target),
        "-np",
        str(parallel),
        "-c",
        str(parallel * s.n_ctx),
        "-t",
        str(s.threads),
        "-tb",
        str(s.threads),
        "-fa",
        s.flash_attn,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--no-webui",
        *native.weight_flags(),
    ]
    if mode != "none":
        cmd += ["--spec-type", native.spec_type(mode), "--spec-draft-n-max", str(s.n_max)]
        if "draft-model" in parse_mode(mode):
            if s.draft is None:
                raise LocalspecError("native draft-model needs a draft model (-md)")
            cmd += ["-md", str(s.draft)]
    return cmd


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def running_server(s: ServerSettings, parallel: int, mode: str) -> Iterator[str]:
    """A started llama-server, ready (its /health answers 200); its base URL. It is stopped
    on the way out, however the block ends."""
    check_server(s.tool_dir)
    port = free_port()
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as log:
        process = subprocess.Popen(
            server_command(s, parallel, port, mode),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            wait_healthy(url, process, log)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def wait_healthy(url: str, process: subprocess.Popen[bytes], log: IO[str]) -> None:
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise LocalspecError(
                f"{SERVER} ended while loading (exit status {process.returncode})",
                "its log ends: " + log_tail(log),
            )
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):  # not listening yet, or 503 while loading
            pass
        time.sleep(0.2)
    raise LocalspecError(
        f"{SERVER} was not ready after {HEALTH_TIMEOUT_S:.0f} s", "its log ends: " + log_tail(log)
    )


def log_tail(log: IO[str]) -> str:
    log.flush()
    log.seek(0)
    text = " ".join(log.read().split())
    return text[-LOG_TAIL:] or "(nothing)"


def completion_body(
    prompt: str, n_tokens: int, temperature: float, seed: int, schema: str | None
) -> dict[str, object]:
    """A /completion request as localspec's bench samples: temperature alone (llama.cpp's
    default top-k 40 / top-p 0.95 / min-p 0.05 would sharpen the distribution, and drafts
    would be accepted more often), greedy at 0; the slot's cached prompt reused."""
    body: dict[str, object] = {
        "prompt": prompt,
        "n_predict": n_tokens,
        "temperature": temperature,
        "top_k": 0,
        "top_p": 1.0,
        "min_p": 0.0,
        "seed": seed,
        "cache_prompt": True,
        "stream": False,
    }
    if schema is not None:
        body["json_schema"] = json.loads(schema)
    return body


def completion(url: str, body: dict[str, object]) -> int:
    """Send one /completion request; the tokens it generated."""
    data = json.dumps(body).encode("utf-8")
    request = urllib.request.Request(
        f"{url}/completion", data, {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as answer:
            reply = json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", "replace")[:LOG_TAIL]
        raise LocalspecError(f"{SERVER} answered {exc.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise LocalspecError(f"{SERVER} did not answer: {exc}") from None
    return int(reply.get("tokens_predicted") or reply.get("timings", {}).get("predicted_n", 0))


def server_sender(
    url: str,
    prompts: Sequence[str],
    schemas: Sequence[str | None],
    n_tokens: int,
    temperature: float,
    stop: threading.Event,
) -> Sender:
    """``prompts``: the chat-rendered texts localspec's requests tokenize to."""

    def send(request: Request) -> int:
        if stop.is_set():
            return 0
        body = completion_body(
            prompts[request.prompt], n_tokens, temperature, request.seed, schemas[request.prompt]
        )
        return completion(url, body)

    return send
