"""The main screen: conversation, live statistics, prompt input."""

from __future__ import annotations

import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Protocol

from textual import events, on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Footer, Header
from textual.worker import get_current_worker

from localspec.api import Engine
from localspec.engine.loop import RoundEvent
from localspec.engine.settings import GenerationSettings
from localspec.errors import GenerationCancelled, LocalspecError
from localspec.tui.messages import AnswerFinished, GenerationFailed
from localspec.tui.screens.ask_path import AskScreen
from localspec.tui.screens.context_full import ContextFullScreen
from localspec.tui.screens.help import HelpScreen
from localspec.tui.session import ChatSession
from localspec.tui.widgets.conversation import Conversation
from localspec.tui.widgets.message_view import MessageView
from localspec.tui.widgets.prompt_area import PromptArea
from localspec.tui.widgets.stats_panel import StatsPanel


class ChatHost(Protocol):
    """What the chat screen needs from its app (``tui.app.ChatApp``): the engine, the
    options, the settings of the next answer; the panel follows its ``mode`` and ``speedup``
    (reactive attributes) by watching them."""

    engine: Engine | None
    options: Any

    def generation_settings(self) -> GenerationSettings: ...


REFRESH_S = 0.25  # redraw four times a second: rendering must not slow generation
ANSWER_ROOM = 256  # tokens kept free for the answer when checking that a prompt fits...
ANSWER_ROOM_SHARE = 4  # ... or a quarter of a smaller context (or -n, if less)
NARROW_COLUMNS = 80  # the side panel shows from this width up
STOP_WAIT_S = 60.0  # a generation stops after its round: seconds at most, even on a slow CPU


class ChatScreen(Screen[None]):
    BINDINGS = [
        Binding("escape", "stop", "stop"),
        # above the input's own ctrl+c (copy), which would swallow it with nothing selected
        Binding("ctrl+c", "interrupt", "stop/quit", show=False, priority=True),
        Binding("ctrl+n", "new_chat", "new"),
        Binding("ctrl+s", "save", "save"),
        Binding("ctrl+o", "load", "load"),
        Binding("ctrl+y", "copy_answer", "copy", priority=True),  # above the prompt's redo
        Binding("ctrl+t", "toggle_colours", "colours"),
        Binding("f1", "help", "help"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.session = ChatSession()
        self.answer: MessageView | None = None
        self.generating = False
        self.pending: deque[RoundEvent] = deque()  # filled by the generation thread
        self.idle = threading.Event()  # set while no generation thread is in the engine
        self.idle.set()
        self._window: list[tuple[float, int]] = []  # (time, n_tokens) for "tok/s now"

    @property
    def chat_app(self) -> ChatHost:
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal():
            yield Conversation()
            yield StatsPanel()
        yield PromptArea("Ask something (enter sends, ctrl+j a new line, f1 help)", id="prompt")
        yield Footer()

    def on_mount(self) -> None:
        self.session.system = self.chat_app.options.system
        prompt = self.query_one(PromptArea)
        prompt.cursor_blink = False  # a blinking cursor repaints twice a second for nothing
        prompt.focus()
        self.set_interval(REFRESH_S, self.drain)
        self.watch(self.app, "mode", self._show_mode)
        self.watch(self.app, "speedup", self._show_speedup)

    def on_resize(self, event: events.Resize) -> None:
        # below 80 columns the conversation needs the panel's width more than the figures
        self.stats.display = event.size.width >= NARROW_COLUMNS
        self.conversation.scroll_end(animate=False)  # the latest turn stays in view

    def _show_mode(self, mode: str) -> None:
        self.stats.mode = mode
        self.stats.show(self.stats.last)

    def _show_speedup(self, speedup: float | None) -> None:
        self.stats.speedup = speedup
        self.stats.show(self.stats.last)

    @property
    def conversation(self) -> Conversation:
        return self.query_one(Conversation)

    @property
    def stats(self) -> StatsPanel:
        return self.query_one(StatsPanel)

    def notice(self, text: str) -> None:
        self.conversation.add("notice", text)

    # ----- sending ----------------------------------------------------------------------------

    @on(PromptArea.Submitted, "#prompt")
    def send(self, event: PromptArea.Submitted) -> None:
        text = event.value.strip()
        if not text:
            return
        if self.chat_app.engine is None:
            self.notify("the model is still loading", severity="warning")
            return
        if self.generating:
            self.notify("an answer is being generated (esc stops it)", severity="warning")
            return
        if not self.fits_alone(text):
            return
        event.prompt.value = ""
        self.session.add("user", text)
        self.conversation.add("user", text)
        self.start_answer()

    def start_answer(self) -> None:
        engine = self.chat_app.engine
        assert engine is not None
        messages = self.session.messages()
        try:
            n_prompt = self.prompt_length()
        except LocalspecError as exc:  # text the model cannot take (e.g. from a loaded file)
            self.session.turns.pop()
            self.notice(f"not sent: {exc.message}")
            return
        if n_prompt + self.answer_room() > engine.target.n_ctx:
            self.app.push_screen(
                ContextFullScreen(n_prompt, engine.target.n_ctx), self.context_full_choice
            )
            return
        self.generating = True
        self._window.clear()
        self.answer = self.conversation.add("assistant")
        self.idle.clear()
        self.generate(messages, self.session)

    def prompt_length(self, session: ChatSession | None = None) -> int:
        engine = self.chat_app.engine
        assert engine is not None
        return len(engine.tokenize_prompt((session or self.session).messages()))

    def fits_alone(self, text: str) -> bool:
        """Whether this prompt could be answered with no earlier turn: if not, no trimming
        can make room, and the text stays in the input to be shortened (a long paste is
        not lost)."""
        engine = self.chat_app.engine
        assert engine is not None
        alone = ChatSession(self.session.system, [{"role": "user", "content": text}])
        try:
            n_tokens = self.prompt_length(alone)
        except LocalspecError:
            return True  # said once sent, by start_answer
        n_ctx = engine.target.n_ctx
        if n_tokens + self.answer_room() <= n_ctx:
            return True
        self.notice(
            f"not sent: this prompt alone needs {n_tokens} tokens plus room for the answer, "
            f"and the context holds {n_ctx}: shorten it, or restart the chat with a larger "
            f"context (-c {-(-(n_tokens + ANSWER_ROOM) // 1024) * 1024} at least)"
        )
        return False

    def answer_room(self) -> int:
        """Tokens the prompt must leave free: a small context keeps a share for the answer."""
        engine = self.chat_app.engine
        assert engine is not None
        n_ctx, wanted = engine.target.n_ctx, self.chat_app.options.max_tokens
        return min(ANSWER_ROOM, wanted or ANSWER_ROOM, n_ctx // ANSWER_ROOM_SHARE)

    def fits(self) -> bool:
        engine = self.chat_app.engine
        assert engine is not None
        return self.prompt_length() + self.answer_room() <= engine.target.n_ctx

    async def context_full_choice(self, choice: str | None) -> None:
        if choice == "trim":
            while not self.fits() and self.session.trim_oldest_turn():
                pass
            if not self.fits():
                self.session.turns.pop()
                await self.redraw_conversation()
                self.notice("not sent: this prompt alone is too long for the context")
                return
            await self.redraw_conversation()
            self.notice("oldest turns trimmed to fit the context")
            self.start_answer()
        elif choice == "new":  # the prompt opens the new chat
            text = self.session.turns[-1]["content"]
            await self.action_new_chat()
            self.session.add("user", text)
            self.conversation.add("user", text)
            self.start_answer()
        else:  # the prompt goes back to the input, as it was before enter
            text = self.session.turns.pop()["content"]
            await self.redraw_conversation()
            self.query_one(PromptArea).value = text
            self.notice("not sent: the conversation is too long for the context")

    @work(thread=True, exclusive=True, group="generate")
    def generate(self, messages: list[dict[str, str]], chat: ChatSession) -> None:
        worker = get_current_worker()
        app = self.chat_app
        assert app.engine is not None
        text, reason = [], "stop"
        try:
            settings = app.generation_settings()
            # asked while the engine reads the prompt or calibrates: a stop or a quit then
            # comes at once instead of after that work
            stream = app.engine.stream(messages, settings, cancelled=lambda: worker.is_cancelled)
            try:
                for event in stream:
                    text.append(event.text)
                    reason = event.finish_reason or reason
                    self.pending.append(event)  # drained by the UI at its own pace
                    if worker.is_cancelled:
                        break
            finally:
                stream.close()  # the engine is consistent for the next turn
        except GenerationCancelled:
            pass  # stopped before its first token: an empty answer, marked stopped
        except LocalspecError as exc:
            self.post_message(GenerationFailed(str(exc)))
            return
        finally:
            self.idle.set()
        self.post_message(AnswerFinished("".join(text), reason, worker.is_cancelled, chat))

    def drain(self) -> None:
        """Show what the generation thread produced since the last call. Run on a timer, not
        per token: on a small CPU every cycle the interface takes is taken from llama.cpp."""
        event = None
        while self.pending:
            event = self.pending.popleft()
            if self.answer is not None:
                drafted, rest = self.split_drafted(event)
                self.answer.append(drafted, event.drafted_by or "draft")
                self.answer.append(rest)
        if event is not None:
            now = time.perf_counter()
            self._window.append((now, event.stats.n_tokens))
            self._window = [(t, n) for t, n in self._window if now - t <= 2.0]
            self.redraw(event)

    def split_drafted(self, event: RoundEvent) -> tuple[str, str]:
        """The round's text is its accepted drafted tokens followed by the target's token."""
        n_drafted = sum(event.from_draft)
        if not n_drafted or self.chat_app.engine is None:
            return "", event.text
        piece = self.chat_app.engine.target.piece
        drafted = b"".join(piece(t) for t in event.tokens[:n_drafted])
        cut = min(len(drafted.decode("utf-8", errors="ignore")), len(event.text))
        return event.text[:cut], event.text[cut:]

    def redraw(self, event: RoundEvent) -> None:
        if self.answer is not None:
            self.answer.flush()
            self.conversation.scroll_end(animate=False)
        (t0, n0), (t1, n1) = self._window[0], self._window[-1]
        now_tps = (n1 - n0) / (t1 - t0) if t1 > t0 else event.stats.tokens_per_s
        self.stats.show(event.stats, now_tps)

    def on_answer_finished(self, message: AnswerFinished) -> None:
        if message.chat is not self.session or not self.shown():
            # a new or loaded chat replaced its own, or the app is closing
            self.pending.clear()
            self.generating, self.answer = False, None
            return
        self.drain()
        self.generating = False
        if self.answer is not None:
            self.answer.finish()
        self.session.add("assistant", message.text)
        if message.cancelled:
            self.notice("stopped")
        elif message.finish_reason == "length":
            self.notice("the answer reached its length limit")
        self.answer = None

    def on_generation_failed(self, message: GenerationFailed) -> None:
        self.pending.clear()
        self.generating = False
        self.answer = None
        if self.session.turns and self.session.turns[-1]["role"] == "user":
            self.session.turns.pop()
        if self.shown():
            self.notice(f"error: {message.error}")

    def shown(self) -> bool:
        """Whether the conversation is on screen (not while the app closes)."""
        try:
            return self.conversation.is_attached
        except NoMatches:
            return False

    # ----- actions ----------------------------------------------------------------------------

    def action_stop(self) -> None:
        if self.generating:
            self.workers.cancel_group(self, "generate")

    def action_interrupt(self) -> None:
        """ctrl+c as in a terminal: copies text selected in the prompt, else stops the answer
        being written, else quits."""
        prompt = self.query_one(PromptArea)
        if not prompt.selection.is_empty:
            prompt.action_copy()
        elif self.generating:
            self.action_stop()
        else:
            self.app.exit()

    def stop_and_wait(self) -> bool:
        """Stop the answer being written and wait until its thread has left the engine (it
        stops after its round): only then may the engine be freed. False if it did not."""
        self.action_stop()
        return self.idle.wait(STOP_WAIT_S)

    async def action_new_chat(self) -> None:
        self.action_stop()
        self.session = ChatSession(self.session.system)
        self.answer = None
        await self.conversation.remove_children()
        self.stats.show(None)

    def action_help(self) -> None:
        self.app.push_screen(HelpScreen())

    def action_toggle_colours(self) -> None:
        self.conversation.set_colour_drafts(not self.conversation.colour_drafts)

    def action_copy_answer(self) -> None:
        answer = self.session.last_answer()
        if answer is None:
            self.notify("no answer to copy yet", severity="warning")
            return
        self.app.copy_to_clipboard(answer)
        self.notify("last answer copied")

    def action_save(self) -> None:
        default = str(Path.cwd() / f"chat-{time.strftime('%Y%m%d-%H%M%S')}.json")
        self.app.push_screen(AskScreen("Save the conversation to:", default), self.save_to)

    def save_to(self, path: str | None) -> None:
        if not path:
            return
        try:
            self.session.save(Path(path).expanduser(), str(self.chat_app.options.target))
        except (OSError, LocalspecError) as exc:
            self.notify(f"not saved: {exc}", severity="error")
            return
        self.notify(f"saved to {path}")

    def action_load(self) -> None:
        self.app.push_screen(AskScreen("Load a conversation from:"), self.load_from)

    async def load_from(self, path: str | None) -> None:
        if not path:
            return
        try:
            session = ChatSession.load(Path(path).expanduser())
        except LocalspecError as exc:
            self.notify(f"not loaded, the current chat is kept: {exc.message}", severity="error")
            return
        if session.system is None:  # saved without one: this chat's --system applies
            session.system = self.chat_app.options.system
        self.action_stop()
        self.session, self.answer = session, None
        await self.redraw_conversation()
        self.notify(f"loaded {path}")

    async def redraw_conversation(self) -> None:
        await self.conversation.remove_children()
        for m in self.session.turns:
            self.conversation.add(m["role"], m["content"])
