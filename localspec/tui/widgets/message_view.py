"""One message of the conversation. Tokens that came from accepted drafts can be shown in
their own colour, which is how speculation becomes visible; ctrl+t switches finished answers
between that view and their Markdown rendering."""

from __future__ import annotations

from rich.console import RenderableType
from rich.markdown import Markdown
from rich.text import Text
from textual.widgets import Static

DRAFT_STYLE = "bold green"
# drafters whose tokens have a colour of their own: what the suffix drafter drew from earlier
# answers is the memory at work, which a user should be able to see
DRAFTER_STYLES = {"suffix": "bold magenta"}


class MessageView(Static):
    DEFAULT_CSS = """
    MessageView { padding: 0 1; margin: 0 0 1 0; }
    MessageView.user { background: $boost; color: $text; }
    MessageView.assistant { color: $text; }
    MessageView.notice { color: $warning; }
    """

    def __init__(self, role: str, text: str = "", colour_drafts: bool = True) -> None:
        super().__init__(classes=role)
        self.role = role
        # each piece, and the drafter it came from ("": the target's own token)
        self.spans: list[tuple[str, str]] = [(text, "")] if text else []
        self.colour_drafts = colour_drafts
        self.complete = role != "assistant" or bool(text)  # complete once generation ends
        self._dirty = True

    @property
    def text(self) -> str:
        return "".join(piece for piece, _ in self.spans)

    def append(self, piece: str, drafted_by: str = "") -> None:
        if piece:
            self.spans.append((piece, drafted_by))
            self._dirty = True

    def set_colour_drafts(self, on: bool) -> None:
        self.colour_drafts = on
        self._dirty = True
        self.flush()

    def finish(self) -> None:
        self.complete = True
        self._dirty = True
        self.flush()

    def flush(self) -> None:
        """Re-render if anything changed (called at a bounded rate while streaming)."""
        if self._dirty:
            self._dirty = False
            self.update(self.renderable())

    def renderable(self) -> RenderableType:
        if self.role == "assistant" and self.complete and not self.colour_drafts:
            return Markdown(self.text)
        return self.as_text()

    def as_text(self) -> Text:
        label = {"user": "you", "assistant": "model"}.get(self.role, self.role)
        out = Text()
        out.append(f"{label}: ", style="bold")
        for piece, drafter in self.spans:
            out.append(piece, style=draft_style(drafter) if self.colour_drafts else "")
        return out


def draft_style(drafter: str) -> str:
    """The colour of accepted drafted tokens ("": the target's own: none)."""
    return DRAFTER_STYLES.get(drafter, DRAFT_STYLE) if drafter else ""
