"""Tool calls: how a model is told about tools, how its calls are read back, and the grammar
that forces a call when the caller requires one.

One format per template family, chosen from the model's own chat template (as llama.cpp's
``common/chat.cpp`` does):

* ``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (Qwen2.5,
  Qwen3, Hermes, SmolLM3 templates; their templates render the tools themselves);
* ``llama3``: the whole answer is ``{"name": ..., "parameters": {...}}`` (Llama 3.1-3.3);
* ``generic``: a template that knows nothing of tools gets them described in a system
  message, with the hermes format to answer in (small models follow it readily).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from localspec.engine.grammar import schema_grammar
from localspec.engine.schema_checks import reference_problem, shape_problem
from localspec.errors import LocalspecError

Tool = dict[str, Any]
# OpenAI: a function without parameters takes none
NO_ARGUMENTS = {"type": "object", "properties": {}, "additionalProperties": False}
ANY_ARGUMENTS = {"type": "object"}


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it
    id: str

    def as_openai(self, index: int | None = None) -> dict[str, Any]:
        call: dict[str, Any] = {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        return call if index is None else {"index": index, **call}


def new_call(name: str, arguments: Any) -> ToolCall:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return ToolCall(name, text, f"call_{uuid.uuid4().hex[:24]}")


def function_of(tool: Tool) -> dict[str, Any]:
    return tool.get("function", tool) if isinstance(tool, dict) else {}


def check_tools(tools: Sequence[Tool]) -> None:
    """Each tool must be ``{"type": "function", "function": {"name": ..., ...}}``, its
    parameters a well-formed JSON schema (as the provider APIs check them). They are not
    compiled here: the model reads them as sent, and a schema the grammar converter cannot
    take (a lookahead in a ``pattern``, as zod writes an e-mail field) is one those APIs
    accept; only a required call is shaped by it (``arguments_schema``)."""
    for i, tool in enumerate(tools):
        function = function_of(tool)
        if tool.get("type", "function") != "function" or not isinstance(function, dict):
            raise LocalspecError(f"tools[{i}]: only tools of type 'function' are supported")
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise LocalspecError(f"tools[{i}].function.name: a function needs a name")
        parameters = function.get("parameters", {})
        if not isinstance(parameters, dict):
            raise LocalspecError(f"tools[{i}].function.parameters: must be a JSON schema object")
        if (problem := shape_problem(parameters) or reference_problem(parameters)) is not None:
            raise LocalspecError(f"tools[{i}].function.parameters: {problem}")


def arguments_schema(function: dict[str, Any]) -> dict[str, Any]:
    """What a required call's arguments are held to: the function's parameters, or any JSON
    object where the converter cannot compile them (the call's name is still held to the
    tools'): a client's tool is not refused for a schema its provider accepts."""
    parameters = function.get("parameters") or NO_ARGUMENTS
    try:
        schema_grammar(parameters)
    except LocalspecError:
        return ANY_ARGUMENTS
    return parameters


def call_schema(tools: Sequence[Tool], arguments_key: str = "arguments") -> dict[str, Any]:
    """The JSON schema of one call to any of ``tools``."""
    options = []
    for tool in tools:
        function = function_of(tool)
        options.append(
            {
                "type": "object",
                "properties": {
                    "name": {"const": function["name"]},
                    arguments_key: arguments_schema(function),
                },
                "required": ["name", arguments_key],
            }
        )
    return options[0] if len(options) == 1 else {"anyOf": options}


def _renamed_root(gbnf: str, name: str) -> str:
    """The converter's grammar with its ``root`` rule renamed, to embed it in another."""
    return re.sub(r"(?<![\w-])root(?![\w-])", name, gbnf)


def bare_call(text: str, names: Sequence[str], *argument_keys: str) -> ToolCall | None:
    """A whole answer that is one call's JSON (in a code fence or not) to a known tool:
    small models often answer so even when their template asks for tags."""
    body = FENCE.sub("", text.strip()).strip()
    if not body.startswith("{"):
        return None
    call = _call_from_json(body, *argument_keys)
    return call if call is not None and call.name in names else None


FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")


@dataclass(frozen=True)
class HermesFormat:
    names: tuple[str, ...] = ()  # the tools of the request: a bare JSON call must name one
    name = "hermes"
    opener = "<tool_call>"
    BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)

    def grammar(self, tools: Sequence[Tool], parallel: bool = False) -> str:
        """A ``<tool_call>`` block (several with ``parallel``) and nothing else."""
        call = _renamed_root(schema_grammar(call_schema(tools)), "call")
        more = ' ("\\n" block)*' if parallel else ""
        return f'root ::= block{more}\nblock ::= "<tool_call>\\n" call "\\n</tool_call>"\n' + call

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        calls = []
        for found in self.BLOCK.finditer(text):
            call = _call_from_json(found.group(1), "arguments")
            if call is None:  # not a call after all: the text stays content
                return text, []
            calls.append(call)
        if not calls:
            bare = bare_call(text, self.names, "arguments", "parameters")
            return (None, [bare]) if bare is not None else (text, [])
        content = self.BLOCK.sub("", text).strip()
        return content or None, calls

    def complete_blocks(self, text: str) -> int:
        """How many whole blocks ``text`` holds (a stream emits each as soon as it closes)."""
        return text.count("</tool_call>")


@dataclass(frozen=True)
class Llama3Format:
    names: tuple[str, ...] = ()
    name = "llama3"
    opener = "{"

    def grammar(self, tools: Sequence[Tool], parallel: bool = False) -> str:
        """One call: this format has no way to write several."""
        return schema_grammar(call_schema(tools, "parameters"))

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        body = text.strip().removeprefix("<|python_tag|>")
        call = bare_call(body, self.names, "parameters", "arguments")
        return (None, [call]) if call is not None else (text, [])

    def complete_blocks(self, text: str) -> int:
        return 0  # known only at the end


def _call_from_json(text: str, *argument_keys: str) -> ToolCall | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    for key in argument_keys:
        if key in value:
            return new_call(value["name"], value[key])
    return new_call(value["name"], {})


ToolFormat = HermesFormat | Llama3Format

GENERIC_INSTRUCTIONS = (
    "You can call functions to answer. The functions, as JSON signatures:\n{tools}\n\n"
    "To call one, answer with nothing but\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <arguments-json-object>}}\n</tool_call>\n'
    "(one block per call). Otherwise answer normally."
)


def for_tools(fmt: ToolFormat, tools: Sequence[Tool]) -> ToolFormat:
    """The format, knowing the request's tool names."""
    return replace(fmt, names=tuple(function_of(t)["name"] for t in tools))


def format_for(template: str | None) -> tuple[ToolFormat, bool]:
    """The tool-call format of a chat template, and whether the template renders the tools
    itself (if not, ``describe_tools`` adds them to the messages)."""
    text = template or ""
    renders_tools = "tools" in text
    if "<tool_call>" in text:
        return HermesFormat(), renders_tools
    if "<|python_tag|>" in text or ("ipython" in text and renders_tools):
        return Llama3Format(), renders_tools
    return HermesFormat(), False


def describe_tools(messages: list[dict[str, Any]], tools: Sequence[Tool]) -> list[dict[str, Any]]:
    """Messages for a template that does not render tools: the tools in the system message;
    earlier calls and results written as the format says."""
    listing = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    intro = GENERIC_INSTRUCTIONS.format(tools=listing)
    out = [dict(m) for m in messages]
    for m in out:
        if m.get("tool_calls"):
            blocks = [
                "<tool_call>\n"
                + json.dumps(
                    {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                )
                + "\n</tool_call>"
                for c in m.pop("tool_calls")
            ]
            m["content"] = "\n".join(filter(None, [m.get("content") or "", *blocks]))
        if m.get("role") == "tool":
            m["role"] = "user"
            m["content"] = f"<tool_response>\n{m.get('content', '')}\n</tool_response>"
    if out and out[0].get("role") == "system":
        out[0]["content"] = f"{out[0]['content']}\n\n{intro}"
    else:
        out.insert(0, {"role": "system", "content": intro})
    return out


def chosen_tools(tools: Sequence[Tool], choice: str | dict[str, Any] | None) -> list[Tool] | None:
    """The tools a call must be made to (``required``: any; a named function: that one),
    or None when the model may answer freely (``auto``)."""
    if choice in (None, "auto", "none"):
        return None
    if choice == "required":
        return list(tools)
    if isinstance(choice, dict):
        function = function_of(choice)
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise LocalspecError(
                "tool_choice.function must be an object with a string 'name'",
                'e.g. {"type": "function", "function": {"name": "get_weather"}}',
            )
        name = function["name"]
        named = [t for t in tools if function_of(t).get("name") == name]
        if not named:
            raise LocalspecError(f"tool_choice names {name!r}, which is not among the tools")
        return named
    raise LocalspecError(
        f"tool_choice {choice!r} is not one of 'none', 'auto', 'required' or a named function"
    )
