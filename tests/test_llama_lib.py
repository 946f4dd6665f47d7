"""Ctrl-C inside a llama.cpp callback is kept and re-raised once the C call returns."""

import pytest

from localspec.engine import llama_lib


class InterruptingDeque:
    def append(self, _line: str) -> None:
        raise KeyboardInterrupt


def test_ctrl_c_inside_the_log_callback_is_not_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llama_lib, "_recent", InterruptingDeque())
    llama_lib._log_callback(2, b"llama_model_loader: loading\n", None)  # through ctypes
    with pytest.raises(KeyboardInterrupt):
        llama_lib.raise_deferred_interrupt()
    llama_lib.raise_deferred_interrupt()  # raised once, then cleared
