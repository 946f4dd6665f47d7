"""Built-in prompt sets: one prompt per kind (``builtin.toml``: code-edit, code, qa, summary,
creative, french, json), and a wider suite (``suite.toml``: several prompts per kind, multi-turn
chats among them) split in two halves, ``tune`` (what drafting policies may be tuned on) and
``held-out`` (what figures are reported on).

A prompt may carry a JSON schema (``schema``, the schema's JSON text): its answer is then
constrained to it, as an API client's ``response_format: json_schema`` would. A multi-turn
prompt gives its conversation as ``turns`` (role and content each) instead of ``text``."""

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

KINDS = ("code-edit", "code", "qa", "summary", "creative", "french", "json", "chat")
SPLITS = ("tune", "held-out")
ROLES = ("system", "user", "assistant")
Message = dict[str, str]


@dataclass(frozen=True)
class PromptCase:
    name: str
    kind: str
    language: str
    text: str
    schema: str | None = None  # JSON schema text the answer must follow
    turns: tuple[tuple[str, str], ...] = ()  # (role, content) of a multi-turn conversation
    split: str = ""  # "tune" or "held-out" (suite prompts)

    @property
    def messages(self) -> list[Message]:
        """The chat messages the prompt sends: its conversation, or its text as one user
        message."""
        if self.turns:
            return [{"role": role, "content": content} for role, content in self.turns]
        return [{"role": "user", "content": self.text}]

    @property
    def grammar(self) -> str | None:
        from localspec.engine.grammar import schema_grammar

        return schema_grammar(json.loads(self.schema)) if self.schema else None


def builtin_prompts() -> list[PromptCase]:
    return _packaged("builtin.toml")


def suite_prompts(split: str | None = None) -> list[PromptCase]:
    """The suite's prompts, or one half of them."""
    return [p for p in _packaged("suite.toml") if split is None or p.split == split]


def _packaged(name: str) -> list[PromptCase]:
    text = resources.files(__package__).joinpath(name).read_text("utf-8")
    return parse_prompts(Path(name), tomllib.loads(text))


def select_prompts(spec: str) -> list[PromptCase]:
    """``--prompts``: comma-separated kinds (one built-in prompt of each, in that order),
    ``suite`` / ``suite:tune`` / ``suite:held-out`` (the suite, or one half of it), or a
    file: TOML with ``[[prompt]]`` tables (name, kind, text or turns, optional language,
    schema, split), or any other text file as a single prompt."""
    path = Path(spec)
    if path.suffix in (".toml", ".txt", ".md") or path.exists():
        return load_prompt_file(path)
    if spec == "suite" or spec.startswith("suite:"):
        split = spec.partition(":")[2] or None
        if split is not None and split not in SPLITS:
            raise LocalspecError(
                f"--prompts: unknown half of the suite '{split}'",
                "use suite, suite:tune or suite:held-out",
            )
        return suite_prompts(split)
    kinds = [k.strip() for k in spec.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise LocalspecError(
            f"--prompts: unknown kind(s) {', '.join(unknown) or '(none)'}",
            f"use kinds from {', '.join(KINDS)}, suite (suite:tune, suite:held-out), "
            "or a prompt file",
        )
    prompts = builtin_prompts() + suite_prompts()  # a kind without a built-in one: the suite's
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
    return parse_prompts(path, data)


def parse_prompts(path: Path, data: dict[str, object]) -> list[PromptCase]:
    raw = data.get("prompt")
    if not isinstance(raw, list) or not raw:
        raise LocalspecError(f"{path}: no [[prompt]] tables", "add [[prompt]] name/kind/text")
    return [parse_prompt(path, i, p) for i, p in enumerate(raw, 1)]


def parse_prompt(path: Path, i: int, p: object) -> PromptCase:
    where = f"{path}: prompt #{i}"
    if not isinstance(p, dict):
        raise LocalspecError(f"{where} is not a table", "write it as [[prompt]] with fields")
    turns = parse_turns(where, p.get("turns"))
    required = ("name", "kind") if turns else ("name", "kind", "text")
    for field in required:
        if not isinstance(p.get(field), str) or not p[field].strip():
            raise LocalspecError(
                f"{where}: field '{field}' is missing or empty",
                "each [[prompt]] needs name, kind and text strings (or turns)",
            )
    schema = p.get("schema")
    if schema is not None:
        check_schema(path, i, schema)
    split = str(p.get("split", ""))
    if split and split not in SPLITS:
        raise LocalspecError(f"{where}: split '{split}' is neither tune nor held-out")
    text = p.get("text") or (turns[-1][1] if turns else "")
    return PromptCase(
        p["name"], p["kind"], str(p.get("language", "")), str(text), schema, turns, split
    )


def parse_turns(where: str, raw: object) -> tuple[tuple[str, str], ...]:
    """A conversation's turns, checked: roles known, contents strings, a user turn last."""
    if raw is None:
        return ()
    ok = (
        isinstance(raw, list)
        and raw
        and all(
            isinstance(t, dict) and t.get("role") in ROLES and isinstance(t.get("content"), str)
            for t in raw
        )
    )
    if not ok or raw[-1]["role"] != "user":
        raise LocalspecError(
            f"{where}: 'turns' must be tables with a role ({', '.join(ROLES)}) and a content, "
            "the last one the user's",
            'write [[prompt.turns]] role = "user" content = "..."',
        )
    return tuple((t["role"], t["content"]) for t in raw)


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
