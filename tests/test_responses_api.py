"""OpenAI's Responses API (``POST /v1/responses``) with the ``openai`` SDK's ``responses``
client and a request shaped as Codex CLI sends it, against a real server on
Qwen2.5-Coder-0.5B-Instruct (whose template knows tools)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from localspec import Engine
from localspec.server.app import ServerSettings
from tests.test_server import LiveServer, openai_client

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
ASK = "What's the weather in Paris right now?"
GREEDY: dict[str, Any] = {"model": "local", "temperature": 0}


@pytest.fixture(scope="module")
def base(qwen: Engine) -> Iterator[str]:
    with LiveServer(qwen, ServerSettings()) as url:
        yield url


@pytest.fixture(scope="module")
def client(base: str) -> openai.OpenAI:
    return openai_client(base)  # type: ignore[no-any-return]


def test_a_response_is_the_chat_answer_in_this_api_s_shape(client: openai.OpenAI) -> None:
    asked = "Say hello in French."
    reply = client.responses.create(input=asked, max_output_tokens=16, **GREEDY)
    chat = client.chat.completions.create(
        messages=[{"role": "user", "content": asked}], max_tokens=16, **GREEDY
    )
    assert reply.output_text == chat.choices[0].message.content
    assert reply.status == "completed" and reply.object == "response"
    (item,) = reply.output
    assert item.type == "message" and item.role == "assistant" and item.status == "completed"
    usage = reply.usage
    assert usage is not None and usage.output_tokens == chat.usage.completion_tokens
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    cut = client.responses.create(
        input="Count from 1 to 50.", instructions="Be brief.", max_output_tokens=5, **GREEDY
    )
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert cut.usage.output_tokens == 5 and cut.instructions == "Be brief."
    assert cut.output[0].status == "incomplete"  # the message the limit cut
    listing = "Write the word 'cat' ten times, separated by commas."
    plain = client.responses.create(input=listing, max_output_tokens=16, **GREEDY)
    penalized = client.responses.create(
        input=listing, max_output_tokens=16, extra_body={"repeat_penalty": 1.5}, **GREEDY
    )
    assert penalized.output_text != plain.output_text  # penalties as on the chat route


def test_a_stream_s_events_and_its_final_response(client: openai.OpenAI) -> None:
    asked = "Name three colours."
    whole = client.responses.create(input=asked, max_output_tokens=24, **GREEDY)
    with client.responses.stream(input=asked, max_output_tokens=24, **GREEDY) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text == whole.output_text and final.status == "completed"


def test_a_function_call_and_its_output(client: openai.OpenAI) -> None:
    called = client.responses.create(
        input=ASK, tools=[WEATHER], tool_choice="required", max_output_tokens=48, **GREEDY
    )
    (call,) = called.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"} and call.call_id
    with client.responses.stream(
        input=ASK, tools=[WEATHER], tool_choice="required", max_output_tokens=48, **GREEDY
    ) as stream:
        kinds = [e.type for e in stream]
        streamed = stream.get_final_response()
    assert "response.function_call_arguments.done" in kinds
    assert [(o.type, o.arguments) for o in streamed.output] == [("function_call", call.arguments)]
    # the next turn: the call and its output sent back as items
    sent = {"call_id": call.call_id, "name": call.name, "arguments": call.arguments}
    turn = [
        {"role": "user", "content": ASK},
        {"type": "function_call", **sent},
        {"type": "function_call_output", "call_id": call.call_id, "output": "18 degrees, sunny"},
    ]
    answer = client.responses.create(
        input=turn, tools=[WEATHER], tool_choice="none", max_output_tokens=32, **GREEDY
    )
    assert answer.status in ("completed", "incomplete") and answer.output_text
    # a tool's output holding an image is said in a line, not refused (the turn would stay)
    image = {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}
    turn[-1] = {**turn[-1], "output": [{"type": "input_text", "text": "a chart"}, image]}
    shown = client.responses.create(input=turn, tools=[WEATHER], max_output_tokens=8, **GREEDY)
    assert shown.status in ("completed", "incomplete")


def test_structured_output_through_text_format(client: openai.OpenAI) -> None:
    person = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    fmt = {"format": {"type": "json_schema", "name": "person", "schema": person}}
    reply = client.responses.create(
        input="Bob is 31 years old. Describe him.", text=fmt, max_output_tokens=40, **GREEDY
    )
    assert json.loads(reply.output_text) == {"name": "Bob", "age": 31}


def said(role: str, text: str, kind: str = "input_text") -> dict[str, Any]:
    return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}


def test_a_request_shaped_as_codex_sends_it(base: str) -> None:
    """Codex CLI: ``developer`` instructions as an input item, an earlier answer's
    reasoning item sent back, ``store: false``, ``include``, ``reasoning``, a prompt cache
    key, tools with ``strict``, streamed; what changes nothing here is accepted."""
    body = {
        "model": "gpt-5-codex",
        "instructions": "You are a coding agent.",
        "input": [
            said("developer", "Be terse."),
            said("user", "Say OK."),
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "xyz"},
            said("assistant", "OK.", "output_text"),
            said("user", "Again."),
        ],
        "tools": [{**WEATHER, "strict": False}],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "editor-chat-1",
        "max_output_tokens": 8,
        "temperature": 0,
    }
    with httpx.stream("POST", f"{base}/v1/responses", json=body, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line.startswith("event: ")]
    assert lines[0] == "event: response.created"
    assert lines[-1] in ("event: response.completed", "event: response.incomplete")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": "hi", "background": True}, "background"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools.0.type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input.0.content.0",
        ),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input.0"),
        ({"input": [{"role": "robot", "content": "hi"}]}, "input.0.role"),
        ({"input": [{"role": ["user"], "content": "hi"}]}, "input.0.role"),
        ({"input": "hi", "tool_choice": {"type": "mcp"}}, "tool_choice"),
        ({"input": "hi", "text": {"format": {"type": "yaml"}}}, "text.format"),
        ({"input": 3}, "input"),
        # the chat request's checks, named as this API names its fields
        ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": []}, "input"),
        ({"input": "hi", "tools": [{"type": "function"}]}, "tools"),
        ({"input": "hi", "frequency_penalty": 9}, "frequency_penalty"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(base: str, body: dict[str, Any], param: str) -> None:
    r = httpx.post(f"{base}/v1/responses", json={"model": "local", **body}, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    assert "max_tokens" not in error["message"] and ".function." not in error["message"]


async def test_a_failure_after_the_stream_started_is_an_error_event() -> None:
    from localspec.server.responses_routes import ResponseReply, ResponsesRequest
    from localspec.server.schemas import ChatRequest
    from tests.test_anthropic_api import FailingEvents, FailingHost

    host, events = FailingHost(), FailingEvents()
    req = ResponsesRequest.model_validate({"input": "Hi", "stream": True})
    chat = ChatRequest.model_validate({"messages": [{"role": "user", "content": "Hi"}]})
    reply = ResponseReply(host, req, chat, "none", None, "m")  # type: ignore[arg-type]
    chunks = [chunk async for chunk in reply.sse(events)]  # type: ignore[arg-type]
    assert chunks[-1].startswith("event: error\n")
    error = json.loads(chunks[-1].split("data: ", 1)[1])
    assert error["code"] == "server_error" and "llama_decode returned -1" in error["message"]
    assert "response.output_text.delta" in "".join(chunks[:-1])
    assert "response.completed" not in "".join(chunks)
    assert events.closed and host.statuses == [500]
