"""Reading tool calls back from model text, whole and streamed piece by piece (no model)."""

from __future__ import annotations

import json

import pytest

from localspec.engine.toolcalls import (
    HermesFormat,
    Llama3Format,
    chosen_tools,
    describe_tools,
    format_for,
)
from localspec.errors import LocalspecError
from localspec.server.tool_stream import ToolCallStream, call_deltas

HERMES = HermesFormat(names=("get_weather",))
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}


def test_hermes_blocks_and_the_text_around_them() -> None:
    content, calls = HERMES.parse(f"Let me check.\n{CALL}\n{CALL}")
    assert content == "Let me check." and [c.name for c in calls] == ["get_weather"] * 2
    assert json.loads(calls[0].arguments) == {"city": "Paris"}
    assert calls[0].id != calls[1].id


def test_a_bare_call_counts_only_for_a_known_tool() -> None:
    bare = '```json\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n```'
    assert HERMES.parse(bare)[1][0].name == "get_weather"
    other = '{"name": "Bob", "arguments": {}}'  # JSON the user asked for, not a call
    assert HERMES.parse(other) == (other, [])
    assert HERMES.parse("<tool_call>not json</tool_call>")[1] == []


def test_llama3_format() -> None:
    fmt = Llama3Format(names=("get_weather",))
    text = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Rome"}}'
    assert json.loads(fmt.parse(text)[1][0].arguments) == {"city": "Rome"}
    assert fmt.parse("It is sunny.") == ("It is sunny.", [])


def test_formats_are_chosen_from_the_template() -> None:
    assert format_for("{% if tools %}<tool_call>{% endif %}") == (HermesFormat(), True)
    assert isinstance(format_for("{{ tools }} <|python_tag|>")[0], Llama3Format)
    assert format_for("{{ messages }}") == (HermesFormat(), False)  # described by us
    messages = describe_tools(
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "", "tool_calls": [json.loads(_openai_call())]},
            {"role": "tool", "content": "18C"},
        ],
        [TOOL],
    )
    assert messages[0]["role"] == "system" and "get_weather" in messages[0]["content"]
    assert "<tool_call>" in messages[2]["content"]
    assert messages[3] == {"role": "user", "content": "<tool_response>\n18C\n</tool_response>"}


def _openai_call() -> str:
    function = {"name": "get_weather", "arguments": {"city": "Paris"}}
    return json.dumps({"id": "c1", "type": "function", "function": function})


def test_tool_choice() -> None:
    other = {"type": "function", "function": {"name": "other"}}
    assert chosen_tools([TOOL, other], "auto") is None
    assert chosen_tools([TOOL, other], "required") == [TOOL, other]
    assert chosen_tools([TOOL, other], {"type": "function", "function": {"name": "other"}}) == [
        other
    ]
    with pytest.raises(LocalspecError, match="not among"):
        chosen_tools([TOOL], {"type": "function", "function": {"name": "nope"}})
    with pytest.raises(LocalspecError, match="tool_choice"):
        chosen_tools([TOOL], "sometimes")


def _stream(pieces: list[str]) -> tuple[str, list[str]]:
    stream = ToolCallStream(HERMES)
    text, names = [], []
    for piece in pieces:
        content, calls = stream.feed(piece)
        text.append(content)
        names += [c.name for c in calls]
    content, calls = stream.finish()
    return "".join([*text, content]), names + [c.name for c in calls]


def test_a_streamed_call_never_leaks_as_content() -> None:
    pieces = ["Sure", ". <tool", "_call>\n", CALL[12:40], CALL[40:], "\n"]
    assert _stream(pieces) == ("Sure. ", ["get_weather"])


def test_a_call_goes_out_as_soon_as_its_block_closes() -> None:
    stream = ToolCallStream(HERMES)
    content, calls = stream.feed("Checking. " + CALL)
    assert content == "Checking. " and [c.name for c in calls] == ["get_weather"]
    assert stream.feed("\n") == ("", []) and stream.finish() == ("", [])
    assert stream.called


def test_text_that_only_looks_like_an_opener_is_content() -> None:
    assert _stream(["a <", "b> and <tool", "s>"]) == ("a <b> and <tools>", [])
    bare = ['{"name": "get_weather", ', '"arguments": {"city": "Paris"}}']
    assert _stream(bare) == ("", ["get_weather"])
    assert _stream(['{"a": 1}']) == ('{"a": 1}', [])  # held, then given back as content


def test_call_deltas_shape() -> None:
    _, calls = HERMES.parse(CALL)
    head, arguments = call_deltas(calls, 0)
    assert head["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": ""}
    assert head["tool_calls"][0]["index"] == 0 and head["tool_calls"][0]["type"] == "function"
    assert arguments == {
        "tool_calls": [{"index": 0, "function": {"arguments": calls[0].arguments}}]
    }
