"""The server with parallel slots under real concurrent clients (the openai SDK's async
client, httpx streams), on the real SmolLM2-135M: answers as each is alone, a JSON-schema
request beside free text, a client leaving mid-batch, the queue past the slots, and a long
prompt arriving while another answer streams."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from localspec import Engine
from localspec.lossless import NEAR_TIE_GAP
from tests.test_server import LiveServer, health, post, wait_for

SLOTS = 3
QUESTIONS = (
    "Name three rivers of Europe.",
    "Write a haiku about snow.",
    "What is 12 times 12? Explain briefly.",
)
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["city", "population"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def engine(smollm_path: Path) -> Iterator[Engine]:
    with Engine.load(smollm_path, mode="ngram-simple", n_ctx=2048, parallel=SLOTS) as engine:
        yield engine


@pytest.fixture(scope="module")
def base(engine: Engine) -> Iterator[str]:
    from localspec.server.app import ServerSettings

    with LiveServer(engine, ServerSettings(max_queue=1)) as url:
        yield url


def chat(question: str, tokens: int = 32, **kw: object) -> dict[str, object]:
    return {
        "model": "local",
        "messages": [{"role": "user", "content": question}],
        "max_tokens": tokens,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
        **kw,
    }


async def ask_all(base: str, bodies: list[dict[str, object]]) -> list[object]:
    """Every request at once through the openai SDK's async client."""
    import openai

    client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    async with client:
        return list(
            await asyncio.gather(*(client.chat.completions.create(**b) for b in bodies))  # type: ignore[call-overload]
        )


Tops = list[tuple[str, list[tuple[str, float]]]]  # each token, and its two likeliest


def tops_of(answer: object) -> Tops:
    """An SDK answer's tokens with their top logprobs."""
    return [
        (t.token, [(c.token, c.logprob) for c in t.top_logprobs])
        for t in answer.choices[0].logprobs.content  # type: ignore[attr-defined]
    ]


def same_up_to_a_near_tie(alone: Tops, together: Tops) -> bool:
    """Equal token by token, or the first difference is where the lone answer's top two
    tokens were within the near-tie gap and the other answer took the runner-up."""
    for (mine, top), (theirs, _) in zip(alone, together, strict=False):
        if mine != theirs:
            return len(top) > 1 and top[0][1] - top[1][1] < NEAR_TIE_GAP and theirs == top[1][0]
    return True


def test_concurrent_clients_get_what_each_gets_alone(base: str, engine: Engine) -> None:
    totals = engine.scheduler().totals
    shared = totals.shared_steps
    bodies = [chat(q) for q in QUESTIONS]
    together = asyncio.run(ask_all(base, bodies))
    assert totals.shared_steps > shared + 10  # answered in shared steps, not one by one
    for body, answer in zip(bodies, together, strict=True):
        [alone] = asyncio.run(ask_all(base, [body]))
        assert answer.choices[0].message.content  # type: ignore[attr-defined]
        assert same_up_to_a_near_tie(tops_of(alone), tops_of(answer)), (body, alone, answer)


def test_a_schema_request_beside_free_text(base: str) -> None:
    schema = chat(
        "Give a city and its population as JSON.",
        96,
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA}},
    )
    free = [chat(q, 48) for q in QUESTIONS[:2]]
    answers = asyncio.run(ask_all(base, [free[0], schema, free[1]]))
    data = json.loads(answers[1].choices[0].message.content)  # type: ignore[attr-defined]
    assert set(data) == {"city", "population"} and isinstance(data["population"], int)
    for answer in (answers[0], answers[2]):
        text = answer.choices[0].message.content  # type: ignore[attr-defined]
        assert text and not text.lstrip().startswith("{")


def stream_lines(
    base: str, body: dict[str, object], out: list[tuple[float, str]], path: str = "chat/completions"
) -> None:
    """A streamed answer's events, each with the time it arrived."""
    with httpx.stream("POST", f"{base}/v1/{path}", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line:
                out.append((time.perf_counter(), line))


def streamed_tops(lines: list[tuple[float, str]]) -> Tops:
    """A streamed chat answer's tokens with their top logprobs."""
    out: Tops = []
    for _, line in lines:
        if line.startswith("data: {"):
            for choice in json.loads(line.removeprefix("data: "))["choices"]:
                for t in (choice.get("logprobs") or {}).get("content") or ():
                    out.append(
                        (t["token"], [(c["token"], c["logprob"]) for c in t["top_logprobs"]])
                    )
    return out


def test_a_client_leaving_mid_batch_disturbs_no_one(base: str) -> None:
    bodies = [{**chat(q, 40), "stream": True} for q in QUESTIONS]
    bodies[1]["max_tokens"] = 400
    alone = []
    for i in (0, 2):
        lines: list[tuple[float, str]] = []
        stream_lines(base, bodies[i], lines)
        alone.append(streamed_tops(lines))
    got: dict[int, list[tuple[float, str]]] = {0: [], 2: []}
    threads = [threading.Thread(target=stream_lines, args=(base, bodies[i], got[i])) for i in got]
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=bodies[1], timeout=120) as r:
        lines_iter = (line for line in r.iter_lines() if line)
        next(lines_iter)
        for thread in threads:
            thread.start()
        wait_for(lambda: health(base)["slots_busy"] == SLOTS)
        for _ in range(3):
            next(lines_iter)
    # the client leaves: its slot is free within a step or so, the others go on
    for thread in threads:
        thread.join(120)
    for mine, lines in zip(alone, got.values(), strict=True):
        assert lines[-1][1] == "data: [DONE]"
        theirs = streamed_tops(lines)
        assert same_up_to_a_near_tie(mine, theirs)  # a tipped near tie may end it elsewhere
        if all(a[0] == b[0] for a, b in zip(mine, theirs, strict=False)):
            assert len(theirs) == len(mine)  # the same end (40 tokens or its own)
    wait_for(lambda: health(base)["slots_busy"] == 0, seconds=10)


def test_the_queue_starts_past_the_slots_and_429_past_the_queue(base: str) -> None:
    long = {**chat("Write a long essay about rivers.", 600), "stream": True}
    stop = threading.Event()

    def occupy() -> None:
        with httpx.stream("POST", f"{base}/v1/chat/completions", json=long, timeout=120) as r:
            for _ in r.iter_lines():
                if stop.is_set():
                    return

    runners = [threading.Thread(target=occupy) for _ in range(SLOTS + 1)]
    try:
        for i, runner in enumerate(runners):
            runner.start()
            if i < SLOTS:
                wait_for(lambda i=i: health(base)["slots_busy"] == i + 1)
        wait_for(lambda: health(base)["queue_depth"] == 1)  # the slots are all taken: it waits
        turned_away = post(base, "/v1/chat/completions", chat("Hi", 4))
        assert turned_away.status_code == 429, turned_away.text
        assert health(base)["slots"] == SLOTS
    finally:
        stop.set()
        for runner in runners:
            runner.join(120)
    wait_for(lambda: health(base)["slots_busy"] + health(base)["queue_depth"] == 0, 20)


@pytest.mark.slow
def test_a_long_prompt_does_not_stall_a_streaming_answer(base: str, engine: Engine) -> None:
    """A prompt of ~1500 tokens is read in chunks between the other answer's steps: that
    answer's events keep coming, each gap far shorter than reading the whole prompt."""
    log = "".join(
        f"line {i}: service {i % 7} answered request {i * 13} in {i % 50} ms\n" for i in range(90)
    )
    long_prompt = "Summarise this log.\n" + log
    assert len(engine.target.tokenize(long_prompt)) > 1200
    t0 = time.perf_counter()  # alone, a different first line: nothing of it cached
    post(base, "/v1/chat/completions", chat("Count the lines of this log.\n" + log, 1))
    whole_prompt_s = time.perf_counter() - t0

    streaming: list[tuple[float, str]] = []
    body = {"prompt": "1, 2, 3, 4, 5, 6, 7,", "max_tokens": 600, "temperature": 0, "stream": True}
    reader = threading.Thread(target=stream_lines, args=(base, body, streaming, "completions"))
    reader.start()
    wait_for(lambda: len(streaming) > 3)
    sent = time.perf_counter()
    answer = post(base, "/v1/chat/completions", chat(long_prompt, 1))
    read = time.perf_counter()
    reader.join(120)
    assert answer.status_code == 200
    assert streaming[-1][0] > read  # the answer was still streaming when the prompt was read
    during = [t for t, _ in streaming if sent <= t <= read]
    gaps = [b - a for a, b in zip([sent, *during], [*during, read], strict=False)]
    assert len(during) >= 3 and max(gaps) < whole_prompt_s / 3, (gaps, whole_prompt_s)


def test_n_answers_to_one_request_run_side_by_side(base: str, engine: Engine) -> None:
    """``n`` as the openai SDK sends it: n choices, indexed, read from one prompt read once;
    seeded, choice i draws as a request with seed + i (a draw tips only where a batched
    pass's rounding moves a boundary onto it: too rare to see); greedy, each is the answer
    alone up to a near tie; usage counts the prompt once and every choice's tokens."""
    import openai

    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    system = "You write short poems about the seasons, in plain words. " * 8
    messages = [{"role": "system", "content": system}, {"role": "user", "content": QUESTIONS[1]}]
    ask = {"model": "local", "messages": messages}
    totals = engine.scheduler().totals
    copies = totals.copies
    seeded = client.chat.completions.create(**ask, n=3, max_tokens=16, temperature=0.9, seed=40)
    assert [c.index for c in seeded.choices] == [0, 1, 2]
    assert totals.copies >= copies + 2  # the prompt was read once, then copied
    for choice in seeded.choices:
        one = client.chat.completions.create(
            **ask, max_tokens=16, temperature=0.9, seed=40 + choice.index
        )
        assert one.choices[0].message.content == choice.message.content
    assert len({c.message.content for c in seeded.choices}) > 1
    tokens = sum(
        len(engine.target.tokenize(c.message.content or "", add_special=False))
        for c in seeded.choices
    )
    assert seeded.usage is not None and abs(seeded.usage.completion_tokens - tokens) <= 3
    assert seeded.usage.prompt_tokens == one.usage.prompt_tokens  # type: ignore[union-attr]

    ask = {"model": "local", "prompt": "The three primary colours are", "max_tokens": 12}
    greedy = client.completions.create(**ask, n=2, temperature=0, logprobs=2)
    alone = client.completions.create(**ask, temperature=0, logprobs=2)
    assert greedy.choices[0].text == greedy.choices[1].text  # the same rows, side by side
    assert same_up_to_a_near_tie(legacy_tops(alone.choices[0]), legacy_tops(greedy.choices[0]))


def legacy_tops(choice: object) -> Tops:
    """A completion choice's tokens with their top logprobs (the legacy shape)."""
    lp = choice.logprobs  # type: ignore[attr-defined]
    return [
        (token, sorted(top.items(), key=lambda kv: -kv[1]))
        for token, top in zip(lp.tokens, lp.top_logprobs, strict=True)
    ]


def test_n_answers_stream_interleaved_by_index(base: str) -> None:
    body = {**chat(QUESTIONS[0], 12), "stream": True, "n": 2, "temperature": 0.8, "seed": 3}
    body["stream_options"] = {"include_usage": True}
    lines: list[tuple[float, str]] = []
    stream_lines(base, body, lines)
    chunks = [json.loads(line[6:]) for _, line in lines if line.startswith("data: {")]
    text = {0: "", 1: ""}
    finished = set()
    for chunk in chunks[:-1]:
        [choice] = chunk["choices"]
        text[choice["index"]] += choice["delta"].get("content") or ""
        if choice["finish_reason"]:
            finished.add(choice["index"])
    assert finished == {0, 1} and all(text.values())
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 24
    assert lines[-1][1] == "data: [DONE]"
    for index in (0, 1):
        one = {**body, "n": 1, "seed": 3 + index, "stream": False}
        answer = post(base, "/v1/chat/completions", one).json()
        assert answer["choices"][0]["message"]["content"] == text[index]
    # without include_usage, the usage of every choice rides once, on the last chunk
    lines = []
    stream_lines(base, {**body, "stream_options": None}, lines)
    usages = [
        u
        for _, line in lines
        if line.startswith("data: {") and (u := json.loads(line[6:]).get("usage"))
    ]
    assert [u["completion_tokens"] for u in usages] == [24]


def test_an_echoed_prompt_alone_comes_once_per_choice(base: str) -> None:
    """``echo`` with ``max_tokens: 0``, as evaluation harnesses score a text: n choices,
    and streamed as a stream."""
    body = {"prompt": "def fib(n):", "echo": True, "max_tokens": 0, "n": 2, "logprobs": 1}
    whole = post(base, "/v1/completions", body).json()
    assert [c["index"] for c in whole["choices"]] == [0, 1]
    assert {c["text"] for c in whole["choices"]} == {"def fib(n):"}
    lines: list[tuple[float, str]] = []
    stream_lines(base, {**body, "stream": True}, lines, "completions")
    chunks = [json.loads(line[6:]) for _, line in lines if line.startswith("data: {")]
    assert [c["choices"][0]["index"] for c in chunks] == [0, 1]
    assert lines[-1][1] == "data: [DONE]"


def test_n_past_the_slots_is_refused(base: str) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="--parallel 4") as error:
        client.chat.completions.create(
            model="local", messages=[{"role": "user", "content": "Hi"}], n=SLOTS + 1
        )
    assert error.value.body["param"] == "n"  # type: ignore[index]
    refused = post(base, "/v1/completions", {"prompt": "Hi", "n": 0})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "n"


def test_requests_for_several_slots_gather_them_one_request_at_a_time() -> None:
    """Two requests of n=3 on three slots, the slots freed one by one: were both to take
    what came free, each would hold some and wait for the other's forever."""
    from types import SimpleNamespace

    from localspec.server.runner import EngineRunner

    runner = EngineRunner(SimpleNamespace(parallel=3), max_queue=8)  # type: ignore[arg-type]

    async def main() -> None:
        for _ in range(3):
            await runner.acquire()  # single requests hold every slot
        first = asyncio.create_task(runner.acquire(3))
        second = asyncio.create_task(runner.acquire(3))
        await asyncio.sleep(0)
        for _ in range(3):  # the single requests end one after the other
            runner.release()
            await asyncio.sleep(0)
        await asyncio.wait_for(first, 1)
        assert not second.done() and runner.queue_depth == 1
        runner.release(3)
        await asyncio.wait_for(second, 1)

    asyncio.run(main())
