"""Progress display for long steps (downloads, joins, checksums, requantization).

Uses rich on a terminal and stays silent otherwise, so `--json` output and tests are clean.
"""

from __future__ import annotations

import contextlib
import logging
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


STATUS = logging.getLogger("localspec.status")


def status(message: str, warning: bool = False) -> None:
    """One line of what is happening. The command line shows each on stderr (stdout is for
    the answer); a program using the Python API gets log records of ``localspec.status``
    (INFO; WARNING for what may need the user's attention), shown as it sets up logging:
    by default only the warnings, as a library should."""
    STATUS.log(logging.WARNING if warning else logging.INFO, message)


class _StderrLines(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        print(record.getMessage(), file=sys.stderr, flush=True)  # stderr as it is now


def show_status_lines() -> None:
    """The command line's setting: every status line on stderr, as it is."""
    if not any(isinstance(h, _StderrLines) for h in STATUS.handlers):
        STATUS.addHandler(_StderrLines())
    STATUS.setLevel(logging.INFO)
    STATUS.propagate = False


PIPED_WIDTH = 160  # rich folds tables into 80 columns when not on a terminal: cells get cut


def report_console(stderr: bool = False) -> Console:
    """Where a command prints its tables: the terminal's width, or a wide one when piped,
    where its lines of text are not wrapped either (a file or a program reads them whole)."""
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=PIPED_WIDTH, soft_wrap=True)


def plural(count: int, noun: str) -> str:
    """``1 wheel``, ``2 wheels``: a count in words a user reads."""
    return f"{count} {noun}{'' if count == 1 else 's'}"
