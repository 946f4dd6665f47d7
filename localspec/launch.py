"""The ``localspec`` command's entry point. Loading the modules behind it (numpy, llama.cpp)
takes most of a second: a Ctrl-C meanwhile is an interruption like any other, not a
traceback."""

from __future__ import annotations

import sys


def main() -> int:
    try:
        from localspec.cli import main as run
    except KeyboardInterrupt:
        print("\nlocalspec: interrupted", file=sys.stderr)
        return 130
    return run()
