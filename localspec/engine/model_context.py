"""One llama.cpp model and context, driven through the low-level ``llama_cpp`` C API.

Why not ``llama_cpp.Llama``: speculative decoding needs logits for exactly the positions
being verified (not ``logits_all``), zero-copy access to those rows, and a KV cache that can
be cut back after a rejection. This class offers those three things and nothing more.

The KV cache always holds ``tokens`` (positions 0 .. n_past-1); ``decode`` appends, ``trim``
is the one place where it is cut back (``llama_memory_seq_rm``), and ``evaluate`` reuses the
longest common prefix of what is cached (multi-turn chat, a drafter following the target).

Recurrent and hybrid models keep a state, not a per-position cache: llama.cpp can roll back
at most ``n_rs_seq`` trailing tokens of the latest decode (``max_rollback``; the loop keeps
drafts that short). A deeper cut clears the sequence and decodes the kept tokens again.
"""

from __future__ import annotations

import copy
import ctypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

import llama_cpp
import numpy as np

from localspec.engine.healing import PieceIndex
from localspec.engine.llama_lib import (
    ensure_initialised,
    log_mark,
    recent_log,
    weight_repacking,
)
from localspec.errors import EngineFailure, GenerationCancelled, LocalspecError
from localspec.hardware import default_threads
from localspec.interrupts import (
    defer_interrupt,
    interrupt_pending,
    llama_callback,
    raise_deferred_interrupt,
)
from localspec.progress import status
from localspec.vocab import Vocab

PREFILL_CHUNK = 64  # reproducible prompt evaluation: chunks at fixed positions (see evaluate)
FlashAttn = Literal["auto", "on", "off"]
FLASH_ATTN_CHOICES: tuple[FlashAttn, ...] = get_args(FlashAttn)


@dataclass(frozen=True)
class ContextOptions:
    n_ctx: int = 4096
    n_threads: int | None = None  # None: physical cores
    n_gpu_layers: int | None = None  # None: llama.cpp's default; 0 keeps everything on the CPU
    n_batch: int = 512
    # recurrent/hybrid models (Qwen3.5, Mamba...): how many trailing tokens a later
    # ``llama_memory_seq_rm`` may cut without a re-prefill (llama.cpp keeps that many state
    # snapshots per decode; ignored by attention-only models)
    n_rs_seq: int = 0
    load_mtp: bool = False  # load the NextN/MTP layers too (``draft-mtp``)
    flash_attn: FlashAttn = "auto"  # see ``flash_attn_setting``
    # sequences the context holds (parallel generations); ``n_ctx`` is each one's size
    n_seq: int = 1


def runs_on_cpu(options: ContextOptions) -> bool:
    """Whether every layer stays on the CPU (-ngl 0, or a llama.cpp built without a GPU)."""
    return options.n_gpu_layers == 0 or not llama_cpp.llama_supports_gpu_offload()


def flash_attn_setting(options: ContextOptions) -> FlashAttn:
    """What llama.cpp is told for ``options.flash_attn``: "on", "off", or "auto". "auto"
    turns it off when the model runs on the CPU: there llama.cpp's flash-attention kernel
    walks the whole cache once per query row, so a verify batch of k tokens pays its
    attention k times where the plain path shares one pass between them. Measured, verify
    batches cost much less with it off once the context holds a few hundred tokens, one-token
    steps about the same, prompt processing a little more; with parallel slots under load
    (a few rows per sequence) it would win back 3-10%, less than a lone speculating client
    loses (docs/benchmarks.md). On a GPU llama.cpp decides."""
    if options.flash_attn == "auto" and runs_on_cpu(options):
        return "off"
    return options.flash_attn


def flash_attn_type(options: ContextOptions) -> int:
    """``flash_attn_setting`` as llama.cpp's enum."""
    return {
        "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
        "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
    }.get(flash_attn_setting(options), llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO)


@dataclass(frozen=True)
class SavedSequence:
    """A sequence's cache copied out of llama.cpp (``ModelContext.save``): its tokens and the
    state that restores them into any sequence of the same context."""

    tokens: tuple[int, ...]
    prefilled: int
    last_prefill: tuple[tuple[int, ...], np.ndarray] | None
    state: ctypes.Array[ctypes.c_ubyte]

    @property
    def size(self) -> int:
        """Bytes held: the state, and the prompt's logits row when kept."""
        return len(self.state) + (self.last_prefill[1].nbytes if self.last_prefill else 0)


class ModelContext:
    """A loaded model with one context, seen as its sequence 0. A context made for several
    sequences (``ContextOptions.n_seq``) hands out the others with ``sequence(i)``: views
    that share the model and the context, each with its own tokens and KV cells."""

    reused = 0  # tokens of the last prompt evaluated whose cache was kept

    def _trained_length_note(self, n_seq: int) -> str:
        """How ``-c 0`` came to this context size: the model's trained length, which
        llama.cpp shares out between the sequences of one context."""
        trained = llama_cpp.llama_model_n_ctx_train(self.model)
        if n_seq > 1:
            return f" a slot (-c 0: the model's trained length, {trained}, shared by {n_seq} slots)"
        return f" (-c 0: the model's trained length, {trained})"

    def __init__(
        self,
        path: Path,
        options: ContextOptions | None = None,
        progress: Callable[[float], None] | None = None,
    ) -> None:
        """``progress(fraction)`` is called while the weights load (for progress displays)."""
        ensure_initialised()
        self.path = path
        self.options = options = options or ContextOptions()
        self.model = self._load_model(path, options, progress)
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.ctx = self._new_context(options)
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.seq_id = 0
        self.owner = True  # frees the model and the context (a sequence view does not)
        self.n_ctx = llama_cpp.llama_n_ctx(self.ctx) // max(1, options.n_seq)
        if options.n_ctx == 0:
            status(f"context: {self.n_ctx} tokens{self._trained_length_note(options.n_seq)}")
        # llama.cpp caps the batch at the context size: ask it rather than trust the request.
        self.n_batch = min(llama_cpp.llama_n_batch(self.ctx), llama_cpp.llama_n_ubatch(self.ctx))
        self.flash_attn = flash_attn_setting(options)  # as llama.cpp was told
        self.tokens: list[int] = []
        self.n_decoded = 0  # tokens llama.cpp evaluated since the load (cache reuse shows here)
        # asked between the chunks of a long input: a prompt of thousands of tokens takes
        # seconds to read, and a server's client may have gone meanwhile
        self.cancelled: Callable[[], bool] | None = None
        # leading positions whose cache rows came from prefill in aligned n_batch chunks
        self.prefilled = 0
        # the prompt last evaluated reproducibly, with its logits row (see ``evaluate``)
        self._last_prefill: tuple[tuple[int, ...], np.ndarray] | None = None
        # called after every decoded chunk with (first position, tokens): the MTP drafter
        # mirrors the target's hidden states this way
        self.listeners: list[Callable[[int, Sequence[int]], None]] = []
        recurrent = llama_cpp.llama_model_is_recurrent(self.model) or (
            llama_cpp.llama_model_is_hybrid(self.model)
        )
        self.max_rollback: int | None = llama_cpp.llama_n_rs_seq(self.ctx) if recurrent else None
        self._batch = _Batch(self.n_batch)
        self._views: dict[int, ModelContext] = {0: self}
        self._pieces: dict[int, bytes] = {}
        self._piece_index: list[PieceIndex] = []  # shared by the sequences' views
        self._eog_tokens: tuple[int, ...] | None = None
        self._eog = np.zeros(self.n_vocab, dtype=bool)
        for token in range(self.n_vocab):
            self._eog[token] = llama_cpp.llama_vocab_is_eog(self.vocab, token)

    # ----- loading -------------------------------------------------------------------------

    @staticmethod
    def _load_model(
        path: Path, options: ContextOptions, progress: Callable[[float], None] | None
    ) -> llama_cpp.llama_model_p:
        params = llama_cpp.llama_model_default_params()
        # Kept in a local until the load returns: ctypes must not free the callback early.
        # always set: it is how Ctrl-C stops a load (a large model takes a while)
        callback = _progress_callback(progress)
        params.progress_callback = callback
        if options.n_gpu_layers is not None:
            params.n_gpu_layers = options.n_gpu_layers
        params.load_mtp = options.load_mtp
        params.use_extra_bufts = weight_repacking()
        model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        try:
            raise_deferred_interrupt()
        except KeyboardInterrupt:
            if model:
                llama_cpp.llama_model_free(model)
            raise
        if not model:
            raise LocalspecError(
                f"llama.cpp could not load {path}: {_diagnose_gguf(path) or recent_log()}",
                "re-download the file (it may be truncated or corrupt), "
                "or upgrade localspec if the architecture is newer than its llama.cpp",
            )
        return model

    def _new_context(self, options: ContextOptions) -> llama_cpp.llama_context_p:
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = options.n_ctx * options.n_seq
        params.n_batch = params.n_ubatch = options.n_batch
        params.n_seq_max = options.n_seq
        # a cache per sequence: a step's attention reads only each sequence's own cells (a
        # shared cache makes every row read every slot's history); the batch then runs in
        # passes of equal rows per sequence, which the draft budget prices (step_batch.passes)
        params.kv_unified = False
        params.n_rs_seq = options.n_rs_seq
        threads = options.n_threads or default_threads()
        params.n_threads = params.n_threads_batch = threads
        params.flash_attn_type = flash_attn_type(options)
        params.no_perf = True
        ctx = llama_cpp.llama_init_from_model(self.model, params)
        try:
            raise_deferred_interrupt()
        except KeyboardInterrupt:
            if ctx:
                llama_cpp.llama_free(ctx)
            llama_cpp.llama_model_free(self.model)
            raise
        if not ctx:
            llama_cpp.llama_model_free(self.model)
            raise LocalspecError(
                f"llama.cpp could not create a context of {options.n_ctx} tokens for "
                f"{self.path}: {recent_log()}",
                "lower the context size (-c) or free some memory",
            )
        return ctx

    def sequence(self, seq_id: int) -> ModelContext:
        """The view of sequence ``seq_id`` (0: this object): same model and context, its own
        tokens and cache cells, rolled back by its own ``trim``."""
        if not 0 <= seq_id < max(1, self.options.n_seq):
            raise ValueError(f"sequence {seq_id} of a context with {self.options.n_seq}")
        view = self._views.get(seq_id)
        if view is None:
            view = copy.copy(self)
            view.seq_id, view.owner = seq_id, False
            view.tokens, view.n_decoded, view.prefilled = [], 0, 0
            view._last_prefill, view.listeners, view.cancelled = None, [], None
            view._batch = _Batch(self.n_batch, seq_id)
            self._views[seq_id] = view
        return view

    def close(self) -> None:
        if not self.owner:
            self._batch.free()
            return
        for view in self._views.values():
            if view is not self:
                view._batch.free()
        if self.ctx:
            llama_cpp.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            llama_cpp.llama_model_free(self.model)
            self.model = None
        self._batch.free()

    # ----- decoding ------------------------------------------------------------------------

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    def evaluate(self, sequence: Sequence[int], reproducible: bool = False) -> np.ndarray:
        """Make the cache hold ``sequence`` and return the logits row after its last token,
        decoding only what differs from what is already cached.

        llama.cpp's float results depend on how tokens were batched, so a prompt whose
        start was cached by an earlier request (decoded in other batches) gives slightly
        different logits than the same prompt evaluated afresh. ``reproducible`` decodes
        the prompt in chunks of PREFILL_CHUNK tokens at fixed positions (0, 64, 128...) and
        reuses only whole chunks that were prefilled that way: the result is then what a
        fresh evaluation gives, whatever the cache held. (Prefill runs as fast in chunks of
        64 as of 512 on a CPU; a repeated prompt re-decodes at most 63 tokens.)"""
        keep, kept_row = self.reuse_prefix(sequence, reproducible)
        self.reused = keep
        if kept_row is not None:
            return kept_row
        row = self.decode(sequence[keep:], chunk=PREFILL_CHUNK if reproducible else None)[0]
        self.note_prefilled(sequence, keep, row, reproducible)
        return row

    def reuse_prefix(
        self, sequence: Sequence[int], reproducible: bool
    ) -> tuple[int, np.ndarray | None]:
        """What ``evaluate`` keeps of the cache for ``sequence`` (the rest is cut): the number
        of leading tokens kept, and the kept logits row when nothing is left to decode (the
        same prompt, prefilled reproducibly just before)."""
        keep = self.reusable(sequence, reproducible)
        if keep == len(sequence):
            self.trim(len(sequence))
            assert self._last_prefill is not None
            return len(sequence), self._last_prefill[1]
        if keep < self.n_past:
            self.trim(keep)
        return keep, None

    def reusable(self, sequence: Sequence[int], reproducible: bool) -> int:
        """How many of ``sequence``'s first tokens ``reuse_prefix`` keeps (all of them: the
        same prompt prefilled reproducibly just before, its logits row kept)."""
        keep = common_prefix_length(self.tokens, sequence)
        if reproducible and self._same_prefill(sequence, keep):
            return len(sequence)
        keep = min(keep, len(sequence) - 1)  # the last token must be decoded for its logits
        if reproducible:
            keep = min(keep, self.prefilled)
            keep -= keep % PREFILL_CHUNK
        return keep

    def note_prefilled(
        self, sequence: Sequence[int], keep: int, row: np.ndarray, reproducible: bool
    ) -> None:
        """After ``sequence[keep:]`` was decoded (in PREFILL_CHUNK-aligned chunks when
        ``reproducible``), with ``row`` the logits after its last token."""
        self.prefilled = len(sequence) if reproducible else min(self.prefilled, keep)
        if reproducible and not self.listeners:
            self._last_prefill = (tuple(sequence), row.copy())

    def _same_prefill(self, sequence: Sequence[int], cached: int) -> bool:
        """Whether ``sequence`` is the prompt last evaluated reproducibly and the cache still
        holds it as then prefilled: its logits row is then the one kept (a seeded request
        asked again skips its prompt). Not with listeners: they follow decodes."""
        return (
            self._last_prefill is not None
            and not self.listeners
            and cached >= len(sequence)
            and self.prefilled >= len(sequence)
            and self._last_prefill[0] == tuple(sequence)
        )

    def decode(
        self, tokens: Sequence[int], all_logits: bool = False, chunk: int | None = None
    ) -> np.ndarray:
        """Append ``tokens`` to the sequence; return logits rows (a view, valid until the next
        call): one row per token if ``all_logits``, else the last token's row only. Long
        inputs are decoded in chunks of ``chunk`` tokens (default: the batch size)."""
        if self.n_past + len(tokens) > self.n_ctx:
            raise LocalspecError(
                f"context full: {self.n_past} + {len(tokens)} tokens > {self.n_ctx}",
                "raise the context size (-c) or shorten the prompt",
            )
        start, size = 0, min(chunk or self.n_batch, self.n_batch)
        while len(tokens) - start > size:  # long prompts: chunks without logits
            self._decode_chunk(tokens[start : start + size], want=0)
            start += size
            self.stop_if_cancelled("the prompt was being read")  # a retry reuses the chunks
        rest = tokens[start:]
        n_rows = len(rest) if all_logits else 1
        self._decode_chunk(rest, want=n_rows)
        logits = llama_cpp.llama_get_logits(self.ctx)
        return np.ctypeslib.as_array(logits, shape=(n_rows, self.n_vocab))

    def stop_if_cancelled(self, during: str) -> None:
        """Between two long steps of work for one caller: stop if it has gone."""
        if self.cancelled is not None and self.cancelled():
            raise GenerationCancelled(during)

    def _decode_chunk(self, tokens: Sequence[int], want: int) -> None:
        if llama_cpp.llama_memory_seq_pos_max(self.memory, self.seq_id) >= self.n_past:
            # a KeyboardInterrupt landed between an earlier decode and its bookkeeping: the
            # cache holds tokens the list does not, and llama.cpp would refuse this batch
            self.trim(self.n_past)
        self._batch.fill(tokens, self.n_past, want)
        mark = log_mark()
        rc = llama_cpp.llama_decode(self.ctx, self._batch.batch)
        if rc != 0:
            # llama_decode restores the memory on rc 1/-1; on other codes we re-sync by trimming.
            self.trim(self.n_past)
            raise EngineFailure(f"llama_decode failed with code {rc}: {recent_log(since=mark)}")
        self.record_decoded(tokens)
        raise_deferred_interrupt()  # after the bookkeeping: the cache and tokens agree

    def record_decoded(self, tokens: Sequence[int]) -> None:
        """Bookkeeping after ``tokens`` were decoded at the end of this sequence (here, or
        in a batch shared with other sequences: ``engine/step_batch.py``)."""
        start = self.n_past
        self.tokens.extend(tokens)
        self.n_decoded += len(tokens)
        for listener in self.listeners:
            listener(start, tokens)

    def trim(self, n_keep: int) -> None:
        """Forget every token at position >= n_keep. The only KV-cache rollback in localspec."""
        if n_keep > self.n_past:
            return
        self.prefilled = min(self.prefilled, n_keep)
        if llama_cpp.llama_memory_seq_rm(self.memory, self.seq_id, n_keep, -1):
            del self.tokens[n_keep:]
            return
        if self.max_rollback is None:
            raise LocalspecError(
                f"llama.cpp refused to cut {self.path.name}'s cache at position {n_keep}",
                "use --mode none with this model and report the issue",
            )
        # a recurrent state cannot go back that far: start over and decode the kept part
        kept = self.tokens[:n_keep]
        llama_cpp.llama_memory_seq_rm(self.memory, self.seq_id, 0, -1)
        self.tokens = []
        if kept:
            self.decode(kept)

    def save(self) -> SavedSequence:
        """A copy of this sequence's cache (host memory), for ``restore`` later."""
        size = llama_cpp.llama_state_seq_get_size(self.ctx, self.seq_id)
        state = (ctypes.c_ubyte * size)()
        written = llama_cpp.llama_state_seq_get_data(self.ctx, state, size, self.seq_id)
        if written < size:  # nothing (a failure) or less than announced: keep what was written
            state = (ctypes.c_ubyte * written).from_buffer_copy(state)
        return SavedSequence(tuple(self.tokens), self.prefilled, self._last_prefill, state)

    def restore(self, saved: SavedSequence) -> bool:
        """Replace this sequence's cache with ``saved``; False (and an empty sequence) when
        llama.cpp could not read it back."""
        llama_cpp.llama_memory_seq_rm(self.memory, self.seq_id, -1, -1)
        self.tokens, self.prefilled, self._last_prefill = [], 0, None
        read = llama_cpp.llama_state_seq_set_data(self.ctx, saved.state, saved.size, self.seq_id)
        if read == 0:
            llama_cpp.llama_memory_seq_rm(self.memory, self.seq_id, -1, -1)
            return False
        self.tokens, self.prefilled = list(saved.tokens), saved.prefilled
        self._last_prefill = saved.last_prefill
        return True

    def copy_from(self, other: ModelContext) -> None:
        """Make this sequence's cache a copy of ``other``'s (which goes on with its own): a
        prompt another sequence has read is not read again. llama.cpp copies the whole
        sequence (its cells live apart: ``kv_unified`` off); ``reuse_prefix`` then cuts what
        the next prompt does not share."""
        assert other._views is self._views and other is not self
        llama_cpp.llama_memory_seq_rm(self.memory, self.seq_id, -1, -1)
        llama_cpp.llama_memory_seq_cp(self.memory, other.seq_id, self.seq_id, -1, -1)
        self.tokens, self.prefilled = list(other.tokens), other.prefilled
        self._last_prefill = other._last_prefill

    def move_to(self, other: ModelContext) -> None:
        """Move this sequence's cache to ``other``'s sequence id, and give ``other`` this
        one's: the two views trade ids, this one keeps its tokens (their cells copied over),
        ``other`` now names the cells left behind, a copy of the same tokens. llama.cpp runs a
        step's sequences in one pass only when their ids follow each other: the scheduler
        closes the gap a finished generation leaves this way."""
        assert other._views is self._views and other is not self
        llama_cpp.llama_memory_seq_rm(self.memory, other.seq_id, -1, -1)
        llama_cpp.llama_memory_seq_cp(self.memory, self.seq_id, other.seq_id, -1, -1)
        self.seq_id, other.seq_id = other.seq_id, self.seq_id
        self._batch, other._batch = other._batch, self._batch
        self._views[self.seq_id], self._views[other.seq_id] = self, other
        other.tokens, other.prefilled, other._last_prefill = list(self.tokens), self.prefilled, None

    # ----- vocabulary ----------------------------------------------------------------------

    def tokenize(
        self, text: str, add_special: bool = True, parse_special: bool = True
    ) -> list[int]:
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate: JSON's "\ud800", or bad argv bytes
            raise LocalspecError(
                f"the text holds {text[exc.start]!r} at character {exc.start}, which is not "
                "a Unicode character (half of a UTF-16 surrogate pair)",
                "send valid Unicode text (UTF-8)",
            ) from None
        capacity = len(data) + 16
        buf = (llama_cpp.llama_token * capacity)()
        n = llama_cpp.llama_tokenize(
            self.vocab, data, len(data), buf, capacity, add_special, parse_special
        )
        if n < 0:  # buffer too small: -n is the size needed
            capacity = -n
            buf = (llama_cpp.llama_token * capacity)()
            n = llama_cpp.llama_tokenize(
                self.vocab, data, len(data), buf, capacity, add_special, parse_special
            )
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """The bytes of one token as it appears in generated text (special tokens rendered)."""
        cached = self._pieces.get(token)
        if cached is None:
            buf = ctypes.create_string_buffer(64)
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, 64, 0, True)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, -n, 0, True)
            cached = self._pieces[token] = buf.raw[:n]
        return cached

    def piece_index(self) -> PieceIndex:
        """Every token's bytes, sorted (token healing: ``healing.py``), built on first use."""
        if not self._piece_index:
            self._piece_index.append(PieceIndex(self))
        return self._piece_index[0]

    def is_eog(self, token: int) -> bool:
        return bool(self._eog[token])

    def eog_tokens(self) -> tuple[int, ...]:
        """Every token that ends a generation (EOS, EOT, ``<|im_end|>``...)."""
        if self._eog_tokens is None:
            self._eog_tokens = tuple(int(t) for t in np.flatnonzero(self._eog))
        return self._eog_tokens

    def detokenize(self, tokens: Sequence[int]) -> str:
        """The text of ``tokens`` as generated (special tokens rendered; a character cut at
        the end becomes a replacement character)."""
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")

    def token_text(self, token: int) -> str:
        raw = llama_cpp.llama_vocab_get_text(self.vocab, token)
        return raw.decode("utf-8", errors="replace") if raw else ""

    def vocab_view(self) -> Vocab:
        """The loaded vocabulary, for the compatibility rules (``pairing.vocab_problems``)."""
        return Vocab(self.model, self.path, owned=False)

    def chat_template(self) -> str | None:
        raw = llama_cpp.llama_model_chat_template(self.model, None)
        return raw.decode("utf-8") if raw else None

    @property
    def bos_token(self) -> int:
        return llama_cpp.llama_vocab_bos(self.vocab)

    @property
    def fim_tokens(self) -> dict[str, int]:
        """The fill-in-the-middle tokens the vocabulary has (-1: none), by llama.cpp's names."""
        vocab = self.vocab
        return {
            "pre": llama_cpp.llama_vocab_fim_pre(vocab),
            "suf": llama_cpp.llama_vocab_fim_suf(vocab),
            "mid": llama_cpp.llama_vocab_fim_mid(vocab),
            "rep": llama_cpp.llama_vocab_fim_rep(vocab),
            "sep": llama_cpp.llama_vocab_fim_sep(vocab),
        }

    @property
    def eos_token(self) -> int:
        return llama_cpp.llama_vocab_eos(self.vocab)


class _Batch:
    """A reusable ``llama_batch`` whose arrays are filled through numpy views (no per-token
    ctypes calls on the hot path). Every row holds one sequence id, ``seq_id`` unless the
    caller writes others (``set_sequences``)."""

    def __init__(self, capacity: int, seq_id: int = 0) -> None:
        self.capacity = capacity
        self.batch = llama_cpp.llama_batch_init(capacity, 0, 1)
        b = self.batch
        self.token = np.ctypeslib.as_array(b.token, shape=(capacity,))
        self.pos = np.ctypeslib.as_array(b.pos, shape=(capacity,))
        self.logits = np.ctypeslib.as_array(b.logits, shape=(capacity,))
        np.ctypeslib.as_array(b.n_seq_id, shape=(capacity,))[:] = 1
        self._seq = [seq_id] * capacity
        for i in range(capacity):
            b.seq_id[i][0] = seq_id

    def set_sequences(self, start: int, count: int, seq_id: int) -> None:
        """Rows ``start .. start+count-1`` belong to sequence ``seq_id`` (written only where
        they change: each write is a ctypes call)."""
        for i in range(start, start + count):
            if self._seq[i] != seq_id:
                self.batch.seq_id[i][0] = self._seq[i] = seq_id

    def fill(self, tokens: Sequence[int], start_pos: int, want_rows: int) -> None:
        n = len(tokens)
        self.token[:n] = tokens
        self.pos[:n] = np.arange(start_pos, start_pos + n)
        self.logits[:n] = 0
        if want_rows:
            self.logits[n - want_rows : n] = 1
        self.batch.n_tokens = n

    def free(self) -> None:
        if self.capacity:
            llama_cpp.llama_batch_free(self.batch)
            self.capacity = 0


def _progress_callback(progress: Callable[[float], None] | None) -> object:
    """llama.cpp's load-progress callback around ``progress``; Ctrl-C during the load stops
    it (returning False aborts the load) and is re-raised once the load call returns."""

    @llama_callback
    def call(fraction: float, _user: object) -> bool:
        try:
            if progress is not None:
                progress(fraction)
        except KeyboardInterrupt:
            defer_interrupt()
        return not interrupt_pending()

    return llama_cpp.llama_progress_callback(call)


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if list(a[:n]) == list(b[:n]):
        return n
    i = 0
    while a[i] == b[i]:
        i += 1
    return i


def _diagnose_gguf(path: Path) -> str | None:
    """Explain why llama.cpp refused a file, when the file itself is the cause."""
    from localspec.derivation.gguf_info import truncation_problem

    return truncation_problem(path)
