"""`localspec chat`: the Textual terminal chat, and a line-by-line one without a terminal."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from localspec.commands.flags import (
    add_length_and_temperature,
    add_memory_flags,
    add_model_flags,
    add_spec_flags,
    engine_options,
)
from localspec.errors import LocalspecError

if TYPE_CHECKING:
    from localspec.tui.app import ChatOptions


def run(args: argparse.Namespace) -> int:
    from localspec.api import validate_sampling
    from localspec.loading import check_memory_file
    from localspec.sources import resolve_model
    from localspec.tui.app import ChatApp, ChatOptions

    validate_sampling(args.temperature, 0, 1.0, 0.0, None)
    options = engine_options(args)
    options["spec"].validate()
    # Find (download, derive) the models on the terminal, before the full-screen interface
    # starts: a missing model is an error line and exit status 2, as for `localspec run`.
    options["target"] = str(resolve_model(options["target"]))
    if options["draft"] is not None:
        options["draft"] = str(resolve_model(options["draft"]))
    if isinstance(options["spec_memory_path"], str):  # a file named: one the chat may write
        check_memory_file(Path(options["spec_memory_path"]), "--spec-memory")
    chat_options = ChatOptions(
        **options, system=args.system, temperature=args.temperature, max_tokens=args.max_tokens
    )
    if not on_a_terminal():
        return line_chat(chat_options)
    app = ChatApp(chat_options)
    with drawn_on_the_terminal():
        app.run()
    if app.load_error is not None:
        raise app.load_error
    return app.return_code or 0


def is_terminal(stream: TextIO | None) -> bool:
    return stream is not None and stream.isatty()


def on_a_terminal() -> bool:
    """The full-screen chat reads keys from standard input and draws on standard error
    (Textual's choice), or on standard output when only standard error is redirected."""
    return is_terminal(sys.stdin) and (is_terminal(sys.stderr) or is_terminal(sys.stdout))


@contextlib.contextmanager
def drawn_on_the_terminal() -> Iterator[None]:
    """``2>log`` (to keep messages apart) would leave the screen blank: while the chat
    runs, standard error is the terminal that standard output is; then the log again."""
    if is_terminal(sys.stderr):
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(1, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def line_chat(options: ChatOptions) -> int:
    """The chat without a terminal (a pipe, a script, a background job): each line of
    standard input is a turn of one conversation, each answer is written to standard output
    as it comes; the end of the input ends the chat."""
    from localspec.engine.settings import GenerationSettings
    from localspec.progress import status
    from localspec.tui.app import load_engine

    status("no terminal: the chat reads one prompt a line from standard input")
    for signum in (signal.SIGTERM, signal.SIGHUP):  # ended as by the input's end: memory saved
        signal.signal(signum, _exit_by_signal)
    settings = GenerationSettings.pick(options)
    system = [{"role": "system", "content": options.system}] if options.system else []
    turns: list[dict[str, str]] = []
    with load_engine(options) as engine:
        for line in sys.stdin:
            if not line.strip():
                continue
            turns.append({"role": "user", "content": line.rstrip("\n")})
            answer, reason = [], None
            try:
                for event in engine.stream(system + turns, settings):
                    answer.append(event.text)
                    reason = event.finish_reason or reason
                    sys.stdout.write(event.text)
                    sys.stdout.flush()
            except LocalspecError as exc:  # e.g. the conversation outgrew the context
                turns.pop()
                status(f"not answered: {exc.message}", warning=True)
                continue
            # a blank line between answers: an answer may span lines itself
            sys.stdout.write("\n\n")
            sys.stdout.flush()
            if reason == "length":
                status("the answer reached its length limit (-n)", warning=True)
            turns.append({"role": "assistant", "content": "".join(answer)})
    return 0


def _exit_by_signal(signum: int, _frame: object) -> None:
    # the status a shell gives a process killed by this signal, after the memory is saved
    raise SystemExit(128 + signum)


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("chat", help="terminal chat showing speculation live")
    add_model_flags(p)
    add_spec_flags(p)
    add_memory_flags(p, on_by_default=True)
    p.add_argument("--system", default=None, help="system message")
    add_length_and_temperature(p, 1024, "per answer")
    p.set_defaults(handler=run)
