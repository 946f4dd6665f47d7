"""Messages the worker threads post to the UI (Textual messages are thread-safe to post)."""

from __future__ import annotations

from textual.message import Message

from localspec.api import Engine
from localspec.errors import LocalspecError


class EngineReady(Message):
    def __init__(self, engine: Engine) -> None:
        super().__init__()
        self.engine = engine


class EngineFailed(Message):
    def __init__(self, error: LocalspecError) -> None:
        super().__init__()
        self.error = error


class AnswerFinished(Message):
    def __init__(self, text: str, finish_reason: str, cancelled: bool, chat: object) -> None:
        super().__init__()
        self.text = text
        self.finish_reason = finish_reason
        self.cancelled = cancelled
        self.chat = chat  # the conversation it answers (a new or loaded one drops it)


class GenerationFailed(Message):
    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


class LoadProgress(Message):
    def __init__(self, what: str, fraction: float) -> None:
        super().__init__()
        self.what = what
        self.fraction = fraction
