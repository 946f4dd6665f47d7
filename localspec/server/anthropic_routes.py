"""Anthropic's Messages API, as Claude Code and the clients of Anthropic's SDKs call it:
``POST /v1/messages`` (whole or streamed) and ``POST /v1/messages/count_tokens``.

A request is translated into the OpenAI chat request the other routes take, so that it goes
through the same checks, the same queue and the same generation; the answer is written back
in Anthropic's shapes: ``text`` and ``tool_use`` content blocks, a ``stop_reason``, and a
stream of named server-sent events. Errors come in Anthropic's shape too, with the statuses
the OpenAI routes use. What cannot be honoured (images, documents, server-side tools, a
prefilled assistant turn) is refused with a 400 that says so; fields that change nothing
here (``metadata``, ``thinking``, ``service_tier``, ``cache_control``...) are ignored."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from localspec.engine.loop import RoundEvent
from localspec.engine.stats import Stats
from localspec.engine.toolcalls import ToolCall, ToolFormat, check_tools, for_tools
from localspec.errors import LocalspecError
from localspec.server.answer_stream import streamed
from localspec.server.host import RouteHost
from localspec.server.reply import Reply, ReplyHost, gathered, unfinished
from localspec.server.runner import GenerationStream
from localspec.server.schemas import PENALTY_FIELDS, ChatRequest, LenientBody, Number
from localspec.server.shapes import ApiError

if TYPE_CHECKING:
    from localspec.engine.settings import GenerationSettings

log = logging.getLogger("localspec.server")
ENDPOINT = "/v1/messages"
# Anthropic's error types by status; what is not listed is the request's fault (400s) or
# the server's (5xx)
ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
}
# the names of the OpenAI request's fields in the messages of its checks, and Anthropic's
RENAMED = ((".function.parameters", ".input_schema"), ("response_format", "output_config.format"))
TEXT_ONLY = ("image", "document", "search_result")
# the reasoning of an earlier answer, which agents send back: left out of the prompt, as
# Claude's earlier turns' thinking is
DROPPED_BLOCKS = ("thinking", "redacted_thinking")


# ----- errors ---------------------------------------------------------------------------------


def error_body(error: ApiError) -> dict[str, Any]:
    """Anthropic's error object: the same in a JSON response and in a stream's error event.
    The field names of a message that the OpenAI checks wrote are put in Anthropic's words."""
    if error.status >= 500:
        kind = "api_error"
    else:
        kind = ERROR_TYPES.get(error.status, "invalid_request_error")
    message = error.message
    for openai_name, name in RENAMED:
        message = message.replace(openai_name, name)
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error_body(error), status_code=error.status, headers=error.headers)


def refused(where: str, message: str) -> ApiError:
    return ApiError(400, f"{where}: {message}", param=where)


# ----- requests -------------------------------------------------------------------------------


class AnthropicMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["user", "assistant"]
    content: StrictStr | list[dict[str, Any]]


class CountTokensRequest(LenientBody):
    """What ``count_tokens`` takes: the prompt's part of a Messages request."""

    model: StrictStr | None = None  # informational only, as on the OpenAI routes
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: StrictStr | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    speculative: Any = None  # localspec's own override, checked as on the OpenAI routes


class MessagesRequest(CountTokensRequest):
    max_tokens: StrictInt = Field(ge=1)  # required by Anthropic's API: no default length
    stop_sequences: list[StrictStr] | None = None
    temperature: Number | None = Field(default=None, ge=0.0, le=1.0)
    top_p: Number | None = None
    top_k: StrictInt | None = None
    stream: StrictBool = False
    output_config: dict[str, Any] | None = None  # its ``format``; ``effort`` changes nothing
    output_format: dict[str, Any] | None = None  # the structured-outputs beta's name for it
    # penalties, as the OpenAI routes take them (Anthropic's API has none)
    frequency_penalty: Any = None
    presence_penalty: Any = None
    repeat_penalty: Any = None
    repeat_last_n: Any = None


def block_type(block: dict[str, Any], where: str) -> str:
    kind = block.get("type")
    if not isinstance(kind, str):
        raise refused(where, "a content block must be an object with a string 'type'")
    if kind in TEXT_ONLY:
        raise refused(
            where,
            f"content blocks of type {kind!r} are not supported: this server's model reads "
            "text only (send 'text' blocks)",
        )
    return kind


def block_text(block: dict[str, Any], where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise refused(where, "a 'text' block needs a string field 'text'")
    return text


def joined_text(blocks: list[Any], where: str, first: int = 0) -> str:
    """The text of a list of text blocks (a system prompt, a tool's result), the first at
    index ``first`` of ``where``."""
    texts = []
    for i, block in enumerate(blocks, start=first):
        here = f"{where}.{i}"
        if not isinstance(block, dict) or block_type(block, here) != "text":
            raise refused(here, "only 'text' blocks are accepted here")
        texts.append(block_text(block, here))
    return "\n".join(texts)


def result_text(blocks: list[Any], where: str) -> str:
    """A tool result's text. What the model cannot read (a screenshot or a PDF that Claude
    Code's Read tool returns) is said in a line in its place rather than refused: a refused
    result stays in the conversation, and every later turn would be refused with it. A
    document given as plain text is read."""
    texts = []
    for i, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind in TEXT_ONLY:
            texts.append(plain_document(block) or f"[{kind} not shown: this model reads text only]")
        else:
            texts.append(joined_text([block], where, first=i))
    return "\n".join(texts)


def plain_document(block: dict[str, Any]) -> str | None:
    """A ``document`` block's text where its source is plain text, else None."""
    source = block.get("source")
    if isinstance(source, dict) and source.get("type") == "text":
        data = source.get("data")
        return data if isinstance(data, str) else None
    return None


def system_messages(system: str | list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    if system is None:
        return []
    text = system if isinstance(system, str) else joined_text(system, "system")
    return [{"role": "system", "content": text}] if text else []


class Conversation:
    """Anthropic's messages as OpenAI's: a ``tool_use`` block is an assistant's
    ``tool_calls`` entry, a ``tool_result`` block a ``tool`` message of its own."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.tool_names: dict[str, str] = {}  # a call's id -> its tool, for its result

    def add(self, message: AnthropicMessage, where: str) -> None:
        if isinstance(message.content, str):
            self.messages.append({"role": message.role, "content": message.content})
        elif message.role == "assistant":
            self.add_answer(message.content, f"{where}.content")
        else:
            self.add_turn(message.content, f"{where}.content")

    def add_answer(self, blocks: list[dict[str, Any]], where: str) -> None:
        texts, calls = [], []
        for i, block in enumerate(blocks):
            here = f"{where}.{i}"
            kind = block_type(block, here)
            if kind == "text":
                texts.append(block_text(block, here))
            elif kind == "tool_use":
                calls.append(self.call(block, here))
            elif kind not in DROPPED_BLOCKS:
                raise refused(
                    here, unsupported(kind, "an assistant message", "'text' and 'tool_use'")
                )
        message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
        if calls:
            message["tool_calls"] = calls
            message["content"] = message["content"] or None
        self.messages.append(message)

    def call(self, block: dict[str, Any], where: str) -> dict[str, Any]:
        call_id, name, arguments = block.get("id"), block.get("name"), block.get("input", {})
        if not isinstance(call_id, str) or not isinstance(name, str):
            raise refused(where, "a 'tool_use' block needs a string 'id' and 'name'")
        if not isinstance(arguments, dict):
            raise refused(where, "a 'tool_use' block's 'input' must be an object")
        self.tool_names[call_id] = name
        function = {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}
        return {"id": call_id, "type": "function", "function": function}

    def add_turn(self, blocks: list[dict[str, Any]], where: str) -> None:
        """A user's turn: tool results (each a message of its own) and text, in order."""
        texts: list[str] = []
        for i, block in enumerate(blocks):
            here = f"{where}.{i}"
            kind = block_type(block, here)
            if kind == "text":
                texts.append(block_text(block, here))
            elif kind == "tool_result":
                if texts:  # text before a result: its own user message, to keep the order
                    self.messages.append({"role": "user", "content": "\n".join(texts)})
                    texts = []
                self.messages.append(self.result(block, here))
            else:
                raise refused(here, unsupported(kind, "a user message", "'text' and 'tool_result'"))
        if texts or not blocks:
            self.messages.append({"role": "user", "content": "\n".join(texts)})

    def result(self, block: dict[str, Any], where: str) -> dict[str, Any]:
        call_id, content = block.get("tool_use_id"), block.get("content", "")
        if not isinstance(call_id, str):
            raise refused(where, "a 'tool_result' block needs a string 'tool_use_id'")
        if isinstance(content, list):
            content = result_text(content, f"{where}.content")
        elif not isinstance(content, str):
            raise refused(where, "a 'tool_result' block's content must be text or text blocks")
        if block.get("is_error") is True:  # the template has no such flag: the text says it
            content = f"Error: {content}"
        message = {"role": "tool", "tool_call_id": call_id, "content": content}
        if call_id in self.tool_names:
            message["name"] = self.tool_names[call_id]
        return message


def unsupported(kind: str, where: str, allowed: str) -> str:
    return f"content blocks of type {kind!r} are not supported in {where} (send {allowed} blocks)"


def function_tool(tool: dict[str, Any], where: str) -> dict[str, Any]:
    """An Anthropic tool as an OpenAI function tool (its ``input_schema`` the parameters)."""
    kind = tool.get("type", "custom")
    if kind != "custom":
        raise refused(
            where,
            f"tools of type {kind!r} are not supported: this server runs no tools of its own "
            "(send your tools with 'name', 'description' and 'input_schema')",
        )
    name, description = tool.get("name"), tool.get("description")
    if not isinstance(name, str) or not name:
        raise refused(where, "a tool needs a string 'name'")
    function: dict[str, Any] = {"name": name}
    if isinstance(description, str):
        function["description"] = description
    schema = tool.get("input_schema")
    if schema is not None and not isinstance(schema, dict):
        raise refused(f"{where}.input_schema", "must be a JSON schema object")
    if schema is not None:
        function["parameters"] = schema
    return {"type": "function", "function": function}


def openai_tool_choice(choice: dict[str, Any]) -> str | dict[str, Any]:
    """``auto``, ``any`` (a call to some tool), ``tool`` (to that one) and ``none``."""
    kind = choice.get("type")
    simple = {"auto": "auto", "any": "required", "none": "none"}
    if kind in simple:
        return simple[kind]
    if kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str):
            raise refused("tool_choice", "a choice of type 'tool' needs the tool's 'name'")
        return {"type": "function", "function": {"name": name}}
    raise refused("tool_choice", f"type {kind!r} is not one of 'auto', 'any', 'tool', 'none'")


def chat_body(req: CountTokensRequest) -> dict[str, Any]:
    """The OpenAI chat request of an Anthropic one (its fields checked on the way)."""
    conversation = Conversation()
    for i, message in enumerate(req.messages):
        conversation.add(message, f"messages.{i}")
    if req.messages[-1].role != "user":
        raise refused(
            "messages",
            "the last message must be the user's: continuing a prefilled assistant answer "
            "is not supported",
        )
    body: dict[str, Any] = {
        "messages": system_messages(req.system) + conversation.messages,
        "speculative": req.speculative,
    }
    if req.tools is not None:
        body["tools"] = [function_tool(t, f"tools.{i}") for i, t in enumerate(req.tools)]
    if req.tool_choice is not None:
        body["tool_choice"] = openai_tool_choice(req.tool_choice)
    if isinstance(req, MessagesRequest):
        body.update(
            max_tokens=req.max_tokens,
            stop=req.stop_sequences,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            stream=req.stream,
            response_format=response_format(req),
            **{name: getattr(req, name) for name in PENALTY_FIELDS},
        )
    return {key: value for key, value in body.items() if value is not None}


def response_format(req: MessagesRequest) -> dict[str, Any] | None:
    """Structured output (``output_config.format``) as OpenAI's ``json_schema`` format."""
    where, fmt = "output_config.format", (req.output_config or {}).get("format")
    if fmt is None:
        where, fmt = "output_format", req.output_format
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        raise refused(where, "the only format is {'type': 'json_schema', 'schema': {...}}")
    if not isinstance(fmt.get("schema"), dict):
        raise refused(where, "a JSON schema object 'schema' is required")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}


# ----- answers --------------------------------------------------------------------------------


def tool_use_block(call: ToolCall) -> dict[str, Any]:
    """A call as a ``tool_use`` block: Anthropic's ids start ``toolu_``, its input is an
    object (what the model wrote as arguments, when that was one)."""
    try:
        arguments = json.loads(call.arguments)
        if isinstance(arguments, str):  # arguments written as JSON text inside the JSON
            arguments = json.loads(arguments)
    except ValueError:
        arguments = None
    return {
        "type": "tool_use",
        "id": f"toolu_{call.id.removeprefix('call_')}",
        "name": call.name,
        "input": arguments if isinstance(arguments, dict) else {},
    }


def usage_of(stats: Stats) -> dict[str, int]:
    return {
        "input_tokens": stats.n_prompt,
        "output_tokens": stats.n_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def sse_event(name: str, payload: dict[str, Any]) -> str:
    return f"event: {name}\ndata: {json.dumps(payload)}\n\n"


class BlockWriter:
    """A stream's content blocks, numbered as they open: text goes into an open text block
    (opened on the first text), a tool call closes it and is a whole block of its own."""

    def __init__(self) -> None:
        self.count = 0
        self.text_open = False

    def text(self, text: str) -> Iterator[str]:
        if not text:
            return
        if not self.text_open:
            start = {"type": "text", "text": ""}
            yield sse_event("content_block_start", self._start(start))
            self.text_open = True
        delta = {"type": "text_delta", "text": text}
        yield sse_event("content_block_delta", self._delta(delta))

    def tool_use(self, call: ToolCall) -> Iterator[str]:
        yield from self.close()
        block = tool_use_block(call)
        yield sse_event("content_block_start", self._start({**block, "input": {}}))
        partial = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        yield sse_event("content_block_delta", self._delta(partial))
        yield sse_event("content_block_stop", self._stop())

    def close(self) -> Iterator[str]:
        if self.text_open:
            self.text_open = False
            yield sse_event("content_block_stop", self._stop())

    def _start(self, block: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_start", "index": self.count, "content_block": block}

    def _delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": self.count, "delta": delta}

    def _stop(self) -> dict[str, Any]:
        self.count += 1  # the next block opens at the next index
        return {"type": "content_block_stop", "index": self.count - 1}


class MessageReply:
    """One answer in Anthropic's shape: a whole message, or a stream of events. A client
    that goes away stops the generation within a round, as on the OpenAI routes."""

    def __init__(
        self,
        server: ReplyHost,
        req: ChatRequest,
        mode: str,
        n_prompt: int,
        tool_format: ToolFormat | None,
        model: str,
    ) -> None:
        self.server, self.mode, self.n_prompt, self.model = server, mode, n_prompt, model
        self.tool_format = tool_format
        # the OpenAI reply's accounting of failures and of clients that left, shared
        self.accounting = Reply(server, req, mode, ENDPOINT, tool_format)
        self.mid = f"msg_{uuid.uuid4().hex}"
        self.blocks = BlockWriter()  # a stream's content blocks

    @staticmethod
    def stop_of(last: RoundEvent, called: bool) -> tuple[str, str | None]:
        """Anthropic's ``stop_reason`` and ``stop_sequence``."""
        if last.finish_reason == "length":
            return "max_tokens", None
        if called:
            return "tool_use", None
        if last.stop_word is not None:
            return "stop_sequence", last.stop_word
        return "end_turn", None

    def message(
        self, content: list[dict[str, Any]], stop: tuple[str | None, str | None]
    ) -> dict[str, Any]:
        return {
            "id": self.mid,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": stop[0],
            "stop_sequence": stop[1],
        }

    def localspec_extras(self, stats: Stats) -> dict[str, Any]:
        """localspec's ``speculative`` and llama-server's ``timings`` objects."""
        extras = self.server.extras(stats, self.mode)
        extras.pop("usage")  # Anthropic's usage has its own shape
        return extras

    # ----- a whole message ----------------------------------------------------------------

    def _failed(self, exc: LocalspecError) -> Response:
        return error_response(self.accounting.failed(exc))

    async def whole(self, request: Request, events: GenerationStream) -> Response:
        try:
            text, last = await gathered(request, events)
        except LocalspecError as exc:
            return self._failed(exc)
        ended = unfinished(self.server, last, self._failed, self.accounting.gone)
        if ended is not None or last is None:
            return ended or Response(status_code=499)
        content, calls = self.content(text)
        stop = self.stop_of(last, bool(calls))
        self.server.finished(ENDPOINT, self.mode, last.stats, stop[0])
        body = {
            **self.message(content, stop),
            "usage": usage_of(last.stats),
            **self.localspec_extras(last.stats),
        }
        return JSONResponse(body)

    def content(self, text: str) -> tuple[list[dict[str, Any]], list[ToolCall]]:
        """The answer's blocks: its text, then the tool calls read from it."""
        calls: list[ToolCall] = []
        if self.tool_format is not None:
            rest, calls = self.tool_format.parse(text)
            text = (rest or "") if calls else text
        blocks = [{"type": "text", "text": text}] if text else []
        return blocks + [tool_use_block(call) for call in calls], calls

    # ----- a stream -----------------------------------------------------------------------

    def opening(self) -> Iterator[str]:
        message = self.message([], (None, None))
        usage = {**usage_of(Stats(n_prompt=self.n_prompt)), "output_tokens": 0}
        payload = {"type": "message_start", "message": {**message, "usage": usage}}
        yield sse_event("message_start", payload)
        yield sse_event("ping", {"type": "ping"})

    def text(self, text: str) -> Iterator[str]:
        return self.blocks.text(text)

    def call(self, call: ToolCall) -> Iterator[str]:
        return self.blocks.tool_use(call)

    def closing(self, last: RoundEvent, called: bool) -> tuple[str, Iterator[str]]:
        stop = self.stop_of(last, called)
        return stop[0], self._closing(last.stats, stop)

    def _closing(self, stats: Stats, stop: tuple[str, str | None]) -> Iterator[str]:
        yield from self.blocks.close()
        delta = {"stop_reason": stop[0], "stop_sequence": stop[1]}
        usage = {"output_tokens": stats.n_tokens, "input_tokens": stats.n_prompt}
        extras = self.localspec_extras(stats)
        payload = {"type": "message_delta", "delta": delta, "usage": usage, **extras}
        yield sse_event("message_delta", payload)
        yield sse_event("message_stop", {"type": "message_stop"})

    @staticmethod
    def error(error: ApiError) -> str:
        return sse_event("error", error_body(error))

    def sse(self, events: GenerationStream) -> AsyncIterator[str]:
        return streamed(self, events, self.tool_format, self.accounting)


# ----- the routes -----------------------------------------------------------------------------


class AnthropicRoutes:
    def __init__(self, server: RouteHost) -> None:
        self.server = server

    async def _request(self, request: Request, model: type[CountTokensRequest]) -> tuple[str, Any]:
        """The caller's memory partition and the request as an OpenAI chat request."""
        partition = self.server.check_caller(request)
        body = self.server.parse_body(model, await self.server.read_json(request))
        return partition, self.server.parse(ChatRequest, chat_body(body))

    async def messages(self, request: Request) -> Response:
        try:
            partition, req = await self._request(request, MessagesRequest)
            args = self.server.generation_args(req, partition)
            n_prompt = args.pop("n_prompt")
            events = await self.server.start(request, args)
        except ApiError as exc:
            self.server.ended(ENDPOINT, exc.status)
            return error_response(exc)
        settings: GenerationSettings = args["settings"]
        tools = settings.tools
        tool_format = for_tools(self.server.tool_format, tools) if tools else None
        mode = str(settings.mode)
        reply = MessageReply(self.server, req, mode, n_prompt, tool_format, self.server.model_id)
        if req.stream:
            return StreamingResponse(reply.sse(events), media_type="text/event-stream")
        return await reply.whole(request, events)

    async def count_tokens(self, request: Request) -> Response:
        """The tokens of the prompt the request would have the model read (read-only: no
        turn in the queue)."""
        try:
            _, req = await self._request(request, CountTokensRequest)
            messages = [m.for_template() for m in req.messages]
            try:
                if req.active_tools:
                    check_tools(req.active_tools)
                tokens = self.server.engine.tokenize_prompt(messages, tools=req.active_tools)
            except LocalspecError as exc:
                raise ApiError(400, exc.message) from None
        except ApiError as exc:
            return error_response(exc)
        return JSONResponse({"input_tokens": len(tokens)})
