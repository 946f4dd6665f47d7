"""`localspec chat`: the Textual terminal chat."""

from __future__ import annotations

import argparse
from pathlib import Path

from localspec.commands.flags import (
    add_length_and_temperature,
    add_memory_flags,
    add_model_flags,
    add_spec_flags,
    engine_options,
)


def run(args: argparse.Namespace) -> int:
    from localspec.api import check_memory_file, validate_sampling
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
    app = ChatApp(
        ChatOptions(
            **options, system=args.system, temperature=args.temperature, max_tokens=args.max_tokens
        )
    )
    app.run()
    if app.load_error is not None:
        raise app.load_error
    return app.return_code or 0


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("chat", help="terminal chat showing speculation live")
    add_model_flags(p)
    add_spec_flags(p)
    add_memory_flags(p, on_by_default=True)
    p.add_argument("--system", default=None, help="system message")
    add_length_and_temperature(p, 1024, "per answer")
    p.set_defaults(handler=run)
