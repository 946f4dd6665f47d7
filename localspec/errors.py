"""One exception type for every problem a user can fix.

Every message says what is wrong, where (file, field or flag) and what to do. The CLI prints
it without a traceback and exits with status 2; library callers can catch it.
"""

from __future__ import annotations


class LocalspecError(Exception):
    """A problem with the user's input or environment, with a hint on how to fix it."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}\n  hint: {self.hint}" if self.hint else self.message


class EngineFailure(LocalspecError):
    """llama.cpp failed while generating: not the request's fault (a server answers 500)."""


class GenerationCancelled(LocalspecError):
    """The caller's ``cancelled`` check said stop before the first token (while the prompt
    was being read, or the verify costs measured)."""

    def __init__(self, during: str = "the prompt was being read") -> None:
        super().__init__(f"the generation was cancelled while {during}")
