"""The Textual application: loads the engine in a worker, hosts the chat screen, offers the
command palette (switch mode, draft model, draft length)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from functools import partial
from typing import Any

from textual import work
from textual.app import App
from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.reactive import reactive

from localspec.api import Engine
from localspec.drafters.ngram import NgramParams
from localspec.engine.loop import SpecConfig
from localspec.engine.model_context import FlashAttn
from localspec.engine.settings import GenerationSettings
from localspec.errors import LocalspecError
from localspec.memory_bank import DEFAULT_MEMORY_MB
from localspec.probe_results import saved_speedup
from localspec.tui.messages import EngineFailed, EngineReady, LoadProgress
from localspec.tui.screens.ask_path import AskScreen
from localspec.tui.screens.chat import ChatScreen

DRAFT_LENGTHS = (2, 4, 8, 16, 32, 48)
ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
MODE_HELP = {"none": "no speculation: plain decoding"}


@dataclass
class ChatOptions:
    target: str
    draft: str | None = None
    mode: str | None = None
    spec: SpecConfig = field(default_factory=SpecConfig)
    ngram: NgramParams = field(default_factory=NgramParams)
    n_ctx: int = 4096
    n_threads: int | None = None
    n_gpu_layers: int | None = None
    n_gpu_layers_draft: int | None = None
    flash_attn: FlashAttn = "auto"
    self_layers: str | None = None
    self_quant: str = "auto"
    spec_memory_mb: float = DEFAULT_MEMORY_MB
    spec_memory_path: str | bool | None = None
    parallel: int = 1  # one conversation: one slot
    system: str | None = None
    temperature: float = 0.0
    max_tokens: int = 1024


CHAT_ONLY = ("system", "temperature", "max_tokens")  # the rest are Engine.load's arguments


def load_engine(
    options: ChatOptions, progress: Callable[[str, float], None] | None = None
) -> Engine:
    load = {f.name: getattr(options, f.name) for f in fields(options) if f.name not in CHAT_ONLY}
    engine = Engine.load(**load, progress=progress)
    try:
        engine.warm_up()  # while "loading" shows, not before the first answer's first token
    except BaseException:
        engine.close()
        raise
    return engine


class SpeculationCommands(Provider):
    """Command palette entries: modes, draft lengths, draft model, save/load, new chat."""

    def entries(self) -> list[tuple[str, Callable[[], Any], str]]:
        app: ChatApp = self.app  # type: ignore[assignment]
        modes = app.engine.available_modes() if app.engine else ["ngram-simple", "none"]
        if "draft-model" not in modes:
            modes.append("draft-model")  # offered: it explains how to load a draft
        found = [
            (f"Mode: {m}", partial(app.switch_mode, m), MODE_HELP.get(m, f"speculate with {m}"))
            for m in modes
        ]
        found += [
            (
                f"Draft length: {n}",
                partial(app.set_draft_length, n),
                f"draft at most {n} tokens per round",
            )
            for n in DRAFT_LENGTHS
        ]
        found += [
            ("Draft model: load another…", app.ask_draft_model, "reload with a draft"),
            ("Colour drafted tokens: toggle", partial(app.screen_action, "toggle_colours"), ""),
            ("Save conversation", partial(app.screen_action, "save"), "JSON file"),
            ("Load conversation", partial(app.screen_action, "load"), "JSON file"),
            ("New chat", partial(app.screen_action, "new_chat"), ""),
            ("Copy last answer", partial(app.screen_action, "copy_answer"), ""),
        ]
        return found

    async def discover(self) -> Hits:
        """What the palette lists before anything is typed: these entries, above Textual's
        own (keys, theme, screenshot)."""
        for name, action, help_text in self.entries():
            yield DiscoveryHit(name, action, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, action, help_text in self.entries():
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), action, help=help_text)


class ChatApp(App[None]):
    TITLE = "localspec chat"
    COMMANDS = App.COMMANDS | {SpeculationCommands}
    mode: reactive[str] = reactive("-")  # the mode of the next answer
    speedup: reactive[float | None] = reactive(None)  # its speedup in a saved probe

    def __init__(
        self, options: ChatOptions, loader: Callable[..., Engine] | None = load_engine
    ) -> None:
        """``loader=None`` shows the interface without loading a model (layout snapshots)."""
        super().__init__()
        self.options = options
        self.loader = loader
        self.engine: Engine | None = None
        self.load_error: LocalspecError | None = None  # the first load failed: exit with it
        self.mode_override: str | None = None
        self.loaded_with = options.draft, options.mode  # the engine's draft and mode options
        self.chat = ChatScreen()

    def on_mount(self) -> None:
        # a closed terminal (SIGHUP) or a kill (SIGTERM) ends the chat as ctrl+q does: the
        # speculation memory is saved on the way out
        loop = asyncio.get_running_loop()
        for signum in ENDING_SIGNALS:
            with contextlib.suppress(ValueError, RuntimeError):  # not the main thread
                loop.add_signal_handler(signum, self.exit)
        self.push_screen(self.chat)
        if self.loader is not None:
            self.sub_title = "loading the model…"
            self.load()

    @work(thread=True, exclusive=True, group="load")
    def load(self) -> None:
        assert self.loader is not None
        options = self.options
        if self.engine is not None:  # another draft: the running engine's memory is handed over
            options = dataclasses.replace(options, spec_memory_path=None)
        try:
            engine = self.loader(options, self.report_progress)
        except LocalspecError as exc:
            self.post_message(EngineFailed(exc))
            return
        self.post_message(EngineReady(engine))

    def report_progress(self, what: str, fraction: float) -> None:
        """Called from the loading thread by llama.cpp; throttled to whole percents."""
        percent = int(100 * fraction)
        if percent != getattr(self, "_last_percent", None):
            self._last_percent = percent
            self.post_message(LoadProgress(what, fraction))

    def on_load_progress(self, message: LoadProgress) -> None:
        self.sub_title = f"loading the {message.what} model… {100 * message.fraction:.0f}%"

    def on_engine_ready(self, message: EngineReady) -> None:
        if self.engine is not None:
            if self.engine.target_path == message.engine.target_path:
                # another draft for the same target: what it wrote still drafts (and its
                # file stays held by this memory, not freed with the old engine)
                message.engine.memories, self.engine.memories = (
                    self.engine.memories,
                    message.engine.memories,
                )
            self.close_engine()
        self.engine = message.engine
        self.mode_override = None
        self.show_engine()

    def show_engine(self) -> None:
        assert self.engine is not None
        self.sub_title = f"{self.engine.target_path.name} · {self.engine.mode}"
        self.show_mode(self.current_mode)

    def on_engine_failed(self, message: EngineFailed) -> None:
        if self.engine is None:  # nothing to chat with: leave, and `localspec chat` says why
            self.load_error = message.error
            self.exit(return_code=2)
            return
        self.options.draft, self.options.mode = self.loaded_with  # not the failed load's
        self.show_engine()
        self.notify(
            f"could not load the model, the current one is kept: {message.error}",
            severity="error",
        )

    @property
    def current_mode(self) -> str:
        return self.mode_override or (self.engine.mode if self.engine else "-")

    def generation_settings(self) -> GenerationSettings:
        return GenerationSettings.pick(self.options, mode=self.mode_override)

    # ----- switching without restarting --------------------------------------------------------

    def switch_mode(self, mode: str) -> None:
        if self.engine is None:
            return
        if mode not in self.engine.available_modes():
            hint = "use 'Draft model: load another…'" if "draft-model" in mode else "restart"
            self.notify(f"{mode} needs a draft that is not loaded: {hint}", severity="warning")
            return
        self.mode_override = mode
        self.show_mode(mode)
        self.notify(f"mode: {mode} (from the next answer)")

    def show_mode(self, mode: str) -> None:
        assert self.engine is not None
        self.mode = mode
        self.speedup = saved_speedup(self.engine.target_path, mode)

    async def screen_action(self, action: str) -> None:
        """A palette entry runs the chat screen's own action (its key binding's)."""
        await self.chat.run_action(action)

    def set_draft_length(self, n: int) -> None:
        spec = self.options.spec
        self.options.spec = dataclasses.replace(spec, n_max=n, n_min=min(spec.n_min, n))
        self.notify(f"draft length: at most {n} tokens")

    def ask_draft_model(self) -> None:
        self.push_screen(
            AskScreen("Draft model (.gguf path or catalog name):"), self.reload_with_draft
        )

    def reload_with_draft(self, draft: str | None) -> None:
        if not draft:
            return
        if self.chat.generating:
            self.notify("stop the answer first (esc)", severity="warning")
            return
        self.loaded_with = self.options.draft, self.options.mode
        self.options.draft, self.options.mode = draft, "draft-model"
        self.sub_title = "loading the draft model…"
        self.load()

    def on_unmount(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in ENDING_SIGNALS:
            loop.remove_signal_handler(signum)
        self.close_engine()

    def close_engine(self) -> None:
        """Free the engine (and save its memory) once no answer is being generated with it:
        freeing it under a running llama_decode crashes the process."""
        if self.engine is not None and self.chat.stop_and_wait():
            self.engine.close()
        self.engine = None
