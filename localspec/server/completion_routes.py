"""llama-server's own generation endpoints, as editors and tools call them: ``/completion``
(Tabby, Continue's llama.cpp provider) and ``/infill`` (llama.vim, llama.vscode).

Bodies use llama-server's names and defaults (``n_predict``, sampling at temperature 0.8
with top-k 40, top-p 0.95, min-p 0.05 unless given, ``cache_prompt``); answers and streamed
events carry its fields (``content``, ``stop``, ``stop_type``, ``tokens_predicted``,
``timings``...), a stream being ``data:`` events with no ``[DONE]``. The request is checked
and run through the same path as the OpenAI routes (guards, queue, slots, speculation)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from localspec.engine.fim import ExtraFile, FimPrompt, MiddleEnd
from localspec.engine.grammar import schema_grammar
from localspec.engine.logit_bias import LogitBias
from localspec.engine.loop import RoundEvent
from localspec.engine.settings import GenerationSettings
from localspec.engine.stats import Stats
from localspec.errors import LocalspecError
from localspec.server.host import RouteHost
from localspec.server.reply import (
    ShuttingDown,
    client_gone,
    generation_failed,
    stop_when_gone,
    tokens_text,
)
from localspec.server.schemas import (
    CompletionRequest,
    LenientBody,
    Number,
    PromptField,
    SpeculativeOverride,
    one_prompt,
    prompt_ids,
    prompt_text,
)
from localspec.server.shapes import ApiError, speculative_block, timings_block

if TYPE_CHECKING:
    from localspec.server.runner import GenerationStream

UNLIMITED = (-1, -2)  # llama-server's n_predict for "until the end or the context is full"


class ExtraChunk(BaseModel):
    model_config = ConfigDict(extra="ignore")
    text: StrictStr
    filename: StrictStr = "tmp"


class LlamaCompletionBody(LenientBody):
    """``/completion``'s body (llama-server's fields; unknown ones ignored, as it does)."""

    prompt: PromptField = ""
    n_predict: StrictInt = Field(default=-1, ge=-2)
    temperature: Number = Field(default=0.8, ge=0.0, le=2.0)
    top_k: StrictInt = Field(default=40, ge=0)
    top_p: Number = Field(default=0.95, gt=0.0, le=1.0)
    min_p: Number = Field(default=0.05, ge=0.0, le=1.0)
    seed: StrictInt | None = None
    stop: list[StrictStr] | StrictStr | None = None
    stream: StrictBool = False
    cache_prompt: StrictBool = True
    grammar: StrictStr | None = None
    json_schema: dict[str, Any] | None = None
    repeat_penalty: Number = 1.0
    presence_penalty: Number = 0.0
    frequency_penalty: Number = 0.0
    repeat_last_n: StrictInt = 64
    # llama-server's: [[token or text, bias or false]], or {"token or text": bias or false}
    logit_bias: list[list[Any]] | dict[str, Any] | None = None
    ignore_eos: StrictBool = False
    # what this server does not give is refused, not ignored
    n_probs: StrictInt = 0
    return_tokens: StrictBool = False
    response_fields: list[StrictStr] | None = None
    speculative: SpeculativeOverride | None = None

    @model_validator(mode="after")
    def refuse_what_is_not_honoured(self) -> LlamaCompletionBody:
        if self.n_probs:
            raise ValueError("n_probs is not supported (send 0)")
        return self

    _one_prompt = field_validator("prompt")(one_prompt)

    @property
    def text(self) -> str:
        return prompt_text(self.prompt)

    @property
    def tokens(self) -> tuple[int, ...] | None:
        return prompt_ids(self.prompt)


class InfillBody(LlamaCompletionBody):
    """``/infill``'s body: llama.vim's and llama.vscode's fields on top of ``/completion``'s."""

    input_prefix: StrictStr
    input_suffix: StrictStr
    input_extra: list[ExtraChunk] = Field(default_factory=list)
    n_indent: StrictInt = Field(default=0, ge=0)
    t_max_predict_ms: StrictInt = Field(default=0, ge=0)

    def fim(self) -> FimPrompt:
        """The prompt to fill: a prefix that ends inside the cursor's line (not at a new
        line) is that line's start, typed as ``prompt`` is (its last token healed)."""
        if self.tokens:
            raise ApiError(400, "/infill's prompt is text: the cursor's line", param="prompt")
        extra = tuple(ExtraFile(c.text, c.filename) for c in self.input_extra)
        return FimPrompt.at_cursor(self.input_prefix + self.text, self.input_suffix, extra)


class CompletionRoutes:
    def __init__(self, server: RouteHost) -> None:
        self.server = server

    async def completion(self, request: Request) -> Response:
        return await self._handle(request, LlamaCompletionBody, "/completion")

    async def infill(self, request: Request) -> Response:
        return await self._handle(request, InfillBody, "/infill")

    async def _handle(
        self, request: Request, model: type[LlamaCompletionBody], endpoint: str
    ) -> Response:
        server = self.server
        try:
            partition = server.check_caller(request)
            body = server.parse_body(model, await server.read_json(request))
            prompt = body.fim() if isinstance(body, InfillBody) else None
            if prompt is None and not body.text and not body.tokens:
                raise ApiError(400, "prompt is empty: give some text", param="prompt")
            req = server.parse(CompletionRequest, openai_fields(body))
            args = server.generation_args(req, partition, prompt)
            args["settings"] = self._settings(body, args["settings"])
            n_prompt = args.pop("n_prompt")
            warm_up = body.n_predict == 0
            events = await server.start(request, args)
        except ApiError as exc:
            server.ended(endpoint, exc.status)
            return exc.response()
        reply = LlamaReply(server, body, str(args["settings"].mode), endpoint, n_prompt, warm_up)
        if body.stream:
            return StreamingResponse(reply.sse(events), media_type="text/event-stream")
        return await reply.whole(request, events)

    def _bias(self, body: LlamaCompletionBody) -> tuple[tuple[int, float], ...]:
        """llama-server's ``logit_bias``: a token id, or a text standing for each of its
        tokens, with a bias (``false``: never that token)."""
        given = body.logit_bias or []
        pairs = list(given.items()) if isinstance(given, dict) else given
        target = self.server.engine.target
        entries = []
        for pair in pairs:
            if len(pair) != 2:
                raise ApiError(400, "logit_bias: give [token, bias] pairs", param="logit_bias")
            key, value = pair
            if value is False:
                value = -math.inf
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ApiError(400, f"logit_bias: {value!r} is no bias", param="logit_bias")
            if isinstance(key, str) and key.strip().isdecimal() and key.strip().isascii():
                key = int(key)
            tokens = [key] if isinstance(key, int) else None
            if isinstance(key, str):
                tokens = target.tokenize(key, add_special=False, parse_special=False)
            if tokens is None or isinstance(key, bool):
                raise ApiError(400, f"logit_bias: {key!r} is no token", param="logit_bias")
            entries += [(token, float(value)) for token in tokens]
        try:
            LogitBias(tuple(entries)).validate(target.n_vocab)
        except LocalspecError as exc:
            raise ApiError(400, exc.message, param="logit_bias") from None
        return tuple(entries)

    def _settings(
        self, body: LlamaCompletionBody, settings: GenerationSettings
    ) -> GenerationSettings:
        """llama-server's extras: a grammar or a JSON schema, ``cache_prompt`` (a prompt
        that starts as an earlier one reuses its cache: faster, not bit-for-bit the fresh
        result), and ``n_predict: 0``, which reads the prompt only (an editor warming the
        cache) and is run as one token, not sent."""
        changes: dict[str, Any] = {
            "reproducible": not body.cache_prompt,
            "logit_bias": self._bias(body),
            "ignore_eos": body.ignore_eos,
        }
        if body.grammar is not None and body.json_schema is not None:
            raise ApiError(400, "give grammar or json_schema, not both", param="grammar")
        if body.grammar is not None:
            changes["grammar"] = body.grammar
        elif body.json_schema is not None:
            try:
                changes["grammar"] = schema_grammar(body.json_schema)
            except LocalspecError as exc:
                raise ApiError(400, f"json_schema: {exc.message}", param="json_schema") from None
        if body.n_predict == 0:
            changes["max_tokens"] = 1
        elif body.n_predict in UNLIMITED:  # until the model ends or the context is full
            changes["max_tokens"] = None
        return settings.but(**changes)


def openai_fields(body: LlamaCompletionBody) -> dict[str, Any]:
    """The body in the OpenAI completions request's terms (checked there as everywhere)."""
    unlimited = body.n_predict in UNLIMITED  # no limit there: ``_settings`` lifts it
    return {
        # an infill's prompt may be empty: its text is the FIM
        "prompt": list(body.tokens) if body.tokens else (body.text or " "),
        "max_tokens": 1 if unlimited else max(body.n_predict, 1),
        "temperature": body.temperature,
        "top_k": body.top_k,
        "top_p": body.top_p,
        "min_p": body.min_p,
        "seed": body.seed,
        "repeat_penalty": body.repeat_penalty,
        "presence_penalty": body.presence_penalty,
        "frequency_penalty": body.frequency_penalty,
        "repeat_last_n": body.repeat_last_n,
        "stop": body.stop,
        "stream": body.stream,
        "speculative": body.speculative.model_dump(exclude_none=True) if body.speculative else None,
    }


class LlamaReply:
    """One answer in llama-server's shape, whole or streamed; for ``/infill`` the middle is
    cut where it ends (``MiddleEnd``: indentation, time limit, a rejoined suffix, a code
    fence)."""

    def __init__(
        self,
        server: RouteHost,
        body: LlamaCompletionBody,
        mode: str,
        endpoint: str,
        n_prompt: int,
        warm_up: bool,
    ) -> None:
        self.server, self.body, self.mode, self.endpoint = server, body, mode, endpoint
        self.n_prompt, self.warm_up = n_prompt, warm_up
        self.tokens: list[int] = []
        self.middle = (
            MiddleEnd.of(
                body.fim(),
                body.n_indent,
                body.t_max_predict_ms / 1000 if body.t_max_predict_ms else None,
            )
            if isinstance(body, InfillBody)
            else None
        )
        self.first_token_at: float | None = None
        self.has_new_line = False
        self.stopping_word = ""

    def text_of(self, event: RoundEvent) -> str:
        """The event's text as it may be sent (none for a warm-up; held back by the middle's
        end rules while they may still cut it)."""
        if self.warm_up:
            return ""
        self.tokens.extend(event.tokens)
        self.stopping_word = event.stop_word or ""
        now = time.monotonic()
        if self.first_token_at is None:
            self.first_token_at = now
        text = event.text
        if self.middle is not None:
            text = self.middle.feed(text, now - self.first_token_at)
            if event.finish_reason is not None:
                text += self.middle.finish()
        self.has_new_line = self.has_new_line or "\n" in text
        return text

    @property
    def cut(self) -> bool:
        """A middle's end rule ended the answer (the generation is stopped)."""
        return self.middle is not None and self.middle.ended

    def stop_type(self, reason: str) -> str:
        if self.cut or reason == "length":
            return "limit"
        return "word" if self.stopping_word else "eos"

    def prompt_text(self) -> str:
        """The prompt as text (token ids decoded), as llama-server gives it back."""
        tokens = self.body.tokens
        return tokens_text(self.server, tokens) if tokens else self.body.text

    def final(self, content: str, stats: Stats, reason: str) -> dict[str, Any]:
        n_predicted = 0 if self.warm_up else stats.n_tokens
        stats_out = dataclasses.replace(stats, n_tokens=0) if self.warm_up else stats
        result = {
            "index": 0,
            "content": content,
            "tokens": self.tokens if self.body.return_tokens else [],
            "id_slot": -1,
            "stop": True,
            "model": self.server.model_id,
            "tokens_predicted": n_predicted,
            "tokens_evaluated": self.n_prompt,
            "generation_settings": self.generation_settings(),
            "prompt": self.prompt_text(),
            "has_new_line": self.has_new_line,
            "truncated": False,
            "stop_type": self.stop_type(reason),
            "stopping_word": self.stopping_word,
            "tokens_cached": self.n_prompt + n_predicted,
            "timings": timings_block(stats_out),
            "speculative": speculative_block(stats_out, self.mode),
        }
        return self.selected(result)

    def selected(self, result: dict[str, Any]) -> dict[str, Any]:
        """``response_fields``: only those (paths such as ``timings/prompt_n``), by path."""
        if not self.body.response_fields:
            return result
        out: dict[str, Any] = {}
        for path in self.body.response_fields:
            value: Any = result
            for key in path.split("/"):
                value = value.get(key) if isinstance(value, dict) else None
            if value is not None:
                out[path] = value
        return out

    def generation_settings(self) -> dict[str, Any]:
        b = self.body
        return {
            "n_predict": b.n_predict,
            "temperature": b.temperature,
            "top_k": b.top_k,
            "top_p": b.top_p,
            "min_p": b.min_p,
            "seed": -1 if b.seed is None else b.seed,
            "stop": [b.stop] if isinstance(b.stop, str) else list(b.stop or []),
            "stream": b.stream,
            "cache_prompt": b.cache_prompt,
            "speculative.type": self.mode,
        }

    def finish(self, stats: Stats, reason: str) -> str:
        reason = "stop" if self.cut else reason
        if self.warm_up:  # the token that read the prompt is not an answer's (log, metrics)
            stats = dataclasses.replace(stats, n_tokens=0)
        self.server.finished(self.endpoint, self.mode, stats, reason)
        return reason

    async def whole(self, request: Request, events: GenerationStream) -> Response:
        watcher = asyncio.create_task(stop_when_gone(request, events))
        parts: list[str] = []
        last: RoundEvent | None = None
        try:
            async for event in events:
                last = event
                parts.append(self.text_of(event))
                if self.cut:
                    break
        except LocalspecError as exc:
            return self.failed(exc).response()
        finally:
            watcher.cancel()
            await events.aclose()
        if last is None or not (last.finish_reason or self.cut):
            if self.server.stopping:
                return self.failed(ShuttingDown()).response()
            client_gone(self.server, self.endpoint, self.mode)
            return Response(status_code=499)
        reason = self.finish(last.stats, last.finish_reason or "stop")
        return JSONResponse(self.final("".join(parts), last.stats, reason))

    async def sse(self, events: GenerationStream) -> AsyncIterator[str]:
        done = failed = False
        try:
            async for event in events:
                text = self.text_of(event)
                done = event.finish_reason is not None or self.cut
                if done:
                    await events.aclose()  # its slot is free before the client can send again
                    reason = self.finish(event.stats, event.finish_reason or "stop")
                    yield data(self.final(text, event.stats, reason))
                    break
                if text:
                    yield data(self.partial(text, event.stats))
            if not done and self.server.stopping:
                raise ShuttingDown
        except LocalspecError as exc:
            failed = True
            yield data(self.failed(exc).body())
        finally:
            await events.aclose()
            if not (done or failed):  # the client closed the stream (the stream is cancelled)
                client_gone(self.server, self.endpoint, self.mode)

    def partial(self, text: str, stats: Stats) -> dict[str, Any]:
        return self.selected(
            {
                "index": 0,
                "content": text,
                "tokens": list(self.tokens) if self.body.return_tokens else [],
                "stop": False,
                "id_slot": -1,
                "tokens_predicted": stats.n_tokens,
                "tokens_evaluated": self.n_prompt,
            }
        )

    def failed(self, exc: LocalspecError) -> ApiError:
        return generation_failed(self.server, self.endpoint, self.mode, exc)


def data(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"
