"""The host-memory prompt cache: what it keeps and drops (pure), and a prompt pushed out of
every slot given back on the real model, answering as read afresh."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from localspec import Engine
from localspec.engine.model_context import SavedSequence
from localspec.engine.prompt_cache import MIN_TOKENS, PromptCache
from localspec.errors import LocalspecError
from localspec.lossless import compare


def saved(tokens: list[int], size: int = 100) -> SavedSequence:
    return SavedSequence(tuple(tokens), 0, None, (ctypes.c_ubyte * size)())


def test_a_longer_cache_supersedes_its_prefix_and_the_oldest_go_first() -> None:
    cache = PromptCache(max_bytes=250)
    cache._keep(saved([1, 2, 3]))
    cache._keep(saved([1, 2, 3, 4]))  # extends the first: it replaces it
    assert [s.tokens for s in cache._saved] == [(1, 2, 3, 4)]
    cache._keep(saved([1, 2]))  # a prefix of a kept one: nothing new
    assert len(cache) == 1
    cache._keep(saved([7, 8]))
    cache._keep(saved([9]))  # over 250 bytes: the least recently used goes
    assert [s.tokens for s in cache._saved] == [(7, 8), (9,)]
    cache._keep(saved([5], size=300))  # larger than the whole cache: not kept
    assert cache.size == 200
    best, length = cache._best([7, 8, 1])
    assert best is not None and best.tokens == (7, 8) and length == 2


def test_a_prompt_pushed_out_of_every_slot_comes_back(qwen_path: Path) -> None:
    """Two slots, three long prompts: the first one's cache leaves its slot for host memory,
    and asked again it is restored, not read again; the answer is the one read afresh."""
    heads = ["You are reviewing a pull request.\n", "Translate into French.\n", "Say hi.\n"]
    prompts = [head * 12 + f"Question {i}: what does it do?" for i, head in enumerate(heads)]
    with Engine.load(qwen_path, mode="ngram-simple", parallel=2) as engine:
        scheduler = engine.scheduler()
        cache = scheduler.prompt_cache
        assert cache is not None
        # plain decoding: a drafter's schedule, learnt from the first answer, would batch the
        # second otherwise, and batches of other shapes may tip a near tie
        first = engine.generate(prompts[0], max_tokens=16, temperature=0, mode="none")
        # the other two fill both slots: the first prompt's cache goes to host memory
        engine.generate_many(prompts[1:], max_tokens=4, temperature=0)
        assert len(cache) >= 1
        read = scheduler.totals.prompt_rows
        again = engine.generate(prompts[0], max_tokens=16, temperature=0, mode="none")
        assert cache.restored >= 1
        assert scheduler.totals.prompt_rows - read < MIN_TOKENS  # not read again
        assert again.tokens == first.tokens


def test_the_prompt_cache_size_is_checked_and_zero_turns_it_off(qwen_path: Path) -> None:
    with pytest.raises(LocalspecError, match="prompt_cache_mb"):
        Engine.load(qwen_path, parallel=2, prompt_cache_mb=-1)
    with Engine.load(qwen_path, parallel=2, prompt_cache_mb=0) as engine:
        assert engine.scheduler().prompt_cache is None


def test_one_prompt_asked_at_once_is_read_once(qwen: Engine, qwen_path: Path) -> None:
    """Three seeded requests with one long prompt at once (an ``n`` of three): the first
    reads it, the others wait for that read and copy its slot's cache. Each answer is the
    one the request gives alone, its prompt read afresh."""
    prompt = "You are reviewing a pull request. Be precise and brief.\n" * 12 + "What changed?"
    settings = {"max_tokens": 12, "temperature": 0.8, "seed": 7}
    alone = qwen.generate(prompt, record_margins=True, **settings)
    with Engine.load(qwen_path, mode="ngram-simple", parallel=3, prompt_cache_mb=0) as engine:
        totals = engine.scheduler().totals
        n_prompt = len(engine.tokenize_prompt(prompt))
        got = engine.generate_many([prompt] * 3, **settings)
        assert totals.copies == 2
        assert totals.prompt_rows < n_prompt + MIN_TOKENS  # not three times
    for result in got:
        report = compare(alone.tokens, alone.margins, result.tokens, alone.runners_up)
        assert report.identical or (report.near_tie and report.margin is not None)


def test_requests_under_one_system_prompt_read_it_once(qwen: Engine, qwen_path: Path) -> None:
    """Greedy requests that share a long start and end apart: one reads the start, the
    others copy it and read only their own ends; the answers are those given alone."""
    head = "You are a support agent for a bicycle shop. Answer in one sentence.\n" * 10
    prompts = [head + q for q in ("Do you fix tyres?", "When do you open?", "Is there parking?")]
    with Engine.load(qwen_path, mode="ngram-simple", parallel=3, prompt_cache_mb=0) as engine:
        totals = engine.scheduler().totals
        n_head = len(engine.tokenize_prompt(head))
        got = engine.generate_many(prompts, max_tokens=10)
        assert totals.copies == 2
        assert totals.prompt_rows < n_head + 3 * MIN_TOKENS
    for prompt, result in zip(prompts, got, strict=True):
        ref = qwen.generate(prompt, max_tokens=10, mode="none", record_margins=True)
        assert compare(ref.tokens, ref.margins, result.tokens, ref.runners_up).ok
