"""llama-server's utility endpoints over real HTTP, on the real SmolLM2-135M: /tokenize,
/detokenize, /apply-template and /props, and their bad input."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from localspec import Engine
from localspec.engine.prompting import render_chat
from localspec.server.app import ServerSettings
from tests.test_server import LiveServer, post


@pytest.fixture(scope="module")
def engine(smollm_path: Path) -> Iterator[Engine]:
    with Engine.load(smollm_path, mode="ngram-simple", n_ctx=1024, parallel=2) as engine:
        yield engine


@pytest.fixture(scope="module")
def base(engine: Engine) -> Iterator[str]:
    with LiveServer(engine, ServerSettings(api_keys=("k1",))) as url:
        yield url


AUTH = {"Authorization": "Bearer k1"}


def test_tokenize_and_detokenize_round_trip(base: str, engine: Engine) -> None:
    text = "Hello world, ça va? <|im_end|>"
    r = post(base, "/tokenize", {"content": text}, headers=AUTH)
    assert r.status_code == 200, r.text
    tokens = r.json()["tokens"]
    assert tokens == engine.target.tokenize(text, add_special=False, parse_special=True)
    as_text = post(base, "/tokenize", {"content": text, "parse_special": False}, headers=AUTH)
    assert len(as_text.json()["tokens"]) > len(tokens)  # the special token's text, spelt out
    pieces = post(base, "/tokenize", {"content": text, "with_pieces": True}, headers=AUTH)
    entries = pieces.json()["tokens"]
    assert [e["id"] for e in entries] == tokens
    assert joined([e["piece"] for e in entries]) == text
    back = post(base, "/detokenize", {"tokens": tokens}, headers=AUTH)
    assert back.status_code == 200 and back.json() == {"content": text}


def test_a_piece_that_is_not_whole_utf8_comes_as_bytes(base: str, engine: Engine) -> None:
    text = "😀"  # byte-level tokens: the emoji's four bytes may split across tokens
    entries = post(base, "/tokenize", {"content": text, "with_pieces": True}, headers=AUTH)
    pieces = [e["piece"] for e in entries.json()["tokens"]]
    assert any(isinstance(p, list) for p in pieces)
    assert joined(pieces) == text


def joined(pieces: list[str | list[int]]) -> str:
    """The text of pieces, some of them byte values (a character split across tokens)."""
    return b"".join(p.encode() if isinstance(p, str) else bytes(p) for p in pieces).decode()


def test_apply_template_is_the_chat_prompt(base: str, engine: Engine) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Name a colour."},
    ]
    r = post(base, "/apply-template", {"messages": messages}, headers=AUTH)
    assert r.status_code == 200, r.text
    prompt = r.json()["prompt"]
    assert prompt == render_chat(engine.target, messages)
    assert "Name a colour." in prompt and prompt.rstrip().endswith("assistant")


def test_props_describe_the_server(base: str, engine: Engine) -> None:
    r = httpx.get(f"{base}/props", headers=AUTH)
    assert r.status_code == 200, r.text
    props = r.json()
    assert props["total_slots"] == 2
    assert props["default_generation_settings"]["n_ctx"] == engine.target.n_ctx
    assert props["chat_template"] and props["model_path"].endswith(".gguf")
    params = props["default_generation_settings"]["params"]
    assert params["speculative.type"] == "ngram-simple"
    # what /completion and /infill do without these fields, as llama-server's /props says
    assert (params["temperature"], params["top_k"], params["n_predict"]) == (0.8, 40, -1)


@pytest.mark.parametrize(
    ("path", "body", "needle"),
    [
        ("/tokenize", {"content": 5}, "content"),
        ("/tokenize", {}, "content"),
        ("/tokenize", [1, 2], "JSON object"),
        ("/detokenize", {"tokens": [1, 10**9]}, "not in the vocabulary"),
        ("/detokenize", {"tokens": [-1]}, "not in the vocabulary"),
        ("/detokenize", {"tokens": "abc"}, "tokens"),
        ("/apply-template", {"messages": []}, "messages"),
        ("/apply-template", {"messages": [{"role": "wizard", "content": "x"}]}, "role"),
    ],
)
def test_bad_input_is_a_400_that_says_what(base: str, path: str, body: object, needle: str) -> None:
    r = post(base, path, body, headers=AUTH)
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"]


def test_the_guards_hold_on_these_routes_too(base: str) -> None:
    assert post(base, "/tokenize", {"content": "x"}).status_code == 401  # no key
    assert httpx.get(f"{base}/props").status_code == 401
    evil = {**AUTH, "Origin": "https://evil.example"}
    assert post(base, "/detokenize", {"tokens": [1]}, headers=evil).status_code == 403
    malformed = httpx.post(
        f"{base}/tokenize", content=b"{", headers={**AUTH, "Content-Type": "application/json"}
    )
    assert malformed.status_code == 400
