"""Keys and commands."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

HELP = """\
# localspec chat

| key | does |
|---|---|
| enter | send the prompt |
| ctrl+j | a new line (also shift+enter, where the terminal tells it from enter) |
| f7 | select the whole prompt (then backspace clears it) |
| esc | stop the answer being generated |
| ctrl+c | stop the answer; with none being generated, quit |
| ctrl+n | new chat |
| ctrl+s / ctrl+o | save / load the conversation (JSON) |
| ctrl+y | copy the last answer |
| ctrl+t | colour tokens that came from accepted drafts, or show answers as Markdown |
| ctrl+p | command palette: switch mode, draft model, draft length... |
| f1 | this help (esc or f1 closes it; arrows and page keys scroll it) |
| ctrl+q | quit |

Pasted text keeps its lines.

Green text came from the drafter and was accepted by the target: every green token cost a
fraction of a normal decoding step. Magenta text came from the speculation memory (the suffix
drafter): what this model wrote in earlier answers, drafted again.

The panel on the right shows the speed now and for the answer, the acceptance rate and mean
acceptance length L, the acceptance per draft position (a1, a2, ...), the share of time spent
drafting vs verifying, and what the adaptive controller is doing (its draft length, or
paused when speculation would cost more than it gives).
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [("escape", "dismiss", "close"), ("f1", "dismiss", "close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 80%; max-width: 90; height: 80%; border: thick $primary;
                            background: $surface; }
    """

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Markdown(HELP)
