"""One response in OpenAI's shape: a whole JSON body, or a stream of server-sent chunks.

Streams follow OpenAI exactly, because clients parse them strictly: the first chat chunk
carries ``role``; with ``stream_options.include_usage`` every chunk has ``usage: null``
and the usage comes on a last chunk with empty ``choices``; an error after the stream
started ends it with an error event and ``[DONE]`` (the status line is already sent).
A whole response whose client goes away stops its generation within a round.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from localspec.engine.loop import RoundEvent, TokenLogprob
from localspec.engine.stats import Stats, combined
from localspec.engine.toolcalls import ToolFormat
from localspec.errors import EngineFailure, GenerationCancelled, LocalspecError
from localspec.server.runner import ChoiceStreams, GenerationStream
from localspec.server.schemas import ChatRequest, CompletionRequest
from localspec.server.shapes import ApiError
from localspec.server.tool_stream import ToolCallStream, call_deltas, text_and_calls

log = logging.getLogger("localspec.server")
DISCONNECT_POLL_S = 0.2
COMPLETION_LOGPROBS = ("tokens", "token_logprobs", "top_logprobs", "text_offset")


class ReplyHost(Protocol):
    """What a reply needs from the server (``server.app.Server``)."""

    def envelope(self, chat: bool, rid: str) -> dict[str, Any]: ...
    def extras(self, stats: Stats, mode: str) -> dict[str, Any]: ...
    def finished(self, endpoint: str, mode: str, stats: Stats, reason: str) -> None: ...
    def ended(self, endpoint: str, status: int) -> None: ...
    def token_bytes(self, token: int) -> bytes: ...
    @property
    def stopping(self) -> bool: ...


class Reply:
    def __init__(
        self,
        server: ReplyHost,
        req: ChatRequest | CompletionRequest,
        mode: str,
        endpoint: str,
        tool_format: ToolFormat | None = None,
        scored: list[tuple[int, TokenLogprob | None]] | None = None,
    ) -> None:
        """``tool_format``: how the model writes tool calls, when it was shown tools.
        ``scored``: the echoed prompt's tokens with their log-probabilities (``echo`` with
        ``logprobs``)."""
        self.server, self.req, self.mode, self.endpoint = server, req, mode, endpoint
        self.tool_format = tool_format
        self.prompt_logprobs = self.prompt_part(scored) if scored is not None else None
        self.chat = isinstance(req, ChatRequest)
        self.rid = f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.echo = self.prompt_text(req) if isinstance(req, CompletionRequest) and req.echo else ""
        self.n = req.n
        # text_offset of each choice's next token (completions logprobs), in characters of
        # its text: a token that ends inside a character adds none until it is complete
        self.offsets = [len(self.echo)] * self.n
        self.decoders = [utf8_decoder() for _ in range(self.n)]

    # ----- logprobs ---------------------------------------------------------------------------

    def prompt_text(self, req: CompletionRequest) -> str:
        """The prompt as text (a prompt of token ids, decoded)."""
        return req.text if req.tokens is None else tokens_text(self.server, req.tokens)

    def _token(self, token: int, logprob: float) -> dict[str, Any]:
        """OpenAI's shape: the token as text (``\\x..`` escapes for bytes that are only part
        of a character) and its exact bytes, which rebuild the text when joined."""
        raw = self.server.token_bytes(token)
        text = raw.decode("utf-8", errors="backslashreplace")
        return {"token": text, "logprob": logprob, "bytes": list(raw)}

    def _entry(self, token: int, lp: TokenLogprob) -> dict[str, Any]:
        return {
            **self._token(token, lp[0]),
            "top_logprobs": [self._token(i, v) for i, v in lp[1]],
        }

    def prompt_part(self, scored: list[tuple[int, TokenLogprob | None]]) -> dict[str, Any]:
        """The echoed prompt in the completions logprobs shape: the first token has no
        log-probability (nothing comes before it), offsets count the prompt's characters."""
        return self._completion_part(scored, utf8_decoder(), 0)[0]

    def _completion_part(
        self, scored: Iterable[tuple[int, TokenLogprob | None]], decoder: Any, at: int
    ) -> tuple[dict[str, Any], int]:
        """Tokens in the completions logprobs shape, their ``text_offset`` counted from
        ``at`` in characters (``decoder`` carries a character split across tokens); and the
        offset after them."""
        part: dict[str, list[Any]] = {k: [] for k in COMPLETION_LOGPROBS}
        for token, lp in scored:
            raw = self.server.token_bytes(token)
            part["tokens"].append(raw.decode("utf-8", errors="backslashreplace"))
            part["token_logprobs"].append(None if lp is None else lp[0])
            part["top_logprobs"].append(
                None if lp is None else {self._token(i, v)["token"]: v for i, v in lp[1]}
            )
            part["text_offset"].append(at)
            at += len(decoder.decode(raw))
        return part, at

    def echoed(self, n_prompt: int) -> Response:
        """``max_tokens: 0`` with ``echo``: the prompt alone (scored, with ``logprobs``), as
        evaluation harnesses ask for it."""
        stats = Stats(n_prompt=n_prompt)
        self.server.finished(self.endpoint, self.mode, stats, "length")
        extras = self.server.extras(stats, self.mode)
        if self.req.stream:
            return StreamingResponse(self._echoed_chunks(extras), media_type="text/event-stream")
        echo = {"text": self.echo, "logprobs": self.prompt_logprobs, "finish_reason": "length"}
        choices = [{"index": i, **echo} for i in range(self.n)]
        body = {**self.server.envelope(self.chat, self.rid), "choices": choices, **extras}
        return JSONResponse(body)

    async def _echoed_chunks(self, extras: dict[str, Any]) -> AsyncIterator[str]:
        usage = self.req.include_usage
        for i in range(self.n):
            last = None if usage or i < self.n - 1 else extras
            yield self.chunk(self.echo, self.prompt_logprobs, "length", last, i)
        if usage:
            yield data({**self._head(), "choices": [], **extras})
        yield "data: [DONE]\n\n"

    def logprobs(self, event: RoundEvent, index: int = 0) -> dict[str, Any] | None:
        """This event of choice ``index``: its tokens in the endpoint's logprobs shape (None:
        not asked for)."""
        if not event.logprobs:
            return None
        scored = list(zip(event.tokens, event.logprobs, strict=False))
        if self.chat:
            return {"content": [self._entry(t, lp) for t, lp in scored]}
        part, self.offsets[index] = self._completion_part(
            scored, self.decoders[index], self.offsets[index]
        )
        return part

    @staticmethod
    def merged(parts: list[dict[str, Any]]) -> dict[str, Any] | None:
        if not parts:
            return None
        return {key: [x for p in parts for x in p[key]] for key in parts[0]}

    # ----- a whole response -------------------------------------------------------------------

    async def whole(self, request: Request, events: ChoiceStreams) -> Response:
        watcher = asyncio.create_task(stop_when_gone(request, events))
        texts = [[self.echo] for _ in range(self.n)]
        echoed = [self.prompt_logprobs] if self.prompt_logprobs is not None else []
        lps: list[list[dict[str, Any]]] = [list(echoed) for _ in range(self.n)]
        lasts: list[RoundEvent | None] = [None] * self.n
        try:
            async for index, event in events:
                texts[index].append(event.text)
                if (lp := self.logprobs(event, index)) is not None:
                    lps[index].append(lp)
                lasts[index] = event
        except LocalspecError as exc:
            await events.aclose()
            return self.failed(exc).response()
        finally:
            watcher.cancel()
        ended = [last for last in lasts if last is not None and last.finish_reason]
        if len(ended) < self.n:
            if self.server.stopping:  # stopped because the server is stopping
                return self.failed(ShuttingDown()).response()
            self.gone()
            return Response(status_code=499)
        choices = [
            self.whole_choice(i, "".join(texts[i]), lps[i], last) for i, last in enumerate(ended)
        ]
        stats = combined([last.stats for last in ended])
        self.server.finished(self.endpoint, self.mode, stats, choices[0]["finish_reason"])
        body = {
            **self.server.envelope(self.chat, self.rid),
            "choices": choices,
            **self.server.extras(stats, self.mode),
        }
        return JSONResponse(body)

    def whole_choice(
        self, index: int, text: str, lps: list[dict[str, Any]], last: RoundEvent
    ) -> dict[str, Any]:
        reason = last.finish_reason
        assert reason is not None
        choice: dict[str, Any] = {"index": index}
        if self.chat:
            choice["message"] = message = {"role": "assistant", "content": text}
            if self.tool_format is not None:
                content, calls = self.tool_format.parse(text)
                if calls:
                    message["content"] = content
                    message["tool_calls"] = [call.as_openai() for call in calls]
                    reason = tool_reason(reason)
        else:
            choice["text"] = text
        choice.update(logprobs=self.merged(lps), finish_reason=reason)
        return choice

    # ----- a stream ---------------------------------------------------------------------------

    def _head(self) -> dict[str, Any]:
        head = self.server.envelope(self.chat, self.rid)
        head["object"] = "chat.completion.chunk" if self.chat else "text_completion"
        if self.req.include_usage:
            head["usage"] = None
        return head

    def chunk(
        self,
        delta: dict[str, Any] | str,
        logprobs: dict[str, Any] | None = None,
        reason: str | None = None,
        extras: dict[str, Any] | None = None,
        index: int = 0,
    ) -> str:
        if self.chat:
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
        else:
            choice = {"index": index, "text": delta, "logprobs": logprobs, "finish_reason": reason}
        return data({**self._head(), "choices": [choice], **(extras or {})})

    def _deltas(self, event: RoundEvent, tools: ToolCallStream | None) -> list[dict[str, Any]]:
        """A chat event's deltas: its text, less what may belong to a tool call, and the
        calls it completed (at the end, whatever was held back)."""
        content, calls = text_and_calls(tools, event.text, event.finish_reason is not None)
        deltas = [{"content": content}] if content else []
        if tools is None:
            return deltas
        return deltas + call_deltas(calls, tools.sent - len(calls))

    async def sse(self, events: ChoiceStreams) -> AsyncIterator[str]:
        lasts: list[RoundEvent | None] = [None] * self.n
        failed = False
        tools = [
            ToolCallStream(self.tool_format) if self.tool_format is not None else None
            for _ in range(self.n)
        ]
        try:
            for i in range(self.n):
                if self.chat:
                    yield self.chunk({"role": "assistant", "content": ""}, index=i)
                elif self.echo:
                    yield self.chunk(self.echo, self.prompt_logprobs, index=i)
            async for i, event in events:
                lasts[i] = event
                for chunk in self.event_chunks(i, event, tools[i], lasts):
                    yield chunk
            ended = [last for last in lasts if last is not None and last.finish_reason]
            if self.req.include_usage and len(ended) == self.n:
                extras = self.server.extras(combined([e.stats for e in ended]), self.mode)
                yield data({**self._head(), "choices": [], **extras})
            if len(ended) < self.n and self.server.stopping:
                raise ShuttingDown
        except LocalspecError as exc:
            failed = True
            yield data(self.failed(exc).body())
        except Exception as exc:  # the status line is sent: say it in the stream
            failed = True
            log.exception("%s: generation failed", self.endpoint)
            failure = ApiError(500, f"generation failed: {type(exc).__name__}", "server_error")
            self.server.ended(self.endpoint, failure.status)
            yield data(failure.body())
        finally:
            await events.aclose()
            ended = [last for last in lasts if last is not None and last.finish_reason]
            if len(ended) == self.n:
                stats = combined([e.stats for e in ended])
                self.server.finished(self.endpoint, self.mode, stats, str(ended[0].finish_reason))
            elif not failed:  # the client closed the stream
                self.gone()
            elif any(lasts) and not self.server.stopping:
                log.info(
                    "%s %s: client went away after %d tokens",
                    self.endpoint,
                    self.mode,
                    sum(last.stats.n_tokens for last in lasts if last is not None),
                )
        yield "data: [DONE]\n\n"

    def event_chunks(
        self,
        index: int,
        event: RoundEvent,
        tools: ToolCallStream | None,
        lasts: list[RoundEvent | None],
    ) -> list[str]:
        """The chunks of one event of choice ``index`` (``lasts``: every choice's last event
        so far). Without ``include_usage`` the usage, timings and speculation of all the
        choices ride on the last choice's last chunk."""
        ended = [e for e in lasts if e is not None and e.finish_reason]
        done = len(ended) == self.n and event.finish_reason is not None
        extras = None
        if done and not self.req.include_usage:
            extras = self.server.extras(combined([e.stats for e in ended]), self.mode)
        logprobs = self.logprobs(event, index)
        if not self.chat:
            return [self.chunk(event.text, logprobs, event.finish_reason, extras, index)]
        deltas = self._deltas(event, tools)
        chunks = [self.chunk(delta, index=index) for delta in deltas[:-1]]
        reason = event.finish_reason
        if reason is not None and tools is not None and tools.called:
            reason = tool_reason(reason)
        chunks.append(self.chunk(deltas[-1] if deltas else {}, logprobs, reason, extras, index))
        return chunks

    def failed(self, exc: LocalspecError) -> ApiError:
        return generation_failed(self.server, self.endpoint, self.mode, exc)

    def gone(self) -> None:
        client_gone(self.server, self.endpoint, self.mode)


def generation_failed(server: ReplyHost, endpoint: str, mode: str, exc: LocalspecError) -> ApiError:
    """The API error of a generation that raised, counted in the metrics (every API's
    replies share it, each writing the error in its own shape)."""
    if isinstance(exc, GenerationCancelled) and not server.stopping:
        log.info("%s %s: client went away before the first token", endpoint, mode)
        error = ApiError(499, "client closed the request")
    elif isinstance(exc, GenerationCancelled):  # stopped before its first token
        error = generation_error(ShuttingDown(), f"{endpoint} {mode}")
    else:
        error = generation_error(exc, f"{endpoint} {mode}")
    server.ended(endpoint, error.status)
    return error


def client_gone(server: ReplyHost, endpoint: str, mode: str) -> None:
    """The client left while its answer was being generated: the generation was stopped."""
    log.info("%s %s: client went away, generation stopped", endpoint, mode)
    server.ended(endpoint, 499)


def generation_error(exc: LocalspecError, where: str) -> ApiError:
    """The API error of a generation that raised: the request's fault (400), the engine's
    (500, logged) or the server's stop (503)."""
    if isinstance(exc, ShuttingDown):
        log.info("%s: stopped, the server is shutting down", where)
        return ApiError(503, exc.message, "server_error")
    if isinstance(exc, EngineFailure):
        log.error("%s: generation failed: %s", where, exc.message)
        return ApiError(500, f"generation failed: {exc.message}", "server_error")
    return ApiError(400, exc.message)


class ShuttingDown(LocalspecError):
    def __init__(self) -> None:
        super().__init__("the server is shutting down: the generation was stopped")


def tool_reason(reason: str) -> str:
    """OpenAI's finish_reason for an answer that called tools (a cut one stays "length")."""
    return "tool_calls" if reason == "stop" else reason


def data(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"


async def stop_when_gone(request: Request, events: GenerationStream | ChoiceStreams) -> None:
    """Stop the generation when the client of a whole (non-streamed) response goes away."""
    while not await request.is_disconnected():
        await asyncio.sleep(DISCONNECT_POLL_S)
    await events.aclose()


def utf8_decoder() -> codecs.IncrementalDecoder:
    return codecs.getincrementaldecoder("utf-8")(errors="replace")


def tokens_text(server: ReplyHost, tokens: Iterable[int]) -> str:
    """The text of token ids given as a prompt."""
    return b"".join(map(server.token_bytes, tokens)).decode("utf-8", "replace")


async def gathered(request: Request, events: GenerationStream) -> tuple[str, RoundEvent | None]:
    """A whole answer's text and its last event, the generation stopped within a round if
    the client goes away (the last event then has no finish reason: ``unfinished``). The
    ``LocalspecError`` of a failed generation goes to the caller, to say in its API's shape."""
    watcher = asyncio.create_task(stop_when_gone(request, events))
    texts, last = [], None
    try:
        async for event in events:
            texts.append(event.text)
            last = event
    finally:
        watcher.cancel()
    return "".join(texts), last


def unfinished(
    server: ReplyHost,
    last: RoundEvent | None,
    failed: Callable[[LocalspecError], Response],
    gone: Callable[[], None],
) -> Response | None:
    """What answers a whole answer that did not finish (None: it finished): the server is
    stopping (``failed``, in the API's shape), or the client left (counted, 499)."""
    if last is not None and last.finish_reason:
        return None
    if server.stopping:
        return failed(ShuttingDown())
    gone()
    return Response(status_code=499)
