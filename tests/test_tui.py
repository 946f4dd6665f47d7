"""`localspec chat` driven with Textual's Pilot, on the real SmolLM2-135M."""

from __future__ import annotations

import asyncio
import fcntl
import html
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from textual import events

from localspec.tui.app import ChatApp, ChatOptions
from localspec.tui.screens.ask_path import AskScreen
from localspec.tui.screens.context_full import ContextFullScreen

WAIT_S = 180.0  # far more than anything here takes on a busy 2-core machine
STOP_TRIES = 3
REPEAT = (
    "Repeat exactly three times: the cat sat on the mat and looked at the dog. "
    "the cat sat on the mat and looked at the dog."
)


def make_app(smollm_path: Path, **kw) -> ChatApp:  # type: ignore[no-untyped-def]
    return ChatApp(ChatOptions(target=str(smollm_path), n_ctx=kw.pop("n_ctx", 2048), **kw))


async def until(app: ChatApp, pilot, done: Callable[[], bool], what: str) -> None:  # type: ignore[no-untyped-def]
    """Wait for ``done()``, at most WAIT_S: a test that waits forever hangs the whole run."""
    deadline = time.monotonic() + WAIT_S
    while not done():
        said = [str(n.message) for n in app._notifications]
        assert time.monotonic() < deadline, (
            f"{what}: not after {WAIT_S} s ({app.load_error}, {said})"
        )
        await pilot.pause(0.02)


async def ready(app: ChatApp, pilot) -> None:  # type: ignore[no-untyped-def]
    await until(app, pilot, lambda: app.engine is not None, "the model loaded")


async def answered(app: ChatApp, pilot) -> None:  # type: ignore[no-untyped-def]
    await until(app, pilot, lambda: not app.chat.generating, "the answer ended")


async def ask(app: ChatApp, pilot, text: str, wait: bool = True) -> None:  # type: ignore[no-untyped-def]
    app.chat.query_one("#prompt").value = text
    await pilot.press("enter")
    await pilot.pause(0.05)
    if wait:
        await answered(app, pilot)


async def test_answer_streams_and_stats_show_speculation(smollm_path: Path) -> None:
    app = make_app(smollm_path, max_tokens=60)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(app, pilot)
        await ask(app, pilot, REPEAT)
        stats = app.chat.stats.last
        assert stats is not None and stats.tokens_per_s > 0 and stats.accepted > 0
        panel = str(app.chat.stats.render_stats().columns[1]._cells)
        assert "ngram-simple" in panel
        answer = app.chat.conversation.views()[-1]
        assert answer.role == "assistant" and answer.text.strip()
        assert any(drafter for _, drafter in answer.spans)  # accepted drafts are coloured
        assert app.chat.session.turns[-1]["role"] == "assistant"


def bottom_line(app: ChatApp) -> str:
    """The screen's last row as text (from Textual's own screenshot)."""
    svg = app.export_screenshot()
    rows: dict[float, list[str]] = {}
    for y, text in re.findall(r'<text[^>]*y="([\d.]+)"[^>]*>(.*?)</text>', svg):
        rows.setdefault(float(y), []).append(html.unescape(re.sub("<[^>]+>", "", text)))
    return "".join(rows[max(rows)]).replace("\xa0", " ")


async def stop_a_long_answer(app: ChatApp, pilot, key: str) -> None:  # type: ignore[no-untyped-def]
    """Ask for a long answer, press ``key`` once it is being written, wait for the stop.

    Keys are posted, not pressed: the pilot's press waits until the process is idle, up to
    two seconds while an answer is generated, and a short answer can end within them. One
    that ends before the key could stop it is asked for again (what the model answers
    depends on the conversation so far)."""
    chat = app.chat

    def writing() -> bool:
        return chat.answer is not None and len(chat.answer.text) >= 20

    for _ in range(STOP_TRIES):
        sent = len(chat.session.turns) + 1
        chat.query_one("#prompt").value = "Write a very long story about a dragon."
        app.post_message(events.Key("enter", "\r"))
        await until(app, pilot, lambda: len(chat.session.turns) >= sent, "the prompt sent")  # noqa: B023
        await until(app, pilot, lambda: writing() or not chat.generating, "the answer written")
        if writing():
            app.post_message(events.Key(key, "\x1b" if key == "escape" else None))
            await answered(app, pilot)
            if chat.conversation.views()[-1].text.endswith("stopped"):
                return
        await answered(app, pilot)
    raise AssertionError(f"no answer long enough to stop in {STOP_TRIES} tries")


@pytest.mark.slow
async def test_escape_stops_and_the_next_prompt_works(smollm_path: Path) -> None:
    app = make_app(smollm_path, max_tokens=600)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(app, pilot)
        footer = bottom_line(app)  # an 80x24 terminal shows every key's label whole
        for label in ("esc stop", "save", "load", "copy", "colours", "f1 help", "palette"):
            assert label in footer, footer
        await stop_a_long_answer(app, pilot, "escape")
        stopped = app.chat.session.turns[-1]["content"]
        assert any(v.text.endswith("stopped") for v in app.chat.conversation.views())
        assert len(stopped) > 0
        await ask(app, pilot, "Say hello.")
        assert app.chat.session.turns[-1]["role"] == "assistant"
        assert app.chat.session.turns[-1]["content"].strip()
        assert app.chat.session.turns[-2]["content"] == "Say hello."
        # ctrl+c as in a terminal: it stops the answer, and with none being written, quits
        await stop_a_long_answer(app, pilot, "ctrl+c")
        assert app.is_running and app.chat.session.turns[-1]["role"] == "assistant"
        # posted, not pressed: the pilot waits for an idle app after a key, and one that
        # quits is never idle again
        app.post_message(events.Key("ctrl+c", None))
        deadline = time.monotonic() + 30
        while app.is_running and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not app.is_running


@pytest.mark.slow
async def test_a_pasted_text_keeps_its_lines_and_ctrl_j_starts_one(smollm_path: Path) -> None:
    app = make_app(smollm_path, max_tokens=4)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(app, pilot)
        app.post_message(events.Paste("def f(x):\n    return x + 1\n"))  # as terminals send it
        await pilot.pause(0.1)
        await pilot.press(*"Explain", "ctrl+j", *"briefly.", "enter")
        await until(app, pilot, lambda: bool(app.chat.session.turns), "the prompt sent")
        await answered(app, pilot)
        question = app.chat.session.turns[0]["content"]
        assert question == "def f(x):\n    return x + 1\nExplain\nbriefly."


async def test_a_narrow_terminal_gives_the_panel_s_width_to_the_conversation() -> None:
    app = ChatApp(ChatOptions(target="model.gguf"), loader=None)
    async with app.run_test(size=(60, 20)) as pilot:
        await pilot.pause(0.1)
        assert not app.chat.stats.display
        await pilot.press("ctrl+p")  # the palette opens on the chat's own commands
        await pilot.pause(0.3)
        assert "Mode:&#160;ngram-simple" in app.export_screenshot()
        await pilot.press("escape")
        await pilot.resize_terminal(100, 30)
        await pilot.pause(0.1)
        assert app.chat.stats.display


async def palette(pilot, entry: str) -> None:  # type: ignore[no-untyped-def]
    """Open the command palette, type an entry, run it."""
    await pilot.press("ctrl+p")
    await pilot.pause(0.2)
    await pilot.press(*entry)
    await pilot.pause(0.5)
    await pilot.press("enter")
    await pilot.pause(0.3)


@pytest.mark.slow
async def test_mode_switch_from_the_command_palette(smollm_path: Path) -> None:
    app = make_app(smollm_path, max_tokens=40)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(app, pilot)
        await palette(pilot, "Mode: none")
        assert app.current_mode == "none"
        assert app.chat.stats.mode == "none"  # the panel follows the app's reactive mode
        await ask(app, pilot, REPEAT)
        assert app.chat.stats.last.drafted == 0
        app.switch_mode("ngram-simple")
        await ask(app, pilot, REPEAT)
        assert app.chat.stats.last.drafted > 0
        await palette(pilot, "New chat")
        assert app.chat.session.turns == []  # the palette ran the screen's own action


@pytest.mark.slow
async def test_save_and_load_round_trip_and_damaged_file(smollm_path: Path, tmp_path: Path) -> None:
    app = make_app(smollm_path, max_tokens=12)
    saved = tmp_path / "chat.json"
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(app, pilot)
        await ask(app, pilot, "Name a colour.")
        turns = list(app.chat.session.turns)
        await pilot.press("ctrl+s")
        await pilot.pause(0.1)
        assert isinstance(app.screen, AskScreen)
        app.screen.query_one("#answer").value = str(saved)
        await pilot.press("enter")
        await pilot.pause(0.1)
        assert json.loads(saved.read_text())["messages"] == turns
        await pilot.press("ctrl+n")
        await pilot.pause(0.1)
        assert app.chat.session.turns == []
        await pilot.press("ctrl+o")
        await pilot.pause(0.1)
        app.screen.query_one("#answer").value = str(saved)
        await pilot.press("enter")
        await pilot.pause(0.1)
        assert app.chat.session.turns == turns
        assert len(app.chat.conversation.views()) == len(turns)

        damaged = tmp_path / "damaged.json"
        damaged.write_text('{"format": "localspec-chat", "messages": [{"role": 3}]}')
        await pilot.press("ctrl+o")
        await pilot.pause(0.1)
        app.screen.query_one("#answer").value = str(damaged)
        await pilot.press("enter")
        await pilot.pause(0.1)
        assert app.chat.session.turns == turns  # the current chat is kept
        assert any("not loaded" in str(n.message) for n in app._notifications)


@pytest.mark.slow
async def test_a_new_or_loaded_chat_drops_the_answer_being_written(
    smollm_path: Path, tmp_path: Path
) -> None:
    """ctrl+n or ctrl+o while an answer streams: the stopped answer belongs to the old chat,
    not to the new one (nor to what ctrl+s writes next)."""
    app = make_app(smollm_path, max_tokens=600)
    saved = tmp_path / "saved.json"
    saved.write_text(
        json.dumps(
            {
                "format": "localspec-chat",
                "version": 1,
                "messages": [{"role": "user", "content": "hi"}],
            }
        )
    )

    async def interrupt(key: str) -> None:  # type: ignore[no-untyped-def]
        await ask(app, pilot, "Write a very long story about a dragon.", wait=False)
        writing = lambda: app.chat.stats.last is not None and app.chat.stats.last.n_tokens >= 5  # noqa: E731
        await until(app, pilot, writing, "the answer is being written")
        await pilot.press(key)
        await pilot.pause(0.1)
        if key == "ctrl+o":
            app.screen.query_one("#answer").value = str(saved)
            await pilot.press("enter")
        await answered(app, pilot)
        await pilot.pause(0.1)

    async with app.run_test(size=(100, 30)) as pilot:
        await ready(app, pilot)
        await interrupt("ctrl+n")
        assert app.chat.session.turns == []
        await interrupt("ctrl+o")
        assert app.chat.session.turns == [{"role": "user", "content": "hi"}]
        await ask(app, pilot, "Say hello.")  # the next answer goes where it belongs
        assert [m["role"] for m in app.chat.session.turns] == ["user", "user", "assistant"]


async def test_a_chat_loaded_without_a_system_message_keeps_the_flags_one(
    smollm_path: Path, tmp_path: Path
) -> None:
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps({"format": "localspec-chat", "version": 1, "messages": []}))
    app = make_app(smollm_path, max_tokens=8, system="Be brief.")
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(app, pilot)
        await app.chat.load_from(str(saved))
        assert app.chat.session.system == "Be brief."


@pytest.mark.slow
async def test_a_small_context_keeps_a_share_for_the_answer(smollm_path: Path) -> None:
    """-c 256: a short question is answered, not sent to the context-full dialog."""
    app = make_app(smollm_path, n_ctx=256, max_tokens=1024)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(app, pilot)
        await ask(app, pilot, "hi")
        assert not isinstance(app.screen, ContextFullScreen)
        assert app.chat.session.turns[-1]["role"] == "assistant"


@pytest.mark.slow
async def test_a_draft_that_does_not_load_leaves_the_chat_as_it_was(smollm_path: Path) -> None:
    app = make_app(smollm_path, max_tokens=8)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(app, pilot)
        title = app.sub_title
        app.reload_with_draft("/nonexistent/draft.gguf")
        loaded = lambda: not app.sub_title.startswith("loading")  # noqa: E731
        await until(app, pilot, loaded, "the draft refused")
        assert app.sub_title == title and app.options.draft is None
        assert any("current one is kept" in str(n.message) for n in app._notifications)
        await ask(app, pilot, "Say yes.")  # the engine still answers
        assert app.chat.session.turns[-1]["role"] == "assistant"


@pytest.mark.slow
async def test_full_context_offers_trim_or_new_chat(smollm_path: Path) -> None:
    app = make_app(smollm_path, n_ctx=512, max_tokens=8)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(app, pilot)
        await ask(app, pilot, "Say yes.")
        history = len(app.engine.tokenize_prompt(app.chat.session.messages()))
        alone = len(app.engine.tokenize_prompt([{"role": "user", "content": ""}]))
        room = 512 - app.chat.answer_room() - alone  # fits alone, not with the history
        assert history - alone > 8
        await ask(app, pilot, "word " * (room - 6), wait=False)
        await pilot.pause(0.2)
        assert isinstance(app.screen, ContextFullScreen)
        await pilot.click("#trim")
        await pilot.pause(0.2)
        await answered(app, pilot)
        assert not isinstance(app.screen, ContextFullScreen)
        texts = [v.text for v in app.chat.conversation.views()]
        assert any("trimmed" in t for t in texts), texts
        # a prompt that alone cannot fit: no trim can help; said at once, the history kept
        # and the text left in the input to be shortened
        turns = list(app.chat.session.turns)
        await ask(app, pilot, "word " * 600, wait=False)
        await pilot.pause(0.2)
        assert not isinstance(app.screen, ContextFullScreen)
        assert app.chat.session.turns == turns
        said = app.chat.conversation.views()[-1].text
        assert "this prompt alone needs" in said and "the context holds 512" in said, said
        assert app.chat.query_one("#prompt").value.startswith("word word")


@pytest.mark.slow
async def test_a_prompt_the_context_full_dialog_cancels_or_moves_is_not_lost(smollm_path: Path):  # type: ignore[no-untyped-def]
    app = make_app(smollm_path, n_ctx=512, max_tokens=8)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(app, pilot)
        await ask(app, pilot, "Say yes.")
        alone = len(app.engine.tokenize_prompt([{"role": "user", "content": ""}]))
        text = "word " * (512 - app.chat.answer_room() - alone - 6)  # fits alone only
        for choice in ("escape", "#new"):
            await ask(app, pilot, text, wait=False)
            await pilot.pause(0.2)
            assert isinstance(app.screen, ContextFullScreen)
            await (pilot.press(choice) if choice == "escape" else pilot.click(choice))
            await pilot.pause(0.2)
            await answered(app, pilot)
            if choice == "escape":  # back in the input, not on screen as a turn
                assert app.chat.query_one("#prompt").value == text.strip()
                assert [t["role"] for t in app.chat.session.turns] == ["user", "assistant"]
                assert not any(v.text == text.strip() for v in app.chat.conversation.views())
            else:  # the new chat's first prompt
                assert app.chat.session.turns[0]["content"] == text.strip()
                assert app.chat.session.turns[-1]["role"] == "assistant"


async def test_loading_reports_progress_and_answers_render_markdown(smollm_path: Path) -> None:
    class Recording(ChatApp):
        seen: list[str] = []

        def on_load_progress(self, message) -> None:  # type: ignore[no-untyped-def]
            super().on_load_progress(message)
            self.seen.append(self.sub_title)

    app = Recording(ChatOptions(target=str(smollm_path), max_tokens=40))
    seen = app.seen
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(app, pilot)
        assert any(t.startswith("loading the target model") for t in seen)
        await ask(app, pilot, "Write a Markdown list of three fruits.")
        answer = app.chat.conversation.views()[-1]
        assert answer.complete
        await pilot.press("ctrl+t")  # colours off: the finished answer is rendered Markdown
        from rich.markdown import Markdown

        assert isinstance(answer.renderable(), Markdown)


@pytest.mark.slow
async def test_tokens_from_the_speculation_memory_have_their_own_colour(smollm_path: Path) -> None:
    from localspec.tui.widgets.message_view import DRAFTER_STYLES

    app = make_app(smollm_path, max_tokens=40, mode="suffix+ngram-simple")
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(app, pilot)
        question = "Write four lines about the sea and its colours."
        await ask(app, pilot, question)
        await palette(pilot, "New chat")
        await ask(app, pilot, question)  # asked again in a new chat: drafted from memory
        answer = [v for v in app.chat.conversation.views() if v.role == "assistant"][-1]
        assert any(drafter == "suffix" for _, drafter in answer.spans)
        styles = {str(span.style) for span in answer.as_text().spans}
        assert DRAFTER_STYLES["suffix"] in styles


def run_in_terminal(
    argv: list[str], keys: list[tuple[str | float, str | int]], timeout: float = 300.0
) -> int:
    """Run a command in a pseudo-terminal as a user would; for each (wait_for, typed): wait
    until the screen has shown ``wait_for`` (or that many seconds), then type (or, for a
    number, send that signal). Returns the exit status."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: a terminal of 100x30, SIGINT as a terminal has it
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.execvpe(argv[0], argv, {**os.environ, "COLUMNS": "100", "LINES": "30"})
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    seen, deadline = b"", time.monotonic() + timeout
    try:
        for wait_for, typed in keys:
            until = time.monotonic() + wait_for if isinstance(wait_for, float) else deadline
            while time.monotonic() < until and not (
                isinstance(wait_for, str) and wait_for.encode() in seen
            ):
                if select.select([fd], [], [], 0.1)[0]:
                    seen += os.read(fd, 65536)
            if isinstance(typed, int):
                os.kill(pid, typed)
            else:
                os.write(fd, typed.encode())
        while time.monotonic() < deadline:  # read until the app has left the terminal
            if select.select([fd], [], [], 0.1)[0]:
                try:
                    if not os.read(fd, 65536):
                        break
                except OSError:
                    break
            if os.waitpid(pid, os.WNOHANG)[0]:
                break
    finally:
        os.close(fd)
    _, status = os.waitpid(pid, 0) if time.monotonic() < deadline else (0, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.mark.slow
def test_quitting_while_an_answer_streams_exits_cleanly_and_keeps_the_memory(
    smollm_path: Path, tmp_path: Path
) -> None:
    """ctrl+q in the middle of an answer, in a real terminal: the engine is freed only once
    the generation thread has left llama.cpp (freed under it: a segfault, exit -11), so
    the exit status is 0 and the speculation memory is written at exit."""
    memory = tmp_path / "memory.bin"
    argv = [sys.executable, "-m", "localspec", "chat", str(smollm_path), "-n", "2000"]
    code = run_in_terminal(
        [*argv, "--spec-memory", str(memory)],
        [
            # the subtitle names the model once it is loaded
            (f"{smollm_path.name} · ", "Write a very long story about a dragon and a knight.\r"),
            (2.0, "\x11"),  # ctrl+q two seconds into the answer (2000 tokens: far more)
        ],
    )
    assert code == 0
    assert memory.stat().st_size > 0


@pytest.mark.slow
def test_a_killed_or_hung_up_chat_keeps_the_memory(smollm_path: Path, tmp_path: Path) -> None:
    """SIGTERM (a kill) or SIGHUP (the terminal closed) ends the chat as ctrl+q does: the
    speculation memory of the session is written on the way out."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        memory = tmp_path / f"memory-{signum}.bin"
        argv = [sys.executable, "-m", "localspec", "chat", str(smollm_path), "-n", "16"]
        code = run_in_terminal(
            [*argv, "--spec-memory", str(memory)],
            [
                (f"{smollm_path.name} · ", "Say hello.\r"),
                (4.0, signum),  # the answer of 16 tokens is written by then
            ],
        )
        assert code == 0, signum
        assert memory.stat().st_size > 0, signum


@pytest.mark.slow
def test_standard_error_redirected_still_shows_the_chat(smollm_path: Path, tmp_path: Path) -> None:
    """``2>log`` in a terminal: the chat draws on the terminal of standard output (Textual
    draws on standard error, which would leave the screen blank)."""
    log = tmp_path / "err.log"
    command = f"exec {sys.executable} -m localspec chat {smollm_path} -n 8 2>{log}"
    code = run_in_terminal(["sh", "-c", command], [(f"{smollm_path.name} · ", "\x11")], 90.0)
    said = log.read_text()
    assert code == 0 and "no terminal" not in said, said  # the full-screen chat, not lines
    assert "\x1b[" not in said  # the screen went to the terminal, not the log


@pytest.mark.slow
def test_without_a_terminal_the_chat_reads_a_prompt_a_line(smollm_path: Path, tmp_path: Path):  # type: ignore[no-untyped-def]
    """A pipe, a script or a background job: no screen drawn for nobody, no hang; each line
    is a turn of one conversation, answered on standard output; the input's end ends it."""
    memory = tmp_path / "memory.bin"
    argv = [sys.executable, "-m", "localspec", "chat", str(smollm_path), "-n", "12"]
    done = subprocess.run(
        [*argv, "--spec-memory", str(memory)],
        input="Say hello.\n\nSay goodbye.\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "\x1b[" not in done.stdout + done.stderr  # no full-screen drawing
    assert "one prompt a line" in done.stderr
    assert len([line for line in done.stdout.splitlines() if line.strip()]) >= 2
    assert memory.stat().st_size > 0  # saved at the end, as the full-screen chat does
    nothing = subprocess.run(
        [sys.executable, "-m", "localspec", "chat", str(smollm_path)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert nothing.returncode == 0 and not nothing.stdout.strip(), nothing.stderr
    # a kill while it waits for the next line: the memory of the answers so far is saved
    memory.unlink()
    killed = subprocess.Popen(
        [*argv, "--spec-memory", str(memory)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert killed.stdin is not None and killed.stdout is not None
    killed.stdin.write("Say hello.\n")
    killed.stdin.flush()
    while killed.stdout.readline().strip() == "":  # the answer's first line
        assert killed.poll() is None
    time.sleep(1.0)  # the rest of a 12-token answer
    killed.terminate()
    assert killed.wait(timeout=60) == 128 + signal.SIGTERM
    assert memory.stat().st_size > 0
