"""Built-in prompt sets, by kind (code-edit, code, qa, summary, creative, french, json).

A prompt may carry a JSON schema (``schema``, the schema's JSON text): its answer is then
constrained to it, as an API client's ``response_format: json_schema`` would."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from localspec.errors import LocalspecError

KINDS = ("code-edit", "code", "qa", "summary", "creative", "french", "json")


@dataclass(frozen=True)
class PromptCase:
    name: str
    kind: str
    language: str
    text: str
    schema: str | None = None  # JSON schema text the answer must follow

    @property
    def grammar(self) -> str | None:
        from localspec.engine.grammar import schema_grammar

        return schema_grammar(json.loads(self.schema)) if self.schema else None


def builtin_prompts() -> list[PromptCase]:
    data = tomllib.loads(resources.files(__package__).joinpath("builtin.toml").read_text("utf-8"))
    return [
        PromptCase(p["name"], p["kind"], p["language"], p["text"], p.get("schema"))
        for p in data["prompt"]
    ]


def select_prompts(spec: str) -> list[PromptCase]:
    """``--prompts``: comma-separated kinds (one built-in prompt of each, in that order), or
    a file: TOML with ``[[prompt]]`` tables (name, kind, text, optional language), or any
    other text file as a single prompt."""
    path = Path(spec)
    if path.suffix in (".toml", ".txt", ".md") or path.exists():
        return load_prompt_file(path)
    kinds = [k.strip() for k in spec.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise LocalspecError(
            f"--prompts: unknown kind(s) {', '.join(unknown) or '(none)'}",
            f"use kinds from {', '.join(KINDS)}, or a prompt file",
        )
    prompts = builtin_prompts()
    return [next(p for p in prompts if p.kind == k) for k in kinds]


def load_prompt_file(path: Path) -> list[PromptCase]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise LocalspecError(
            f"cannot read the prompt file {path}: {exc}", "give a readable UTF-8 file"
        ) from None
    if path.suffix != ".toml":
        if not text.strip():
            raise LocalspecError(f"the prompt file {path} is empty", "put a prompt in it")
        return [PromptCase(path.stem, "custom", "", text)]
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise LocalspecError(f"{path}: not valid TOML: {exc}", "fix the syntax there") from None
    raw = data.get("prompt")
    if not isinstance(raw, list) or not raw:
        raise LocalspecError(f"{path}: no [[prompt]] tables", "add [[prompt]] name/kind/text")
    cases = []
    for i, p in enumerate(raw, 1):
        for field in ("name", "kind", "text"):
            if not isinstance(p, dict) or not isinstance(p.get(field), str) or not p[field].strip():
                raise LocalspecError(
                    f"{path}: prompt #{i}: field '{field}' is missing or empty",
                    "each [[prompt]] needs name, kind and text strings",
                )
        schema = p.get("schema")
        if schema is not None:
            check_schema(path, i, schema)
        cases.append(
            PromptCase(p["name"], p["kind"], str(p.get("language", "")), p["text"], schema)
        )
    return cases


def check_schema(path: Path, i: int, schema: object) -> None:
    from localspec.engine.grammar import schema_grammar

    where = f"{path}: prompt #{i}: schema"
    if not isinstance(schema, str):
        raise LocalspecError(f"{where} must be the schema's JSON text", "schema = '{...}'")
    try:
        schema_grammar(json.loads(schema))
    except ValueError as exc:
        raise LocalspecError(f"{where}: not valid JSON: {exc}", "fix the schema") from None
    except LocalspecError as exc:
        raise LocalspecError(f"{where}: {exc.message}", exc.hint) from None


def default_prompt() -> PromptCase:
    """The prompt `localspec run` uses when none is given: a code edit, where drafting shines."""
    return builtin_prompts()[0]
