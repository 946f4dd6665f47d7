"""A fill-in-the-middle prompt as a lookup reads it: the middle after the prefix, and the
suffix's first line, where a middle ends."""

from __future__ import annotations

from collections.abc import Callable


def middle_after_prefix(context: list[int], fim: tuple[int, int, int]) -> list[int]:
    """A FIM prompt's tokens in the order a lookup reads them: ``[SUF] suffix [MID]`` moved
    before ``[PRE] prefix``, so that what follows ``[MID]`` extends the prefix. Any other
    context is returned as it is."""
    pre, suf, mid = fim
    try:
        at_pre = context.index(pre)
        at_suf = context.index(suf, at_pre)
        at_mid = context.index(mid, at_suf)
    except ValueError:
        return context
    return (
        context[:at_pre]
        + context[at_suf : at_mid + 1]
        + context[at_pre:at_suf]
        + context[at_mid + 1 :]
    )


def first_suffix_line(
    context: list[int], fim: tuple[int, int, int], piece: Callable[[int], bytes]
) -> bytes:
    """The first line of a FIM prompt's suffix that is not blank (b"": none)."""
    _, suf, mid = fim
    if suf not in context or mid not in context[context.index(suf) :]:
        return b""
    at = context.index(suf)
    suffix = b"".join(piece(t) for t in context[at + 1 : context.index(mid, at)])
    return next((line for line in suffix.split(b"\n") if line.strip()), b"")


def until_line(pieces: list[bytes], line: bytes, at_line_start: bool) -> int:
    """How many of the tokens ``pieces`` come before a line that is ``line`` (all of them
    if none is); ``at_line_start``: the first piece starts a line."""
    text = b"".join(pieces)
    starts = [0] if at_line_start else []
    starts += [i + 1 for i in range(len(text)) if text[i] == 10]  # after each newline
    for start in starts:
        rest = text[start:]
        if rest == line or rest.startswith(line + b"\n"):
            end, kept = 0, 0
            while kept < len(pieces) and end + len(pieces[kept]) <= start:
                end += len(pieces[kept])
                kept += 1
            return kept
    return len(pieces)
