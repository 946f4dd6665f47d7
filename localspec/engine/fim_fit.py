"""A fill-in-the-middle prompt cut to the context: an editor sends what surrounds the
cursor (llama.vim: 256 lines before it, 64 after, up to 16 chunks of other files), not what
fits, and llama-server's ``/infill`` cuts it rather than refuse it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from localspec.engine.fim import ExtraFile, FimPrompt, FimVocab, fim_tokens

# an over-long prompt keeps its prefix's last lines in this share of the room, as
# llama-server's /infill does (3 to 1 for the prefix against the suffix)
PREFIX_SHARE = 0.75


def fitted(vocab: FimVocab, fim: FimPrompt, room: int) -> FimPrompt:
    """``fim`` cut to ``room`` tokens where it holds more, as llama-server cuts an
    ``/infill`` prompt (an editor sends what surrounds the cursor, not what fits): the
    edited file first, its prefix's last lines in up to PREFIX_SHARE of the room and its
    suffix's first lines in the rest, then the other files in what is left, the last ones
    first (llama.vim sends the most recent last; the one that does not fit whole keeps its
    last lines). Cut at whole lines: the next keystroke's prompt is cut the same way and
    lands on the cache. What the typed line alone cannot fit is left to the caller."""
    if len(fim_tokens(vocab, fim)) <= room:
        return fim

    def count(text: str) -> int:
        return len(vocab.tokenize(text, add_special=False, parse_special=False)) if text else 0

    out = _fitted_file(fim, room - len(fim_tokens(vocab, FimPrompt("", "", (), fim.typed))), count)
    extra = _fitted_extra(fim.extra, room - len(fim_tokens(vocab, out)), count)
    out = replace(out, extra=extra)
    while len(fim_tokens(vocab, out)) > room and (out.extra or out.prefix or out.suffix):
        out = _one_line_less(out)  # lines counted one by one can tokenize a little longer
    return out


def _fitted_file(fim: FimPrompt, room: int, count: Callable[[str], int]) -> FimPrompt:
    """The edited file's prefix and suffix in ``room`` tokens: the prefix's last lines in
    all but what the suffix may claim (a quarter of the room, or what the prefix does not
    need), then the suffix's first lines in what the prefix left."""
    prefix_lines = fim.prefix.splitlines(keepends=True)
    suffix_lines = fim.suffix.splitlines(keepends=True)
    prefix_sizes = [count(line) for line in prefix_lines]
    suffix_sizes = [count(line) for line in suffix_lines]
    suffix_room = max(room - int(PREFIX_SHARE * room), room - sum(prefix_sizes))
    n_prefix = _last_lines(prefix_sizes, room - min(sum(suffix_sizes), suffix_room))
    kept = prefix_lines[len(prefix_lines) - n_prefix :]
    n_suffix = _last_lines(
        suffix_sizes[::-1], room - sum(prefix_sizes[len(prefix_lines) - n_prefix :])
    )
    return FimPrompt("".join(kept), "".join(suffix_lines[:n_suffix]), (), fim.typed)


def _fitted_extra(
    files: Sequence[ExtraFile], room: int, count: Callable[[str], int]
) -> tuple[ExtraFile, ...]:
    """The other files in ``room`` tokens, the last ones first; the one that does not fit
    whole keeps its last lines."""
    kept: list[ExtraFile] = []
    for file in reversed(files):
        head = count(f"{file.filename}\n") + 1  # its separator token and name
        lines = file.text.splitlines(keepends=True)
        sizes = [count(line) for line in lines]
        n = _last_lines(sizes, room - head)
        if n:
            kept.insert(0, ExtraFile("".join(lines[len(lines) - n :]), file.filename))
            room -= head + sum(sizes[len(sizes) - n :])
        if n < len(lines):
            break
    return tuple(kept)


def _last_lines(sizes: Sequence[int], room: int) -> int:
    """How many of the last lines (their token counts ``sizes``) fit in ``room``."""
    total = n = 0
    for size in reversed(sizes):
        if total + size > room:
            break
        total, n = total + size, n + 1
    return n


def _one_line_less(fim: FimPrompt) -> FimPrompt:
    """``fim`` with one line less: the first other file's first, else the prefix's first,
    else the suffix's last."""
    if fim.extra:
        first, *rest = fim.extra
        text = first.text.split("\n", 1)[1] if "\n" in first.text else ""
        extra = ([ExtraFile(text, first.filename)] if text else []) + rest
        return replace(fim, extra=tuple(extra))
    if fim.prefix:
        return replace(fim, prefix=fim.prefix.split("\n", 1)[1] if "\n" in fim.prefix else "")
    return replace(fim, suffix="".join(fim.suffix.splitlines(keepends=True)[:-1]))
