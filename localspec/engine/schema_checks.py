"""What a JSON schema must be before llama.cpp's converter turns it into a grammar: well
formed (each keyword's value of the right kind: the converter would misread ``"enum":
"abc"`` as three values, or fail with its own internals), its ``$ref``s pointing into it, and
satisfiable (bounds the wrong way round, an empty enum: the converter would ignore the
contradiction). Each check names the place of the first problem, or returns None."""

from __future__ import annotations

import re
from typing import Any

VALUE_KEYWORDS = ("enum", "const", "examples", "default")  # their values are not schemas
SCHEMA_MAPS = ("properties", "$defs", "definitions")  # name -> schema
SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")  # non-empty lists of schemas
COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")
NUMBERS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
TYPES = ("string", "number", "integer", "boolean", "object", "array", "null")


def _keyword_problem(key: str, value: Any) -> str | None:
    """What is wrong with one keyword's value, or None."""
    if key in SCHEMA_MAPS and not (
        isinstance(value, dict) and all(map(_is_schema, value.values()))
    ):
        return f"{key} must be an object of schemas"
    if key in SCHEMA_LISTS and not (
        isinstance(value, list) and value and all(map(_is_schema, value))
    ):
        return f"{key} must be a non-empty list of schemas"
    if key == "items" and isinstance(value, list) and all(map(_is_schema, value)):
        return None  # the older form of prefixItems
    if key in ("items", "additionalProperties") and not _is_schema(value):
        return f"{key} must be a schema (an object) or a boolean"
    if key == "enum" and not isinstance(value, list):
        return "enum must be a list of values"
    if key == "required" and not (
        isinstance(value, list) and all(isinstance(k, str) for k in value)
    ):
        return "required must be a list of property names"
    if key == "type" and not (
        value in TYPES or (isinstance(value, list) and value and all(t in TYPES for t in value))
    ):
        return f"type must be one of {', '.join(TYPES)}, or a list of them"
    if key in COUNTS and not (
        isinstance(value, int) and not isinstance(value, bool) and value >= 0
    ):
        return f"{key} must be a whole number >= 0"
    if key in NUMBERS and not _number(value):
        return f"{key} must be a number"
    if key == "pattern" and not isinstance(value, str):
        return "pattern must be a string (a regular expression)"
    return None


def _is_schema(value: Any) -> bool:
    return isinstance(value, dict | bool)


def _children(key: str, value: Any) -> list[tuple[str, Any]]:
    """The subschemas under one keyword, each with its place."""
    if key in SCHEMA_MAPS:
        return [(f".{key}[{name!r}]", child) for name, child in value.items()]
    if key in SCHEMA_LISTS or (key == "items" and isinstance(value, list)):
        return [(f".{key}[{i}]", child) for i, child in enumerate(value)]
    if key in ("items", "additionalProperties", "not"):
        return [(f".{key}", value)]
    return []


def shape_problem(schema: Any, where: str = "the schema") -> str | None:
    """Where a schema is malformed (a keyword's value of the wrong kind), or None: the
    converter would misread it (``"enum": "abc"`` as three values) or fail on it."""
    if not isinstance(schema, dict):
        return None
    for key, value in schema.items():
        if (problem := _keyword_problem(key, value)) is not None:
            return f"at {where}: {problem}"
        for place, child in _children(key, value):
            if (problem := shape_problem(child, where + place)) is not None:
                return problem
    return None


def pointed(root: Any, ref: str) -> Any:
    """What a ``#/...`` reference points to in ``root`` (None: nothing)."""
    if not ref.startswith("#"):
        return None
    target = root
    for part in filter(None, ref[1:].split("/")):
        key = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(target, dict) or key not in target:
            return None
        target = target[key]
    return target


def reference_problem(schema: Any, root: Any = None, where: str = "the schema") -> str | None:
    """A ``$ref`` the converter cannot follow (outside the schema, or to nothing in it)."""
    root = schema if root is None else root
    if isinstance(schema, list):
        items = ((f"{where}[{i}]", item) for i, item in enumerate(schema))
    elif isinstance(schema, dict):
        ref = schema.get("$ref")
        if ref is not None:
            if not isinstance(ref, str) or not ref.startswith("#"):
                return f"at {where}: $ref {ref!r} is not within the schema (only '#/...' is)"
            seen = {ref}
            target = pointed(root, ref)
            while isinstance(target, dict) and isinstance(target.get("$ref"), str):
                if target["$ref"] in seen:  # a chain of references back to itself
                    return f"at {where}: $ref {ref!r} refers to itself and to nothing else"
                seen.add(target["$ref"])
                target = pointed(root, target["$ref"])
            if target is None:
                return f"at {where}: $ref {ref!r} points to nothing in the schema"
        items = ((f"{where}.{k}", v) for k, v in schema.items() if k not in VALUE_KEYWORDS)
    else:
        return None
    return next((p for w, v in items if (p := reference_problem(v, root, w)) is not None), None)


BOUNDS = (
    ("minLength", "maxLength"),
    ("minItems", "maxItems"),
    ("minProperties", "maxProperties"),
    ("minimum", "maximum"),
    ("exclusiveMinimum", "maximum"),
    ("minimum", "exclusiveMaximum"),
    ("exclusiveMinimum", "exclusiveMaximum"),
)


def unsatisfiable(schema: Any, where: str = "the schema") -> str | None:
    """Where a schema contradicts itself (bounds the wrong way round, an empty enum, a
    pattern that is no regular expression), or None."""
    if isinstance(schema, list):
        for i, item in enumerate(schema):
            if (found := unsatisfiable(item, f"{where}[{i}]")) is not None:
                return found
        return None
    if not isinstance(schema, dict):
        return None
    for low, high in BOUNDS:
        a, b = schema.get(low), schema.get(high)
        if _number(a) and _number(b) and (a > b or (a == b and "exclusive" in low + high)):
            return f"at {where}: {low} {a} and {high} {b} leave nothing"
    if schema.get("enum") == []:
        return f"at {where}: an empty enum"
    if (key := _closed_out(schema)) is not None:
        return f"at {where}: {key!r} is required, but not among the properties allowed"
    pattern = schema.get("pattern")
    if isinstance(pattern, str):
        try:
            re.compile(pattern)
        except re.error as exc:
            return f"at {where}: the pattern {pattern!r} is not a regular expression ({exc})"
    for key, value in schema.items():
        if key in ("enum", "const", "examples", "default"):
            continue  # values, not schemas
        if (found := unsatisfiable(value, f"{where}.{key}")) is not None:
            return found
    return None


def _closed_out(schema: dict[str, Any]) -> str | None:
    """A required key that ``additionalProperties: false`` and the properties forbid."""
    if schema.get("additionalProperties") is not False:
        return None
    listed = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    required = schema.get("required") if isinstance(schema.get("required"), list) else []
    return next((k for k in required if isinstance(k, str) and k not in listed), None)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
