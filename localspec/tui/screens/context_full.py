"""The conversation no longer fits the context: trim the oldest turns, or start anew."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label


class ContextFullScreen(ModalScreen[str]):
    BINDINGS = [("escape", "choose('cancel')", "cancel")]
    DEFAULT_CSS = """
    ContextFullScreen { align: center middle; }
    ContextFullScreen > Vertical { width: 70; height: auto; border: thick $warning;
                                   background: $surface; padding: 1 2; }
    ContextFullScreen Label { width: 100%; }
    ContextFullScreen Horizontal { height: auto; margin-top: 1; }
    ContextFullScreen Button { margin-right: 2; }
    """

    def __init__(self, n_tokens: int, n_ctx: int) -> None:
        super().__init__()
        self.n_tokens, self.n_ctx = n_tokens, n_ctx

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(
                f"The conversation needs {self.n_tokens} tokens plus room for the "
                f"answer, but the context holds {self.n_ctx}."
            )
            with Horizontal():
                yield Button("Trim oldest turns", id="trim", variant="primary")
                yield Button("New chat", id="new")
                yield Button("Cancel", id="cancel")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id or "cancel")

    def action_choose(self, choice: str) -> None:
        self.dismiss(choice)
