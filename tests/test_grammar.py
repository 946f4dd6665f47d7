"""Constrained generation on the real model: the grammar masks every verified position, so
speculative output equals plain constrained decoding (greedy: up to a measured near tie;
sampling: the same distribution), and the grammar-forced drafter drafts what is dictated."""

from __future__ import annotations

import json
import re
from collections import Counter

import numpy as np
import pytest
from scipy.stats import chi2_contingency

from localspec import Engine
from localspec.drafters.grammar_forced import ByteTokens, GrammarForcedDrafter
from localspec.engine.grammar import Grammar, schema_grammar
from localspec.engine.schema_converter import integer_range
from localspec.engine.toolcalls import HermesFormat
from localspec.errors import LocalspecError
from localspec.lossless import compare

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "city": {"type": "string"},
        "occupation": {"type": "string"},
        "employer": {"type": "string"},
        "email": {"type": "string"},
    },
    "required": ["name", "age", "city", "occupation", "employer", "email"],
}
FACTS = (
    "Maria Gonzalez-Whitfield is a 41-year-old structural engineer who lives in Rotterdam. "
    "She works for Van Oord Marine Contractors, where she designs offshore foundations. "
    "You can reach her at maria.whitfield@vanoord-marine.example.com for project enquiries."
)
EXTRACT = [{"role": "user", "content": f"Extract the person's details as JSON.\n\n{FACTS}"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
        },
    },
}
CASES = [
    ("extraction", EXTRACT, schema_grammar(PERSON), None),
    (
        "list",
        [{"role": "user", "content": "Three fruits and their colours, as JSON."}],
        schema_grammar({"type": "object"}),
        None,
    ),
    (
        "tool call",
        [{"role": "user", "content": "What's the weather in Oslo, in fahrenheit?"}],
        HermesFormat().grammar([WEATHER]),
        [WEATHER],
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize("name, messages, grammar, tools", CASES, ids=[c[0] for c in CASES])
def test_speculative_constrained_output_equals_plain_constrained(
    qwen: Engine, name: str, messages: list, grammar: str, tools: list | None
) -> None:
    plain = qwen.generate(
        messages, max_tokens=96, mode="none", grammar=grammar, tools=tools, record_margins=True
    )
    spec = qwen.generate(messages, max_tokens=96, grammar=grammar, tools=tools)
    report = compare(plain.tokens, plain.margins, spec.tokens, plain.runners_up)
    assert report.ok, f"{name}: {report}"
    assert plain.finish_reason == "stop", plain.text  # the grammar let it end
    drafters = {source: accepted for source, _, accepted, *_ in spec.stats.by_drafter}
    assert drafters.get("grammar", 0) > 0, spec.stats.by_drafter  # forced text was drafted
    if name == "tool call":
        _, calls = HermesFormat().parse(spec.text)
        assert calls and calls[0].name == "get_weather"
        assert json.loads(calls[0].arguments)["city"] == "Oslo"
    else:
        answer = json.loads(spec.text)
        assert isinstance(answer, dict)
        if name == "extraction":
            assert set(answer) == set(PERSON["required"]) and answer["age"] == 41


def test_extraction_verifies_whole_spans(qwen: Engine) -> None:
    """Keys and punctuation forced by the schema, values copied from the prompt: most of the
    answer comes out of drafts, several tokens per target pass."""
    result = qwen.generate(EXTRACT, max_tokens=96, grammar=schema_grammar(PERSON))
    assert sum(result.from_draft) >= len(result.tokens) // 2
    assert result.stats.mean_acceptance_length >= 3


@pytest.mark.slow
def test_unconstrained_answer_differs_and_plain_constrained_is_json(qwen: Engine) -> None:
    free = qwen.generate(EXTRACT, max_tokens=96, mode="none")
    constrained = qwen.generate(EXTRACT, max_tokens=96, mode="none", grammar=schema_grammar(PERSON))
    assert free.text.lstrip().startswith("```")  # the model's own habit: a fenced block
    assert json.loads(constrained.text)["name"] == "Maria Gonzalez-Whitfield"


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_banned_end_where_the_grammar_allows_only_an_end_ends_the_answer(
    qwen: Engine, temperature: float
) -> None:
    """``ignore_eos`` bans the end tokens; a finished JSON object allows nothing but an end:
    every allowed token banned, the answer ends there (llama.cpp would abort the process
    on a token its grammar refuses)."""
    grammar = schema_grammar({**COLOURS, "required": ["colour"]})
    for mode in ("none", "ngram-simple"):
        result = qwen.generate(
            PICK, max_tokens=40, temperature=temperature, seed=3, mode=mode, grammar=grammar,
            ignore_eos=True,
        )  # fmt: skip
        assert json.loads(result.text)["colour"] in ("red", "green", "blue")
        assert result.finish_reason == "stop"


COLOURS = {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}}}
PICK = [{"role": "user", "content": "Pick a colour at random: red, green or blue. Answer in JSON."}]


def _colours(engine: Engine, mode: str | None, seeds: range) -> Counter[str]:
    grammar = schema_grammar({**COLOURS, "required": ["colour"]})
    counts: Counter[str] = Counter()
    for seed in seeds:
        result = engine.generate(
            PICK, max_tokens=12, temperature=1.0, seed=seed, mode=mode, grammar=grammar
        )
        counts[json.loads(result.text)["colour"]] += 1
    return counts


@pytest.mark.slow
def test_sampling_under_a_grammar_keeps_the_distribution(qwen: Engine) -> None:
    """Rejection sampling against masked rows: the colour drawn with speculation (the forced
    drafter drafts the key and the enum's tails) follows plain constrained sampling."""
    plain = _colours(qwen, "none", range(60))
    spec = _colours(qwen, None, range(1000, 1060))
    names = sorted(set(plain) | set(spec))
    table = np.array([[plain[n] for n in names], [spec[n] for n in names]]) + 0.5
    assert len(names) >= 2, (plain, spec)  # the test means something only with a choice
    assert chi2_contingency(table).pvalue > 1e-3, (plain, spec)


def test_drafts_are_cut_at_the_first_refused_token(qwen: Engine) -> None:
    grammar = Grammar(qwen.target, schema_grammar(PERSON))
    state = grammar.start()
    good = qwen.target.tokenize('{"name": "Ann"', add_special=False, parse_special=False)
    bad = qwen.target.tokenize(" hello", add_special=False, parse_special=False)
    assert state.valid_prefix(good + bad) == len(good)
    row = np.zeros(qwen.target.n_vocab, dtype=np.float32)
    row[bad[0]] = 10.0  # the model's favourite is refused
    assert state.best(row).argmax() != bad[0]
    masked = state.masked(row)
    assert np.isneginf(masked[bad[0]]) and np.isfinite(masked).sum() <= 4  # "{" and kin
    state.close()
    grammar.close()


def test_forced_text_from_the_start_of_a_schema(qwen: Engine) -> None:
    grammar = Grammar(qwen.target, schema_grammar(PERSON))
    state = grammar.start()
    drafter = GrammarForcedDrafter(qwen.target, state, ByteTokens(qwen.target))
    prompt = qwen.tokenize_prompt(EXTRACT)
    drafter.begin(prompt)
    draft = drafter.propose(prompt, 16)
    text = b"".join(qwen.target.piece(t) for t in draft.tokens)
    assert text == b'{"name": "'  # nothing seen yet: json.dumps's spacing, up to the value
    state.close()
    grammar.close()


def test_bad_grammars_are_refused_with_a_reason(qwen: Engine, capfd) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(LocalspecError, match="does not parse: expecting"):
        Grammar(qwen.target, "root ::= (")
    with pytest.raises(LocalspecError, match="Undefined rule identifier 'foo'"):
        Grammar(qwen.target, "root ::= foo")
    assert "root ::=" not in capfd.readouterr().err  # llama.cpp's own dump is kept back
    with pytest.raises(LocalspecError) as refused:  # no earlier log line in the reason
        Grammar(qwen.target, 'start ::= "a"')
    assert refused.value.message == (
        "the grammar does not parse: grammar does not contain a 'root' symbol"
    )
    with pytest.raises(LocalspecError, match="JSON schema"):
        schema_grammar({"type": "objec"})
    with pytest.raises(LocalspecError, match=r"a JSON schema is a JSON object \(got str\)"):
        schema_grammar("notadict")  # type: ignore[arg-type]
    dangling = {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}
    with pytest.raises(LocalspecError) as refused:
        schema_grammar(dangling)
    assert refused.value.message.endswith(
        "at the schema.properties.a: $ref '#/$defs/missing' points to nothing in the schema"
    )
    with pytest.raises(LocalspecError, match="is not within the schema"):
        schema_grammar({"$ref": "https://example.com/person.json"})
    assert schema_grammar({"$ref": "#/$defs/n", "$defs": {"n": {"type": "integer"}}})


@pytest.mark.parametrize(
    "schema, said",
    [
        ({"type": "string", "minLength": 5, "maxLength": 2}, "minLength 5 and maxLength 2"),
        ({"type": "array", "minItems": 3, "maxItems": 1}, "minItems 3 and maxItems 1"),
        ({"properties": {"n": {"minimum": 10, "maximum": 2}}}, "properties.n: minimum 10"),
        ({"type": "integer", "exclusiveMinimum": 2, "maximum": 2}, "exclusiveMinimum 2"),
        ({"anyOf": [{"type": "null"}, {"enum": []}]}, "anyOf[1]: an empty enum"),
        ({"type": "string", "pattern": "^(((($"}, "is not a regular expression"),
    ],
)
def test_schemas_nothing_satisfies_are_refused(schema: dict, said: str) -> None:
    with pytest.raises(LocalspecError, match="cannot be satisfied") as raised:
        schema_grammar(schema)
    assert said in raised.value.message
    assert schema_grammar({"enum": [[]], "const": {"minLength": 3, "maxLength": 1}})


def _as_regex(expression: str) -> re.Pattern[str]:
    """The GBNF of ``integer_range`` (literals, classes, groups, alternatives, {n,}) as a
    Python pattern, to check every number against it."""
    pattern = re.sub(r'"([^"]*)"', lambda m: re.escape(m.group(1)), expression)
    pattern = pattern.replace(" ", "").replace("(", "(?:")
    return re.compile(f"(?:{pattern})\\Z")


@pytest.mark.parametrize(
    ("lo", "hi"),
    [(18, 30), (0, 9), (-5, -2), (-12, 7), (None, 99), (100, None), (None, -10), (-1, None),
     (7, 7), (0, 0), (1999, 2025), (None, None)],
)  # fmt: skip
def test_integer_bounds_allow_exactly_the_numbers_between(lo: int | None, hi: int | None) -> None:
    """llama-cpp-python's converter leaves integer bounds out; llama.cpp's C++ one (what
    llama-server uses) keeps integers within them, and so does localspec."""
    pattern = _as_regex(integer_range(lo, hi))
    for n in range(-2100, 2100):
        inside = (lo is None or n >= lo) and (hi is None or n <= hi)
        assert bool(pattern.match(str(n))) == inside, (lo, hi, n)
    for odd in ("-0", "007", "01", "-", "1.5", ""):
        assert not pattern.match(odd), (lo, hi, odd)


def test_a_schemas_integer_bounds_hold_on_the_real_model(qwen: Engine) -> None:
    schema = {
        "type": "object",
        "properties": {
            "age": {"type": "integer", "minimum": 18, "maximum": 30},
            "floor": {"type": "integer", "exclusiveMinimum": -4, "exclusiveMaximum": 0},
        },
        "required": ["age", "floor"],
    }
    ask = "Bob is 45 years old and lives on floor 12. Answer in JSON."
    for mode in ("none", "ngram-simple"):
        result = qwen.generate(
            [{"role": "user", "content": ask}], max_tokens=32, mode=mode,
            grammar=schema_grammar(schema),
        )  # fmt: skip
        data = json.loads(result.text)
        assert 18 <= data["age"] <= 30 and -4 < data["floor"] < 0, result.text
    with pytest.raises(LocalspecError, match="no integer is within the bounds"):
        schema_grammar({"type": "integer", "exclusiveMinimum": 1, "exclusiveMaximum": 2})


@pytest.mark.slow
def test_strings_under_a_schema_are_json_strings(qwen: Engine) -> None:
    """A poem has line breaks: under a schema they come escaped (\\n), never raw, which
    json.loads refuses (llama-cpp-python's converter let control characters through)."""
    ask = [{"role": "user", "content": "Write a four-line poem about the sea. Answer in JSON."}]
    schemas = [
        {"type": ["string", "null"]},
        {"type": "object", "properties": {"poem": {"type": "string"}}, "required": ["poem"]},
    ]
    for schema in schemas:
        result = qwen.generate(ask, max_tokens=60, grammar=schema_grammar(schema), mode="none")
        assert "\n" not in result.text.strip(), result.text
        if result.finish_reason == "stop":  # whole: valid JSON
            json.loads(result.text)


def _accepted(engine: Engine, schema: dict, text: str) -> bool:
    """Whether the schema's grammar takes the whole text (as a prefix, token by token)."""
    grammar = Grammar(engine.target, schema_grammar(schema))
    state = grammar.start()
    tokens = engine.target.tokenize(text, add_special=False, parse_special=False)
    try:
        return state.valid_prefix(tokens) == len(tokens)
    finally:
        state.close()
        grammar.close()


def test_required_keys_are_written_even_when_properties_omit_them(qwen: Engine) -> None:
    """llama.cpp's converter writes only the listed properties: a required key left out of
    them could never be written, and every answer would fail the caller's own schema."""
    aged = {
        "type": "object",
        "properties": {"age": {"type": "integer"}},
        "required": ["name", "age"],
    }
    assert _accepted(qwen, aged, '{"age": 3, "name": ["any", 1]}')
    assert not _accepted(qwen, aged, '{"age": 3}')
    named = {"type": "object", "required": ["name"]}  # no properties: others stay allowed
    assert _accepted(qwen, named, '{"name": 1, "other": true}')
    assert not _accepted(qwen, named, '{"other"')
    untyped = {"type": "object", "properties": {"x": {}, "y": {"description": "anything"}}}
    assert _accepted(qwen, {**untyped, "required": ["x", "y"]}, '{"x": [1, 2], "y": "s"}')
    closed = {**aged, "additionalProperties": False}
    with pytest.raises(LocalspecError, match="'name' is required, but not among"):
        schema_grammar(closed)
    result = qwen.generate(EXTRACT, max_tokens=48, grammar=schema_grammar(aged))
    assert set(json.loads(result.text)) == {"age", "name"}


def test_keys_and_values_with_backslashes_or_quotes_are_written_as_json(qwen: Engine) -> None:
    """The port escaped quotes and newlines in GBNF literals but not the backslash: a key or
    an enum value holding one wrote invalid JSON, and one holding a quote did not parse."""
    schema = {
        "type": "object",
        "properties": {"x\\y": {"type": "integer"}, 'a"b': {"enum": ['say "hi"', "new\nline"]}},
        "required": ["x\\y", 'a"b'],
    }
    assert _accepted(qwen, schema, json.dumps({"x\\y": 1, 'a"b': "new\nline"}))
    assert _accepted(qwen, schema, json.dumps({"x\\y": 1, 'a"b': 'say "hi"'}))
    assert not _accepted(qwen, schema, '{"x\\y"')  # a lone backslash: not JSON


def test_regex_escapes_in_patterns(qwen: Engine) -> None:
    """pydantic's patterns (\\d, \\w, \\s, escaped dots): llama.cpp's converters refuse them."""

    def text(pattern: str) -> dict:  # type: ignore[type-arg]
        return {"type": "object", "properties": {"v": {"type": "string", "pattern": pattern}}}

    assert _accepted(qwen, text(r"^\d{5}$"), '{"v": "12345"}')
    assert not _accepted(qwen, text(r"^\d{5}$"), '{"v": "1234a')
    assert _accepted(qwen, text(r"^\w+@\w+\.com$"), '{"v": "ann@mail.com"}')
    assert not _accepted(qwen, text(r"^a\.b$"), '{"v": "axb')
    assert _accepted(qwen, text(r"^[\d\-]+\s\D$"), '{"v": "12-3 x"}')
    with pytest.raises(LocalspecError, match=r"escape \\b is not supported"):
        schema_grammar(text(r"^\bword$"))


@pytest.mark.parametrize(
    "schema, said",
    [
        ({"type": "string", "enum": "abc"}, "enum must be a list of values"),
        ({"type": "object", "required": "a"}, "required must be a list of property names"),
        ({"type": "integer", "minimum": "3"}, "minimum must be a number"),
        ({"type": "string", "maxLength": -1}, "maxLength must be a whole number >= 0"),
        ({"properties": ["a"]}, "properties must be an object of schemas"),
        ({"type": "array", "items": "string"}, "items must be a schema"),
        ({"anyOf": []}, "anyOf must be a non-empty list of schemas"),
        ({"properties": {"a": {"type": "str"}}}, "at the schema.properties['a']: type must be"),
        ({"$defs": {"A": {"$ref": "#/$defs/A"}}, "$ref": "#/$defs/A"}, "refers to itself"),
    ],
)
def test_malformed_schemas_are_named_not_misread(schema: dict, said: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(LocalspecError, match="cannot be turned into a grammar") as refused:
        schema_grammar(schema)
    assert said in refused.value.message


def test_a_recursive_model_as_pydantic_writes_it(qwen: Engine) -> None:
    """The root a $ref into its own $defs, references in chains: the port resolves neither."""
    kids = {"type": "array", "items": {"$ref": "#/$defs/Node"}}
    node = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "kids": kids},
        "required": ["name", "kids"],
    }
    schema = {"$defs": {"Node": node, "Alias": {"$ref": "#/$defs/Node"}}, "$ref": "#/$defs/Alias"}
    assert _accepted(qwen, schema, '{"name": "a", "kids": [{"name": "b", "kids": []}]}')
    assert not _accepted(qwen, schema, '{"kids"')
