"""A fill-in-the-middle answer of the OpenAI and Ollama routes (``suffix`` on
``/v1/completions`` and ``/api/generate``), ended where the middle rejoins the suffix or
leaves the code.

A model that has filled the gap often goes on writing the code that follows it, which the
editor already has: the text would be inserted twice; a chat-tuned one may close the code
and write about it. ``MiddleEnd`` (``engine/fim.py``) sees both coming; here its rules are
applied to a generation's events as they arrive,
and the generation is stopped once the middle has ended. (``/infill`` applies the same
rules with llama-server's own fields, ``n_indent`` and ``t_max_predict_ms``.)
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from localspec.engine.fim import FimPrompt, MiddleEnd
from localspec.engine.loop import RoundEvent

if TYPE_CHECKING:
    from localspec.server.runner import GenerationStream


class MiddleStream:
    """``events`` with each text cut by the middle's end rules (what a rule may still cut is
    held back until decided); once the middle has ended, the last event says ``stop`` and
    the generation is stopped."""

    def __init__(self, events: GenerationStream, fim: FimPrompt) -> None:
        self.events = events
        self.middle = MiddleEnd.of(fim)
        self._done = False

    def __aiter__(self) -> MiddleStream:
        return self

    async def __anext__(self) -> RoundEvent:
        if self._done:
            raise StopAsyncIteration
        event = await self.events.__anext__()
        text = self.middle.feed(event.text)
        if event.finish_reason is not None:
            text += self.middle.finish()
        if not self.middle.ended:
            return dataclasses.replace(event, text=text)
        self._done = True
        await self.events.aclose()  # the rest would repeat the suffix
        return dataclasses.replace(event, text=text, finish_reason="stop", stop_word=None)

    async def aclose(self) -> None:
        await self.events.aclose()

    def __getattr__(self, name: str) -> Any:  # what else a reply reads of its stream
        return getattr(self.events, name)


def ended_at_suffix(events: GenerationStream, prompt: object) -> GenerationStream:
    """The events of a generation of ``prompt``: a middle to fill is cut where its end rules
    say (with an empty suffix too: the cursor at the file's end); any other prompt's events
    as they are."""
    if isinstance(prompt, FimPrompt):
        return MiddleStream(events, prompt)  # type: ignore[return-value]
    return events
