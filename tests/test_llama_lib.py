"""Ctrl-C while llama.cpp calls back into Python is kept and raised once the C call returns;
anywhere else it is an ordinary KeyboardInterrupt."""

import signal
import sys

import pytest

from localspec import interrupts
from localspec.engine import llama_lib


class InterruptingDeque:
    def append(self, _line: str) -> None:
        raise KeyboardInterrupt


def test_ctrl_c_inside_the_log_callback_is_not_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llama_lib, "_recent", InterruptingDeque())
    llama_lib._log_callback(2, b"llama_model_loader: loading\n", None)  # through ctypes
    with pytest.raises(KeyboardInterrupt):
        interrupts.raise_deferred_interrupt()
    interrupts.raise_deferred_interrupt()  # raised once, then cleared


def test_the_handler_defers_only_inside_callbacks() -> None:
    @interrupts.llama_callback
    def callback() -> object:
        return helper()

    def helper() -> object:  # a frame below a callback counts as inside it
        return sys._getframe()

    interrupts.on_sigint(signal.SIGINT, callback())  # type: ignore[arg-type]
    assert interrupts.interrupt_pending()
    with pytest.raises(KeyboardInterrupt):
        interrupts.raise_deferred_interrupt()
    with pytest.raises(KeyboardInterrupt):  # elsewhere: raised at once
        interrupts.on_sigint(signal.SIGINT, sys._getframe())
    assert not interrupts.interrupt_pending()


def test_the_handler_keeps_an_ignored_sigint_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        interrupts.install_interrupt_handler()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        signal.signal(signal.SIGINT, signal.default_int_handler)
        interrupts.install_interrupt_handler()
        assert signal.getsignal(signal.SIGINT) is interrupts.on_sigint
    finally:
        signal.signal(signal.SIGINT, previous)


def test_amx_kernels_are_left_out_unless_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """llama.cpp's AMX products crash where GCC 12 or 13 built them: a build with them
    loads weights without extra buffer types, and llama.cpp's own tools are told the same."""
    from pathlib import Path

    from localspec import native

    monkeypatch.delenv(llama_lib.AMX_VARIABLE, raising=False)
    monkeypatch.setattr(llama_lib, "amx_built_in", lambda: True)
    s = native.NativeSettings(Path("/bin"), Path("/m/t.gguf"), None, 8, 2, 512, 4, "off")
    assert not llama_lib.weight_repacking()
    assert "--no-repack" in native.command(s, "ngram-simple", Path("/p"), 0.0)
    monkeypatch.setenv(llama_lib.AMX_VARIABLE, "1")
    assert llama_lib.weight_repacking()
    assert "--no-repack" not in native.command(s, "ngram-simple", Path("/p"), 0.0)
    monkeypatch.setattr(llama_lib, "amx_built_in", lambda: False)
    monkeypatch.delenv(llama_lib.AMX_VARIABLE)
    assert llama_lib.weight_repacking()


def test_this_build_loads_and_decodes_a_k_quant_model(qwen_path) -> None:  # type: ignore[no-untyped-def]
    """The model every suite uses decodes here (on an AMX CPU its AMX product crashed)."""
    from localspec.api import Engine

    with Engine.load(str(qwen_path), n_ctx=256) as engine:
        assert engine.generate("def add(a, b):", max_tokens=4, mode="none").text
