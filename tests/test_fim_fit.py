"""A completion prompt longer than the context, cut as llama-server's /infill cuts it: the
cursor's surroundings first, at whole lines, the same way from one keystroke to the next;
on the real Qwen2.5-Coder-0.5B vocabulary, and over real HTTP as llama.vim sends it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from localspec import Engine, ExtraFile, FimPrompt
from localspec.engine.fim import fim_tokens
from localspec.engine.fim_fit import PREFIX_SHARE, fitted
from localspec.server.app import ServerSettings
from tests.test_server import LiveServer, post

PREFIX = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(130))
SUFFIX = "".join(f"assert f{i}(1) == {i + 1}\n" for i in range(100))
EXTRA = tuple(
    ExtraFile("".join(f"CONST_{k}_{i} = {i}\n" for i in range(64)), f"consts{k}.py")
    for k in range(8)
)
LONG = FimPrompt(PREFIX, SUFFIX, EXTRA, "    ")


@pytest.fixture(scope="module")
def engine(qwen_path: Path) -> Iterator[Engine]:
    with Engine.load(qwen_path, mode="ngram-simple", n_ctx=1024, parallel=1) as engine:
        yield engine


def test_a_prompt_that_fits_is_left_as_it_is(engine: Engine) -> None:
    short = FimPrompt("def f(x):\n", "\nprint(f(1))\n", (ExtraFile("X = 1\n", "a.py"),), "    ")
    assert fitted(engine.target, short, 1000) is short


@pytest.mark.parametrize("room", [300, 900, 2500])
def test_a_long_prompt_keeps_the_cursor_s_surroundings_at_whole_lines(
    engine: Engine, room: int
) -> None:
    vocab = engine.target
    assert len(fim_tokens(vocab, LONG)) > room
    fit = fitted(vocab, LONG, room)
    assert len(fim_tokens(vocab, fit)) <= room
    assert fit.typed == LONG.typed
    assert PREFIX.endswith(fit.prefix) and (not fit.prefix or PREFIX[-len(fit.prefix) - 1] == "\n")
    assert SUFFIX.startswith(fit.suffix) and fit.suffix.endswith("\n")
    file_tokens = len(fim_tokens(vocab, FimPrompt(fit.prefix, fit.suffix, (), fit.typed)))
    assert fit.extra or file_tokens > 0.9 * room  # the room is used
    # the prefix takes its share of the file's room (lines counted one by one: give or take)
    share = len(vocab.tokenize(fit.prefix)) / len(vocab.tokenize(fit.prefix + fit.suffix))
    assert share >= PREFIX_SHARE - 0.05
    # the other files: the last ones, whole, and before them at most one cut at its lines
    names = [file.filename for file in fit.extra]
    assert names == [file.filename for file in EXTRA[len(EXTRA) - len(names) :]]
    for kept, whole in zip(fit.extra, EXTRA[len(EXTRA) - len(names) :], strict=True):
        assert whole.text.endswith(kept.text)
    assert all(kept.text == EXTRA[-1 - i].text for i, kept in enumerate(fit.extra[::-1][:-1]))


def test_the_next_keystroke_is_cut_the_same_way(engine: Engine) -> None:
    """Only the typed line changes while someone types: the rest is cut as before, so the
    prompt's cached tokens are still good."""
    before = fitted(engine.target, LONG, 900)
    after = fitted(engine.target, FimPrompt(PREFIX, SUFFIX, EXTRA, "    return"), 900)
    assert (after.prefix, after.suffix, after.extra) == (before.prefix, before.suffix, before.extra)


def test_infill_cuts_an_editor_s_long_context_instead_of_refusing_it(engine: Engine) -> None:
    """llama.vim's defaults send 256 lines before the cursor, 64 after and up to 16 chunks of
    other files: more than this 1024-token context, which llama-server's /infill cuts."""
    body = {
        "input_prefix": PREFIX,
        "input_suffix": SUFFIX,
        "input_extra": [{"filename": f.filename, "text": f.text} for f in EXTRA],
        "prompt": "def f130(x):\n    return x +",
        "n_predict": 8,
        "temperature": 0,
    }
    with LiveServer(engine, ServerSettings()) as base:
        r = post(base, "/infill", body)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["content"].strip() and got["timings"]["prompt_n"] + got["tokens_predicted"] <= 1024
