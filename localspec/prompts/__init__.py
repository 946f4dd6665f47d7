"""Built-in prompt sets, by kind (code-edit, code, qa, summary, creative, french)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from importlib import resources

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

KINDS = ("code-edit", "code", "qa", "summary", "creative", "french")


@dataclass(frozen=True)
class PromptCase:
    name: str
    kind: str
    language: str
    text: str


def builtin_prompts() -> list[PromptCase]:
    data = tomllib.loads(resources.files(__package__).joinpath("builtin.toml").read_text("utf-8"))
    return [PromptCase(p["name"], p["kind"], p["language"], p["text"]) for p in data["prompt"]]


def default_prompt() -> PromptCase:
    """The prompt `localspec run` uses when none is given: a code edit, where drafting shines."""
    return builtin_prompts()[0]
