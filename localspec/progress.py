"""Progress display for long steps (downloads, joins, checksums, requantization).

Uses rich on a terminal and stays silent otherwise, so `--json` output and tests are clean.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)


@contextlib.contextmanager
def byte_progress(description: str, total: int | None) -> Iterator[Callable[[int], None]]:
    """Yield an ``advance(n_bytes)`` callback; shows a bar on stderr when it is a terminal."""
    if not sys.stderr.isatty():
        yield lambda _n: None
        return
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n: bar.advance(task, n)


def status(message: str) -> None:
    """One line of what is happening, on stderr (stdout is for the answer)."""
    print(message, file=sys.stderr, flush=True)


PIPED_WIDTH = 160  # rich folds tables into 80 columns when not on a terminal: cells get cut


def report_console(stderr: bool = False) -> Console:
    """Where a command prints its tables: the terminal's width, or a wide one when piped."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else PIPED_WIDTH)


def plural(count: int, noun: str) -> str:
    """``1 wheel``, ``2 wheels``: a count in words a user reads."""
    return f"{count} {noun}{'' if count == 1 else 's'}"
