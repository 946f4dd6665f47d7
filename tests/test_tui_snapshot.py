"""Layout snapshots of the chat (pytest-textual-snapshot). The event stream is stubbed here,
the only place where that is right: these tests are about layout, not generation."""

from __future__ import annotations

from localspec.engine.loop import RoundEvent
from localspec.engine.stats import Stats
from localspec.tui.app import ChatApp, ChatOptions
from localspec.tui.messages import AnswerFinished

STATS = Stats(
    n_prompt=42,
    n_tokens=96,
    drafted=120,
    accepted=84,
    rounds=30,
    verifications=20,
    drafted_at=(20, 18, 16, 14, 12, 10, 8, 6),
    accepted_at=(18, 15, 13, 11, 9, 8, 6, 4),
    prefill_ms=80.0,
    draft_ms=12.0,
    verify_ms=2300.0,
    ttft_ms=95.0,
    gen_ms=2400.0,
    draft_length=8,
    paused=False,
    pauses=1,
)


def app() -> ChatApp:
    return ChatApp(ChatOptions(target="stub.gguf"), loader=None)


async def conversation(pilot) -> None:  # type: ignore[no-untyped-def]
    chat = pilot.app.chat
    question = "Rename load_inventory to read_inventory and print the file."
    chat.session.add("user", question)
    chat.conversation.add("user", question)
    chat.answer = chat.conversation.add("assistant")
    chat.generating = True
    chat.answer.append("def read_inventory(path: Path) -> list[Item]:\n")
    chat.answer.append('    items = []\n    with path.open(newline="") as f:\n', "ngram-simple")
    chat.pending.append(RoundEvent("    return items\n", (1, 2), (False, False), STATS))
    chat.post_message(AnswerFinished("", "stop", cancelled=False, chat=chat.session))
    await pilot.pause()
    chat.stats.mode = "ngram-simple"
    chat.stats.speedup = 2.41
    chat.stats.show(STATS, now_tps=41.5)
    await pilot.pause()


def test_main_screen(snap_compare) -> None:  # type: ignore[no-untyped-def]
    assert snap_compare(app(), terminal_size=(100, 30), run_before=conversation)


def test_main_screen_80x24(snap_compare) -> None:  # type: ignore[no-untyped-def]
    assert snap_compare(app(), terminal_size=(80, 24), run_before=conversation)


def test_stats_panel_wide(snap_compare) -> None:  # type: ignore[no-untyped-def]
    assert snap_compare(app(), terminal_size=(140, 40), run_before=conversation)
