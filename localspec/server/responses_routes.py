"""OpenAI's Responses API, as Codex CLI and the ``openai`` SDK's ``client.responses`` call it:
``POST /v1/responses``, whole or streamed.

As on Anthropic's route, a request is translated into the chat request the other routes take
(same checks, queue, slots and speculation) and the answer written back in this API's
shapes: ``message`` and ``function_call`` output items, a ``status`` (``incomplete`` at the
token limit), and a stream of named events numbered by ``sequence_number``. The server keeps
no responses: a conversation is sent whole in ``input`` (as Codex does with ``store:
false``); ``previous_response_id`` and ``background`` are refused with a 400 that says so,
as are images, files and tools the server would have to run (web search, a shell...).
Fields that change nothing here (``store``, ``include``, ``reasoning``, ``metadata``,
``prompt_cache_key``, ``truncation``...) are accepted and ignored."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

from pydantic import Field, StrictBool, StrictInt, StrictStr
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from localspec.engine.loop import RoundEvent
from localspec.engine.settings import GenerationSettings
from localspec.engine.stats import Stats
from localspec.engine.toolcalls import ToolCall, ToolFormat, for_tools
from localspec.errors import LocalspecError
from localspec.server.answer_stream import streamed
from localspec.server.host import RouteHost
from localspec.server.reply import Reply, ReplyHost, gathered, unfinished
from localspec.server.schemas import PENALTY_FIELDS, ChatRequest, LenientBody, Number
from localspec.server.shapes import ApiError, in_terms_of

if TYPE_CHECKING:
    from localspec.server.runner import GenerationStream

log = logging.getLogger("localspec.server")
ENDPOINT = "/v1/responses"
ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
TEXT_PARTS = ("input_text", "output_text", "text")
MEDIA_PARTS = ("input_image", "input_file", "input_audio")
DROPPED_ITEMS = ("reasoning",)  # an earlier answer's reasoning: not shown to the model
# the chat request's fields, as this API names them (in errors)
NAMES = {"max_tokens": "max_output_tokens", "messages": "input", "response_format": "text.format"}
PHRASES = ((".function.", "."), ("max_tokens", "max_output_tokens"), ("the messages", "the input"))


def refused(where: str, message: str) -> ApiError:
    return ApiError(400, f"{where}: {message}", param=where)


# ----- requests -------------------------------------------------------------------------------


class ResponsesRequest(LenientBody):
    model: StrictStr | None = None  # informational only, as on the other routes
    input: StrictStr | list[dict[str, Any]]
    instructions: StrictStr | None = None
    max_output_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: Number | None = None
    top_p: Number | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: StrictStr | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool | None = None
    text: dict[str, Any] | None = None  # its ``format``: text, json_object or json_schema
    stream: StrictBool = False
    previous_response_id: StrictStr | None = None
    background: StrictBool = False
    speculative: dict[str, Any] | None = None  # localspec's per-request override
    # penalties, as the chat route takes them (this API has none of its own)
    frequency_penalty: Any = None
    presence_penalty: Any = None
    repeat_penalty: Any = None
    repeat_last_n: Any = None


def part_text(part: Any, where: str, said: bool = False) -> str:
    """A content part's text: images and files are refused (the model reads text only), or
    with ``said`` (a tool's output: refused, it would stay in the conversation and every
    later turn would be refused with it) said in a line in their place."""
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in TEXT_PARTS and isinstance(part.get("text"), str):
        return str(part["text"])
    if kind in MEDIA_PARTS and said:
        return f"[{kind} not shown: this model reads text only]"
    if kind in MEDIA_PARTS:
        raise refused(where, f"{kind!r} parts are not supported: this model reads text only")
    raise refused(where, "a content part must be an object with 'type' 'input_text' and 'text'")


def content_text(content: Any, where: str, said: bool = False) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise refused(where, "content must be a string or a list of parts")
    return "".join(part_text(part, f"{where}.{i}", said) for i, part in enumerate(content))


class Conversation:
    """The input items as chat messages: a ``function_call`` is an assistant's
    ``tool_calls`` entry (calls in a row, one message), a ``function_call_output`` a
    ``tool`` message of its own."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.names: dict[str, str] = {}  # a call's id -> its function, for its output

    def add(self, item: dict[str, Any], where: str) -> None:
        kind = item.get("type", "message")
        if kind == "message":
            self.message(item, where)
        elif kind == "function_call":
            self.call(item, where)
        elif kind == "function_call_output":
            self.output(item, where)
        elif kind not in DROPPED_ITEMS:
            raise refused(
                where,
                f"items of type {kind!r} are not supported (send 'message', 'function_call' "
                "and 'function_call_output' items: this server keeps no items to refer to "
                "and runs no tools)",
            )

    def message(self, item: dict[str, Any], where: str) -> None:
        given = item.get("role")
        role = ROLES.get(given) if isinstance(given, str) else None
        if role is None:
            raise refused(f"{where}.role", "must be 'user', 'assistant', 'system' or 'developer'")
        content = content_text(item.get("content"), f"{where}.content")
        self.messages.append({"role": role, "content": content})

    def call(self, item: dict[str, Any], where: str) -> None:
        call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
        if not all(isinstance(v, str) for v in (call_id, name, arguments)):
            raise refused(where, "a 'function_call' needs string 'call_id', 'name', 'arguments'")
        self.names[str(call_id)] = str(name)
        entry = {
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
        last = self.messages[-1] if self.messages else None
        if last is not None and last["role"] == "assistant":  # its text, or calls before
            last.setdefault("tool_calls", []).append(entry)
        else:
            self.messages.append({"role": "assistant", "content": None, "tool_calls": [entry]})

    def output(self, item: dict[str, Any], where: str) -> None:
        call_id = item.get("call_id")
        if not isinstance(call_id, str):
            raise refused(where, "a 'function_call_output' needs a string 'call_id'")
        message = {
            "role": "tool",
            "tool_call_id": call_id,
            "content": content_text(item.get("output", ""), f"{where}.output", said=True),
        }
        if call_id in self.names:
            message["name"] = self.names[call_id]
        self.messages.append(message)


def chat_tool(tool: dict[str, Any], where: str) -> dict[str, Any]:
    """A Responses function tool (flat: ``name``, ``parameters`` at the top) in chat's shape."""
    if tool.get("type") != "function":
        raise refused(
            f"{where}.type",
            f"tools of type {tool.get('type')!r} are not supported: this server runs no "
            "tools (send 'function' tools, which the client runs)",
        )
    function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
    return {"type": "function", "function": function}


def chat_tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, str):
        return choice  # auto, none, required: as in chat, checked there
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise refused("tool_choice", "must be 'auto', 'none', 'required' or a function by 'name'")


def chat_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """``text.format`` as chat's ``response_format``."""
    fmt = (text or {}).get("format")
    if fmt is None or fmt == {"type": "text"}:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("json_object", "json_schema"):
        raise refused("text.format", "must be of type 'text', 'json_object' or 'json_schema'")
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    if not isinstance(fmt.get("schema"), dict):
        raise refused("text.format.schema", "a JSON schema object is required")
    return {
        "type": "json_schema",
        "json_schema": {"name": fmt.get("name", "output"), "schema": fmt["schema"]},
    }


def chat_body(req: ResponsesRequest) -> dict[str, Any]:
    """The chat request of a Responses one (its fields checked on the way)."""
    if req.previous_response_id is not None:
        raise refused(
            "previous_response_id",
            "this server keeps no responses: send the whole conversation in 'input'",
        )
    if req.background:
        raise refused("background", "responses run while the request waits (send false)")
    conversation = Conversation()
    if req.instructions:
        conversation.messages.append({"role": "system", "content": req.instructions})
    items = [{"role": "user", "content": req.input}] if isinstance(req.input, str) else req.input
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise refused(f"input.{i}", "an input item must be an object")
        conversation.add(item, f"input.{i}")
    body: dict[str, Any] = {
        "messages": conversation.messages,
        "max_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "parallel_tool_calls": req.parallel_tool_calls,
        "response_format": chat_format(req.text),
        "speculative": req.speculative,
        **{name: getattr(req, name) for name in PENALTY_FIELDS},
    }
    if req.tools:
        body["tools"] = [chat_tool(t, f"tools.{i}") for i, t in enumerate(req.tools)]
    if req.tool_choice is not None:
        body["tool_choice"] = chat_tool_choice(req.tool_choice)
    return {key: value for key, value in body.items() if value is not None}


# ----- answers --------------------------------------------------------------------------------


def usage_of(stats: Stats) -> dict[str, Any]:
    return {
        "input_tokens": stats.n_prompt,
        "input_tokens_details": {"cached_tokens": stats.n_cached},
        "output_tokens": stats.n_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": stats.n_prompt + stats.n_tokens,
    }


def call_item(call: ToolCall, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{call.id.removeprefix('call_')}",
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
        "status": status,
    }


class ItemWriter:
    """A stream's events, numbered in order: the answer's text as one ``message`` item
    (opened on the first text, closed before a call or at the end), each call a whole
    ``function_call`` item of its own."""

    def __init__(self) -> None:
        self.sequence = 0
        self.items: list[dict[str, Any]] = []  # output items, done
        self.open: dict[str, Any] | None = None  # the message item being written
        self.text = ""

    def event(self, kind: str, **payload: Any) -> str:
        body = {"type": kind, "sequence_number": self.sequence, **payload}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(body)}\n\n"

    def delta(self, text: str) -> Iterator[str]:
        if not text:
            return
        at = len(self.items)
        if self.open is None:
            self.open = message_item("", "in_progress")
            self.open["content"] = []
            yield self.event("response.output_item.added", output_index=at, item=self.open)
            part = {"type": "output_text", "text": "", "annotations": []}
            yield self.event("response.content_part.added", **self._place(), part=part)
        self.text += text
        yield self.event("response.output_text.delta", **self._place(), delta=text, logprobs=[])

    def call(self, call: ToolCall) -> Iterator[str]:
        yield from self.close()
        at = len(self.items)
        item = call_item(call)
        yield self.event(
            "response.output_item.added",
            output_index=at,
            item={**item, "arguments": "", "status": "in_progress"},
        )
        place = {"item_id": item["id"], "output_index": at}
        yield self.event("response.function_call_arguments.delta", **place, delta=call.arguments)
        yield self.event("response.function_call_arguments.done", **place, arguments=call.arguments)
        yield self.event("response.output_item.done", output_index=at, item=item)
        self.items.append(item)

    def close(self, status: str = "completed") -> Iterator[str]:
        """The message item ended: ``completed``, or ``incomplete`` at the token limit."""
        if self.open is None:
            return
        item = message_item(self.text, status)
        item["id"] = self.open["id"]
        part = item["content"][0]
        yield self.event("response.output_text.done", **self._place(), text=self.text, logprobs=[])
        yield self.event("response.content_part.done", **self._place(), part=part)
        yield self.event("response.output_item.done", output_index=len(self.items), item=item)
        self.items.append(item)
        self.open, self.text = None, ""

    def _place(self) -> dict[str, Any]:
        assert self.open is not None
        return {"item_id": self.open["id"], "output_index": len(self.items), "content_index": 0}


def message_item(text: str, status: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": f"msg_{uuid.uuid4().hex}",
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


class ResponseReply:
    """One answer in the Responses API's shape: a whole response, or a stream of events. A
    client that goes away stops the generation within a round, as on the other routes."""

    def __init__(
        self,
        server: ReplyHost,
        req: ResponsesRequest,
        chat: ChatRequest,
        mode: str,
        tool_format: ToolFormat | None,
        model: str,
    ) -> None:
        self.server, self.req, self.mode, self.model = server, req, mode, model
        self.tool_format = tool_format
        # the chat reply's accounting of failures and of clients that left, shared
        self.accounting = Reply(server, chat, mode, ENDPOINT, tool_format)
        self.rid = f"resp_{uuid.uuid4().hex}"
        self.writer = ItemWriter()  # a stream's items and events
        self.created = int(time.time())

    def response(
        self, output: list[dict[str, Any]], last: RoundEvent | None, status: str
    ) -> dict[str, Any]:
        """The response object: ``status`` in_progress (a stream's start), completed, or
        incomplete (the token limit ended it)."""
        req = self.req
        body: dict[str, Any] = {
            "id": self.rid,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": None,
            "incomplete_details": (
                {"reason": "max_output_tokens"} if status == "incomplete" else None
            ),
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": bool(req.parallel_tool_calls),
            "temperature": req.temperature,
            "top_p": req.top_p,
            "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
            "tools": req.tools or [],
            "text": req.text or {"format": {"type": "text"}},
            "metadata": {},
            "usage": None,
        }
        if last is not None:
            extras = self.server.extras(last.stats, self.mode)
            extras.pop("usage")  # this API's usage has its own shape
            body.update(usage=usage_of(last.stats), **extras)
        return body

    @staticmethod
    def status_of(last: RoundEvent) -> str:
        return "incomplete" if last.finish_reason == "length" else "completed"

    def output(self, text: str, status: str) -> list[dict[str, Any]]:
        """The answer's items: its text (``incomplete`` where the token limit cut it), then
        the calls read from it."""
        calls: list[ToolCall] = []
        if self.tool_format is not None:
            rest, calls = self.tool_format.parse(text)
            text = (rest or "") if calls else text
        items = [message_item(text, status)] if text else []
        return items + [call_item(call) for call in calls]

    def _failed(self, exc: LocalspecError) -> Response:
        return self.accounting.failed(exc).response()

    async def whole(self, request: Request, events: GenerationStream) -> Response:
        try:
            text, last = await gathered(request, events)
        except LocalspecError as exc:
            return self._failed(exc)
        ended = unfinished(self.server, last, self._failed, self.accounting.gone)
        if ended is not None or last is None:
            return ended or Response(status_code=499)
        status = self.status_of(last)
        self.server.finished(ENDPOINT, self.mode, last.stats, status)
        return JSONResponse(self.response(self.output(text, status), last, status))

    def opening(self) -> Iterator[str]:
        started = self.response([], None, "in_progress")
        yield self.writer.event("response.created", response=started)
        yield self.writer.event("response.in_progress", response=started)

    def text(self, text: str) -> Iterator[str]:
        return self.writer.delta(text)

    def call(self, call: ToolCall) -> Iterator[str]:
        return self.writer.call(call)

    def closing(self, last: RoundEvent, called: bool) -> tuple[str, Iterator[str]]:
        status = self.status_of(last)
        return status, self._closing(last, status)

    def _closing(self, last: RoundEvent, status: str) -> Iterator[str]:
        yield from self.writer.close(status)
        done = self.response(self.writer.items, last, status)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        yield self.writer.event(kind, response=done)

    def error(self, error: ApiError) -> str:
        code = error.code or error.kind
        return self.writer.event("error", code=code, message=error.message, param=error.param)

    def sse(self, events: GenerationStream) -> AsyncIterator[str]:
        return streamed(self, events, self.tool_format, self.accounting)


# ----- the route ------------------------------------------------------------------------------


class ResponsesRoutes:
    def __init__(self, server: RouteHost) -> None:
        self.server = server

    async def create(self, request: Request) -> Response:
        try:
            partition = self.server.check_caller(request)
            body = self.server.parse_body(ResponsesRequest, await self.server.read_json(request))
            try:
                chat = self.server.parse(ChatRequest, chat_body(body))
                args = self.server.generation_args(chat, partition)
            except ApiError as exc:
                raise in_terms_of(exc, NAMES, PHRASES) from None
            args.pop("n_prompt")
            events = await self.server.start(request, args)
        except ApiError as exc:
            self.server.ended(ENDPOINT, exc.status)
            return exc.response()
        settings: GenerationSettings = args["settings"]
        tools = settings.tools
        tool_format = for_tools(self.server.tool_format, tools) if tools else None
        mode = str(settings.mode)
        reply = ResponseReply(self.server, body, chat, mode, tool_format, self.server.model_id)
        if body.stream:
            return StreamingResponse(reply.sse(events), media_type="text/event-stream")
        return await reply.whole(request, events)
