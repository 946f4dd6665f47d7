"""What every bench report shares: its list flags, its output files checked before a run starts,
and files written whole or not at all."""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from localspec import bench, native
from localspec.errors import LocalspecError
from localspec.fileops import atomic_path, check_output_path


def parse_list(text: str, flag: str, cast=str, sep: str = ",") -> list:  # type: ignore[no-untyped-def]
    try:
        values = [cast(x.strip()) for x in text.split(sep) if x.strip()]
    except (ValueError, argparse.ArgumentTypeError) as exc:
        detail = f" ({exc})" if isinstance(exc, argparse.ArgumentTypeError) else ""
        raise LocalspecError(
            f"{flag} {text!r}: not a comma-separated list of values{detail}",
            "see `localspec bench --help`",
        ) from None
    if not values:
        raise LocalspecError(f"{flag} is empty", "see `localspec bench --help`")
    return values


def write_text(path: str, text: str) -> None:
    with atomic_path(Path(path)) as tmp:
        tmp.write_text(text, encoding="utf-8")


def nothing_measured(args: argparse.Namespace, console: Console, measured: bool) -> bool:
    """Whether a bench stopped (Ctrl-C) before it measured anything: then it writes no file,
    and what an earlier run left under ``--json``, ``--markdown`` or ``--plot`` stays as it
    was (said on the console)."""
    if measured:
        return False
    named = [
        f"{flag} {value}"
        for flag, value in (
            ("--json", args.json),
            ("--markdown", args.markdown),
            ("--plot", getattr(args, "plot", None)),
        )
        if value is not None
    ]
    if named:
        console.print(f"  nothing measured: {', '.join(named)} left as they were")
    return True


def check_outputs(args: argparse.Namespace) -> None:
    """Everything the bench writes or runs at its end is checked before it starts."""
    for flag, value in (
        ("--json", args.json),
        ("--markdown", args.markdown),
        ("--plot", args.plot),
    ):
        if value is not None:
            check_output_path(Path(value), flag)
    if args.plot is not None and importlib.util.find_spec("matplotlib") is None:
        raise LocalspecError(
            "--plot needs matplotlib, which is not installed", "pip install 'localspec[plot]'"
        )
    if args.plot is not None:
        from matplotlib.backend_bases import FigureCanvasBase

        known = FigureCanvasBase.get_supported_filetypes()
        if bench.plot_format(args.plot) not in known:
            raise LocalspecError(
                f"--plot {args.plot}: matplotlib writes no '{bench.plot_format(args.plot)}' images",
                f"end the name with one of: {', '.join('.' + k for k in sorted(known))}",
            )
    if args.native is not None:
        native.check_tool(Path(args.native))


def markdown_table(
    header: str, columns: Sequence[str], rows: Sequence[Sequence[str]], notes: Sequence[str] = ()
) -> str:
    """A bench's table for ``--markdown``: its header in bold, the table, then ``notes`` (what
    the figures say) as a list."""
    lines = [f"**{header}**", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n\n" + "".join(f"- {note}\n" for note in notes)


def print_table(
    console: Console, header: str, columns: Sequence[str], rows: Sequence[Sequence[str]]
) -> None:
    """A bench's table on the console, titled by its header."""
    table = Table(title=header)
    for col in columns:
        table.add_column(col)
    for row in rows:
        table.add_row(*row)
    console.print(table)
