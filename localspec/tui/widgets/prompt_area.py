"""The prompt: a text area that grows with what is typed or pasted. Enter sends; ctrl+j (or
shift+enter, where the terminal tells it from enter) starts a new line. Pasted code or mail
keeps its lines (a one-line input would keep only the first)."""

from __future__ import annotations

from dataclasses import dataclass

from textual import events
from textual.message import Message
from textual.widgets import TextArea

MAX_LINES = 8  # beyond this the prompt scrolls: the conversation keeps the screen


class PromptArea(TextArea):
    DEFAULT_CSS = f"""
    PromptArea {{ height: auto; min-height: 3; max-height: {MAX_LINES + 2};
                  border: tall $border-blurred; padding: 0 1; }}
    PromptArea:focus {{ border: tall $border; }}
    """
    NEWLINE_KEYS = ("ctrl+j", "shift+enter")

    @dataclass
    class Submitted(Message):
        """Enter was pressed: ``value`` is the prompt's text."""

        prompt: PromptArea
        value: str

        @property
        def control(self) -> PromptArea:
            return self.prompt

    def __init__(self, placeholder: str, id: str | None = None) -> None:
        super().__init__(
            id=id,
            placeholder=placeholder,
            soft_wrap=True,
            show_line_numbers=False,
            highlight_cursor_line=False,
            tab_behavior="focus",
        )

    @property
    def value(self) -> str:
        return self.text

    @value.setter
    def value(self, text: str) -> None:
        self.text = text
        self.move_cursor(self.document.end)

    async def _on_key(self, event: events.Key) -> None:
        # here, in the order keys came, not as bindings: a priority binding runs as the key
        # arrives, before the keys typed just ahead of it (a pasted "text\r" sent nothing)
        if event.key == "enter" or event.key in self.NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            if event.key == "enter":
                self.post_message(self.Submitted(self, self.text))
            else:
                self.insert("\n")
            return
        await super()._on_key(event)
