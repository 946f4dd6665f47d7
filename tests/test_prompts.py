"""The prompt sets: the built-in kinds, the tuning/held-out suite, prompt files with turns."""

from collections import Counter
from pathlib import Path

import pytest

from localspec.errors import LocalspecError
from localspec.prompts import KINDS, load_prompt_file, select_prompts, suite_prompts

SUITE_KINDS = ("code-edit", "code", "qa", "summary", "creative", "french", "chat")


def test_the_suite_has_five_prompts_or_more_per_kind_split_in_equal_halves() -> None:
    counts = Counter((p.kind, p.split) for p in suite_prompts())
    for kind in SUITE_KINDS:
        assert counts[(kind, "tune")] == counts[(kind, "held-out")]
        assert counts[(kind, "tune")] + counts[(kind, "held-out")] >= 5
    assert {p.kind for p in suite_prompts()} <= set(KINDS)
    names = [p.name for p in suite_prompts()]
    assert len(names) == len(set(names))
    assert {p.split for p in select_prompts("suite:held-out")} == {"held-out"}
    assert len(select_prompts("suite")) == len(suite_prompts())


def test_chat_prompts_send_a_long_history_ending_with_the_user() -> None:
    chats = [p for p in suite_prompts() if p.kind == "chat"]
    assert chats and all(len(p.turns) >= 6 for p in chats)
    for case in chats:
        messages = case.messages
        assert messages[-1]["role"] == "user" and messages[-1]["content"] == case.text
        assert sum(len(m["content"]) for m in messages) > 3000  # a long history
    one_turn = next(p for p in suite_prompts() if p.kind == "qa")
    assert one_turn.messages == [{"role": "user", "content": one_turn.text}]


def test_a_kind_without_a_builtin_prompt_comes_from_the_suite() -> None:
    assert select_prompts("chat")[0].turns


def test_bad_suite_half_and_bad_turns_are_refused(tmp_path: Path) -> None:
    with pytest.raises(LocalspecError, match="suite:held-out"):
        select_prompts("suite:heldout")
    bad = tmp_path / "p.toml"
    bad.write_text(
        '[[prompt]]\nname = "c"\nkind = "chat"\n'
        '[[prompt.turns]]\nrole = "assistant"\ncontent = "hi"\n'
    )
    with pytest.raises(LocalspecError, match="the last one the user's"):
        load_prompt_file(bad)
    bad.write_text('[[prompt]]\nname = "c"\nkind = "qa"\ntext = "t"\nsplit = "dev"\n')
    with pytest.raises(LocalspecError, match="neither tune nor held-out"):
        load_prompt_file(bad)
    good = tmp_path / "chat.toml"
    good.write_text(
        '[[prompt]]\nname = "c"\nkind = "chat"\n'
        '[[prompt.turns]]\nrole = "user"\ncontent = "hi"\n'
        '[[prompt.turns]]\nrole = "assistant"\ncontent = "hello"\n'
        '[[prompt.turns]]\nrole = "user"\ncontent = "again"\n'
    )
    (case,) = load_prompt_file(good)
    assert case.text == "again" and [m["role"] for m in case.messages] == [
        "user",
        "assistant",
        "user",
    ]
