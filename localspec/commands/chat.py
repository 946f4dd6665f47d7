"""`localspec chat`: the Textual terminal chat."""

from __future__ import annotations

import argparse

from localspec.commands.run import engine_options


def cmd_chat(args: argparse.Namespace) -> int:
    from localspec.api import validate_sampling
    from localspec.sources import resolve_model
    from localspec.tui.app import ChatApp, ChatOptions

    validate_sampling(args.temp, 0, 1.0, 0.0, None)
    options = engine_options(args)
    options["spec"].validate()
    # Find (download, derive) the models on the terminal, before the full-screen interface
    # starts: a missing model is an error line and exit status 2, as for `localspec run`.
    options["target"] = str(resolve_model(options["target"]))
    if options["draft"] is not None:
        options["draft"] = str(resolve_model(options["draft"]))
    app = ChatApp(
        ChatOptions(
            **options, system=args.system, temperature=args.temp, max_tokens=args.max_tokens
        )
    )
    app.run()
    if app.load_error is not None:
        raise app.load_error
    return app.return_code or 0
