"""Value types for command-line flags: a bad number is refused by argparse itself, with one
line that names the flag, the value and the accepted range (exit status 2), before any model
is loaded."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T", int, float)

# a bound beyond which a count is certainly a typo (threads, tokens, queue sizes)
HUGE = 1 << 24


def integer(lo: int | None = None, hi: int | None = None, note: str = "") -> Callable[[str], int]:
    """An integer within [lo, hi]; ``note`` says what the special values mean."""

    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"{value} is out of range: {_range(lo, hi)}{note}")
        return value

    parse.__name__ = "integer"  # argparse names the type in its message
    return parse


def real(
    lo: float | None = None, hi: float | None = None, *, lo_open: bool = False, note: str = ""
) -> Callable[[str], float]:
    """A finite number within [lo, hi] (``(lo, hi]`` with ``lo_open``): nan and inf are refused
    here, since every comparison with nan is false and would slip through later checks."""

    def parse(text: str) -> float:
        try:
            value = float(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        too_low = lo is not None and (value <= lo if lo_open else value < lo)
        if too_low or (hi is not None and value > hi):
            left = "(" if lo_open else "["
            raise argparse.ArgumentTypeError(
                f"{value:g} is out of range: must be within {left}{_num(lo)}, {_num(hi)}]{note}"
            )
        return value

    parse.__name__ = "number"
    return parse


def _range(lo: int | None, hi: int | None) -> str:
    if lo is not None and hi is not None:
        return f"must be between {lo} and {hi}"
    return f"must be >= {lo}" if lo is not None else f"must be <= {hi}"


def _num(x: float | None) -> str:
    return "inf" if x is None else f"{x:g}"


# the flags shared by several commands
count = integer(1, HUGE)  # -n, --repeat, ...
non_negative = integer(0, HUGE)
threads = integer(1, 1024, " (leave -t out to use every physical core)")
# -np: generations sharing one batch (the engine's own bound, loading.MAX_PARALLEL)
MAX_SLOTS = 64
slots = integer(1, MAX_SLOTS, " (generations answered at once)")
MIN_CONTEXT = 64
megabytes = real(0, 100_000, lo_open=True)


def context(text: str) -> int:
    """``-c``: 0 (llama.cpp's convention: the model's trained length) or at least MIN_CONTEXT."""
    value = integer(0, HUGE)(text)
    if 0 < value < MIN_CONTEXT:
        raise argparse.ArgumentTypeError(
            f"{value} tokens is too small a context: give at least {MIN_CONTEXT}, "
            "or 0 for the model's trained context length"
        )
    return value


gpu_layers = integer(-1, 100_000, " (-1: llama.cpp's default, 0: CPU only, 99: all)")
seed = integer(-1, (1 << 64) - 1, " (-1: a random seed)")
temperature = real(0.0, 100.0, note=" (0: greedy)")
probability = real(0.0, 1.0)
port = integer(0, 65535)
top_p = real(0.0, 1.0, lo_open=True, note=" (1: off)")
repeat_penalty = real(0.0, None, lo_open=True, note=" (1: off)")
penalty = real(-2.0, 2.0, note=" (0: off)")  # OpenAI's range for presence and frequency
penalty_window = integer(-1, HUGE, " (0: off, -1: the whole context)")


def text(value: str) -> str:
    """A non-empty string (an empty stop string would do nothing)."""
    if not value:
        raise argparse.ArgumentTypeError("must not be empty")
    return value


def origins(value: str) -> tuple[str, ...]:
    """``--allowed-origins``: ``*``, or web origins written as scheme://host[:port]."""
    found = tuple(o.strip().rstrip("/") for o in value.split(",") if o.strip())
    for origin in found:
        if origin != "*" and not origin.startswith(("http://", "https://")):
            raise argparse.ArgumentTypeError(
                f"{origin!r} is not a web origin: write it as https://host[:port], or * for any"
            )
    return found


def distinct_list(item: Callable[[str], T], example: str) -> Callable[[str], list[T]]:
    """A comma-separated list of distinct values (``--concurrency 1,2,4``, ``--rate
    0.1,0.2``), each read by ``item`` (which raises argparse's error with its own words),
    sorted. An empty item (``1,,2``) is refused rather than skipped: it is most likely a
    typo. ``example``: what to write, for the messages."""

    def parse(text: str) -> list[T]:
        items = [part.strip() for part in text.split(",")]
        if not any(items):
            raise argparse.ArgumentTypeError(f"give {example}")
        values: list[T] = []
        for part in items:
            if not part:
                raise argparse.ArgumentTypeError(f"{text!r} has an empty item: give {example}")
            value = item(part)
            if value in values:
                raise argparse.ArgumentTypeError(f"{part} is given twice")
            values.append(value)
        return sorted(values)

    parse.__name__ = "list"  # argparse names the type in its message
    return parse
