"""The README's Python examples run as written (real model)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


@pytest.mark.slow
def test_readme_python_examples_run(capsys, qwen_path) -> None:  # type: ignore[no-untyped-def]
    blocks = python_blocks()
    assert blocks, "the README lost its Python examples"
    for code in blocks:
        exec(compile(code, str(README), "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out
    assert "def fibonacci" not in out  # the prompt is not echoed
    assert out.strip()
