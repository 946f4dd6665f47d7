"""Tool calls and structured output over HTTP, as real clients use them: the ``openai`` SDK,
``langchain-openai`` (``bind_tools``, ``with_structured_output``) and ``litellm``, against a
real server on Qwen2.5-Coder-0.5B-Instruct (whose template knows tools)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import httpx
import openai
import pytest
from pydantic import BaseModel

from localspec import Engine
from localspec.server.app import ServerSettings
from tests.test_server import LiveServer, ask_openai, openai_client

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
ASK = [{"role": "user", "content": "What's the weather in Paris right now?"}]
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def base(qwen: Engine) -> Iterator[str]:
    with LiveServer(qwen, ServerSettings(max_queue=4)) as url:
        yield url


@pytest.fixture(scope="module")
def client(base: str) -> openai.OpenAI:
    return openai_client(base)


def chat(client: openai.OpenAI, messages: list, **kw):  # type: ignore[no-untyped-def, type-arg]
    return ask_openai(client, messages, 96, **kw)


@pytest.mark.parametrize("choice", ["auto", "required"])
def test_a_tool_call_comes_back_as_tool_calls(client: openai.OpenAI, choice: str) -> None:
    reply = chat(client, ASK, tools=[WEATHER], tool_choice=choice).choices[0]
    assert reply.finish_reason == "tool_calls"
    assert not reply.message.content
    (call,) = reply.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] == "Paris"


@pytest.mark.slow
def test_a_named_tool_choice_is_the_one_called(client: openai.OpenAI) -> None:
    named = {"type": "function", "function": {"name": "get_time"}}
    reply = chat(client, ASK, tools=[WEATHER, TIME], tool_choice=named).choices[0]
    assert [c.function.name for c in reply.message.tool_calls] == ["get_time"]
    assert json.loads(reply.message.tool_calls[0].function.arguments)["city"] == "Paris"


@pytest.mark.slow
def test_the_same_tool_call_every_time(client: openai.OpenAI) -> None:
    calls = {
        chat(client, ASK, tools=[WEATHER]).choices[0].message.tool_calls[0].function.arguments
        for _ in range(3)
    }
    assert len(calls) == 1


def test_streamed_tool_call_deltas(client: openai.OpenAI) -> None:
    calls: dict[int, dict[str, str]] = {}
    content, reasons = [], []
    for chunk in chat(client, ASK, tools=[WEATHER], tool_choice="required", stream=True):
        delta = chunk.choices[0].delta
        content.append(delta.content or "")
        for part in delta.tool_calls or []:
            entry = calls.setdefault(part.index, {"id": "", "name": "", "arguments": ""})
            entry["id"] += part.id or ""
            entry["name"] += part.function.name or ""
            entry["arguments"] += part.function.arguments or ""
        reasons.append(chunk.choices[0].finish_reason)
    assert "".join(content) == ""  # nothing of the call leaks as text
    assert reasons[-1] == "tool_calls"
    assert calls[0]["name"] == "get_weather" and calls[0]["id"].startswith("call_")
    assert json.loads(calls[0]["arguments"])["city"] == "Paris"


@pytest.mark.slow
def test_the_turn_after_a_tool_result(client: openai.OpenAI) -> None:
    first = chat(client, ASK, tools=[WEATHER], tool_choice="required").choices[0].message
    result = {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": '{"temp_c": 18}'}
    follow = [*ASK, first.model_dump(exclude_none=True), result]
    reply = chat(client, follow, tools=[WEATHER], tool_choice="none").choices[0]
    assert reply.finish_reason == "stop" and not reply.message.tool_calls
    assert "18" in reply.message.content


def test_json_schema_answer_parses(client: openai.OpenAI) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON, "strict": True}}
    messages = [{"role": "user", "content": "Bob is 31 years old. Give his name and age."}]
    reply = chat(client, messages, response_format=fmt)
    assert json.loads(reply.choices[0].message.content) == {"name": "Bob", "age": 31}
    assert reply.model_extra["speculative"]["accepted"] > 0


def test_json_object_answer_is_an_object(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "List three colours."}]
    reply = chat(client, messages, response_format={"type": "json_object"})
    assert isinstance(json.loads(reply.choices[0].message.content), dict)


@pytest.mark.slow
def test_a_function_without_parameters_is_called_without_arguments(client: openai.OpenAI) -> None:
    bare = {"type": "function", "function": {"name": "get_time", "description": "Local time"}}
    reply = chat(client, ASK, tools=[bare], tool_choice="required").choices[0]
    assert reply.message.tool_calls[0].function.arguments == "{}"


def test_a_tool_schema_the_converter_cannot_take_is_not_refused(client: openai.OpenAI) -> None:
    """An e-mail field as zod writes it (a lookahead in its pattern, which the grammar
    converter cannot take): the provider APIs accept it, so must this server; a required
    call to such a tool is held to its name, its arguments to any JSON object."""
    email = {"type": "string", "pattern": r"^(?!\.)[^@]+@[^@]+$"}
    contact = {
        "type": "function",
        "function": {
            "name": "send_mail",
            "description": "Send an e-mail",
            "parameters": {
                "type": "object",
                "properties": {"to": email, "subject": {"type": "string"}},
                "required": ["to"],
            },
        },
    }
    ask = [{"role": "user", "content": "Mail bob@example.com that the build is green."}]
    free = chat(client, ask, tools=[contact, WEATHER]).choices[0]
    assert free.message.content or free.message.tool_calls
    calls = chat(client, ask, tools=[contact], tool_choice="required").choices[0].message.tool_calls
    assert calls and all(call.function.name == "send_mail" for call in calls)
    assert all(isinstance(json.loads(call.function.arguments), dict) for call in calls)


def test_what_cannot_be_honoured_is_refused(client: openai.OpenAI) -> None:
    bad_ref = {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}
    contradictory = {"type": "string", "minLength": 5, "maxLength": 2}
    cases = [
        ({"tool_choice": "required"}, "tool_choice needs tools"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "'sometimes' is not one of"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": [bad_ref]}}]},
            "tools[0].function.parameters",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": contradictory},
                }
            },
            "cannot be satisfied",
        ),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}}, "x"),
        ({"tools": [{"type": "function", "function": {}}]}, "name"),
        ({"tools": [{"type": "retrieval"}]}, "function"),
        ({"response_format": {"type": "yaml"}}, "yaml"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "schema"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 5}}}},
            "grammar",
        ),
    ]
    for kw, words in cases:
        with pytest.raises(openai.BadRequestError, match=re.escape(words)):
            chat(client, ASK, **kw)


def test_langchain_bind_tools_round_trip(base: str) -> None:
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        return f"18 degrees and cloudy in {city}"

    llm = ChatOpenAI(base_url=f"{base}/v1", api_key="unused", model="local", temperature=0)
    asked = [HumanMessage("What's the weather in Paris right now?")]
    called = llm.bind_tools([get_weather]).invoke(asked)
    (call,) = called.tool_calls
    assert call["name"] == "get_weather" and call["args"] == {"city": "Paris"}
    result = ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])
    answer = llm.bind_tools([get_weather], tool_choice="none").invoke([*asked, called, result])
    assert "18" in answer.content and not answer.tool_calls


@pytest.mark.slow
def test_langchain_structured_output(base: str) -> None:
    from langchain_openai import ChatOpenAI

    class Person(BaseModel):
        name: str
        age: int

    llm = ChatOpenAI(base_url=f"{base}/v1", api_key="unused", model="local", temperature=0)
    for method in ("json_schema", "function_calling"):
        person = llm.with_structured_output(Person, method=method).invoke(
            "Bob is 31 years old. Give his name and age."
        )
        assert person == Person(name="Bob", age=31), method


@pytest.mark.slow
def test_litellm_tool_call(base: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network here
    import litellm

    reply = litellm.completion(
        model="openai/local",
        api_base=f"{base}/v1",
        api_key="unused",
        messages=ASK,
        tools=[WEATHER],
        tool_choice="required",
        temperature=0,
    )
    assert reply.choices[0].message.tool_calls[0].function.name == "get_weather"


@pytest.mark.slow
def test_a_stream_with_tools_but_no_call_is_plain_content(base: str) -> None:
    body = {
        "messages": [{"role": "user", "content": "Say hello in French, in two words."}],
        "tools": [WEATHER],
        "temperature": 0,
        "max_tokens": 12,
        "stream": True,
    }
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=60) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
    assert text and "tool_calls" not in json.dumps(events)
    assert events[-1]["choices"][0]["finish_reason"] in ("stop", "length")
