"""Constrained generation: llama.cpp's grammar sampler as a mask on the target's rows.

A ``Grammar`` is compiled once per request (GBNF text, or a JSON schema through
llama-cpp-python's port of llama.cpp's JSON-schema converter). A ``GrammarState`` follows the
accepted tokens; speculation works on clones of it: a draft is cut at its first token the
grammar refuses, and each verified row ``i`` is masked with the state after the context
plus ``draft[:i]``. A rejected draft therefore needs no grammar rollback: the accepted state
only ever advances by tokens the target chose. The masked row is the constrained target
distribution, so the acceptance maths stays lossless for it.

Why masks are lazy: llama.cpp checks a 150k vocabulary against a grammar in ~9 ms, a third
of a 0.5B model's decoding step on a small CPU. Greedy decoding only needs the best allowed
token: the argmax is checked alone, then the 64 best, and only then everything. Sampling
needs the whole allowed distribution, but tokens 50 temperature-units of logit under the
best allowed one weigh less than float64 can hold: only a window of candidates is checked
when the best allowed token lies inside it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import tempfile
from collections.abc import Sequence
from typing import Any

import llama_cpp
import numpy as np

from localspec.engine.healing import HealedStart
from localspec.engine.llama_lib import log_mark, recent_log
from localspec.engine.model_context import ModelContext
from localspec.engine.schema_checks import reference_problem, shape_problem, unsatisfiable
from localspec.engine.schema_converter import schema_to_gbnf
from localspec.errors import LocalspecError

TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
GREEDY_CANDIDATES = 64  # checked after the argmax, before the whole vocabulary
WINDOW_T = 100.0  # sampling: candidates within this many temperature-units of the best logit
NEGLIGIBLE_T = 50.0  # ... are enough when the best allowed token is within this many


def schema_grammar(schema: dict[str, Any]) -> str:
    """GBNF for a JSON schema (llama.cpp's converter, as llama-server uses it). A schema
    nothing can satisfy is refused: the converter would ignore the contradiction."""
    if not isinstance(schema, dict):
        raise LocalspecError(
            f"a JSON schema is a JSON object (got {type(schema).__name__})",
            'e.g. {"type": "object", "properties": {"name": {"type": "string"}}}',
        )
    if (problem := shape_problem(schema) or reference_problem(schema)) is not None:
        raise LocalspecError(
            f"the JSON schema cannot be turned into a grammar: {problem}",
            "fix that part of the schema (a $ref points into it as #/$defs/NAME)",
        )
    if (problem := unsatisfiable(schema)) is not None:
        raise LocalspecError(
            f"the JSON schema cannot be satisfied: {problem}", "fix the schema's bounds"
        )
    try:
        return schema_to_gbnf(schema)
    except Exception as exc:  # the converter asserts on what it does not know
        raise LocalspecError(
            f"the JSON schema cannot be turned into a grammar: {exc or type(exc).__name__}",
            "use the JSON-schema subset llama.cpp supports (types, properties, required, "
            "enum, const, items, anyOf, $ref, string formats)",
        ) from None


JSON_OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}


class _OwnedSampler:
    """Frees the llama.cpp sampler it holds, once."""

    _sampler: llama_cpp.llama_sampler_p | None = None

    def close(self) -> None:
        if self._sampler:
            llama_cpp.llama_sampler_free(self._sampler)
            self._sampler = None

    def __del__(self) -> None:
        self.close()


class Grammar(_OwnedSampler):
    """A compiled grammar for one backend's vocabulary; ``start()`` gives a fresh state."""

    def __init__(self, backend: ModelContext, gbnf: str, root: str = "root") -> None:
        self.backend = backend
        self.gbnf = gbnf
        mark = log_mark()
        with _stderr_captured() as said:
            sampler = llama_cpp.llama_sampler_init_grammar(
                backend.vocab, gbnf.encode(), root.encode()
            )
        if not sampler:
            reason = said[0].strip().splitlines()[0] if said and said[0].strip() else ""
            reason = reason.split("error parsing grammar: ")[-1] or recent_log(since=mark)
            raise LocalspecError(
                f"the grammar does not parse: {reason}",
                "check the grammar text; see llama.cpp's grammars/README.md",
            )
        self._sampler = sampler
        self._cells = (llama_cpp.llama_token_data * backend.n_vocab)()
        self._view = np.frombuffer(self._cells, dtype=TOKEN_DATA)
        self._all_ids = np.arange(backend.n_vocab, dtype=np.int32)

    @classmethod
    def from_schema(cls, backend: ModelContext, schema: dict[str, Any]) -> Grammar:
        return cls(backend, schema_grammar(schema))

    def start(self) -> GrammarState:
        return GrammarState(self, llama_cpp.llama_sampler_clone(self._sampler))

    def allowed(self, sampler: llama_cpp.llama_sampler_p, ids: np.ndarray) -> np.ndarray:
        """Which of ``ids`` the grammar allows next, as a boolean array."""
        n = ids.size
        view = self._view[:n]
        view["id"] = ids
        view["logit"] = 0.0
        cells = llama_cpp.llama_token_data_array(self._cells, n, -1, False)
        llama_cpp.llama_sampler_apply(sampler, ctypes.byref(cells))
        return np.isfinite(view["logit"])


class GrammarState(_OwnedSampler):
    """Where the grammar stands after some tokens. ``accept`` only tokens it allows
    (llama.cpp aborts on any other)."""

    def __init__(self, grammar: Grammar, sampler: llama_cpp.llama_sampler_p) -> None:
        self.grammar = grammar
        self._sampler: llama_cpp.llama_sampler_p | None = sampler

    def clone(self) -> GrammarState:
        return GrammarState(self.grammar, llama_cpp.llama_sampler_clone(self._sampler))

    def allows(self, token: int) -> bool:
        return bool(self.grammar.allowed(self._sampler, np.array([token], np.int32))[0])

    def allowed(self, ids: np.ndarray) -> np.ndarray:
        return self.grammar.allowed(self._sampler, ids)

    def accept(self, token: int) -> None:
        llama_cpp.llama_sampler_accept(self._sampler, token)

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` the grammar allows in a row."""
        probe = self.clone()
        try:
            for i, token in enumerate(tokens):
                if not probe.allows(token):
                    return i
                probe.accept(token)
            return len(tokens)
        finally:
            probe.close()

    def best(self, row: np.ndarray, near: float = 0.0) -> np.ndarray:
        """A row whose argmax is the best allowed token (the row itself when its argmax is
        allowed; otherwise the allowed candidates only, found among the best first). With
        ``near`` > 0, every allowed token within ``near`` of the best allowed one is right
        too (tie-aware checks)."""
        first = int(row.argmax())
        close = np.flatnonzero(row >= row[first] - near) if near > 0 else np.array([first])
        if self.allowed(close.astype(np.int32)).all():
            return row
        candidates = np.argpartition(-row, GREEDY_CANDIDATES)[:GREEDY_CANDIDATES]
        ok = self.allowed(candidates.astype(np.int32))
        # a token left out ranks below every candidate: it is not near when the lowest
        # candidate is not
        if ok.any() and (near <= 0 or row[candidates].min() < row[candidates[ok]].max() - near):
            return _only(row, candidates[ok])
        return self.masked(row)

    def masked(self, row: np.ndarray, temperature: float | None = None) -> np.ndarray:
        """``row`` with every refused token at -inf. With a ``temperature``, tokens too
        unlikely to weigh in float64 are set to -inf unchecked (see the module notes)."""
        if temperature is not None and temperature > 0:
            top = float(row.max())
            window = np.flatnonzero(row >= top - WINDOW_T * temperature)
            if window.size < row.size:
                ok = self.allowed(window.astype(np.int32))
                if ok.any() and float(row[window[ok]].max()) >= top - NEGLIGIBLE_T * temperature:
                    return _only(row, window[ok])
        ok = self.allowed(self.grammar._all_ids)
        if not ok.any():
            # a grammar that allows nothing more (not even an end) ends the generation
            return _only(row, np.flatnonzero(self.grammar.backend._eog))
        return _only(row, np.flatnonzero(ok))


@contextlib.contextmanager
def _stderr_captured() -> Any:
    """What llama.cpp writes to the process's stderr meanwhile (its grammar parser prints
    its errors there, with the whole grammar): kept, not shown; ``said[0]`` after."""
    said: list[str] = []
    with tempfile.TemporaryFile() as sink:
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield said
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            said.append(sink.read().decode("utf-8", errors="replace"))


def _only(row: np.ndarray, keep: np.ndarray) -> np.ndarray:
    out = np.full(row.shape, -np.inf, dtype=row.dtype)
    out[keep] = row[keep]
    return out


class ConstrainedRows:
    """The rows of one verified batch, each masked by the grammar state after the context
    plus the draft tokens before it. Rows are masked on first access and must be read in
    order (the acceptance rules stop at the first rejection, so later rows cost nothing)."""

    def __init__(
        self,
        rows: np.ndarray,
        draft: Sequence[int],
        state: GrammarState | HealedStart,
        temperature: float | None,
        near: float,
        eog: Sequence[int] = (),
    ) -> None:
        """``temperature`` None: greedy (only the best allowed token matters; with ``near``
        > 0, those within ``near`` of it too, for tie-aware comparisons). ``eog``: the
        model's end tokens, given where a logit bias may ban every allowed token."""
        self.rows, self.draft = rows, list(draft)
        self.temperature, self.near = temperature, near
        self._state: GrammarState | HealedStart = state.clone()
        self._done: list[np.ndarray] = []
        self.eog = eog

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> np.ndarray:
        while len(self._done) <= i:
            k = len(self._done)
            if k > 0:
                self._state.accept(self.draft[k - 1])
            row = self.rows[k]
            if self.temperature is None:
                masked = self._state.best(row, self.near)
            else:
                masked = self._state.masked(row, self.temperature)
            # only a logit bias can leave no allowed token (``eog`` is given with one)
            ended = bool(self.eog) and not np.isfinite(masked).any()
            self._done.append(self._ended(row) if ended else masked)
        return self._done[i]

    def _ended(self, row: np.ndarray) -> np.ndarray:
        """Where a logit bias bans every token the grammar allows (an end token banned by
        ``ignore_eos`` where only an end may follow): the answer ends here, as it would
        where the grammar allows nothing more."""
        out = np.full(row.shape, -np.inf, dtype=row.dtype)
        out[np.asarray(self.eog, dtype=np.int64)] = 0.0
        return out

    def close(self) -> None:
        self._state.close()
