"""One ``llama_decode`` for several sequences of one context: every active generation's
``[last] + draft`` rows and any prompt chunk, each row tagged with its sequence.

llama.cpp computes a batch's rows together, so a step with four generations reloads the
weights once instead of four times: that is what makes parallel slots pay on a
memory-bound machine. Each part asks for logits on its last ``n_rows`` rows; they come back
in batch order, and each part gets its own slice (views, valid until the next decode).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import llama_cpp
import numpy as np

from localspec.engine.llama_lib import log_mark, recent_log
from localspec.engine.model_context import ModelContext, _Batch
from localspec.errors import EngineFailure


@dataclass(frozen=True)
class BatchPart:
    """``tokens`` appended to ``sequence``; logits wanted for the last ``n_rows`` of them."""

    sequence: ModelContext
    tokens: Sequence[int]
    n_rows: int


class StepBatch:
    """A reusable batch as wide as the context's ``n_batch``."""

    def __init__(self, context: ModelContext) -> None:
        self.context = context
        self._batch = _Batch(context.n_batch)

    @property
    def capacity(self) -> int:
        return self.context.n_batch

    def decode(self, parts: Sequence[BatchPart]) -> list[np.ndarray]:
        """Decode every part in one pass; return each part's logits rows."""
        total = sum(len(p.tokens) for p in parts)
        if total > self.capacity:
            raise ValueError(f"a step of {total} rows does not fit a batch of {self.capacity}")
        at = 0
        b = self._batch
        for part in parts:
            n = len(part.tokens)
            seq = part.sequence
            if n + seq.n_past > seq.n_ctx:
                raise EngineFailure(f"sequence {seq.seq_id} is full ({seq.n_past} + {n} tokens)")
            b.token[at : at + n] = part.tokens
            b.pos[at : at + n] = np.arange(seq.n_past, seq.n_past + n)
            b.logits[at : at + n] = 0
            b.logits[at + n - part.n_rows : at + n] = 1
            b.set_sequences(at, n, seq.seq_id)
            at += n
        b.batch.n_tokens = total
        mark = log_mark()
        rc = llama_cpp.llama_decode(self.context.ctx, b.batch)
        if rc != 0:
            for part in parts:  # llama.cpp restores the memory on 1/-1; re-sync on others
                part.sequence.trim(part.sequence.n_past)
            raise EngineFailure(f"llama_decode failed with code {rc}: {recent_log(since=mark)}")
        n_out = sum(p.n_rows for p in parts)
        logits = llama_cpp.llama_get_logits(self.context.ctx)
        rows = np.ctypeslib.as_array(logits, shape=(n_out, self.context.n_vocab))
        out, first = [], 0
        for part in parts:
            part.sequence.record_decoded(part.tokens)
            out.append(rows[first : first + part.n_rows])
            first += part.n_rows
        return out

    def free(self) -> None:
        self._batch.free()
