"""Where llama-cpp-python's JSON-schema converter (the Python port of llama.cpp's) falls short
of llama.cpp's own C++ converter, which llama-server uses: integer bounds (``minimum``,
``maximum`` and their exclusive forms), which the port leaves out, the characters of a
string, where the port lets control characters through (a raw newline: invalid JSON), and an
untyped schema without shape (``{}``, ``{"description": ...}``), any value for the C++
converter. The schema's other keywords still go through the port; ``JsonSchemaConverter``
adds these. Beyond both converters: a required key missing from ``properties`` is listed.

A range of integers is the numbers of each digit count it spans; numbers of one digit count
between two bounds are written digit by digit: the lower bound's first digit followed by
anything up to its end, the digits strictly between followed by any digits, the upper
bound's first digit followed by anything down to it.
"""

from __future__ import annotations

import json
import math
from typing import Any

from llama_cpp.llama_grammar import PRIMITIVE_RULES, RESERVED_NAMES, SchemaConverter

from localspec.engine.schema_checks import VALUE_KEYWORDS, pointed

BOUND_KEYS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
# regex shorthand classes, which GBNF lacks: their members inside a class, and as a class
SHORTHAND = {"d": "0-9", "w": "a-zA-Z0-9_", "s": r" \t\n\r\x0B\x0C"}
# escapes the port keeps as they are and GBNF knows (parse_char in llama-grammar.cpp)
GBNF_ESCAPES = set("tnrxuU\\")


def _escape(pattern: str, i: int, in_class: bool) -> tuple[str, int]:
    """The GBNF for the regex escape at ``pattern[i]`` (a backslash), and where it ends."""
    if i + 1 >= len(pattern):
        raise ValueError(f"the pattern {pattern!r} ends with a backslash")
    c = pattern[i + 1]
    if c.lower() in SHORTHAND:
        members = SHORTHAND[c.lower()]
        if in_class and c.isupper():
            raise ValueError(f"\\{c} inside a character class is not supported (in {pattern!r})")
        if in_class:
            return members, i + 2
        return (f"[^{members}]" if c.isupper() else f"[{members}]"), i + 2
    if c in GBNF_ESCAPES:
        return pattern[i : i + 2], i + 2
    if c.isalnum():
        raise ValueError(f"the escape \\{c} is not supported (in {pattern!r})")
    # escaped punctuation: the character itself, as a class of one (a hex escape)
    code = f"\\x{ord(c):02X}" if ord(c) < 0x100 else f"\\u{ord(c):04X}"
    return (code if in_class else f"[{code}]"), i + 2


def pattern_for_gbnf(pattern: str) -> str:
    """A regular expression with its escapes written as the port's pattern converter and
    GBNF take them: ``\\d``, ``\\w``, ``\\s`` (and their negations) as character classes,
    escaped punctuation (``\\.``, ``\\$``...) as one-character classes. Neither the port nor
    llama.cpp's C++ converter knows them, and pydantic's patterns are full of them."""
    out, i, in_class = [], 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            piece, i = _escape(pattern, i, in_class)
            out.append(piece)
            continue
        if c == "[" and not in_class:
            in_class = True
        elif c == "]" and in_class and not out[-1].endswith("["):
            in_class = False
        out.append(c)
        i += 1
    return "".join(out)


# what gives an untyped schema a shape; without any of them it allows any JSON value
SHAPING_KEYS = (
    "$ref", "oneOf", "anyOf", "allOf", "const", "enum", "properties", "items", "prefixItems",
    "pattern", "minLength", "maxLength", "format",
)  # fmt: skip
# JSON's string characters: no quote, backslash or control character unescaped
JSON_CHAR = (
    r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] '
    r"[0-9a-fA-F])"
)


def integer_bounds(schema: dict[str, Any]) -> tuple[int | None, int | None]:
    """The least and greatest integers allowed (None: unbounded)."""
    lo = hi = None
    if isinstance(schema.get("minimum"), int | float):
        lo = math.ceil(schema["minimum"])
    if isinstance(schema.get("exclusiveMinimum"), int | float):
        lo = max(lo if lo is not None else -math.inf, math.floor(schema["exclusiveMinimum"]) + 1)
    if isinstance(schema.get("maximum"), int | float):
        hi = math.floor(schema["maximum"])
    if isinstance(schema.get("exclusiveMaximum"), int | float):
        hi = min(hi if hi is not None else math.inf, math.ceil(schema["exclusiveMaximum"]) - 1)
    return (None if lo is None else int(lo)), (None if hi is None else int(hi))


def _digits_between(low: str, high: str) -> list[str]:
    """GBNF alternatives for the digit strings of one length from ``low`` to ``high``."""
    if low == high:
        return [f'"{low}"']
    if len(low) == 1:
        return [f"[{low}-{high}]"]
    rest = len(low) - 1
    head_low, head_high = low[0], high[0]
    if head_low == head_high:
        return [f'"{head_low}" ({" | ".join(_digits_between(low[1:], high[1:]))})']
    out = []
    if low[1:] == "0" * rest:  # the lower bound's whole decade
        first = int(head_low)
    else:
        out.append(f'"{head_low}" ({" | ".join(_digits_between(low[1:], "9" * rest))})')
        first = int(head_low) + 1
    last = int(head_high) if high[1:] == "9" * rest else int(head_high) - 1
    if first <= last:
        out.append(f"[{first}-{last}]" + " [0-9]" * rest)
    if high[1:] != "9" * rest:
        out.append(f'"{head_high}" ({" | ".join(_digits_between("0" * rest, high[1:]))})')
    return out


def _non_negative(lo: int, hi: int | None) -> list[str]:
    """Alternatives for lo <= n <= hi (hi None: no upper bound), 0 <= lo, no leading zeros."""
    out = []
    top = len(str(hi)) if hi is not None else len(str(lo))
    for n_digits in range(len(str(lo)), top + 1):
        start = max(lo, 10 ** (n_digits - 1) if n_digits > 1 else 0)
        end = 10**n_digits - 1 if hi is None else min(hi, 10**n_digits - 1)
        if start <= end:
            out += _digits_between(str(start), str(end))
    if hi is None:  # every number with more digits
        out.append(f"[1-9] [0-9]{{{len(str(lo))},}}")
    return out


def integer_range(lo: int | None, hi: int | None) -> str:
    """A GBNF expression for the integers from ``lo`` to ``hi`` (None: unbounded)."""
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"no integer is within the bounds ({lo} > {hi})")
    alternatives = []
    if lo is None or lo < 0:  # negative numbers: -m with max(-hi, 1) <= m <= -lo
        least = 1 if hi is None or hi >= 0 else -hi
        most = None if lo is None else -lo
        alternatives += [f'"-" ({" | ".join(_non_negative(least, most))})']
    if hi is None or hi >= 0:
        alternatives += _non_negative(max(lo or 0, 0), hi)
    return " | ".join(alternatives)


class JsonSchemaConverter(SchemaConverter):  # type: ignore[misc]
    """The converter, with integers kept within their bounds."""

    def _add_rule(self, name: str, rule: str) -> str:
        return super()._add_rule(name, JSON_CHAR if name == "char" else rule)

    def _format_literal(self, literal: str) -> str:
        """GBNF's quoted literal of a text: the backslash escaped too, as in the C++
        converter (the port leaves it, so a key or enum value holding one wrote invalid
        JSON, and one holding a quote did not parse)."""
        escapes = {"\r": "\\r", "\n": "\\n", '"': '\\"', "\\": "\\\\"}
        return '"' + "".join(escapes.get(c, c) for c in literal) + '"'

    def _visit_pattern(self, pattern: str, name: str) -> str:
        return super()._visit_pattern(pattern_for_gbnf(pattern), name)

    def visit(self, schema: dict[str, Any], name: str) -> str:
        rule = name + "-" if name in RESERVED_NAMES else name or "root"
        if schema.get("type") == "integer" and any(k in schema for k in BOUND_KEYS):
            lo, hi = integer_bounds(schema)
            return self._add_rule(rule, f"({integer_range(lo, hi)}) space")
        if any_value(schema):
            return self._add_rule(rule, self._add_primitive("value", PRIMITIVE_RULES["value"]))
        return super().visit(schema, name)


def any_value(schema: dict[str, Any]) -> bool:
    """``{}`` or ``{"description": ...}``: any JSON value, as the C++ converter reads it (the
    port takes ``{}`` for an object and refuses the second)."""
    additional = schema.get("additionalProperties", True)
    return (
        "type" not in schema and additional is True and not any(k in schema for k in SHAPING_KEYS)
    )


def with_required_properties(schema: Any) -> Any:
    """The schema with each required key that ``properties`` does not list added to it (any
    value, or ``additionalProperties``' schema). The converter writes only the listed
    properties, so a required key missing from them would never be written: every answer
    would fail the caller's own schema."""
    if isinstance(schema, list):
        return [with_required_properties(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {
        key: value if key in VALUE_KEYWORDS else with_required_properties(value)
        for key, value in schema.items()
    }
    required = out.get("required")
    extra = out.get("additionalProperties")
    if not isinstance(required, list) or extra is False:
        return out
    listed = dict(out.get("properties") or {})
    missing = [k for k in required if isinstance(k, str) and k not in listed]
    if not missing:
        return out
    if "properties" not in out and extra is None:
        out["additionalProperties"] = True  # no properties listed: any others stay allowed
    for key in missing:
        listed[key] = extra if isinstance(extra, dict) else {}
    out["properties"] = listed
    return out


def direct_references(schema: Any, root: Any = None) -> Any:
    """The schema with each ``$ref`` to a bare ``$ref`` pointing at the end of the chain:
    the port resolves one step only (checked first: no cycle, no dangling end)."""
    root = schema if root is None else root
    if isinstance(schema, list):
        return [direct_references(item, root) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: v if k in VALUE_KEYWORDS else direct_references(v, root) for k, v in schema.items()}
    ref = out.get("$ref")
    while isinstance(ref, str) and isinstance(target := pointed(root, ref), dict):
        if not isinstance(target.get("$ref"), str):
            break
        ref = out["$ref"] = target["$ref"]
    return out


def schema_to_gbnf(schema: dict[str, Any]) -> str:
    converter = JsonSchemaConverter(
        prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False
    )
    schema = direct_references(json.loads(json.dumps(schema)))  # a copy, changed freely
    root_ref = schema.get("$ref")
    if isinstance(root_ref, str) and isinstance(target := pointed(schema, root_ref), dict):
        # pydantic's recursive models: the root a $ref into its own $defs, which the port
        # cannot resolve; the root becomes what it points to, beside the $defs
        schema = {**{k: v for k, v in schema.items() if k != "$ref"}, **target}
    schema = with_required_properties(schema)
    resolved = converter.resolve_refs(schema, "stdin")
    converter.visit(resolved, "")
    return converter.format_grammar()
