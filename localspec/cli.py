"""The ``localspec`` command."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import errno
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from localspec.commands import bench, chat, doctor, models, pairs, probe, pull, run, serve
from localspec.errors import LocalspecError
from localspec.interrupts import install_interrupt_handler
from localspec.progress import show_status_lines

COMMANDS = (run, pairs, models, pull, probe, chat, bench, doctor, serve)  # help lists them so


class Parser(argparse.ArgumentParser):
    """argparse, with a bad flag said in one line and a hint instead of the usage block."""

    def error(self, message: str, prog: str | None = None, hint: str = "") -> NoReturn:
        prog = prog or self.prog
        hint = hint or self._meant_command(message) or f"see `{prog} --help`"
        self.exit(2, f"{prog}: error: {message}\n  hint: {hint}\n")

    def parse_args(self, args=None, namespace=None):  # type: ignore[no-untyped-def,override]
        """As argparse, but a flag no command knows points to that command's help, or to
        the flag it was meant to be."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = getattr(parsed, "command", None)
            prog = f"{self.prog} {command}" if command else self.prog
            hint = self._meant(command, extras)
            self.error(f"unrecognized arguments: {' '.join(extras)}", prog, hint)
        return parsed

    def _meant(self, command: str | None, extras: list[str]) -> str:
        """``did you mean --parallel?`` for a mistyped flag of ``command``, or nothing."""
        flags = [e.split("=", 1)[0] for e in extras if e.startswith("--")]
        parser = self._command_parsers().get(command or "")
        if not flags or parser is None:
            return ""
        known = [f for f in parser._option_string_actions if f.startswith("--")]
        return _did_you_mean(flags[0], known, 0.75, parser.prog)

    def _meant_command(self, message: str) -> str:
        """``did you mean serve?`` for a mistyped command, or nothing."""
        typed = re.match(r"argument command: invalid choice: '([^']*)'", message)
        return (
            _did_you_mean(typed[1], list(self._command_parsers()), 0.6, self.prog) if typed else ""
        )

    def _command_parsers(self) -> dict[str, argparse.ArgumentParser]:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                return dict(action.choices)
        return {}


def _did_you_mean(typed: str, known: list[str], cutoff: float, prog: str) -> str:
    """The hint for a mistyped ``typed``: the closest of ``known``, or nothing."""
    close = difflib.get_close_matches(typed, known, n=1, cutoff=cutoff)
    return f"did you mean {close[0]}? (`{prog} --help` lists them)" if close else ""


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="localspec", description="Lossless speculative decoding for local LLMs.")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


# failures of the machine, not of localspec: a full disk, a quota, a read-only or failing device
ENVIRONMENT_HINTS = {
    errno.ENOSPC: "free some space, or write elsewhere",
    errno.EDQUOT: "free some space, or write elsewhere",
    errno.EFBIG: "write elsewhere (a file system without that size limit)",
    errno.EROFS: "write elsewhere: that file system is read-only",
    errno.EIO: "check the disk (dmesg), then run again",
}


def machine_failed(exc: OSError) -> str:
    """One line for a file operation the machine refused. Standard output (a full disk,
    /dev/full) is pointed at /dev/null: Python's exit would try to flush it again, and fail."""
    if exc.filename is None:
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    what = exc.filename or "the output"
    return f"{what}: {exc.strerror}\n  hint: {ENVIRONMENT_HINTS[exc.errno]}"


def main(argv: Sequence[str] | None = None) -> int:
    prog = "localspec"  # errors name the command, as argparse's own do
    try:
        args = build_parser().parse_args(argv)
        prog = f"localspec {args.command}"
        install_interrupt_handler()
        show_status_lines()
        return int(args.handler(args) or 0)
    except LocalspecError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nlocalspec: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `localspec ... | head`: the reader left, nothing to say
        return 141
    except Exception as exc:
        if isinstance(exc, OSError) and exc.errno in ENVIRONMENT_HINTS:
            print(f"{prog}: error: {machine_failed(exc)}", file=sys.stderr)
            return 1
        # A bug, not bad input: one line, the traceback only when asked for.
        if os.environ.get("LOCALSPEC_DEBUG"):
            raise
        where = exc.__traceback__
        while where is not None and where.tb_next is not None:
            where = where.tb_next
        frame = (
            f" at {Path(where.tb_frame.f_code.co_filename).name}:{where.tb_lineno}" if where else ""
        )
        print(
            f"localspec: internal error: {type(exc).__name__}: {exc}{frame}\n"
            "  hint: this is a bug in localspec; rerun with LOCALSPEC_DEBUG=1 for the "
            "traceback and report it",
            file=sys.stderr,
        )
        return 70


if __name__ == "__main__":
    sys.exit(main())
