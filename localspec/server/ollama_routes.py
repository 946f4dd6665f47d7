"""Ollama's API, for the tools that speak it (Open WebUI, desktop chat apps, the ``ollama``
Python client, ``langchain-ollama``): ``/api/chat``, ``/api/generate``, ``/api/tags``,
``/api/show``, ``/api/ps``, ``/api/version``, and ``GET /`` ("Ollama is running").

A generation request is translated into the OpenAI request it means (``ChatRequest`` or
``CompletionRequest``) and runs through the same checks, queue, slots and speculation as the
OpenAI routes; its events are written back in Ollama's shapes: newline-delimited JSON
objects when streamed (Ollama streams unless told ``"stream": false``), durations in
nanoseconds, errors as ``{"error": "..."}`` with the status the OpenAI routes would send.

Sampling options are applied as on the OpenAI routes (penalties included); those this
server does not apply (mirostat, ``tfs_z``, ``typical_p``) are refused rather than ignored
where they would change the answer; options about loading
(``num_ctx``, ``num_gpu``...) and ``keep_alive`` are ignored: the model is loaded once, by
``localspec serve``. The version reported is the Ollama API version these routes follow,
for clients that check it: the server is localspec, not Ollama."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import StrictBool, StrictInt, StrictStr
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from localspec.derivation.gguf_info import gguf_info, read_header
from localspec.engine.fim import missing_fim_tokens
from localspec.engine.model_context import runs_on_cpu
from localspec.engine.schema_checks import VALUE_KEYWORDS
from localspec.engine.stats import Stats
from localspec.engine.toolcalls import ToolCall, ToolFormat, for_tools, format_for
from localspec.errors import LocalspecError
from localspec.server.fim_stream import ended_at_suffix
from localspec.server.host import RouteHost, counted_route
from localspec.server.reply import (
    ShuttingDown,
    client_gone,
    gathered,
    generation_failed,
    unfinished,
)
from localspec.server.runner import GenerationStream
from localspec.server.schemas import ChatRequest, CompletionRequest, LenientBody, Number
from localspec.server.shapes import ApiError, in_terms_of, speculative_block
from localspec.server.tool_stream import ToolCallStream, text_and_calls

if TYPE_CHECKING:
    pass

log = logging.getLogger("localspec.server")

# The Ollama API version these routes follow (chat with tools, JSON-schema formats): what
# clients that check /api/version are told. It is compatibility, not an Ollama server.
OLLAMA_API_VERSION = "0.6.0"
CHAT, GENERATE = "/api/chat", "/api/generate"
# Ollama's sampling defaults, for requests that leave them out: its clients expect them
# (no repeat penalty: Ollama stopped applying its old default of 1.1 to models whose
# parameters set none in 2026, as llama.cpp did before it)
OLLAMA_SAMPLING = {"temperature": 0.8, "top_k": 40, "top_p": 0.9}
# Ollama options whose neutral value changes nothing, and which are refused otherwise: this
# server does not apply them, and a sampler setting silently ignored changes the answer
NEUTRAL_OPTIONS: dict[str, float] = {
    "mirostat": 0,
    "tfs_z": 1.0,
    "typical_p": 1.0,
}
# options that are the OpenAI request's own fields, under the same names
SAMPLING_OPTIONS = (
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "seed",
    "stop",
    "frequency_penalty",
    "presence_penalty",
    "repeat_penalty",
    "repeat_last_n",
)
NO_LIMIT = (-1, -2)  # num_predict: -1 no limit, -2 until the context is full (the same here)
# an error about an OpenAI field, named as the Ollama request names it
OLLAMA_NAMES = {
    **{name: f"options.{name}" for name in SAMPLING_OPTIONS},
    "max_tokens": "options.num_predict",
    "response_format": "format",
}


# ----- request bodies -------------------------------------------------------------------------


class Options(LenientBody):
    """Ollama's ``options``: those not declared here (``num_ctx``, ``num_gpu``, ``num_thread``,
    ``penalize_newline``...) are about loading or change nothing here, and are ignored."""

    num_predict: StrictInt | None = None
    temperature: Number | None = None
    top_k: StrictInt | None = None
    top_p: Number | None = None
    min_p: Number | None = None
    seed: StrictInt | None = None
    stop: StrictStr | list[StrictStr] | None = None
    frequency_penalty: Number | None = None
    presence_penalty: Number | None = None
    repeat_penalty: Number | None = None
    repeat_last_n: StrictInt | None = None
    mirostat: StrictInt | None = None
    tfs_z: Number | None = None
    typical_p: Number | None = None


class _GenerationBody(LenientBody):
    model: StrictStr = ""
    stream: StrictBool = True  # Ollama's default
    format: StrictStr | dict[str, Any] | None = None
    options: Options | None = None
    keep_alive: Any = None  # ignored: the model stays loaded while the server runs
    think: Any = None  # ignored: the answer comes as the model writes it
    logprobs: StrictBool = False
    images: list[Any] | None = None
    speculative: dict[str, Any] | None = None  # localspec's per-request override


class OllamaMessage(LenientBody):
    role: StrictStr
    content: StrictStr = ""
    images: list[Any] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_name: StrictStr | None = None
    thinking: StrictStr | None = None  # an earlier answer's reasoning: not shown to the model


class ChatBody(_GenerationBody):
    messages: list[OllamaMessage] = []
    tools: list[dict[str, Any]] | None = None


class GenerateBody(_GenerationBody):
    prompt: StrictStr = ""
    suffix: StrictStr = ""
    system: StrictStr | None = None
    template: StrictStr = ""
    context: list[StrictInt] | None = None
    raw: StrictBool = False


class ShowBody(LenientBody):
    model: StrictStr = ""
    name: StrictStr = ""  # what older clients send
    verbose: Any = None


@dataclass(frozen=True)
class Translation:
    """The OpenAI request an Ollama one means: its kind and its body."""

    kind: type[ChatRequest] | type[CompletionRequest]
    body: dict[str, Any]


# ----- the routes -----------------------------------------------------------------------------


class OllamaRoutes:
    def __init__(self, server: RouteHost) -> None:
        self.server = server
        self.engine = server.engine

    # ----- generation ---------------------------------------------------------------------

    async def chat(self, request: Request) -> Response:
        return await self._serve(request, CHAT, ChatBody)

    async def generate(self, request: Request) -> Response:
        return await self._serve(request, GENERATE, GenerateBody)

    async def _serve(
        self, request: Request, endpoint: str, body: type[ChatBody] | type[GenerateBody]
    ) -> Response:
        arrived = time.perf_counter_ns()
        try:
            partition = self.server.check_caller(request)
            req = self.server.parse_body(body, await self.server.read_json(request))
            name = self.served_name(req.model)
            refuse_unsupported(req)
            translation = self.chat_request(req) if endpoint == CHAT else self.generate_request(req)
            if translation is None:  # Ollama's "load the model" call: it is loaded
                self.server.ended(endpoint, 200)
                return JSONResponse(loaded(name, endpoint == CHAT))
            openai = self.openai_request(translation)
            args = self.server.generation_args(openai, partition)
            args.pop("n_prompt")
            events = ended_at_suffix(await self.server.start(request, args), args["prompt"])
        except ApiError as exc:
            self.server.ended(endpoint, exc.status)
            return error_response(exc)
        settings = args["settings"]
        tools = settings.tools
        tool_format = for_tools(self.server.tool_format, tools) if tools else None
        reply = OllamaReply(self.server, endpoint, str(settings.mode), name, tool_format, arrived)
        if req.stream:
            return StreamingResponse(reply.lines(events), media_type="application/x-ndjson")
        return await reply.whole(request, events)

    def served_name(self, given: str) -> str:
        """The model name as the client gave it (Ollama answers with it), if it names the
        loaded model: its id or a name it was served under, with or without ``:latest``."""
        if not given:
            raise ApiError(400, "model is required", param="model")
        names = (self.server.model_id, *self.server.settings.model_names)
        if bare_name(given) not in {bare_name(n) for n in names}:
            raise ApiError(404, f"model '{given}' not found", code="model_not_found")
        return given

    def chat_request(self, req: ChatBody) -> Translation | None:
        if not req.messages:
            return None
        body = self.common_fields(req)
        body["messages"] = [openai_message(m) for m in req.messages]
        if req.tools:
            body["tools"] = [listed_types(tool) for tool in req.tools]
        return Translation(ChatRequest, body)

    def generate_request(self, req: GenerateBody) -> Translation | None:
        if not req.prompt:
            return None
        if req.suffix:
            return self.infill(req)
        body = self.common_fields(req)
        if req.raw:  # the text as the model reads it (Ollama ignores ``system`` then too)
            if "response_format" in body:  # the grammar path is the chat request's
                raise ApiError(
                    400,
                    "format is not supported with raw: true (leave raw out, or use /api/chat)",
                    param="format",
                )
            return Translation(CompletionRequest, {**body, "prompt": req.prompt})
        system = [{"role": "system", "content": req.system}] if req.system else []
        body["messages"] = [*system, {"role": "user", "content": req.prompt}]
        return Translation(ChatRequest, body)

    def infill(self, req: GenerateBody) -> Translation:
        """``suffix``: fill in the middle between the prompt (the text before the cursor) and
        the suffix, from the model's FIM tokens (``engine.fim``; a model without them: 400)."""
        body = self.common_fields(req)
        if "response_format" in body:
            raise ApiError(400, "format is not supported with a suffix", param="format")
        return Translation(CompletionRequest, {**body, "prompt": req.prompt, "suffix": req.suffix})

    def common_fields(self, req: ChatBody | GenerateBody) -> dict[str, Any]:
        """Sampling, length and format, as the OpenAI request's fields."""
        options = req.options or Options()
        refuse_reshaping(options)
        body: dict[str, Any] = {**OLLAMA_SAMPLING, "stream": False}
        body.update(
            {
                name: value
                for name in SAMPLING_OPTIONS
                if (value := getattr(options, name)) is not None
            }
        )
        limit = options.num_predict
        # the context ends an answer anyway: as many tokens as it holds is "no limit"
        body["max_tokens"] = self.engine.target.n_ctx if limit in (None, *NO_LIMIT) else limit
        if (response_format := openai_format(req.format)) is not None:
            body["response_format"] = response_format
        if req.speculative is not None:
            body["speculative"] = req.speculative
        return body

    def openai_request(self, translation: Translation) -> ChatRequest | CompletionRequest:
        try:
            return self.server.parse(translation.kind, translation.body)
        except ApiError as exc:
            raise in_ollama_terms(exc) from None

    # ----- what is served -----------------------------------------------------------------

    async def root(self, request: Request) -> Response:
        """What clients probe to find an Ollama server (public, as ``/health``)."""
        return PlainTextResponse("Ollama is running")

    async def version(self, request: Request) -> Response:
        try:
            self.server.check_caller(request)
        except ApiError as exc:
            return error_response(exc)
        return JSONResponse({"version": OLLAMA_API_VERSION})

    async def tags(self, request: Request) -> Response:
        try:
            self.server.check_caller(request)
        except ApiError as exc:
            return error_response(exc)
        facts = self.facts
        entry = {
            "name": self.listed_name,
            "model": self.listed_name,
            "modified_at": facts.modified_at,
            "size": facts.size,
            "digest": facts.digest,
            "details": facts.details,
        }
        return JSONResponse({"models": [entry]})

    async def ps(self, request: Request) -> Response:
        try:
            self.server.check_caller(request)
        except ApiError as exc:
            return error_response(exc)
        facts = self.facts
        on_gpu = not runs_on_cpu(self.engine.target.options)
        entry = {
            "name": self.listed_name,
            "model": self.listed_name,
            "size": facts.size,
            "digest": facts.digest,
            "details": facts.details,
            "expires_at": NEVER,  # loaded for as long as the server runs
            # the weights' size where layers are offloaded (a closer figure is not known here)
            "size_vram": facts.size if on_gpu else 0,
            "context_length": self.engine.target.n_ctx,
        }
        return JSONResponse({"models": [entry]})

    async def show(self, request: Request) -> Response:
        try:
            self.server.check_caller(request)
            req = self.server.parse_body(ShowBody, await self.server.read_json(request))
            self.served_name(req.model or req.name)
        except ApiError as exc:
            return error_response(exc)
        facts, target = self.facts, self.engine.target
        return JSONResponse(
            {
                "modelfile": "",
                "parameters": "",
                "template": target.chat_template() or "",
                "details": facts.details,
                "model_info": facts.model_info,
                "capabilities": self.capabilities,
                "modified_at": facts.modified_at,
            }
        )

    @property
    def listed_name(self) -> str:
        return f"{self.server.model_id}:latest"

    @cached_property
    def facts(self) -> ModelFacts:
        """Read once, on first use: the file does not change while it is loaded."""
        return model_facts(self.engine.target_path)

    @cached_property
    def capabilities(self) -> list[str]:
        """Ollama's: ``tools`` where the model's template renders tools (a model trained to
        call them; tools are accepted with any model), ``insert`` with fill-in-the-middle."""
        target = self.engine.target
        found = ["completion"]
        if format_for(target.chat_template())[1]:
            found.append("tools")
        if not missing_fim_tokens(target):
            found.append("insert")
        return found


def listed_types(schema: Any) -> Any:
    """``schema`` with each ``"type": "integer, string"`` written as the list it means: the
    ``ollama`` client writes a Python function's union parameter so
    (``convert_function_to_tool``), and Ollama takes it."""
    if isinstance(schema, list):
        return [listed_types(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    listed = {k: v if k in VALUE_KEYWORDS else listed_types(v) for k, v in schema.items()}
    kind = schema.get("type")
    if isinstance(kind, str) and "," in kind:
        listed["type"] = [t.strip() for t in kind.split(",")]
    return listed


def bare_name(name: str) -> str:
    """A model name as compared: Ollama's names ignore case and a ``:latest`` tag."""
    return name.strip().lower().removesuffix(":latest")


def refuse_unsupported(req: ChatBody | GenerateBody) -> None:
    """What these routes cannot honour: a 400 that says so, never silently dropped."""
    if req.logprobs:
        raise ApiError(
            400,
            "logprobs are not supported on the Ollama routes (/v1/chat/completions has them)",
            param="logprobs",
        )
    images = bool(req.images)
    if isinstance(req, ChatBody):
        images |= any(m.images for m in req.messages)
    if images:
        raise ApiError(400, "images are not supported: this server's model reads text only")
    if isinstance(req, GenerateBody):
        if req.template:
            raise ApiError(
                400,
                "template is not supported: the model's own chat template is used (send "
                "raw: true with a prompt already in the model's format)",
                param="template",
            )
        if req.context:
            raise ApiError(
                400,
                "context is not supported: send the conversation as /api/chat messages",
                param="context",
            )


def refuse_reshaping(options: Options) -> None:
    for name, neutral in NEUTRAL_OPTIONS.items():
        value = getattr(options, name)
        if value is not None and value != neutral:
            raise ApiError(
                400,
                f"options.{name} is not supported: this server does not apply it, and refuses "
                f"rather than ignores what would change the answer (send {neutral} or leave it "
                "out)",
                param=f"options.{name}",
            )


def openai_message(message: OllamaMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:  # Ollama's calls have no id, and arguments as an object
        out["tool_calls"] = [{"type": "function", **call} for call in message.tool_calls]
    if message.tool_name is not None:
        out["name"] = message.tool_name
    return out


def openai_format(given: str | dict[str, Any] | None) -> dict[str, Any] | None:
    """Ollama's ``format``: ``"json"`` (any JSON object) or a JSON schema."""
    if given in (None, ""):
        return None
    if given == "json":
        return {"type": "json_object"}
    if isinstance(given, dict):
        return {"type": "json_schema", "json_schema": {"name": "format", "schema": given}}
    raise ApiError(400, f"format {given!r} is not 'json' or a JSON schema object", param="format")


def in_ollama_terms(exc: ApiError) -> ApiError:
    """An error about a translated field, named as the Ollama request names it."""
    return in_terms_of(exc, OLLAMA_NAMES)


# ----- the model's description ----------------------------------------------------------------

NEVER = "9999-12-31T23:59:59Z"


@dataclass(frozen=True)
class ModelFacts:
    size: int
    modified_at: str
    digest: str
    details: dict[str, Any]
    model_info: dict[str, Any]


def model_facts(path: Path) -> ModelFacts:
    info = gguf_info(path)
    stat = path.stat()
    arch = info.architecture
    model_info: dict[str, Any] = {
        key: value
        for key, value in read_header(path).metadata.items()
        # scalars only: arrays (token lists, per-layer values) are not what clients show
        if key.startswith(("general.", f"{arch}.")) and isinstance(value, str | int | float)
    }
    model_info["general.parameter_count"] = info.n_params
    return ModelFacts(
        size=stat.st_size,
        modified_at=rfc3339(stat.st_mtime),
        digest=file_digest(path, stat.st_size, stat.st_mtime_ns),
        details={
            "parent_model": "",
            "format": "gguf",
            "family": arch,
            "families": [arch],
            "parameter_size": info.size_label or parameter_size(info.n_params),
            "quantization_level": info.file_type,
        },
        model_info=model_info,
    )


def file_digest(path: Path, size: int, mtime_ns: int) -> str:
    """An identity of the file in Ollama's digest shape (64 hex digits): the SHA-256 of its
    path, size and modification time, not of its bytes (gigabytes would take seconds)."""
    return hashlib.sha256(f"{path.resolve()}\0{size}\0{mtime_ns}".encode()).hexdigest()


def parameter_size(n_params: int) -> str:
    if n_params >= 1_000_000_000:
        return f"{n_params / 1e9:.1f}B"
    return f"{n_params / 1e6:.2f}M"


def rfc3339(timestamp: float | None = None) -> str:
    """A time as Ollama writes it (UTC, with a fraction of a second): now, by default."""
    moment = (
        datetime.now(timezone.utc)
        if timestamp is None
        else (datetime.fromtimestamp(timestamp, timezone.utc))
    )
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# ----- replies --------------------------------------------------------------------------------


def error_response(exc: ApiError) -> JSONResponse:
    """Ollama's error shape, with the status the OpenAI routes send."""
    return JSONResponse({"error": exc.message}, status_code=exc.status, headers=exc.headers)


def loaded(model: str, chat: bool) -> dict[str, Any]:
    """The answer to Ollama's "load the model" call (no messages, or an empty prompt)."""
    part: dict[str, Any] = (
        {"message": {"role": "assistant", "content": ""}} if chat else {"response": ""}
    )
    return {"model": model, "created_at": rfc3339(), **part, "done": True, "done_reason": "load"}


def ollama_calls(calls: list[ToolCall]) -> list[dict[str, Any]]:
    """Tool calls in Ollama's shape: the arguments as an object, not JSON text."""
    return [{"function": {"name": c.name, "arguments": arguments_object(c)}} for c in calls]


def arguments_object(call: ToolCall) -> dict[str, Any]:
    try:
        arguments = json.loads(call.arguments)
    except ValueError:
        arguments = None
    if isinstance(arguments, dict):
        return arguments
    # Ollama's clients read an object: a model that wrote something else is logged
    log.info("tool call %s: arguments %r are no JSON object, sent as {}", call.name, call.arguments)
    return {}


def durations(stats: Stats, arrived_ns: int) -> dict[str, int]:
    """Ollama's counts and durations (nanoseconds). ``total_duration`` runs from the
    request's arrival, queue included; the model was loaded before (``load_duration`` 0). A
    duration is at least 1 ns where tokens were counted: clients divide by it."""
    return {
        "total_duration": time.perf_counter_ns() - arrived_ns,
        "load_duration": 0,
        "prompt_eval_count": stats.n_prompt,
        "prompt_eval_duration": nanoseconds(stats.prefill_ms, stats.n_prompt),
        "eval_count": stats.n_tokens,
        "eval_duration": nanoseconds(stats.gen_ms, stats.n_tokens),
    }


def nanoseconds(ms: float, count: int) -> int:
    return max(round(ms * 1e6), 1 if count else 0)


class OllamaReply:
    """One answer in Ollama's shapes: a whole JSON object, or newline-delimited JSON lines
    (one per round of tokens, the last with ``done: true`` and the figures). Chat answers
    carry a ``message``, generate answers a ``response``."""

    def __init__(
        self,
        server: RouteHost,
        endpoint: str,
        mode: str,
        model: str,
        tool_format: ToolFormat | None,
        arrived_ns: int,
    ) -> None:
        self.server, self.endpoint, self.mode, self.model = server, endpoint, mode, model
        self.chat = endpoint == CHAT
        self.tool_format = tool_format
        self.arrived_ns = arrived_ns

    def part(self, text: str, calls: list[ToolCall]) -> dict[str, Any]:
        if not self.chat:
            return {"response": text}
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            message["tool_calls"] = ollama_calls(calls)
        return {"message": message}

    def piece(self, text: str, calls: list[ToolCall]) -> dict[str, Any]:
        return {
            "model": self.model,
            "created_at": rfc3339(),
            **self.part(text, calls),
            "done": False,
        }

    def last(self, text: str, calls: list[ToolCall], stats: Stats, reason: str) -> dict[str, Any]:
        body = {
            **self.piece(text, calls),
            "done": True,
            "done_reason": reason,
            **durations(stats, self.arrived_ns),
            "speculative": speculative_block(stats, self.mode),
        }
        if not self.chat:
            body["context"] = []  # Ollama's token context: not kept (send messages instead)
        return body

    # ----- a whole answer -----------------------------------------------------------------

    async def whole(self, request: Request, events: GenerationStream) -> Response:
        try:
            text, last = await gathered(request, events)
        except LocalspecError as exc:
            return self._failed(exc)
        ended = unfinished(self.server, last, self._failed, self.gone)
        if ended is not None or last is None:
            return ended or Response(status_code=499)
        content, calls = text, []
        if self.tool_format is not None:
            rest, calls = self.tool_format.parse(content)
            content = (rest or "") if calls else content
        self.server.finished(self.endpoint, self.mode, last.stats, last.finish_reason)
        return JSONResponse(self.last(content, calls, last.stats, last.finish_reason))

    # ----- a stream -----------------------------------------------------------------------

    async def lines(self, events: GenerationStream) -> AsyncIterator[str]:
        last, failed = None, False
        tools = ToolCallStream(self.tool_format) if self.tool_format is not None else None
        try:
            async for event in events:
                last = event
                text, calls = text_and_calls(tools, event.text, event.finish_reason is not None)
                if event.finish_reason is not None:
                    yield line(self.last(text, calls, event.stats, event.finish_reason))
                elif text or calls:
                    yield line(self.piece(text, calls))
            if (last is None or not last.finish_reason) and self.server.stopping:
                raise ShuttingDown
        except LocalspecError as exc:
            failed = True
            yield line({"error": self.failed(exc).message})
        except Exception as exc:  # the status line is sent: say it in the stream
            failed = True
            log.exception("%s: generation failed", self.endpoint)
            self.server.ended(self.endpoint, 500)
            yield line({"error": f"generation failed: {type(exc).__name__}"})
        finally:
            await events.aclose()
            if last is not None and last.finish_reason:
                self.server.finished(self.endpoint, self.mode, last.stats, last.finish_reason)
            elif not failed:  # the client closed the stream
                self.gone()

    def _failed(self, exc: LocalspecError) -> Response:
        return error_response(self.failed(exc))

    def failed(self, exc: LocalspecError) -> ApiError:
        return generation_failed(self.server, self.endpoint, self.mode, exc)

    def gone(self) -> None:
        client_gone(self.server, self.endpoint, self.mode)


def line(payload: dict[str, Any]) -> str:
    return json.dumps(payload) + "\n"


def ollama_routes(server: RouteHost) -> list[Route]:
    """The Ollama API's routes, for ``create_app``."""
    ollama = OllamaRoutes(server)
    return [
        Route("/", ollama.root, methods=["GET", "HEAD"]),
        counted_route(server, "/api/version", ollama.version),
        counted_route(server, "/api/tags", ollama.tags),
        counted_route(server, "/api/ps", ollama.ps),
        counted_route(server, "/api/show", ollama.show, methods=["POST"]),
        Route(CHAT, ollama.chat, methods=["POST"]),
        Route(GENERATE, ollama.generate, methods=["POST"]),
    ]
