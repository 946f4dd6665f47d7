"""Fuzzing the two doors user input comes through: the command line and the catalog.

Whatever hypothesis types, a command either refuses it with one error line (exit status 2)
or gets as far as loading a model; it never ends in a traceback or an internal error. The
model load itself is the point where the fuzzed run stops (it would start minutes of real
work): ``Engine.load`` and the chat's full-screen ``run`` raise ``Reached``."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localspec.catalog import _parse_catalog, load_catalog
from localspec.cli import build_parser, main
from localspec.errors import LocalspecError


class Reached(BaseException):
    """The input passed every check; the real work would start here."""


VALUES = (
    "0", "1", "-1", "2", "4", "16", "48", "511", "512", "100000", "nan", "inf", "-inf", "1e309",
    "0.5", "1.5", "-0.0", "abc", "", " ", "4,8", "4,,8", "0,x", "none", "auto", "ngram-simple",
    "draft-self", "draft-model", "draft-mtp", "ngram-simple,draft-self", "ngram-simple+draft-self",
    "0-5,12-23", "skip-every=1", "skip-every=2", "99", "Q4_0", "code-edit,qa", "qa,bogus",
    "\x00", "é", "9" * 30,
)  # fmt: skip


@pytest.fixture
def stop_before_work(monkeypatch, tmp_path):  # type: ignore[no-untyped-def]
    from localspec.api import Engine
    from localspec.tui.app import ChatApp

    def reached(*_args: object, **_kwargs: object) -> None:
        raise Reached

    monkeypatch.setattr(Engine, "load", classmethod(reached))
    monkeypatch.setattr(ChatApp, "run", reached)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    return tmp_path


def command_options() -> dict[str, tuple[list[str], list[str]]]:
    """Each subcommand's flags that take a value, and its switches, read off the parser."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    options = {}
    for name, parser in sub.choices.items():
        flags = [a for a in parser._actions if a.option_strings and a.dest != "help"]
        options[name] = (
            [a.option_strings[0] for a in flags if a.nargs != 0],
            [a.option_strings[0] for a in flags if a.nargs == 0],
        )
    return options


def argv_strategy(models: list[str]) -> st.SearchStrategy[list[str]]:
    value = st.one_of(
        st.sampled_from(VALUES),
        st.integers(-(1 << 70), 1 << 70).map(str),
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
        st.text(max_size=6),
    )

    def for_command(command: str, flags: list[str], switches: list[str]) -> st.SearchStrategy:
        kinds = [st.tuples(st.sampled_from(flags), value).map(list)] if flags else []
        if switches:
            kinds.append(st.sampled_from(switches).map(lambda s: [s]))
        return st.builds(
            lambda model, options: [command, *model, *(x for o in options for x in o)],
            st.lists(st.sampled_from(models), max_size=1 if command != "pairs" else 2),
            st.lists(st.one_of(kinds), max_size=4) if kinds else st.just([]),
        )

    return st.one_of(
        [for_command(c, flags, switches) for c, (flags, switches) in command_options().items()]
    )


@pytest.mark.slow
def test_fuzzed_command_lines_never_crash(stop_before_work, smollm_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    text_file = stop_before_work / "notes.gguf"
    text_file.write_text("not a model")
    models = [str(smollm_path), "smollm2-135m", "/nope.gguf", str(text_file), "qwen2.5-code"]

    @settings(
        max_examples=250,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(argv_strategy(models))
    def check(argv: list[str]) -> None:
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse: bad flag value, or --help
            code = exc.code if isinstance(exc.code, int) else 1
        except Reached:
            code = None
        printed = capsys.readouterr()
        out = printed.out + printed.err
        assert "Traceback" not in out and "internal error" not in out, (argv, out)
        assert code in (None, 0, 2, 130), (argv, code, out)
        if code == 2:
            assert "error:" in out, (argv, out)

    check()


# ----- the catalog ------------------------------------------------------------------------

scalar = st.one_of(
    st.text(max_size=10),
    st.integers(-5, 1 << 40),
    st.booleans(),
    st.floats(allow_nan=False),
    st.sampled_from(["a", "b", "c", "org/a", "a.gguf", "../x.gguf", "F16", "Q4_0", "x==1"]),
)
toml_value = st.recursive(
    scalar,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=8,
)
MODEL_KEYS = ("name", "repo", "file", "sha256", "size", "mirror", "derive", "description")
model_table = st.dictionaries(
    st.sampled_from(MODEL_KEYS),
    toml_value
    | st.sampled_from(["a", "b", "c"])
    | st.fixed_dictionaries(
        {"from": st.sampled_from(["a", "b", "c"]), "ftype": st.sampled_from(["F16", "Q8_0"])}
    ),
)
catalog_data = st.fixed_dictionaries(
    {},
    optional={
        "default_model": st.sampled_from(["a", "b"]) | toml_value,
        "model": st.lists(model_table, max_size=4) | toml_value,
        "pair": st.lists(st.dictionaries(st.sampled_from(["target", "draft", "note"]), scalar))
        | toml_value,
    },
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(catalog_data)
def test_fuzzed_catalogs_load_or_say_why(data: dict) -> None:  # type: ignore[type-arg]
    try:
        catalog = _parse_catalog(Path("models.toml"), "", data)
    except LocalspecError as exc:
        assert str(exc).startswith("models.toml")
        return
    catalog.get(catalog.default_model)
    for entry in catalog.models.values():  # every derivation ends at a downloadable model
        seen = 0
        while entry.derive is not None:
            entry = catalog.get(entry.derive.source)
            seen += 1
            assert seen <= len(catalog.models)
        assert entry.repo and entry.file


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_fuzzed_catalog_bytes_load_or_say_why(tmp_path_factory, raw: bytes) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path_factory.mktemp("catalog") / "models.toml"
    path.write_bytes(raw)
    try:
        load_catalog(path)
    except LocalspecError as exc:
        assert str(path) in str(exc)


# ----- sampling settings, through the real engine ----------------------------------------

edge_floats = st.sampled_from([0.0, 1e-300, 1e-30, 1e-7, 0.5, 1.0, 2.0, 100.0, 1e30])


@pytest.fixture(scope="module")
def smollm(smollm_path: Path):  # type: ignore[no-untyped-def]
    from localspec.api import Engine

    with Engine.load(smollm_path, mode="ngram-simple") as engine:
        yield engine


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    temperature=edge_floats | st.floats(allow_nan=True, allow_infinity=True),
    top_k=st.sampled_from([0, 1, 2, 40, 49152, 10**9]) | st.integers(-3, 10),
    top_p=edge_floats | st.floats(allow_nan=True),
    min_p=edge_floats | st.floats(allow_nan=True),
    seed=st.sampled_from([None, -1, 0, (1 << 64) - 1]) | st.integers(-5, 1 << 70),
    mode=st.sampled_from(["none", "ngram-simple"]),
)
@pytest.mark.slow
def test_fuzzed_sampling_settings_generate_or_say_why(  # type: ignore[no-untyped-def]
    smollm, temperature, top_k, top_p, min_p, seed, mode
) -> None:
    try:
        result = smollm.generate(
            "1, 2, 3, 4,",
            max_tokens=6,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            seed=seed,
            mode=mode,
        )
    except LocalspecError:
        return
    assert len(result.tokens) <= 6 and result.finish_reason in ("stop", "length")
    assert all(0 <= t < smollm.target.n_vocab for t in result.tokens)
