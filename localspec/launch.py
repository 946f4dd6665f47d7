"""The ``localspec`` command's entry point. Loading the modules behind it (numpy, llama.cpp)
takes most of a second, and Python's shutdown after the command runs clean-up callbacks: a
Ctrl-C in either is an interruption like any other, not a traceback. Nothing but ``sys`` (built
in) is imported before the handler's ``try``: a Ctrl-C before it is Python's own."""

from __future__ import annotations

import sys


def main() -> int:
    try:
        from localspec.cli import main as run

        code = run()
    except KeyboardInterrupt:
        print("\nlocalspec: interrupted", file=sys.stderr)
        code = 130
    import signal  # loaded by then: a lookup, not an import

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the work is done: nothing left to stop
    return code
