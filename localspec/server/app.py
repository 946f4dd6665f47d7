"""The OpenAI-compatible API on Starlette: /v1/models, /v1/completions, /v1/chat/completions,
/health, /metrics. Every response carries ``usage``, a ``speculative`` object and
llama-server-compatible ``timings``; streaming puts them on the final chunk."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from localspec.api import Engine
from localspec.engine.stats import Stats
from localspec.errors import LocalspecError
from localspec.modes import canonical
from localspec.server.metrics import ServerMetrics
from localspec.server.runner import EngineRunner, GenerationStream, QueueFull
from localspec.server.schemas import ChatRequest, CompletionRequest

log = logging.getLogger("localspec.server")


@dataclass(frozen=True)
class ServerSettings:
    api_key: str | None = None
    max_queue: int = 8
    max_body_bytes: int = 1 << 20


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind
        self.param, self.code, self.headers = param, code, headers

    def response(self) -> JSONResponse:
        body = {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def speculative_block(stats: Stats, mode: str) -> dict[str, Any]:
    return {
        "mode": mode,
        "drafted": stats.drafted,
        "accepted": stats.accepted,
        "acceptance_rate": round(stats.acceptance_rate, 4),
        "mean_acceptance_length": round(stats.mean_acceptance_length, 4),
        "acceptance_per_position": [round(a, 4) for a in stats.acceptance_per_position],
        "draft_ms": round(stats.draft_ms, 3),
        "verify_ms": round(stats.verify_ms, 3),
        "paused": stats.paused,
    }


def timings_block(stats: Stats) -> dict[str, Any]:
    """llama-server's ``timings`` object, with its field names."""
    return {
        "prompt_n": stats.n_prompt,
        "prompt_ms": round(stats.prefill_ms, 3),
        "predicted_n": stats.n_tokens,
        "predicted_ms": round(stats.gen_ms, 3),
        "predicted_per_second": round(stats.tokens_per_s, 3),
        "draft_n": stats.drafted,
        "draft_n_accepted": stats.accepted,
    }


def usage_block(stats: Stats) -> dict[str, int]:
    return {
        "prompt_tokens": stats.n_prompt,
        "completion_tokens": stats.n_tokens,
        "total_tokens": stats.n_prompt + stats.n_tokens,
    }


class Server:
    def __init__(self, engine: Engine, settings: ServerSettings) -> None:
        self.engine = engine
        self.settings = settings
        self.runner = EngineRunner(engine, settings.max_queue)
        self.metrics = ServerMetrics()
        self.model_id = engine.target_path.stem
        self.created = int(time.time())

    # ----- plumbing -----------------------------------------------------------------------

    def check_auth(self, request: Request) -> None:
        key = self.settings.api_key
        if key is None:
            return
        given = request.headers.get("authorization", "")
        if not secrets.compare_digest(given.encode(), f"Bearer {key}".encode()):
            raise ApiError(
                401,
                "invalid or missing API key (Authorization: Bearer KEY)",
                "authentication_error",
                code="invalid_api_key",
            )

    async def read_json(self, request: Request) -> Any:
        limit = self.settings.max_body_bytes
        if int(request.headers.get("content-length") or 0) > limit:
            raise ApiError(413, f"request body larger than {limit} bytes")
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise ApiError(413, f"request body larger than {limit} bytes")
        try:
            return json.loads(body)
        except ValueError as exc:
            raise ApiError(400, f"malformed JSON body: {exc}") from None

    @staticmethod
    def parse(model: type[CompletionRequest] | type[ChatRequest], data: Any):  # type: ignore[no-untyped-def]
        try:
            req = model.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            param = ".".join(str(p) for p in first["loc"])
            raise ApiError(400, f"{param}: {first['msg']}", param=param) from None
        if req.n != 1:
            raise ApiError(400, "only n=1 is supported", param="n")
        if req.max_tokens is not None and req.max_tokens <= 0:
            raise ApiError(400, "max_tokens must be > 0", param="max_tokens")
        if req.logprobs:
            raise ApiError(400, "logprobs are not supported", param="logprobs")
        return req

    def generation_args(self, req: CompletionRequest | ChatRequest) -> dict[str, Any]:
        over = req.speculative
        mode = over.mode if over and over.mode else self.engine.mode
        available = self.engine.available_modes()
        try:
            mode = canonical(mode)
        except LocalspecError:
            mode = ""
        if mode not in available:
            raise ApiError(
                400,
                f"speculative.mode {over.mode if over else mode!r} is not available on this "
                f"server (it has: {', '.join(available)})",
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
        prompt = (
            req.prompt
            if isinstance(req, CompletionRequest)
            else [m.model_dump() for m in req.messages]
        )
        n_prompt = len(self.engine.tokenize_prompt(prompt))
        if n_prompt >= self.engine.target.n_ctx:
            raise ApiError(
                400,
                f"the prompt has {n_prompt} tokens but the context holds "
                f"{self.engine.target.n_ctx}",
                code="context_length_exceeded",
                param="messages" if isinstance(req, ChatRequest) else "prompt",
            )
        return dict(
            prompt=prompt,
            max_tokens=req.max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            min_p=req.min_p,
            seed=req.seed,
            stop=req.stops(),
            mode=mode,
            spec=spec,
        )

    async def start(self, request: Request, args: dict[str, Any]) -> GenerationStream:
        try:
            await self.wait_turn(request)
        except QueueFull:
            raise ApiError(
                429,
                f"the server is busy: {self.runner.max_queue} requests are already waiting",
                "rate_limit_error",
                headers={"Retry-After": "1"},
            ) from None
        finally:
            self.metrics.queue_depth.set(self.runner.queue_depth)
        return self.runner.generate(**args)

    async def wait_turn(self, request: Request) -> None:
        """Queue for the engine, leaving the queue if the client goes away meanwhile."""
        turn = asyncio.create_task(self.runner.acquire())
        while True:
            done, _ = await asyncio.wait({turn}, timeout=0.2)
            if done:
                turn.result()  # raises QueueFull
                return
            if await request.is_disconnected():
                turn.cancel()
                try:
                    await turn
                except asyncio.CancelledError:
                    raise ApiError(499, "client closed the request while queued") from None
                self.runner.release()  # got the turn just as it was cancelled: give it back
                raise ApiError(499, "client closed the request while queued")

    def finished(self, endpoint: str, mode: str, stats: Stats, reason: str) -> None:
        self.metrics.record(stats)
        self.metrics.requests.labels(endpoint, "200").inc()
        log.info(
            "%s %s: %d+%d tokens, %.1f tok/s, accepted %d/%d (L %.2f), %s",
            endpoint,
            mode,
            stats.n_prompt,
            stats.n_tokens,
            stats.tokens_per_s,
            stats.accepted,
            stats.drafted,
            stats.mean_acceptance_length,
            reason,
        )

    # ----- endpoints ----------------------------------------------------------------------

    async def completions(self, request: Request) -> Response:
        return await self.handle(request, CompletionRequest, "/v1/completions")

    async def chat(self, request: Request) -> Response:
        return await self.handle(request, ChatRequest, "/v1/chat/completions")

    async def handle(self, request: Request, model: type, endpoint: str) -> Response:
        try:
            self.check_auth(request)
            req = self.parse(model, await self.read_json(request))
            args = self.generation_args(req)
            events = await self.start(request, args)
        except ApiError as exc:
            self.metrics.requests.labels(endpoint, str(exc.status)).inc()
            return exc.response()
        chat = model is ChatRequest
        if req.stream:
            return StreamingResponse(
                self.sse(events, chat, args["mode"], endpoint), media_type="text/event-stream"
            )
        return await self.whole(events, chat, args["mode"], endpoint)

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

    async def whole(
        self, events: GenerationStream, chat: bool, mode: str, endpoint: str
    ) -> Response:
        text, last = [], None
        try:
            async for event in events:
                text.append(event.text)
                last = event
        except LocalspecError as exc:
            return ApiError(400, exc.message).response()
        assert last is not None
        reason = last.finish_reason or "stop"
        content = "".join(text)
        choice: dict[str, Any] = {"index": 0, "finish_reason": reason}
        if chat:
            choice["message"] = {"role": "assistant", "content": content}
        else:
            choice.update(text=content, logprobs=None)
        self.finished(endpoint, mode, last.stats, reason)
        body = {
            **self.envelope(chat, f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"),
            "choices": [choice],
            **self.extras(last.stats, mode),
        }
        return JSONResponse(body)

    async def sse(
        self, events: GenerationStream, chat: bool, mode: str, endpoint: str
    ) -> AsyncIterator[str]:
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        head = self.envelope(chat, rid)
        head["object"] = "chat.completion.chunk" if chat else "text_completion"
        last = None
        try:
            async for event in events:
                last = event
                yield sse_chunk(
                    head,
                    chat,
                    event.text,
                    event.finish_reason,
                    self.extras(event.stats, mode) if event.finish_reason else None,
                )
        finally:
            await events.aclose()
            if last is not None and last.finish_reason:
                self.finished(endpoint, mode, last.stats, last.finish_reason)
            elif last is not None:
                log.info(
                    "%s %s: client went away after %d tokens", endpoint, mode, last.stats.n_tokens
                )
        yield "data: [DONE]\n\n"

    async def models(self, request: Request) -> Response:
        try:
            self.check_auth(request)
        except ApiError as exc:
            return exc.response()
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.model_id,
                        "object": "model",
                        "created": self.created,
                        "owned_by": "localspec",
                        "speculative_mode": self.engine.mode,
                    }
                ],
            }
        )

    async def health(self, request: Request) -> Response:
        return JSONResponse(
            {"status": "ok", "busy": self.runner.busy, "queue_depth": self.runner.queue_depth}
        )

    async def prometheus(self, request: Request) -> Response:
        self.metrics.queue_depth.set(self.runner.queue_depth)
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def sse_chunk(
    head: dict[str, Any], chat: bool, text: str, reason: str | None, extras: dict[str, Any] | None
) -> str:
    if chat:
        choice: dict[str, Any] = {
            "index": 0,
            "delta": {"content": text} if text else {},
            "finish_reason": reason,
        }
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
    return f"data: {json.dumps({**head, 'choices': [choice], **(extras or {})})}\n\n"


def create_app(engine: Engine, settings: ServerSettings | None = None) -> Starlette:
    server = Server(engine, settings or ServerSettings())
    app = Starlette(
        routes=[
            Route("/health", server.health),
            Route("/metrics", server.prometheus),
            Route("/v1/models", server.models),
            Route("/v1/completions", server.completions, methods=["POST"]),
            Route("/v1/chat/completions", server.chat, methods=["POST"]),
        ]
    )
    app.state.server = server
    return app
