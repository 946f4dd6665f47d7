"""A vocabulary as llama.cpp sees it, from a loaded model or a vocab-only load (fast: no
weights), so that draft/target compatibility is judged exactly as llama.cpp judges it."""

from __future__ import annotations

from pathlib import Path

import llama_cpp

from localspec.engine.llama_lib import ensure_initialised, recent_log
from localspec.errors import LocalspecError


class Vocab:
    def __init__(self, model: llama_cpp.llama_model_p, path: Path, owned: bool) -> None:
        self.path = path
        self._model = model
        self._owned = owned
        self._vocab = llama_cpp.llama_model_get_vocab(model)
        self.n_tokens = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self.type = int(llama_cpp.llama_vocab_type(self._vocab))
        self.bos = int(llama_cpp.llama_vocab_bos(self._vocab))
        self.eos = int(llama_cpp.llama_vocab_eos(self._vocab))
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))
        self.add_eos = bool(llama_cpp.llama_vocab_get_add_eos(self._vocab))

    @classmethod
    def load(cls, path: Path) -> Vocab:
        ensure_initialised()
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        if not model:
            raise LocalspecError(
                f"llama.cpp could not read the vocabulary of {path}: {recent_log()}",
                "check that the file is a complete GGUF",
            )
        return cls(model, path, owned=True)

    def text(self, token: int) -> str:
        raw = llama_cpp.llama_vocab_get_text(self._vocab, token)
        return raw.decode("utf-8", errors="replace") if raw else ""

    def close(self) -> None:
        if self._owned and self._model:
            llama_cpp.llama_model_free(self._model)
        self._model = None

    def __enter__(self) -> Vocab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
