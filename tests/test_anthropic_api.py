"""Anthropic's Messages API over real HTTP, driven by the ``anthropic`` SDK and
``langchain-anthropic``: whole and streamed messages on SmolLM2-135M (the same greedy text as
the OpenAI route), stop sequences, token counts, keys, bad input; and tool use on
Qwen2.5-Coder-0.5B-Instruct (whose template knows tools)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from localspec import Engine
from localspec.engine.loop import RoundEvent
from localspec.engine.stats import Stats
from localspec.errors import EngineFailure
from localspec.server.anthropic_routes import MessageReply, MessagesRequest, chat_body
from localspec.server.app import ServerSettings
from localspec.server.schemas import ChatRequest
from tests.test_server import (
    LiveServer,
    health,
    leave_a_whole_answer,
    post,
    requests_counted,
    wait_for,
)

KEY = {"x-api-key": "k1", "anthropic-version": "2023-06-01"}
ASK = [{"role": "user", "content": "Name three colours."}]
COUNT = [{"role": "user", "content": "Count from 1 to 20, separated by commas."}]
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city",
    "input_schema": SCHEMA,
}
PARIS = [{"role": "user", "content": "What's the weather in Paris right now?"}]


@pytest.fixture(scope="module")
def smollm(smollm_path: Path) -> Iterator[Engine]:
    with Engine.load(smollm_path, mode="ngram-simple", n_ctx=1024, parallel=2) as engine:
        yield engine


@pytest.fixture(scope="module")
def base(smollm: Engine) -> Iterator[str]:
    with LiveServer(smollm, ServerSettings(api_keys=("k1",))) as url:
        yield url


@pytest.fixture(scope="module")
def client(base: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base, api_key="k1", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def qwen_client(qwen: Engine) -> Iterator[anthropic.Anthropic]:
    with LiveServer(qwen, ServerSettings()) as url:
        yield anthropic.Anthropic(base_url=url, api_key="any", max_retries=0, timeout=120)


def ask(client: anthropic.Anthropic, messages: list[Any], tokens: int = 24, **kw: Any) -> Any:
    """One greedy message of at most ``tokens`` tokens, ``kw`` overriding. The SDK has no
    ``temperature`` parameter any more: it goes in the body as an extra field."""
    extra = {"temperature": 0, **kw.pop("extra_body", {})}
    return client.messages.create(
        model="local", messages=messages, max_tokens=tokens, extra_body=extra, **kw
    )


GREEDY = {"extra_body": {"temperature": 0}}


def openai_chat(base: str, messages: list[Any], tokens: int = 24, **kw: Any) -> dict[str, Any]:
    body = {"messages": messages, "max_tokens": tokens, "temperature": 0, **kw}
    r = post(base, "/v1/chat/completions", body, headers={"Authorization": "Bearer k1"})
    assert r.status_code == 200, r.text
    return r.json()


def text_of(message: Any) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


# ----- text -----------------------------------------------------------------------------------


def test_a_message_is_the_openai_routes_greedy_answer(client: anthropic.Anthropic, base: str):
    message = ask(client, ASK)
    openai = openai_chat(base, ASK)
    choice = openai["choices"][0]
    assert message.id.startswith("msg_") and message.type == "message"
    assert message.role == "assistant" and message.model == openai["model"]
    assert text_of(message) == choice["message"]["content"] != ""
    expected = {"length": "max_tokens", "stop": "end_turn"}[choice["finish_reason"]]
    assert message.stop_reason == expected and message.stop_sequence is None
    usage = message.usage
    assert usage.input_tokens == openai["usage"]["prompt_tokens"]
    assert usage.output_tokens == openai["usage"]["completion_tokens"]
    assert usage.cache_read_input_tokens == 0 and usage.cache_creation_input_tokens == 0
    extras = message.model_extra
    assert extras["speculative"]["mode"] == "ngram-simple"
    assert extras["timings"]["predicted_n"] == usage.output_tokens


def test_a_stream_spells_the_whole_message(client: anthropic.Anthropic) -> None:
    whole = ask(client, COUNT, 40)
    with client.messages.stream(model="local", messages=COUNT, max_tokens=40, **GREEDY) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == text_of(whole) == text_of(final)
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert final.usage.input_tokens == whole.usage.input_tokens


def test_the_stream_s_events_in_order(base: str) -> None:
    # greedy: a sampled answer to ASK can end within 8 tokens ("Red, blue, green.")
    body = {"model": "local", "messages": ASK, "max_tokens": 8, "stream": True, "temperature": 0}
    with httpx.stream("POST", f"{base}/v1/messages", json=body, headers=KEY, timeout=120) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    names = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    payloads = [json.loads(line.removeprefix("data: ")) for line in lines if line[:5] == "data:"]
    assert [p["type"] for p in payloads] == names
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    start, delta = payloads[0]["message"], payloads[-2]
    assert start["content"] == [] and start["usage"]["input_tokens"] > 0
    assert delta["delta"]["stop_reason"] == "max_tokens" and delta["usage"]["output_tokens"] == 8
    assert delta["speculative"]["mode"] == "ngram-simple"


def test_system_blocks_with_cache_control(client: anthropic.Anthropic, base: str) -> None:
    system = [
        {"type": "text", "text": "You are a pirate.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Answer in one sentence."},
    ]
    message = ask(
        client,
        ASK,
        system=system,
        metadata={"user_id": "someone"},
        extra_body={"service_tier": "auto", "container": "c1", "mcp_servers": []},
    )
    prompt = [{"role": "system", "content": "You are a pirate.\nAnswer in one sentence."}, *ASK]
    assert text_of(message) == openai_chat(base, prompt)["choices"][0]["message"]["content"]


def test_a_stop_sequence_ends_the_answer(client: anthropic.Anthropic) -> None:
    text = text_of(ask(client, COUNT, 40))
    at = len(text) // 2
    while text.find(text[at : at + 3]) != at:  # a stop string the answer holds only once
        at += 1
    stop = text[at : at + 3]
    message = ask(client, COUNT, 40, stop_sequences=["never seen", stop])
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == stop
    assert text_of(message) == text[:at]
    with client.messages.stream(
        model="local", messages=COUNT, max_tokens=40, stop_sequences=[stop], **GREEDY
    ) as stream:
        final = stream.get_final_message()
    assert final.stop_sequence == stop and text_of(final) == text[:at]


def test_output_config_format_shapes_the_answer(client: anthropic.Anthropic) -> None:
    colour = {"type": "string", "enum": ["red", "green", "blue"]}
    schema = {"type": "object", "properties": {"colour": colour}, "required": ["colour"]}
    fmt = {"type": "json_schema", "schema": schema}
    message = ask(client, ASK, 40, output_config={"format": fmt})
    assert message.stop_reason == "end_turn"
    assert json.loads(text_of(message))["colour"] in colour["enum"]


def test_count_tokens_counts_the_prompt(client: anthropic.Anthropic) -> None:
    counted = client.messages.count_tokens(model="local", messages=ASK, system="Be brief.")
    message = ask(client, ASK, 2, system="Be brief.")
    assert counted.input_tokens == message.usage.input_tokens > 0


def counted(base: str, status: int) -> float:
    """How many /v1/messages requests ended with ``status`` (the server's metrics)."""
    return requests_counted(base, "/v1/messages", status, KEY)


def test_a_client_that_leaves_stops_its_generation(base: str) -> None:
    essay = [{"role": "user", "content": "Write a long essay about rivers."}]
    body = {
        "model": "local",
        "messages": essay,
        "max_tokens": 900,
        "stream": True,
        "temperature": 0,
    }
    left, served = counted(base, 499), counted(base, 200)
    with httpx.stream("POST", f"{base}/v1/messages", json=body, headers=KEY, timeout=120) as r:
        for line in r.iter_lines():
            if "text_delta" in line:
                break  # the client goes away mid-stream
    wait_for(lambda: not health(base)["busy"], seconds=5)  # stopped within a step or so
    leave_a_whole_answer(base, "/v1/messages", {**body, "stream": False}, KEY)
    wait_for(lambda: not health(base)["busy"], seconds=5)
    # the reply counts its 499 just after its generation frees the slot
    wait_for(lambda: counted(base, 499) == left + 2, seconds=5)
    assert counted(base, 200) == served


class FailingHost:
    """Just enough of a server for a reply whose generation fails after its first round."""

    stopping = False

    def __init__(self) -> None:
        self.statuses: list[int] = []

    def envelope(self, chat: bool, rid: str) -> dict[str, Any]:
        return {"model": "m"}

    def extras(self, stats: Stats, mode: str) -> dict[str, Any]:
        return {"usage": {}, "speculative": {}, "timings": {}}

    def finished(self, endpoint: str, mode: str, stats: Stats, reason: str) -> None:
        self.statuses.append(200)

    def ended(self, endpoint: str, status: int) -> None:
        self.statuses.append(status)

    def token_bytes(self, token: int) -> bytes:
        return b"Hi"


class FailingEvents:
    def __init__(self) -> None:
        self.rounds = [RoundEvent("Hi", (1,), (False,), Stats(n_prompt=3, n_tokens=1))]
        self.closed = False

    def __aiter__(self) -> FailingEvents:
        return self

    async def __anext__(self) -> RoundEvent:
        if self.rounds:
            return self.rounds.pop()
        raise EngineFailure("llama_decode returned -1")

    async def aclose(self) -> None:
        self.closed = True


async def test_a_failure_after_the_stream_started_is_an_error_event() -> None:
    host, events = FailingHost(), FailingEvents()
    req = ChatRequest.model_validate({"messages": ASK})
    reply = MessageReply(host, req, "none", 3, None, "m")  # type: ignore[arg-type]
    chunks = [chunk async for chunk in reply.sse(events)]  # type: ignore[arg-type]
    assert chunks[-1].startswith("event: error\n")
    error = json.loads(chunks[-1].split("data: ", 1)[1])
    assert error == {
        "type": "error",
        "error": {"type": "api_error", "message": "generation failed: llama_decode returned -1"},
    }
    assert "text_delta" in "".join(chunks[:-1]) and "message_stop" not in "".join(chunks)
    assert events.closed and host.statuses == [500]


# ----- keys and bad input ---------------------------------------------------------------------


def test_keys_by_x_api_key_or_bearer(base: str) -> None:
    wrong = anthropic.Anthropic(base_url=base, api_key="k2", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as caught:
        wrong.messages.count_tokens(model="local", messages=ASK)
    assert caught.value.body["error"]["type"] == "authentication_error"
    bearer = anthropic.Anthropic(base_url=base, auth_token="k1", max_retries=0)
    assert bearer.messages.count_tokens(model="local", messages=ASK).input_tokens > 0
    r = post(base, "/v1/messages", {"model": "local", "messages": ASK, "max_tokens": 4})
    assert r.status_code == 401 and r.json()["type"] == "error"


def test_an_image_is_refused(client: anthropic.Anthropic) -> None:
    image = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}
    content = [{"type": "image", "source": image}, {"type": "text", "text": "What is it?"}]
    with pytest.raises(anthropic.BadRequestError) as caught:
        ask(client, [{"role": "user", "content": content}])
    error = caught.value.body["error"]
    assert error["type"] == "invalid_request_error"
    assert "'image'" in error["message"] and "messages.0.content.0" in error["message"]


def user_says(content: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": content}]


DOCUMENT = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}
BAD_BODIES = [
    ({"messages": ASK}, "max_tokens"),
    ({"messages": ASK, "max_tokens": 0}, "max_tokens"),
    ({"messages": ASK, "max_tokens": -1}, "max_tokens"),
    ({"messages": ASK, "max_tokens": 4, "repeat_penalty": 0}, "repeat_penalty"),
    ({"messages": ASK, "max_tokens": 4, "temperature": 1.5}, "temperature"),
    ({"messages": [], "max_tokens": 4}, "messages"),
    ({"messages": [{"role": "system", "content": "x"}], "max_tokens": 4}, "role"),
    ({"messages": [*ASK, {"role": "assistant", "content": "Red,"}], "max_tokens": 4}, "prefill"),
    ({"messages": user_says([{"text": "no type"}]), "max_tokens": 4}, "'type'"),
    ({"messages": user_says([DOCUMENT]), "max_tokens": 4}, "'document'"),
    (
        {"messages": user_says([{"type": "tool_use", "id": "a", "name": "f"}]), "max_tokens": 4},
        "user",
    ),
    (
        {
            "messages": user_says(
                [{"type": "tool_result", "tool_use_id": "a", "content": [{"type": "x"}]}]
            ),
            "max_tokens": 4,
        },
        "content.0.content.0: only 'text' blocks",
    ),
    ({"messages": user_says("word " * 3000), "max_tokens": 4}, "prompt is too long: "),
    ({"messages": ASK, "max_tokens": 4, "system": [{"type": "image"}]}, "system.0"),
    ({"messages": ASK, "max_tokens": 4, "tool_choice": {"type": "any"}}, "tool_choice"),
    ({"messages": ASK, "max_tokens": 4, "tools": [WEATHER], "tool_choice": {"type": "x"}}, "'x'"),
    (
        {"messages": ASK, "max_tokens": 4, "tools": [{"type": "web_search_20250305", "name": "w"}]},
        "web_search",
    ),
    (
        {
            "messages": ASK,
            "max_tokens": 4,
            "tools": [{**WEATHER, "input_schema": {"type": "object", "required": "city"}}],
        },
        "input_schema",
    ),
    ({"messages": ASK, "max_tokens": 4, "speculative": {"mode": "nonsense"}}, "speculative.mode"),
    (
        {"messages": ASK, "max_tokens": 4, "output_config": {"format": {"type": "yaml"}}},
        "output_config.format",
    ),
    ([1, 2], "JSON object"),
]


@pytest.mark.parametrize(("body", "words"), BAD_BODIES)
def test_bad_input_is_a_400_in_anthropic_s_shape(base: str, body: Any, words: str) -> None:
    r = post(base, "/v1/messages", body, headers=KEY)
    assert r.status_code == 400, r.text
    error = r.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert words in error["error"]["message"]


def test_a_screenshot_a_tool_returns_is_said_not_refused(client: anthropic.Anthropic) -> None:
    """Claude Code's Read tool returns images and PDFs in a tool result: refused, it would
    stay in the conversation and every later turn would be refused with it."""
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "x"}}
    pdf = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf"}}
    content = [{"type": "text", "text": "Read 2 files"}, image, DOCUMENT, pdf]
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": content}
    call = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}
    history = [*PARIS, {"role": "assistant", "content": [call]}, *user_says([result])]
    said = chat_body(MessagesRequest.model_validate({"max_tokens": 4, "messages": history}))
    assert said["messages"][-1]["content"] == (
        "Read 2 files\n[image not shown: this model reads text only]\nx\n"
        "[document not shown: this model reads text only]"
    )
    assert ask(client, history, tokens=4).stop_reason in ("end_turn", "max_tokens")


def test_malformed_json_and_a_wrong_method(base: str) -> None:
    r = httpx.post(f"{base}/v1/messages", content=b'{"model": ', headers=KEY)
    assert r.status_code == 400
    assert r.json()["error"] == {
        "type": "invalid_request_error",
        "message": r.json()["error"]["message"],
    }
    assert "malformed JSON" in r.json()["error"]["message"]
    got = httpx.get(f"{base}/v1/messages", headers=KEY)
    assert got.status_code == 405 and got.json()["type"] == "error"


def test_a_conversation_with_tools_in_openai_s_words() -> None:
    call = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}
    failed = {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True}
    body = {
        "max_tokens": 8,
        "system": "Be brief.",
        "messages": [
            *PARIS,
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Hmm.", "signature": "s"},
                    {"type": "text", "text": "Let me look."},
                    call,
                ],
            },
            user_says([{**failed, "content": [{"type": "text", "text": "timed out"}]}])[0],
            {"role": "user", "content": [{"type": "text", "text": "Try again."}]},
        ],
        "tools": [WEATHER],
        "tool_choice": {"type": "tool", "name": "get_weather"},
        "stop_sequences": ["\n\n"],
        "metadata": {"user_id": "u"},
    }
    arguments = '{"city": "Oslo"}'
    assert chat_body(MessagesRequest.model_validate(body)) == {
        "messages": [
            {"role": "system", "content": "Be brief."},
            *PARIS,
            {
                "role": "assistant",
                "content": "Let me look.",
                "tool_calls": [
                    {
                        "id": "toolu_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": arguments},
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": "toolu_1",
                "content": "Error: timed out",
                "name": "get_weather",
            },
            {"role": "user", "content": "Try again."},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": WEATHER["description"],
                    "parameters": WEATHER["input_schema"],
                },
            }
        ],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "max_tokens": 8,
        "stop": ["\n\n"],
        "stream": False,
    }


# ----- tools ----------------------------------------------------------------------------------


def test_tool_use_round_trip(qwen_client: anthropic.Anthropic) -> None:
    named = {"type": "tool", "name": "get_weather"}
    message = ask(qwen_client, PARIS, 64, tools=[WEATHER], tool_choice=named)
    assert message.stop_reason == "tool_use"
    (call,) = [block for block in message.content if block.type == "tool_use"]
    assert call.id.startswith("toolu_") and call.name == "get_weather"
    assert call.input == {"city": "Paris"}
    result = {"type": "tool_result", "tool_use_id": call.id, "content": "18 degrees and cloudy"}
    follow = [*PARIS, {"role": "assistant", "content": message.content}, user_says([result])[0]]
    answer = ask(qwen_client, follow, 48, tools=[WEATHER], tool_choice={"type": "none"})
    assert answer.stop_reason in ("end_turn", "max_tokens")
    assert [block.type for block in answer.content] == ["text"]
    assert "18" in text_of(answer)
    # the same conversation in OpenAI's words gets the same greedy answer
    openai_call = {
        "id": call.id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps(call.input)},
    }
    as_openai = [
        *PARIS,
        {"role": "assistant", "content": None, "tool_calls": [openai_call]},
        {
            "role": "tool",
            "tool_call_id": call.id,
            "name": "get_weather",
            "content": result["content"],
        },
    ]
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}
    body = {"tools": [tool], "tool_choice": "none"}
    openai = openai_chat(str(qwen_client.base_url).rstrip("/"), as_openai, 48, **body)
    assert text_of(answer) == openai["choices"][0]["message"]["content"]


def test_a_streamed_tool_use(qwen_client: anthropic.Anthropic) -> None:
    deltas = []
    with qwen_client.messages.stream(
        model="local",
        messages=PARIS,
        max_tokens=64,
        tools=[WEATHER],
        tool_choice={"type": "any"},
        **GREEDY,
    ) as stream:
        for event in stream:
            if event.type == "content_block_delta":
                deltas.append(event.delta.type)
        final = stream.get_final_message()
    assert deltas == ["input_json_delta"]  # nothing of the call leaks as text
    assert final.stop_reason == "tool_use"
    (call,) = final.content
    assert call.type == "tool_use" and call.name == "get_weather"
    assert call.input == {"city": "Paris"}


def test_penalties_as_the_openai_routes_take_them(qwen_client: anthropic.Anthropic) -> None:
    """Anthropic's API has no penalties; this server takes the OpenAI routes' ones here too,
    rather than ignoring them."""
    listing = user_says("Write the word 'cat' ten times, separated by commas.")
    plain = ask(qwen_client, listing, 16)
    penalized = ask(qwen_client, listing, 16, extra_body={"repeat_penalty": 1.5})
    assert penalized.content[0].text != plain.content[0].text


def test_count_tokens_counts_the_tools(qwen_client: anthropic.Anthropic) -> None:
    bare = qwen_client.messages.count_tokens(model="local", messages=PARIS).input_tokens
    shown = qwen_client.messages.count_tokens(model="local", messages=PARIS, tools=[WEATHER])
    assert shown.input_tokens > bare > 0


def test_langchain_anthropic_round_trip(qwen_client: anthropic.Anthropic) -> None:
    from langchain_anthropic import ChatAnthropic
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool

    @tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        return f"18 degrees and cloudy in {city}"

    llm = ChatAnthropic(
        model="local",
        base_url=str(qwen_client.base_url),
        api_key="any",
        temperature=0,
        max_tokens=64,
        max_retries=0,
    )
    asked = [HumanMessage("What's the weather in Paris right now?")]
    called = llm.bind_tools([get_weather], tool_choice="get_weather").invoke(asked)
    (call,) = called.tool_calls
    assert call["name"] == "get_weather" and call["args"] == {"city": "Paris"}
    result = ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])
    answer = llm.invoke([*asked, called, result])
    assert "18" in answer.text and not answer.tool_calls
