"""One ``llama_decode`` for several sequences of one context: every active generation's
``[last] + draft`` rows and any prompt chunk, each row tagged with its sequence.

llama.cpp computes a batch's rows together, so a step with four generations reloads the
weights once instead of four times: that is what makes parallel slots pay on a
memory-bound machine. Each part asks for logits on its last ``n_rows`` rows; each part gets
its own slice (views, valid until the next decode).

Every sequence has its own cache (a "stream"): a step's attention then reads only each
sequence's own cells, where one cache shared by all would make every row of every step read
every slot's history. The price is llama.cpp's rule for such batches (``split_equal``): one
pass takes the same number of rows from each sequence, and only sequences whose ids follow
each other. A step whose parts differ in length, or skip an id, runs as several passes;
``passes`` predicts them, so that the draft budget prices a step as llama.cpp will run it.
Where one pass of equal parts costs less than the passes of uneven ones, the shorter parts
are padded (``BatchPart.pad``): rows of no use, without logits, forgotten once decoded.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import llama_cpp
import numpy as np

from localspec.engine.llama_lib import log_mark, recent_log
from localspec.engine.model_context import ModelContext, _Batch
from localspec.errors import EngineFailure


@dataclass(frozen=True)
class BatchPart:
    """``tokens`` appended to ``sequence``; logits wanted for the last ``n_rows`` of them.
    ``pad``: rows decoded after them only to even the step's parts (``padding``), removed
    from the cache at once."""

    sequence: ModelContext
    tokens: Sequence[int]
    n_rows: int
    pad: int = 0

    @property
    def rows(self) -> int:
        return len(self.tokens) + self.pad


class StepBatch:
    """A reusable batch as wide as the context's ``n_batch``."""

    def __init__(self, context: ModelContext) -> None:
        self.context = context
        self._batch = _Batch(context.n_batch)

    @property
    def capacity(self) -> int:
        return self.context.n_batch

    def decode(self, parts: Sequence[BatchPart]) -> list[np.ndarray]:
        """Decode every part in one call; return each part's logits rows (in ``parts``'
        order). The rows go to llama.cpp by sequence id: its passes need ids in order."""
        total = sum(p.rows for p in parts)
        if total > self.capacity:
            raise ValueError(f"a step of {total} rows does not fit a batch of {self.capacity}")
        order = sorted(range(len(parts)), key=lambda i: parts[i].sequence.seq_id)
        at = 0
        b = self._batch
        for part in (parts[i] for i in order):
            n, real = part.rows, len(part.tokens)
            seq = part.sequence
            if n + seq.n_past > seq.n_ctx:
                raise EngineFailure(f"sequence {seq.seq_id} is full ({seq.n_past} + {n} tokens)")
            b.token[at : at + real] = part.tokens
            b.token[at + real : at + n] = part.tokens[-1] if real else 0
            b.pos[at : at + n] = np.arange(seq.n_past, seq.n_past + n)
            b.logits[at : at + n] = 0
            b.logits[at + real - part.n_rows : at + real] = 1
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
        out: list[np.ndarray] = [rows[:0]] * len(parts)
        first = 0
        for i in order:
            part = parts[i]
            part.sequence.record_decoded(part.tokens)
            if part.pad:
                part.sequence.trim(part.sequence.n_past)
            out[i] = rows[first : first + part.n_rows]
            first += part.n_rows
        return out

    def free(self) -> None:
        self._batch.free()


def passes(rows: dict[int, int], n_ubatch: int, streams: int) -> list[int]:
    """The rows of each pass llama.cpp makes for a batch of ``rows[seq_id]`` rows per
    sequence (ids ascending in the batch): one pass for a context of one stream, else its
    ``split_equal`` with sequential ids. Each pass takes, from a run of consecutive ids, as
    many rows from each as the shortest still has (within ``n_ubatch``); what is left of the
    longer ones goes to the next passes."""
    left = {seq: n for seq, n in sorted(rows.items()) if n > 0}
    if streams <= 1:
        total = sum(left.values())
        return [min(n_ubatch, total - at) for at in range(0, total, n_ubatch)]
    out = []
    while left:
        run: list[int] = []
        for seq in left:  # the first id, then each that follows the last one taken
            if not run or seq == run[-1] + 1:
                run.append(seq)
            if len(run) > n_ubatch:
                break
        per_seq = max(1, min(min(left[s] for s in run), n_ubatch // len(run)))
        out.append(per_seq * len(run))
        for seq in run:
            left[seq] -= per_seq
            if not left[seq]:
                del left[seq]
    return out


def padding(rows: dict[int, int], paddable: Collection[int]) -> dict[int, int]:
    """The pad rows that raise every ``paddable`` sequence to the longest one's rows (one
    pass of equal parts, where ``passes`` would make several of uneven ones)."""
    longest = max((rows.get(seq, 0) for seq in paddable), default=0)
    return {seq: longest - rows[seq] for seq in paddable if 0 < rows.get(seq, 0) < longest}
