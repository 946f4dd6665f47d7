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
        first = engine.generate(prompts[0], max_tokens=16, temperature=0)
        # the other two fill both slots: the first prompt's cache goes to host memory
        engine.generate_many(prompts[1:], max_tokens=4, temperature=0)
        assert len(cache) >= 1
        read = scheduler.totals.prompt_rows
        again = engine.generate(prompts[0], max_tokens=16, temperature=0)
        assert cache.restored >= 1
        assert scheduler.totals.prompt_rows - read < MIN_TOKENS  # not read again
        assert again.tokens == first.tokens


def test_the_prompt_cache_size_is_checked_and_zero_turns_it_off(qwen_path: Path) -> None:
    with pytest.raises(LocalspecError, match="prompt_cache_mb"):
        Engine.load(qwen_path, parallel=2, prompt_cache_mb=-1)
    with Engine.load(qwen_path, parallel=2, prompt_cache_mb=0) as engine:
        assert engine.scheduler().prompt_cache is None
