"""The scrolling list of messages."""

from __future__ import annotations

from textual.containers import VerticalScroll

from localspec.tui.widgets.message_view import MessageView


class Conversation(VerticalScroll):
    DEFAULT_CSS = """
    Conversation { height: 1fr; width: 1fr; }
    """

    def __init__(self) -> None:
        super().__init__(id="conversation")
        self.colour_drafts = True

    def add(self, role: str, text: str = "") -> MessageView:
        view = MessageView(role, text, self.colour_drafts)
        self.mount(view)
        view.flush()
        self.scroll_end(animate=False)
        return view

    def views(self) -> list[MessageView]:
        return list(self.query(MessageView))

    def set_colour_drafts(self, on: bool) -> None:
        self.colour_drafts = on
        for view in self.views():
            view.set_colour_drafts(on)
