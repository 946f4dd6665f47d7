"""Tool calls out of a stream of text: content goes out as it comes, a call goes out whole
as soon as its block closes, and nothing that might open a call is sent as content.

OpenAI streams a call as ``delta.tool_calls`` entries: the first for a call carries its
``index``, ``id``, ``type`` and ``function.name`` (arguments ""); the next ones append to
``function.arguments``. Clients (the openai SDK, LangChain) accumulate by ``index``.
"""

from __future__ import annotations

from typing import Any

from localspec.engine.toolcalls import Llama3Format, ToolCall, ToolFormat

BARE_OPENERS = ("```", "{", "<|python_tag|>")


class ToolCallStream:
    def __init__(self, fmt: ToolFormat) -> None:
        self.fmt = fmt
        self.pending = ""  # text held back: inside calls, or maybe the start of one
        self.in_calls = False
        self.sent = 0  # calls already sent
        self.content_sent = False

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        """New content to send, and calls completed by this text."""
        self.pending += text
        if not self.in_calls:
            content = self._content()
            if not self.in_calls:
                return content, []
        else:
            content = ""
        complete = self.fmt.complete_blocks(self.pending)
        if complete <= self.sent:
            return content, []
        _, calls = self.fmt.parse(self.pending[: self._end_of_block(complete)])
        new = calls[self.sent :]
        self.sent = len(calls)
        return content, new

    def finish(self) -> tuple[str, list[ToolCall]]:
        """At the end: the calls not sent yet; or, if the held text was no call after
        all, that text as content."""
        if not self.in_calls:
            rest, self.pending = self.pending, ""
            return rest, []
        content, calls = self.fmt.parse(self.pending)
        if not calls:
            rest, self.pending = self.pending, ""
            return rest, []
        new = calls[self.sent :]
        self.sent = len(calls)
        return content or "", new  # text around the blocks

    @property
    def called(self) -> bool:
        return self.sent > 0

    def _content(self) -> str:
        opener = self.fmt.opener
        if not self.content_sent:
            # an answer that opens like a bare call is held until it ends (see bare_call)
            stripped = self.pending.lstrip()
            if any(o.startswith(stripped) for o in BARE_OPENERS):
                return ""  # too short to tell (empty included)
            if stripped.startswith(BARE_OPENERS):
                self.in_calls = True
                return ""
            if isinstance(self.fmt, Llama3Format):
                return self._send_all()
        elif isinstance(self.fmt, Llama3Format):
            return self._send_all()
        at = self.pending.find(opener)
        if at >= 0:
            content, self.pending = self.pending[:at], self.pending[at:]
            self.in_calls = True
            self.content_sent |= bool(content)
            return content
        keep = _partial_opener(self.pending, opener)
        content = self.pending[: len(self.pending) - keep]
        self.pending = self.pending[len(content) :]
        self.content_sent |= bool(content)
        return content

    def _send_all(self) -> str:
        content, self.pending = self.pending, ""
        self.content_sent = True
        return content

    def _end_of_block(self, n: int) -> int:
        end = -1
        for _ in range(n):
            end = self.pending.index("</tool_call>", end + 1)
        return end + len("</tool_call>")


def _partial_opener(text: str, opener: str) -> int:
    """The length of the longest end of ``text`` that starts ``opener``."""
    for n in range(min(len(opener) - 1, len(text)), 0, -1):
        if opener.startswith(text[-n:]):
            return n
    return 0


def text_and_calls(
    tools: ToolCallStream | None, text: str, last: bool
) -> tuple[str, list[ToolCall]]:
    """A streamed event's text to send, less what may belong to a tool call, and the calls
    it completed (``last``: the answer ends here, and whatever was held back comes out)."""
    if tools is None:
        return text, []
    content, calls = tools.feed(text)
    if last:
        rest, more = tools.finish()
        content, calls = content + rest, calls + more
    return content, calls


def call_deltas(calls: list[ToolCall], first_index: int) -> list[dict[str, Any]]:
    """OpenAI's delta entries for whole calls: head (id, name) then the arguments."""
    deltas = []
    for i, call in enumerate(calls, start=first_index):
        head = call.as_openai(i)
        head["function"] = {"name": call.name, "arguments": ""}
        deltas.append({"tool_calls": [head]})
        deltas.append({"tool_calls": [{"index": i, "function": {"arguments": call.arguments}}]})
    return deltas
