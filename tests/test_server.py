"""The OpenAI-compatible server over real HTTP (uvicorn on a free port, httpx as client),
on the real SmolLM2-135M."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import uvicorn

from localspec import Engine, SpecConfig
from localspec.commands.serve import CONNECTIONS_WAIT_S
from localspec.errors import EngineFailure, LocalspecError
from localspec.server.app import ServerSettings, create_app
from localspec.server.reply import ShuttingDown, generation_error

REPEAT = "alpha beta gamma delta epsilon zeta eta theta " * 6


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    def __init__(self, engine: Engine, settings: ServerSettings) -> None:
        self.port = free_port()
        config = uvicorn.Config(
            create_app(engine, settings), host="127.0.0.1", port=self.port, log_level="warning"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:  # a port taken meanwhile ends the thread: say so
            assert self.thread.is_alive() and time.monotonic() < deadline, "no server started"
            time.sleep(0.02)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def openai_client(base: str):  # type: ignore[no-untyped-def]
    """The official SDK against a live server, failing fast (no retries)."""
    import openai

    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)


def ask_openai(client, messages: list, tokens: int, **kw):  # type: ignore[no-untyped-def, type-arg]
    """One greedy chat completion of at most ``tokens`` tokens, ``kw`` overriding."""
    return client.chat.completions.create(
        model="local", messages=messages, **{"temperature": 0, "max_tokens": tokens, **kw}
    )


@pytest.fixture(scope="module")
def smollm(smollm_path: Path) -> Iterator[Engine]:
    # Adaptivity off so that draft lengths, and so the override checks, are deterministic.
    spec = SpecConfig(n_max=16, adaptive=False)
    with Engine.load(smollm_path, mode="ngram-simple", n_ctx=1024, spec=spec) as engine:
        yield engine


@pytest.fixture(scope="module")
def base(smollm: Engine) -> Iterator[str]:
    with LiveServer(smollm, ServerSettings(max_queue=1)) as url:
        yield url


def post(base: str, path: str, body: object, timeout: float = 120, **kw: object) -> httpx.Response:
    return httpx.post(f"{base}{path}", json=body, timeout=timeout, **kw)  # type: ignore[arg-type]


def test_models_and_health(base: str) -> None:
    models = httpx.get(f"{base}/v1/models").json()
    assert models["data"][0]["id"] == "SmolLM2-135M-Instruct.Q4_1"
    assert httpx.get(f"{base}/health").json()["status"] == "ok"


def test_completion_carries_usage_speculative_and_timings(base: str) -> None:
    r = post(base, "/v1/completions", {"prompt": REPEAT, "max_tokens": 40, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion" and body["choices"][0]["text"]
    assert body["usage"]["completion_tokens"] == 40
    spec, timings = body["speculative"], body["timings"]
    assert spec["mode"] == "ngram-simple" and spec["drafted"] > 0 and spec["accepted"] > 0
    assert timings["draft_n"] == spec["drafted"] and timings["draft_n_accepted"] == spec["accepted"]
    assert timings["predicted_per_second"] > 0 and timings["predicted_n"] == 40


def test_chat_streaming_puts_stats_on_the_final_chunk(base: str) -> None:
    chunks = []
    with httpx.stream(
        "POST",
        f"{base}/v1/chat/completions",
        timeout=120,
        json={
            "messages": [{"role": "user", "content": "Count from 1 to 10."}],
            "max_tokens": 24,
            "temperature": 0,
            "stream": True,
        },
    ) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                chunks.append(line[6:])
    assert chunks[-1] == "[DONE]"
    events = [json.loads(c) for c in chunks[:-1]]
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert "usage" in events[-1] and "speculative" in events[-1] and "timings" in events[-1]
    assert all("usage" not in e for e in events[:-1])
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events)
    assert text.strip()


@pytest.mark.slow
def test_per_request_override_does_not_leak(base: str) -> None:
    body = {"prompt": REPEAT, "max_tokens": 30, "temperature": 0}
    off = post(base, "/v1/completions", {**body, "speculative": {"mode": "none"}}).json()
    assert off["speculative"]["mode"] == "none" and off["speculative"]["drafted"] == 0
    short = post(base, "/v1/completions", {**body, "speculative": {"n_max": 2}}).json()
    assert max(len(short["speculative"]["acceptance_per_position"]), 0) <= 2
    after = post(base, "/v1/completions", body).json()
    assert after["speculative"]["mode"] == "ngram-simple" and after["speculative"]["drafted"] > 0
    assert len(after["speculative"]["acceptance_per_position"]) > 2
    assert off["choices"][0]["text"] == after["choices"][0]["text"]  # lossless


def test_a_chain_is_served_in_the_order_asked(base: str) -> None:
    body = {"prompt": REPEAT, "max_tokens": 8, "temperature": 0}
    chain = {"mode": "ngram-simple+suffix", "n_max": 300}  # up to a verification batch
    r = post(base, "/v1/completions", {**body, "speculative": chain})
    assert r.status_code == 200 and r.json()["speculative"]["mode"] == "ngram-simple+suffix"


def test_an_engine_failure_is_the_servers_error_not_the_clients() -> None:
    assert generation_error(EngineFailure("llama_decode failed"), "here").status == 500
    assert generation_error(ShuttingDown(), "here").status == 503
    assert generation_error(LocalspecError("bad stop string"), "here").status == 400


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"prompt": 5}, 400, "prompt"),
        ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens must be > 0"),
        (
            {"prompt": "x", "n": 2},
            400,
            "this server runs 1 slot (start the server with --parallel 2",
        ),
        ({"prompt": "x", "speculative": {"n_mx": 3}}, 400, "speculative.n_mx"),
        (
            {"prompt": "x", "speculative": {"mode": "draft-model"}},
            400,
            "not available on this server",
        ),
        (
            {"prompt": "x", "speculative": {"mode": "draft-fast"}},
            400,
            "not available on this server",
        ),
        ({"prompt": "x", "speculative": {"mode": ""}}, 400, "not available on this server"),
        ({"prompt": "x", "speculative": {"n_max": 600}}, 400, "more than one verification"),
        ({"prompt": "x", "temperature": "hot"}, 400, "temperature"),
        ({"prompt": "x", "best_of": 2}, 400, "best_of"),
        ({"prompt": "x", "suffix": "return x"}, 400, "cannot fill in the middle"),
        ({"prompt": "x", "suffix": "y", "echo": True}, 400, "echo"),
        ({"prompt": "word " * 2000}, 400, "context holds 1024"),
        ({"prompt": "x", "stop": ["\n", ""]}, 400, "stop: a stop string must not be empty"),
    ],
)
def test_bad_requests_get_openai_shaped_errors(base: str, body, status, needle) -> None:  # type: ignore[no-untyped-def]
    r = post(base, "/v1/completions", body)
    assert r.status_code == status
    error = r.json()["error"]
    assert needle in error["message"] and error["type"] == "invalid_request_error"


def test_errors_outside_the_endpoints_are_openai_shaped_too(base: str) -> None:
    wrong_method = httpx.get(f"{base}/v1/chat/completions", timeout=30)
    assert wrong_method.status_code == 405 and "error" in wrong_method.json()
    unknown = httpx.post(f"{base}/v1/embeddings", json={"input": "x"}, timeout=30)
    assert unknown.status_code == 404 and "/v1/embeddings" in unknown.json()["error"]["message"]
    model_id = httpx.get(f"{base}/v1/models", timeout=30).json()["data"][0]["id"]
    assert httpx.get(f"{base}/v1/models/{model_id}", timeout=30).json()["id"] == model_id
    other = httpx.get(f"{base}/v1/models/gpt-4o", timeout=30)
    assert other.status_code == 404 and other.json()["error"]["code"] == "model_not_found"
    chat = {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}
    lonely = post(base, "/v1/chat/completions", chat)
    assert lonely.status_code == 400 and "needs logprobs" in lonely.json()["error"]["message"]
    hot = post(base, "/v1/completions", {"prompt": "x", "temperature": "hot"})
    assert hot.json()["error"]["param"] == "temperature"


def test_a_lone_surrogate_is_the_clients_error(base: str) -> None:
    """JSON can escape half of a UTF-16 pair, which no UTF-8 text holds."""
    for path, body in [
        ("/v1/completions", b'{"prompt": "hi \\ud800 there", "max_tokens": 2}'),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\udc00"}]}'),
    ]:
        r = httpx.post(f"{base}{path}", content=body, timeout=60)
        assert r.status_code == 400, r.text
        assert "not a Unicode character" in r.json()["error"]["message"]


def test_malformed_tool_fields_are_the_clients_error(base: str) -> None:
    """A tool call or tool choice whose function is no object: a 400 naming it, not a 500."""
    weather = {"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}
    for function in ("w", 5, [1, 2], None):
        call = {"id": "1", "type": "function", "function": function}
        messages = [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "1", "content": "x"},
        ]
        r = post(base, "/v1/chat/completions", {"messages": messages, "max_tokens": 2})
        assert r.status_code == 400, r.text
        assert "tool_calls[0].function must be an object" in r.json()["error"]["message"]
    call = {"id": "1", "type": "function", "function": {"name": "w"}}  # no arguments
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [call]}]
    r = post(base, "/v1/chat/completions", {"messages": messages, "max_tokens": 2})
    assert r.status_code == 400, r.text
    assert "tool_calls[0].function.arguments is missing" in r.json()["error"]["message"]
    for function in ("w", ["w"]):
        choice = {"type": "function", "function": function}
        body = {"messages": [{"role": "user", "content": "hi"}], "tools": [weather]}
        r = post(base, "/v1/chat/completions", {**body, "tool_choice": choice, "max_tokens": 2})
        assert r.status_code == 400, r.text
        assert "tool_choice.function must be an object" in r.json()["error"]["message"]


def test_malformed_json_and_large_body(base: str) -> None:
    r = httpx.post(f"{base}/v1/completions", content=b"{not json", timeout=30)
    assert r.status_code == 400 and "malformed JSON" in r.json()["error"]["message"]
    r = httpx.post(f"{base}/v1/completions", content=b"x" * (2 << 20), timeout=30)
    assert r.status_code == 413
    for body in (b"[]", b"null", b'"hi"'):
        r = httpx.post(f"{base}/v1/chat/completions", content=body, timeout=30)
        error = r.json()["error"]
        assert r.status_code == 400 and error["message"] == "the request body must be a JSON object"
    # a check across fields names no field, and reads as the check's own sentence
    body = {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}
    error = post(base, "/v1/chat/completions", body).json()["error"]
    assert error["message"] == "top_logprobs needs logprobs: true" and error["param"] is None


def wait_for(condition, seconds: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.time() + seconds
    while not condition():
        assert time.time() < deadline, "timed out"
        time.sleep(0.01)


def health(base: str) -> dict:  # type: ignore[type-arg]
    return httpx.get(f"{base}/health").json()


def leave_a_whole_answer(
    base: str, path: str, body: dict[str, object], headers: dict[str, str] | None = None
) -> None:
    """Ask for a whole (non-streamed) answer and go away once its generation runs. The
    answer must outlast the leaving: a client that timed out instead would race an answer
    that ends early on a fast machine."""

    async def ask_and_leave() -> None:
        async with httpx.AsyncClient(base_url=base, timeout=120) as client:
            asked = asyncio.create_task(client.post(path, json=body, headers=headers))
            while not (await client.get("/health")).json()["busy"] and not asked.done():
                await asyncio.sleep(0.01)
            asked.cancel()  # closes the connection
            with contextlib.suppress(asyncio.CancelledError):
                answer = await asked
                raise AssertionError(f"answered before the client left: {answer.status_code}")

    asyncio.run(ask_and_leave())


def test_queue_limit_disconnect_and_cancelled_waiter(base: str) -> None:
    """One generation runs, one waits (max_queue=1), a third gets 429. The waiter gives up
    without disturbing the running one; a client that disconnects mid-stream frees the
    engine within a step."""
    long_body = {
        "prompt": "Write a long essay about rivers.",
        "max_tokens": 900,
        "temperature": 0,
        "stream": True,
    }
    stop_reading = threading.Event()
    results: dict[str, object] = {}

    def running() -> None:
        with httpx.stream("POST", f"{base}/v1/completions", json=long_body, timeout=120) as r:
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    results["finished"] = True
                if stop_reading.is_set():
                    break  # the client goes away mid-stream

    give_up = threading.Event()

    def waiting() -> None:  # leaves when told to, not on a timeout the answer could outrun
        async def wait_then_leave() -> None:
            async with httpx.AsyncClient(base_url=base, timeout=120) as client:
                short = {"prompt": "x", "max_tokens": 2}
                asked = asyncio.create_task(client.post("/v1/completions", json=short))
                while not give_up.is_set() and not asked.done():
                    await asyncio.sleep(0.01)
                results["waiter"] = "served" if asked.done() else "gave up"
                asked.cancel()

        asyncio.run(wait_then_leave())

    left_before = requests_counted(base, "/v1/completions", 499)
    first = threading.Thread(target=running)
    first.start()
    wait_for(lambda: health(base)["busy"])
    waiter = threading.Thread(target=waiting)
    waiter.start()
    wait_for(lambda: health(base)["queue_depth"] == 1)
    third = post(base, "/v1/completions", {"prompt": "x", "max_tokens": 2})
    assert third.status_code == 429 and third.headers["retry-after"] == "1"
    assert third.json()["error"]["type"] == "rate_limit_error"
    give_up.set()
    waiter.join()
    assert results["waiter"] == "gave up"
    wait_for(lambda: health(base)["queue_depth"] == 0)  # the server saw it leave the queue
    assert health(base)["busy"] and "finished" not in results  # the running one goes on
    stop_reading.set()
    first.join()
    assert "finished" not in results
    wait_for(lambda: not health(base)["busy"], seconds=5)  # stopped within a step or so
    leave_a_whole_answer(base, "/v1/completions", {**long_body, "stream": False})
    wait_for(lambda: not health(base)["busy"], seconds=5)
    ok = post(base, "/v1/completions", {"prompt": "Hi", "max_tokens": 4, "temperature": 0})
    assert ok.status_code == 200
    assert health(base) == {
        "status": "ok",
        "busy": False,
        "slots": 1,
        "slots_busy": 0,
        "queue_depth": 0,
    }
    # each request that its client left is counted once: queued, streamed, awaited whole
    wait_for(lambda: requests_counted(base, "/v1/completions", 499) == left_before + 3, seconds=5)


def requests_counted(
    base: str, endpoint: str, status: int, headers: dict[str, str] | None = None
) -> float:
    """How many ``endpoint`` requests ended with ``status`` (the server's metrics)."""
    wanted = f'localspec_requests_total{{endpoint="{endpoint}",status="{status}"}} '
    for line in httpx.get(f"{base}/metrics", headers=headers).text.splitlines():
        if line.startswith(wanted):
            return float(line.removeprefix(wanted))
    return 0.0


def test_metrics(base: str) -> None:
    post(base, "/v1/completions", {"prompt": REPEAT, "max_tokens": 20, "temperature": 0})
    text = httpx.get(f"{base}/metrics").text
    for name in (
        "localspec_requests_total",
        "localspec_generated_tokens_total",
        "localspec_drafted_tokens_total",
        "localspec_accepted_tokens_total",
        'localspec_acceptance_per_position{position="1"}',
        "localspec_mean_acceptance_length",
        "localspec_tokens_per_second_bucket",
        "localspec_queue_depth",
        "localspec_slots_busy",
        "localspec_draft_budget",
        "localspec_draft_models_resting",
    ):
        assert name in text, name


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("GET", "/v1/models", None, 200),
        ("POST", "/tokenize", {"content": "hello"}, 200),
        ("POST", "/detokenize", {"tokens": [-1]}, 400),
        ("GET", "/props", None, 200),
        ("GET", "/api/tags", None, 200),
        ("POST", "/api/show", {"model": "no-such-model"}, 404),
        ("POST", "/v1/messages/count_tokens", {"messages": []}, 400),
    ],
)
def test_requests_that_read_no_generation_are_counted_too(
    base: str, method: str, path: str, body: object, status: int
) -> None:
    """An operator's request count holds every route a client calls (Claude Code asks for
    its prompt's token count before most turns), by the status answered."""
    before = requests_counted(base, path, status)
    r = httpx.request(method, f"{base}{path}", json=body, timeout=60)
    assert r.status_code == status, r.text
    assert requests_counted(base, path, status) == before + 1


def test_api_key(smollm: Engine) -> None:
    with LiveServer(smollm, ServerSettings(api_keys=("s3cret",))) as url:
        assert httpx.get(f"{url}/v1/models").status_code == 401
        r = post(
            url,
            "/v1/completions",
            {"prompt": "x", "max_tokens": 1},
            headers={"Authorization": "Bearer wrong"},
        )
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        ok = post(
            url,
            "/v1/completions",
            {"prompt": "x", "max_tokens": 1},
            headers={"Authorization": "Bearer s3cret"},
        )
        assert ok.status_code == 200
        for header in ("bearer s3cret", "BEARER  s3cret"):  # the scheme ignores case
            assert httpx.get(f"{url}/v1/models", headers={"Authorization": header}).is_success
        for header in ("Basic s3cret", "Bearer s3cre", "s3cret", "Bearer"):
            assert httpx.get(f"{url}/v1/models", headers={"Authorization": header}).is_error


def test_a_warmed_up_engine_measures_nothing_in_its_first_request(
    smollm_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``serve`` warms the engine before it answers: the batch costs a speculative
    request needs are measured then, not while the first client waits."""
    from localspec.engine.costs import VerifyCost

    with Engine.load(smollm_path, mode="ngram-simple", n_ctx=512) as engine:
        engine.warm_up()

        def measured_again(*_: object) -> None:
            raise AssertionError("measured in the first request")

        monkeypatch.setattr(VerifyCost, "measure", classmethod(measured_again))
        assert engine.generate("Once upon a time", max_tokens=8).tokens


def test_serve_command_starts_and_stops_cleanly(smollm_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "localspec",
            "serve",
            str(smollm_path),
            "--port",
            str(port),
            "-c",
            "512",
        ],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ},
    )
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        r = post(f"http://127.0.0.1:{port}", "/v1/completions", {"prompt": "Hi", "max_tokens": 3})
        assert r.status_code == 200
        for name in (smollm_path.stem, str(smollm_path)):  # the file's name, and the name typed
            card = httpx.get(f"http://127.0.0.1:{port}/v1/models/{name}")
            assert card.status_code == 200 and card.json()["id"] == smollm_path.stem
        gone, stalled = (_half_sent_request(port) for _ in range(2))
        gone.close()  # a client that goes away while sending its body: not a traceback
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        stopped_at = time.time()
        # a client still sending its body does not hold the stop (a supervisor would kill
        # the process before it saves its memory: docker stop waits 10 s), and is told why
        stalled.settimeout(30)
        answer = _read_response(stalled)
        told_after = time.time() - stopped_at
        stalled.close()
        code = proc.wait(timeout=30)
    finally:
        proc.kill()
    assert answer.startswith("HTTP/1.1 503") and "the server is shutting down" in answer
    assert told_after < CONNECTIONS_WAIT_S  # uvicorn's own wait would answer 500 after it
    err = proc.stderr.read() if proc.stderr else ""
    assert code == 0 and "graceful shutdown exceeded" not in err, err
    assert "serving SmolLM2" in err and "/v1/completions" in err  # one log line per request
    assert "Traceback" not in err and "Exception" not in err, err


def _read_response(sock: socket.socket) -> str:
    """A whole HTTP response: its head and its body can come in separate packets."""
    data = b""
    while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < _length(data):
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.decode()


def _length(data: bytes) -> int:
    for line in data.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def _half_sent_request(port: int) -> socket.socket:
    """A connection whose request announces 100 bytes of body and sends 12."""
    sock = socket.create_connection(("127.0.0.1", port))
    head = "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
    head += "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    sock.sendall(head.encode() + b'{"messages":')
    return sock


@pytest.mark.slow
@pytest.mark.parametrize("signals", [1, 2])
def test_ctrl_c_stops_the_running_generations_and_keeps_the_memory(
    smollm_path: Path, tmp_path: Path, signals: int
) -> None:
    """The first Ctrl-C ends every running generation after its round (each client is told
    why) instead of holding the shutdown until the answers are complete, a queued request is
    not started, and the memory file is written. A second one at once (which once could
    deadlock the signal handler) does not wait for open connections: no traceback either."""
    port, memory = free_port(), tmp_path / "memory.npz"
    command = ["serve", str(smollm_path), "--port", str(port), "-c", "1024", "-np", "2"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "localspec", *command, "--spec-memory", str(memory)],
        stderr=subprocess.PIPE,
        text=True,
        # a background shell's children ignore SIGINT: this one gets it as a terminal would
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    url = f"http://127.0.0.1:{port}"
    queued: list[httpx.Response] = []
    beside: list[str] = []
    rest = ""
    try:
        wait_for(lambda: _up(url), 120)
        # greedy: a sampled answer could end before the queue and the signals are in place
        body = {"prompt": "1, 2, 3, 4, 5, 6, 7,", "max_tokens": 900, "stream": True}
        body["temperature"] = 0
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
            lines = (line for line in r.iter_lines() if line)
            assert all(next(lines).startswith("data:") for _ in range(5))  # generating
            other = {**body, "prompt": "a, b, c, d, e, f,"}
            second = threading.Thread(target=lambda: _stream_quietly(url, other, beside))
            second.start()
            wait_for(lambda: health(url)["slots_busy"] == 2)
            whole = {**body, "stream": False}
            waiter = threading.Thread(target=lambda: _post_quietly(url, whole, queued))
            waiter.start()
            wait_for(lambda: health(url)["queue_depth"] == 1)  # both slots taken
            for _ in range(signals):
                proc.send_signal(signal.SIGINT)
            stopped_at = time.time()
            with contextlib.suppress(httpx.HTTPError):  # a forced stop may cut the stream
                rest = "\n".join(lines)
        waiter.join(timeout=60)
        second.join(timeout=60)
        code = proc.wait(timeout=60)
        assert time.time() - stopped_at < 30  # 900 tokens would take minutes here
    finally:
        proc.kill()
    err = proc.stderr.read() if proc.stderr else ""
    assert code == 0 and "localspec: stopped" in err and "Traceback" not in err, err
    if signals == 1:
        for stream in (rest, beside[0]):
            assert "the server is shutting down" in stream and stream.endswith("[DONE]")
        assert queued[0].status_code == 503  # waiting when the server stopped: never started
        event = next(line for line in rest.splitlines() if '"error"' in line)
        # the streamed error is the error object a JSON response would have held
        assert json.loads(event.removeprefix("data: ")) == queued[0].json()
        with np.load(memory) as kept:
            assert kept["lengths"].size == 2  # the stopped requests, prompts and answers so far
    else:
        with np.load(memory) as kept:
            assert kept["lengths"].size >= 1


def _stream_quietly(url: str, body: dict, into: list[str]) -> None:  # type: ignore[type-arg]
    """A streamed request's events, joined, once it ends (or is cut)."""
    seen: list[str] = []
    with (
        contextlib.suppress(httpx.HTTPError),
        httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r,
    ):
        seen.extend(line for line in r.iter_lines() if line)
    into.append("\n".join(seen))


def _post_quietly(url: str, body: dict, into: list[httpx.Response]) -> None:  # type: ignore[type-arg]
    with contextlib.suppress(httpx.HTTPError):
        into.append(post(url, "/v1/completions", body))


def _up(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
