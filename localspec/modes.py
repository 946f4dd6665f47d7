"""Drafting modes, alone or chained: what a ``--mode`` string means and which draft it needs.

A chain such as ``ngram-simple+draft-self`` tries the n-gram lookup first each round and
asks the neural drafter only when the lookup has nothing (llama.cpp's precedence: the
cheap, often long n-gram draft wins when it exists). Chains are written with ``+``, which
stays unambiguous in comma-separated lists (``--modes none,ngram-simple+draft-self``);
``--mode ngram-simple,draft-self``, llama.cpp's spelling, is read the same.
"""

from __future__ import annotations

from localspec.errors import LocalspecError

LOOKUP_MODES = ("ngram-simple", "suffix")
NEURAL_MODES = ("draft-model", "draft-self", "draft-mtp")
SINGLE_MODES = ("none", *LOOKUP_MODES, *NEURAL_MODES)
EXAMPLES = (
    "none, ngram-simple, suffix, draft-model, draft-self, draft-mtp, ngram-simple+draft-self, "
    "suffix+ngram-simple"
)


def parse_mode(mode: str) -> tuple[str, ...]:
    """``'ngram-simple+draft-model'`` (or with a comma) -> ('ngram-simple', 'draft-model'),
    validated."""
    if not isinstance(mode, str):
        raise LocalspecError(f"a mode is a name such as 'ngram-simple' (got {mode!r})")
    parts = tuple(p.strip() for p in mode.replace("+", ",").split(","))
    unknown = [p for p in parts if p not in SINGLE_MODES]
    if unknown:
        raise LocalspecError(
            f"unknown mode '{unknown[0]}'",
            f"choose one of {EXAMPLES} (--mode of run, chat and serve also takes auto: the "
            "winner of `localspec probe --save`)",
        )
    if len(parts) == 1:
        return parts
    neural = [p for p in parts if p in NEURAL_MODES]
    if "none" in parts or len(set(parts)) != len(parts) or len(neural) > 1:
        raise LocalspecError(
            f"--mode '{mode}' is not a valid chain",
            "chain lookup modes (in the order given) and at most one neural mode, e.g. "
            "ngram-simple+draft-model or suffix+ngram-simple",
        )
    return (*[p for p in parts if p in LOOKUP_MODES], *neural)  # a neural drafter last


def neural_part(mode: str) -> str | None:
    """The neural drafter a mode uses (which decides what must be loaded), if any."""
    return next((p for p in parse_mode(mode) if p in NEURAL_MODES), None)


def canonical(mode: str) -> str:
    """The one spelling of a mode: a chain lookup first, joined with ``+``."""
    return "+".join(parse_mode(mode))
