"""`localspec chat`: the Textual terminal chat."""

from __future__ import annotations

import argparse

from localspec.commands.run import engine_options
from localspec.errors import LocalspecError


def cmd_chat(args: argparse.Namespace) -> int:
    from localspec.api import validate_sampling
    from localspec.tui.app import ChatApp, ChatOptions

    validate_sampling(args.temp, 0, 1.0, 0.0, None)
    if args.max_tokens <= 0:
        raise LocalspecError(f"-n must be > 0 (got {args.max_tokens})")
    options = ChatOptions(
        **engine_options(args),
        system=args.system,
        temperature=args.temp,
        max_tokens=args.max_tokens,
    )
    ChatApp(options).run()
    return 0
