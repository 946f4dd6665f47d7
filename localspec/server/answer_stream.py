"""A streamed answer as the event-based APIs write it (Anthropic's Messages, OpenAI's
Responses): what every one of them does alike, around what each writes in its own events.

The answer's text goes out as it comes and each tool call whole as soon as it closes
(``ToolCallStream``); at the end come the API's closing events; a client that closes the
stream stops the generation (counted as gone); a failure once the status line is sent is an
error event that ends the stream, counted as the failure it was."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Protocol

from localspec.engine.loop import RoundEvent
from localspec.engine.toolcalls import ToolCall, ToolFormat
from localspec.errors import LocalspecError
from localspec.server.reply import Reply, ShuttingDown
from localspec.server.shapes import ApiError
from localspec.server.tool_stream import ToolCallStream, text_and_calls

if TYPE_CHECKING:
    from localspec.server.runner import GenerationStream

log = logging.getLogger("localspec.server")


class EventWriter(Protocol):
    """One API's events for a streamed answer."""

    def opening(self) -> Iterator[str]: ...
    def text(self, text: str) -> Iterator[str]: ...
    def call(self, call: ToolCall) -> Iterator[str]: ...
    def closing(self, last: RoundEvent, called: bool) -> tuple[str, Iterator[str]]:
        """The reason the answer ended (as the metrics count it) and the last events."""
        ...

    def error(self, error: ApiError) -> str: ...


async def streamed(
    writer: EventWriter,
    events: GenerationStream,
    tool_format: ToolFormat | None,
    accounting: Reply,
) -> AsyncIterator[str]:
    """The answer's events; ``accounting`` counts its end, its failure or its client's
    leaving, as the chat routes' replies do."""
    server, endpoint, mode = accounting.server, accounting.endpoint, accounting.mode
    last, failed, reason = None, False, ""
    tools = ToolCallStream(tool_format) if tool_format is not None else None
    try:
        for chunk in writer.opening():
            yield chunk
        async for event in events:
            last = event
            text, calls = text_and_calls(tools, event.text, event.finish_reason is not None)
            for chunk in writer.text(text):
                yield chunk
            for call in calls:
                for chunk in writer.call(call):
                    yield chunk
        if last is None or not last.finish_reason:
            if server.stopping:
                raise ShuttingDown
            return  # the client closed the stream: counted below
        reason, closing = writer.closing(last, tools is not None and tools.called)
        for chunk in closing:
            yield chunk
    except LocalspecError as exc:
        failed = True
        yield writer.error(accounting.failed(exc))
    except Exception as exc:  # the status line is sent: say it in the stream
        failed = True
        log.exception("%s: generation failed", endpoint)
        failure = ApiError(500, f"generation failed: {type(exc).__name__}", "server_error")
        server.ended(endpoint, failure.status)
        yield writer.error(failure)
    finally:
        await events.aclose()
        if reason and last is not None:
            server.finished(endpoint, mode, last.stats, reason)
        elif not failed:  # the client closed the stream
            accounting.gone()
