"""The live statistics panel: speed, acceptance per draft position, where the time goes and
what the adaptive controller is doing."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from localspec.engine.stats import Stats

BAR_WIDTH = 10
MAX_POSITIONS = 6  # a1..a6 fit an 80x24 terminal


def bar(fraction: float, width: int = BAR_WIDTH) -> str:
    filled = round(max(0.0, min(1.0, fraction)) * width)
    return "█" * filled + "·" * (width - filled)


class StatsPanel(Static):
    DEFAULT_CSS = """
    StatsPanel { width: 32; padding: 0 1; border-left: solid $primary; height: 1fr; }
    """

    def __init__(self) -> None:
        super().__init__(id="stats")
        self.mode = "-"
        self.speedup: float | None = None  # against plain decoding, when known (probe)
        self.last: Stats | None = None
        self.now_tps = 0.0

    def show(self, stats: Stats | None, now_tps: float = 0.0) -> None:
        self.last, self.now_tps = stats, now_tps
        self.update(self.render_stats())

    def render_stats(self) -> Table:
        grid = Table.grid(padding=(0, 1))
        grid.add_column(style="dim", no_wrap=True)
        grid.add_column(no_wrap=True)
        # a chain one member a line: "suffix+ngram-simple" is wider than the panel
        grid.add_row("mode", self.mode.replace("+", "+\n"))
        s = self.last
        if s is None:
            grid.add_row("", "waiting for a prompt")
            return grid
        grid.add_row("tok/s now", f"{self.now_tps:.1f}")
        grid.add_row("tok/s avg", f"{s.tokens_per_s:.1f}")
        grid.add_row("1st token", f"{s.ttft_ms:.0f} ms")
        grid.add_row("tokens", str(s.n_tokens))
        grid.add_row("accepted", f"{s.accepted}/{s.drafted} {100 * s.acceptance_rate:.0f}%")
        grid.add_row("mean L", f"{s.mean_acceptance_length:.2f}")
        for i, a in enumerate(s.acceptance_per_position[:MAX_POSITIONS], 1):
            grid.add_row(f"a{i}", Text(f"{bar(a)} {100 * a:3.0f}%"))
        busy = s.draft_ms + s.verify_ms
        share = s.draft_ms / busy if busy else 0.0
        grid.add_row("draft/verif", f"{100 * share:.0f}% / {100 * (1 - share):.0f}%")
        grid.add_row("adaptive", f"paused ({s.pauses})" if s.paused else f"draft {s.draft_length}")
        vs_plain = f"{self.speedup:.2f}x probe" if self.speedup else "not probed"
        grid.add_row("vs plain", vs_plain)  # `localspec probe --save` measures it
        return grid
