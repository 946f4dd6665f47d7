"""The OpenAI-compatible API on Starlette: /v1/models, /v1/completions, /v1/chat/completions,
/health, /metrics (and the other APIs' routes, each in its module: Anthropic's /v1/messages,
OpenAI's /v1/responses, Ollama's, llama-server's). Every response
carries ``usage``, a ``speculative`` object and llama-server-compatible ``timings``;
streaming puts them on the final chunk."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from localspec.api import Engine, Prompt, validate_sampling
from localspec.engine.fim import FimPrompt
from localspec.engine.fim_fit import fitted
from localspec.engine.grammar import schema_grammar
from localspec.engine.logit_bias import LogitBias
from localspec.engine.loop import TokenLogprob
from localspec.engine.prompting import TokenPrompt
from localspec.engine.scheduler import StepFigures
from localspec.engine.settings import GenerationSettings
from localspec.engine.stats import Stats
from localspec.engine.toolcalls import check_tools, chosen_tools, for_tools, format_for
from localspec.errors import LocalspecError
from localspec.memory_bank import DEFAULT_PARTITION, partition_for_key
from localspec.modes import canonical
from localspec.server.anthropic_routes import ENDPOINT as MESSAGES_PATH
from localspec.server.anthropic_routes import AnthropicRoutes
from localspec.server.anthropic_routes import error_response as anthropic_error
from localspec.server.completion_routes import CompletionRoutes
from localspec.server.fim_stream import ended_at_suffix
from localspec.server.guard import (
    OriginCORS,
    body_type_allowed,
    host_of,
    is_loopback_host,
    origin_allowed,
)
from localspec.server.host import counted_route
from localspec.server.llama_routes import LlamaRoutes
from localspec.server.metrics import ServerMetrics
from localspec.server.ollama_routes import error_response as ollama_error
from localspec.server.ollama_routes import ollama_routes
from localspec.server.reply import DISCONNECT_POLL_S as POLL_S
from localspec.server.reply import Reply, ShuttingDown
from localspec.server.responses_routes import ResponsesRoutes
from localspec.server.runner import ChoiceStreams, EngineRunner, GenerationStream, QueueFull
from localspec.server.schemas import ChatRequest, CompletionRequest
from localspec.server.shapes import ApiError, speculative_block, timings_block, usage_block

log = logging.getLogger("localspec.server")


@dataclass(frozen=True)
class ServerSettings:
    api_keys: tuple[str, ...] = ()  # any of them is accepted; each has its own memory
    max_queue: int = 8
    max_body_bytes: int = 1 << 20
    allowed_origins: tuple[str, ...] = ()  # beyond loopback ones; "*": any
    loopback_hosts_only: bool = True  # listening on loopback: Host must name a loopback host
    model_names: tuple[str, ...] = ()  # what /v1/models/{id} also answers to (the name typed)


class Server:
    def __init__(self, engine: Engine, settings: ServerSettings) -> None:
        self.engine = engine
        self.settings = settings
        self.runner = EngineRunner(engine, settings.max_queue)
        self.metrics = ServerMetrics()
        self.model_id = engine.target_path.stem
        self.tool_format = format_for(engine.target.chat_template())[0]
        self.created = int(time.time())

    # ----- plumbing -----------------------------------------------------------------------

    def check_caller(self, request: Request) -> str:
        """Web pages may not drive the server (see ``guard.py``), and with keys, only
        callers that send one may. Returns the caller's memory partition."""
        origin = request.headers.get("origin")
        if origin is not None and not origin_allowed(origin, self.settings.allowed_origins):
            raise ApiError(
                403,
                f"requests from the web origin {origin} are not allowed "
                "(start the server with --allowed-origins to allow it)",
                "permission_error",
            )
        host = host_of(request.headers.get("host", ""))
        if self.settings.loopback_hosts_only and not is_loopback_host(host):
            raise ApiError(
                403,
                f"host {host!r} is not allowed: this server listens on a loopback address "
                "(use localhost or 127.0.0.1)",
                "permission_error",
            )
        return self.check_auth(request)

    def check_auth(self, request: Request) -> str:
        """The partition of the suffix drafter's memory the caller's requests use: one per
        key, so that one user's earlier prompts never draft (nor time) another's answers."""
        if not self.settings.api_keys:
            return DEFAULT_PARTITION
        scheme, _, bearer = request.headers.get("authorization", "").strip().partition(" ")
        # the scheme's name is case-insensitive (RFC 9110); Anthropic's clients send x-api-key
        given = [bearer.strip()] if scheme.lower() == "bearer" else []
        given += [request.headers["x-api-key"].strip()] if "x-api-key" in request.headers else []
        for key in self.settings.api_keys:
            if any(secrets.compare_digest(g.encode(), key.encode()) for g in given):
                return partition_for_key(key)
        raise ApiError(
            401,
            "invalid or missing API key (Authorization: Bearer KEY, or x-api-key: KEY)",
            "authentication_error",
            code="invalid_api_key",
        )

    async def read_json(self, request: Request) -> Any:
        if not body_type_allowed(
            request.headers.get("content-type"), request.headers.get("origin")
        ):
            raise ApiError(
                415,
                f"the body must be JSON, not {request.headers['content-type']!r} "
                "(send Content-Type: application/json)",
                code="unsupported_media_type",
            )
        limit = self.settings.max_body_bytes
        if int(request.headers.get("content-length") or 0) > limit:
            raise ApiError(413, f"request body larger than {limit} bytes")
        body = await self.receive_body(request, limit)
        try:
            return json.loads(body)
        except ValueError as exc:
            raise ApiError(400, f"malformed JSON body: {exc}") from None
        except RecursionError:
            raise ApiError(400, "malformed JSON body: nested too deeply") from None

    async def receive_body(self, request: Request, limit: int) -> bytes:
        """The body as the client sends it. A server that begins to stop meanwhile answers
        at once (503) rather than wait for a slow client and cut it off with a bare 500."""
        receiving = asyncio.create_task(_body(request, limit))
        while True:
            done, _ = await asyncio.wait({receiving}, timeout=POLL_S)
            if done:
                return receiving.result()
            if self.stopping:
                receiving.cancel()
                raise ApiError(503, "the server is shutting down", "server_error")

    @staticmethod
    def parse_body(model: type[BaseModel], data: Any) -> Any:
        """The body as ``model``, or a 400 naming the first field that is wrong."""
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            param = ".".join(str(p) for p in first["loc"] if not _TYPE_TAG.match(str(p)))
            if first["type"] == "model_type":  # a list, a string, null...
                if param:  # a nested object: ``"options": "hot"``
                    raise ApiError(400, f"{param}: must be a JSON object", param=param) from None
                raise ApiError(400, "the request body must be a JSON object") from None
            # a validator's own message, without pydantic's "Value error, " before it
            message = first["msg"].removeprefix("Value error, ")
            where = f"{param}: " if param else ""
            raise ApiError(400, f"{where}{message}", param=param or None) from None

    @classmethod
    def parse(cls, model: type[CompletionRequest] | type[ChatRequest], data: Any):  # type: ignore[no-untyped-def]
        req = cls.parse_body(model, data)
        limit = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        echoed = isinstance(req, CompletionRequest) and req.echo  # 0: the prompt alone
        if echoed and req.suffix is not None:
            raise ApiError(400, "echo cannot be combined with a suffix", param="echo")
        if req.token_limit is not None and req.token_limit < (0 if echoed else 1):
            least = ">= 0 (with echo)" if echoed else "> 0"
            raise ApiError(400, f"{limit} must be {least}", param=limit)
        return req

    def constraints(self, req: CompletionRequest | ChatRequest) -> dict[str, Any]:
        """The tools shown to the model and the grammar its answer must follow (a required
        or named tool call, or a JSON response format)."""
        if not isinstance(req, ChatRequest):
            return {"tools": None, "grammar": None}
        tools = req.active_tools
        if not req.tools and req.tool_choice not in (None, "none", "auto"):
            raise ApiError(400, "tool_choice needs tools to choose from", param="tool_choice")
        try:
            if tools:
                check_tools(tools)
        except LocalspecError as exc:
            raise ApiError(400, exc.message, param="tools") from None
        try:
            chosen = chosen_tools(tools, req.tool_choice) if tools else None
        except LocalspecError as exc:
            raise ApiError(400, exc.message, param="tool_choice") from None
        try:
            schema = req.response_schema()
        except ValueError as exc:
            raise ApiError(400, str(exc), param="response_format") from None
        if chosen and schema is not None:
            raise ApiError(
                400,
                "a required tool call and a JSON response_format cannot both shape one answer",
                param="response_format",
            )
        try:
            if chosen:
                grammar = self.tool_format.grammar(chosen, req.parallel_tool_calls)
            else:
                grammar = schema_grammar(schema) if schema is not None else None
        except LocalspecError as exc:
            where = "tools" if chosen else "response_format"
            raise ApiError(400, exc.message, param=where) from None
        return {"tools": tools, "grammar": grammar}

    def generation_args(
        self,
        req: CompletionRequest | ChatRequest,
        partition: str = DEFAULT_PARTITION,
        prompt: Prompt | None = None,
    ) -> dict[str, Any]:
        """What ``Engine.stream`` is called with for this request (``prompt``: another
        prompt than the request's own, e.g. a middle to fill), or a 400 saying what is
        wrong."""
        self.check_choices(req.n)
        over = req.speculative
        asked = over.mode if over and over.mode is not None else self.engine.mode
        try:
            mode = canonical(asked)
            available = self.engine.mode_available(mode)
        except LocalspecError:
            available = False
        if not available:
            raise ApiError(
                400,
                f"speculative.mode {asked!r} is not available on this server (it has: "
                f"{', '.join(self.engine.available_modes())}, or a chain of them)",
                param="speculative.mode",
            )
        spec = self.engine.spec
        if over:
            changes = {
                k: v
                for k, v in (("n_max", over.n_max), ("n_min", over.n_min), ("p_min", over.p_min))
                if v is not None
            }
            spec = dataclasses.replace(spec, **changes)
            try:
                spec.validate()
            except LocalspecError as exc:
                raise ApiError(
                    400, exc.message.replace("--spec-draft-", "speculative."), param="speculative"
                ) from None
        if prompt is None:
            prompt = prompt_of(req)
        constraints = self.constraints(req)
        try:
            validate_sampling(
                req.temperature, req.top_k, req.top_p, req.min_p, req.seed, req.penalties
            )
            try:
                LogitBias(req.bias_entries).validate(self.engine.target.n_vocab)
            except LocalspecError as exc:
                raise ApiError(400, exc.message, param="logit_bias") from None
            where = "messages" if isinstance(req, ChatRequest) else "prompt"
            try:
                n_prompt = len(self.engine.tokenize_prompt(prompt, tools=constraints["tools"]))
            except LocalspecError as exc:
                raise ApiError(400, exc.message, param=where) from None
            room = self.fim_room(req.token_limit)
            if isinstance(prompt, FimPrompt) and n_prompt > room:  # read again only if cut
                prompt = fitted(self.engine.target, prompt, room)
                n_prompt = len(self.engine.tokenize_prompt(prompt))
        except LocalspecError as exc:
            raise ApiError(400, exc.message) from None
        if n_prompt == 0:
            raise ApiError(400, f"{where} is empty: give some text", param=where)
        if n_prompt >= self.engine.target.n_ctx:
            raise ApiError(
                400,
                # Anthropic's words, which Claude Code and its users know, and what to do
                f"prompt is too long: {n_prompt} tokens > {self.engine.target.n_ctx} maximum "
                f"(the context holds {self.engine.target.n_ctx} tokens a slot: shorten the "
                f"{where}, or start the server with a larger -c)",
                code="context_length_exceeded",
                param=where,
            )
        settings = GenerationSettings.pick(
            req,
            max_tokens=req.token_limit,
            stop=req.stops(),
            mode=mode,
            spec=spec,
            logprobs=req.wants_logprobs if isinstance(req, ChatRequest) else req.top_logprobs,
            # identical greedy requests must not depend on what earlier ones left cached
            reproducible=req.temperature == 0,
            memory_partition=partition,
            logit_bias=req.bias_entries,
            **constraints,
        )
        return {"prompt": prompt, "settings": settings, "n_prompt": n_prompt}

    def check_choices(self, n: int) -> None:
        """``n`` answers run side by side, each in a slot of its own."""
        slots = self.engine.parallel
        if n < 1:
            raise ApiError(400, f"n must be 1 or more (got {n}): the answers to give", param="n")
        if n > slots:
            raise ApiError(
                400,
                f"n={n} asks for {n} answers at once; this server runs {slots} slot"
                f"{'s' if slots > 1 else ''} (start the server with --parallel {n} or more)",
                param="n",
            )

    @staticmethod
    def choice_args(args: dict[str, Any], n: int) -> list[dict[str, Any]]:
        """The generation of each of ``n`` choices: a seeded request's choice i draws with
        seed + i (the answers differ, and each is reproducible)."""
        settings: GenerationSettings = args["settings"]
        if n == 1 or settings.seed is None or settings.seed < 0:
            return [args] * n
        return [{**args, "settings": settings.but(seed=settings.seed + i)} for i in range(n)]

    def fim_room(self, token_limit: int | None) -> int:
        """The tokens a completion's prompt may take: the context less the middle's room
        (its token limit, or a quarter of the context without one; at most half)."""
        n_ctx = self.engine.target.n_ctx
        answer = token_limit if token_limit is not None and token_limit > 0 else n_ctx // 4
        return n_ctx - min(answer, n_ctx // 2)

    async def start(self, request: Request, args: dict[str, Any]) -> GenerationStream:
        await self.take_turn(request)
        return self.runner.generate(**args)

    async def start_choices(self, request: Request, args: list[dict[str, Any]]) -> ChoiceStreams:
        """A generation for each choice's ``args``, all started together (in as many slots)."""
        await self.take_turn(request, len(args))
        return ChoiceStreams(
            [ended_at_suffix(self.runner.generate(**one), one["prompt"]) for one in args]
        )

    async def take_turn(self, request: Request, count: int = 1) -> None:
        """Wait for the engine in the queue (429 when it is full, 503 once stopping)."""
        try:
            await self.wait_turn(request, count)
        except QueueFull:
            raise ApiError(
                429,
                f"the server is busy: {self.runner.max_queue} requests are already waiting",
                "rate_limit_error",
                headers={"Retry-After": "1"},
            ) from None
        finally:
            self.metrics.queue_depth.set(self.runner.queue_depth)
        if self.runner.closing:  # queued when the server began to stop: not started
            self.runner.release(count)
            raise ApiError(503, ShuttingDown().message, "server_error")

    async def score_prompt(
        self, request: Request, req: CompletionRequest | ChatRequest
    ) -> list[tuple[int, TokenLogprob | None]] | None:
        """``echo`` with ``logprobs``: the prompt's own tokens scored, in the engine's turn."""
        if not (isinstance(req, CompletionRequest) and req.echo and req.logprobs is not None):
            return None
        await self.take_turn(request)
        try:
            scored = TokenPrompt(req.tokens) if req.tokens is not None else req.text
            return await asyncio.to_thread(self.engine.score, scored, req.logprobs)
        except LocalspecError as exc:
            raise ApiError(400, exc.message, param="prompt") from None
        finally:
            self.runner.release()

    async def wait_turn(self, request: Request, count: int = 1) -> None:
        """Queue for ``count`` slots, leaving the queue if the client goes away meanwhile."""
        turn = asyncio.create_task(self.runner.acquire(count))
        while True:
            done, _ = await asyncio.wait({turn}, timeout=POLL_S)
            if done:
                turn.result()  # raises QueueFull
                return
            if await request.is_disconnected():
                turn.cancel()
                try:
                    await turn
                except asyncio.CancelledError:
                    raise ApiError(499, "client closed the request while queued") from None
                self.runner.release(count)  # got the turns just as it was cancelled: back
                raise ApiError(499, "client closed the request while queued")

    def ended(self, endpoint: str, status: int) -> None:
        """Count a request once, with the status it ended with (499: the client left)."""
        self.metrics.requests.labels(endpoint, str(status)).inc()

    def finished(self, endpoint: str, mode: str, stats: Stats, reason: str) -> None:
        self.metrics.record(stats)
        self.ended(endpoint, 200)
        figures = self.step_figures()
        load = ""
        if figures is not None:  # what the batch looked like as this answer ended
            load = (
                f"; slots {figures.slots_busy}/{self.engine.parallel}, step of "
                f"{figures.rows} rows, drafts {figures.drafted}/{figures.wanted} verified"
            )
            if figures.resting:
                load += f", {figures.resting} draft model(s) resting"
        # a single token comes with the prompt's pass: no speed of its own to show
        speed = f"{stats.tokens_per_s:.1f} tok/s" if stats.tokens_per_s > 0 else "- tok/s"
        log.info(
            "%s %s: %d+%d tokens, %s, accepted %d/%d (L %.2f), %s%s",
            endpoint,
            mode,
            stats.n_prompt,
            stats.n_tokens,
            speed,
            stats.accepted,
            stats.drafted,
            stats.mean_acceptance_length,
            reason,
            load,
        )

    def step_figures(self) -> StepFigures | None:
        if self.engine.parallel == 1:
            return None
        return self.engine.scheduler().figures

    # ----- endpoints ----------------------------------------------------------------------

    async def completions(self, request: Request) -> Response:
        return await self.handle(request, CompletionRequest, "/v1/completions")

    async def chat(self, request: Request) -> Response:
        return await self.handle(request, ChatRequest, "/v1/chat/completions")

    async def handle(self, request: Request, model: type, endpoint: str) -> Response:
        try:
            partition = self.check_caller(request)
            req = self.parse(model, await self.read_json(request))
            args = self.generation_args(req, partition)
            n_prompt = args.pop("n_prompt")
            scored = await self.score_prompt(request, req)
            if req.token_limit == 0:  # echo alone: nothing to generate
                return Reply(self, req, "none", endpoint, scored=scored).echoed(n_prompt)
            events = await self.start_choices(request, self.choice_args(args, req.n))
        except ApiError as exc:
            self.ended(endpoint, exc.status)
            return exc.response()
        settings: GenerationSettings = args["settings"]
        tools = settings.tools
        tool_format = for_tools(self.tool_format, tools) if tools else None
        reply = Reply(self, req, str(settings.mode), endpoint, tool_format, scored)
        if req.stream:
            return StreamingResponse(reply.sse(events), media_type="text/event-stream")
        return await reply.whole(request, events)

    def envelope(self, chat: bool, rid: str) -> dict[str, Any]:
        return {
            "id": rid,
            "created": int(time.time()),
            "model": self.model_id,
            "object": "chat.completion" if chat else "text_completion",
        }

    def extras(self, stats: Stats, mode: str) -> dict[str, Any]:
        return {
            "usage": usage_block(stats),
            "speculative": speculative_block(stats, mode),
            "timings": timings_block(stats),
        }

    @property
    def stopping(self) -> bool:
        return self.runner.closing

    def token_bytes(self, token: int) -> bytes:
        """A token's own bytes: a token may hold only part of a UTF-8 character."""
        return self.engine.target.piece(token)

    async def models(self, request: Request) -> Response:
        try:
            self.check_caller(request)
        except ApiError as exc:
            return exc.response()
        return JSONResponse({"object": "list", "data": [self.model_card()]})

    async def model(self, request: Request) -> Response:
        """One model by id (``client.models.retrieve``): the one loaded, or a 404."""
        try:
            self.check_caller(request)
            if request.path_params["model_id"] not in (self.model_id, *self.settings.model_names):
                raise ApiError(
                    404,
                    f"no model {request.path_params['model_id']!r} here: this server has "
                    f"{self.model_id!r}",
                    code="model_not_found",
                )
        except ApiError as exc:
            return exc.response()
        return JSONResponse(self.model_card())

    def model_card(self) -> dict[str, Any]:
        return {
            "id": self.model_id,
            "object": "model",
            "created": self.created,
            "owned_by": "localspec",
            "speculative_mode": self.engine.mode,
        }

    async def health(self, request: Request) -> Response:
        """Public, also with a key: it tells a supervisor whether the server is up."""
        return JSONResponse(
            {
                "status": "ok",
                "busy": self.runner.busy,
                "slots": self.runner.slots,
                "slots_busy": self.runner.running,
                "queue_depth": self.runner.queue_depth,
            }
        )

    async def prometheus(self, request: Request) -> Response:
        try:  # what the server served is the key holder's business
            self.check_caller(request)
        except ApiError as exc:
            return exc.response()
        self.metrics.queue_depth.set(self.runner.queue_depth)
        self.metrics.record_step(self.engine.parallel, self.step_figures())
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def prompt_of(req: CompletionRequest | ChatRequest) -> Prompt:
    """The request's prompt: chat messages, text, or with a ``suffix`` a middle to fill."""
    if isinstance(req, ChatRequest):
        return [m.for_template() for m in req.messages]
    if req.tokens is not None and req.suffix is not None:
        raise ApiError(400, "a suffix needs a text prompt (not token ids)", param="suffix")
    if req.tokens is not None:
        return TokenPrompt(req.tokens)
    if req.suffix is not None:
        return FimPrompt.at_cursor(req.text, req.suffix)
    return req.text


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own errors (an unknown path, a wrong method) in the shape of the API the
    path belongs to: Anthropic's and Ollama's clients read their own."""
    assert isinstance(exc, HTTPException)
    what = f"{request.method} {request.url.path}: {exc.detail}"
    error = ApiError(exc.status_code, what, headers=exc.headers)
    if request.url.path.startswith(MESSAGES_PATH):
        return anthropic_error(error)
    if request.url.path.startswith("/api/"):
        return ollama_error(error)
    return error.response()


# the type names pydantic adds to an error's location (a union's member, a validator)
async def _body(request: Request, limit: int) -> bytes:
    body = b""
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise ApiError(413, f"request body larger than {limit} bytes")
    except ClientDisconnect:
        raise ApiError(499, "client closed the request while sending it") from None
    return body


_TYPE_TAG = re.compile(r"^(str|int|float|bool|none|list\[.*\]|dict\[.*\]|function-.*)$")


def create_app(engine: Engine, settings: ServerSettings | None = None) -> Starlette:
    server = Server(engine, settings or ServerSettings())
    llama = LlamaRoutes(server)
    completion = CompletionRoutes(server)
    anthropic = AnthropicRoutes(server)
    responses = ResponsesRoutes(server)
    app = Starlette(
        routes=[
            Route("/health", server.health),
            Route("/v1/health", server.health),  # llama-server's aliases
            Route("/metrics", server.prometheus),
            counted_route(server, "/v1/models", server.models),
            counted_route(server, "/models", server.models),
            counted_route(server, "/v1/models/{model_id:path}", server.model),
            counted_route(server, "/models/{model_id:path}", server.model),
            Route("/v1/completions", server.completions, methods=["POST"]),
            Route("/v1/chat/completions", server.chat, methods=["POST"]),
            Route("/chat/completions", server.chat, methods=["POST"]),
            Route("/v1/messages", anthropic.messages, methods=["POST"]),
            Route("/v1/responses", responses.create, methods=["POST"]),
            Route("/responses", responses.create, methods=["POST"]),
            counted_route(
                server, "/v1/messages/count_tokens", anthropic.count_tokens, methods=["POST"]
            ),
            counted_route(server, "/tokenize", llama.tokenize, methods=["POST"]),
            counted_route(server, "/detokenize", llama.detokenize, methods=["POST"]),
            counted_route(server, "/apply-template", llama.apply_template, methods=["POST"]),
            counted_route(server, "/props", llama.props),
            *ollama_routes(server),
            Route("/completion", completion.completion, methods=["POST"]),
            Route("/completions", completion.completion, methods=["POST"]),
            Route("/infill", completion.infill, methods=["POST"]),
        ],
        exception_handlers={HTTPException: http_error},
        middleware=[Middleware(OriginCORS, allowed=server.settings.allowed_origins)],
    )
    app.state.server = server
    return app
