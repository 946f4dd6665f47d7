"""The MTP (NextN) draft context: the target's own multi-token-prediction head, run by llama.cpp.

As llama.cpp's ``draft-mtp`` driver (``common/speculative.cpp``) does it:

* the target model is loaded with ``load_mtp`` and a second context of type
  ``LLAMA_CONTEXT_TYPE_MTP`` is created on the same model; for qwen35/qwen35moe it has its
  own small KV cache holding only the NextN block (``ctx_other`` is not retained);
* the target outputs its final hidden state ``h`` (after the output norm) for every batch
  token (``llama_set_embeddings_nextn(ctx, true, masked=false)``);
* the MTP cache at position p holds the pair (h_{p-1}, x_p): after every target decode the
  new tokens are fed, each with the target's hidden state of the position before it
  (``mirror``, a ``ModelContext`` listener). Feeding a position again first cuts the MTP cache
  there, which is also how a rejected draft is rolled back: no separate bookkeeping;
* drafting runs the head autoregressively: (h_{p-1}, x_p) -> x_{p+1}; the head's own output
  state becomes the h of the next step.

Models with several NextN heads (``nextn_predict_layers > 1``, e.g. step35, mimo2, hy_v3) and
an MTP cache of their own *chain* them, as llama.cpp does (``chain_heads``):

* each head is its own decoder layer with its own K/V, so the catch-up after a target decode
  runs the batch once per head (``llama_set_nextn_layer_offset``), cutting the MTP cache at
  the batch start before each pass;
* draft step i runs head i, so a draft has at most one token per head (``max_draft``);
* head i has K/V only for positions before the draft (from the catch-up), so step i cuts the
  cache at the draft start and re-adds the whole draft prefix under head i: entry t is
  (x_t, h_t) at ``pos0 + t`` with x_0 the target's last token, h_0 = h_{pos0-1} (target) and
  h_t (t >= 1) the state head t-1 output at step t-1.

The hidden states are kept for every position (``n_ctx x n_embd`` float32) so that a new
generation that reuses the cached prompt prefix can resume feeding where it differs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import llama_cpp
import numpy as np

from localspec.derivation.gguf_info import gguf_info
from localspec.engine import nextn_ext
from localspec.engine.llama_lib import recent_log
from localspec.engine.model_context import ModelContext, flash_attn_type
from localspec.errors import LocalspecError
from localspec.hardware import default_threads

# architectures with an MTP draft graph in the vendored llama.cpp (LLM_GRAPH_TYPE_DECODER_MTP)
# and their own MTP KV cache; tested here on tiny qwen35/qwen35moe files (one head) and a tiny
# hy_v3 file with three chained heads. step35, mimo2 and hy_v3 accept several NextN heads
# (chained, see above); the others assert a single one.
SUPPORTED_ARCHS = (
    "qwen35",
    "qwen35moe",
    "qwen3next",
    "bailingmoe3",
    "cohere2moe",
    "deepseek2",
    "deepseek32",
    "deepseek4",
    "glm4moe",
    "glm-dsa",
    "nemotron_h_moe",
    "hy_v3",
    "mimo2",
    "step35",
)


class MtpContext:
    def __init__(self, target: ModelContext) -> None:
        n_nextn = llama_cpp.llama_model_n_layer_nextn(target.model)
        if n_nextn <= 0:
            raise LocalspecError(
                f"{target.path.name} has no NextN (MTP) layers, so --mode draft-mtp cannot draft",
                "use the model's -MTP GGUF variant, or --mode draft-self / ngram-simple",
            )
        self.target = target
        self.n_embd = llama_cpp.llama_model_n_embd_out(target.model)
        self.ctx = self._new_context(target)
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.n_vocab = target.n_vocab
        nextn_ext.llama_set_embeddings_nextn(target.ctx, True, False)
        nextn_ext.llama_set_embeddings_nextn(self.ctx, True, True)
        self.hidden = np.zeros((target.n_ctx, self.n_embd), dtype=np.float32)
        self.synced = 0  # positions [0, synced) are mirrored (hidden states and MTP cache)
        self.active = False
        self._batch = nextn_ext.MtpBatch(self.ctx, self.n_embd)
        self._capacity = llama_cpp.llama_n_batch(self.ctx)
        self.n_heads = int(n_nextn)
        self.chained = self.n_heads > 1 and not self._memory_shared()
        # chained heads draft one token per head (llama.cpp caps n_max the same way)
        self.max_draft: int | None = self.n_heads if self.chained else None
        self._pos0 = 0  # where the current draft started
        self._chain: list[tuple[int, np.ndarray]] = []  # its (token, h) entries so far
        target.listeners.append(self.mirror)

    @staticmethod
    def _new_context(target: ModelContext) -> llama_cpp.llama_context_p:
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = target.n_ctx
        params.n_batch = params.n_ubatch = target.n_batch
        params.n_seq_max = 1
        params.n_threads = params.n_threads_batch = target.options.n_threads or default_threads()
        params.flash_attn_type = flash_attn_type(target.options)  # the target's, as its cache
        params.ctx_type = llama_cpp.LLAMA_CONTEXT_TYPE_MTP
        params.ctx_other = target.ctx
        params.no_perf = True
        ctx = llama_cpp.llama_init_from_model(target.model, params)
        if not ctx:
            raise LocalspecError(
                f"llama.cpp could not create the MTP draft context for {target.path.name}: "
                f"{recent_log()}",
                "check that the model's architecture supports MTP drafting "
                f"({', '.join(SUPPORTED_ARCHS)}), or use another --mode",
            )
        return ctx

    def _memory_shared(self) -> bool:
        """Whether the MTP context attends the target's own KV cache (gemma4-style: llama.cpp
        runs all heads in one graph there, so it never chains them)."""
        other = nextn_ext.llama_get_ctx_other(self.ctx)
        return other is not None and other == getattr(self.target.ctx, "value", self.target.ctx)

    def close(self) -> None:
        if self.mirror in self.target.listeners:
            self.target.listeners.remove(self.mirror)
        self._batch.close()
        if self.ctx:
            llama_cpp.llama_free(self.ctx)
            self.ctx = None

    # ----- following the target ------------------------------------------------------------

    def mirror(self, start: int, tokens: Sequence[int]) -> None:
        """The target decoded ``tokens`` at ``start``: store its hidden states and feed the
        (h_{p-1}, x_p) pairs to the MTP cache (cut at ``start`` first)."""
        n = len(tokens)
        if not self.active:  # plain decoding (e.g. a --compare baseline) pays nothing
            self.synced = min(self.synced, start)
            return
        if start > self.synced:
            raise LocalspecError(
                f"internal error: the MTP mirror has a gap ({self.synced} < {start})"
            )
        self.hidden[start : start + n] = nextn_ext.nextn_rows(self.target.ctx, n, self.n_embd)
        for _ in self._each_head():
            llama_cpp.llama_memory_seq_rm(self.memory, 0, start, -1)
            self._feed(start, tokens)
        self.synced = start + n

    def _feed(self, start: int, tokens: Sequence[int]) -> None:
        """Decode the (h_{p-1}, x_p) pairs of ``tokens`` at ``start`` under the current head."""
        n = len(tokens)
        for chunk in range(0, n, self._capacity):
            self._batch.clear()
            for i in range(chunk, min(n, chunk + self._capacity)):
                pos = start + i
                h = self.hidden[pos - 1] if pos > 0 else np.zeros(self.n_embd, np.float32)
                self._batch.add(tokens[i], pos, h)
            self._decode()

    def _each_head(self) -> Iterator[int]:
        """Yield once (one head, nothing selected), or, for chained heads, once per head with
        that head selected: each head's layer needs its own K/V for every position. Head 0 is
        selected again afterwards, the default every other decode relies on."""
        if not self.chained:
            yield 0
            return
        try:
            for head in range(self.n_heads):
                nextn_ext.llama_set_nextn_layer_offset(self.ctx, head)
                yield head
        finally:
            nextn_ext.llama_set_nextn_layer_offset(self.ctx, 0)

    def _decode(self) -> None:
        rc = self._batch.decode()
        if rc != 0:
            raise LocalspecError(f"the MTP draft decode failed with code {rc}: {recent_log()}")

    # ----- drafting ------------------------------------------------------------------------

    def first_step(self, last: int, pos: int) -> np.ndarray:
        """Start a draft after ``last`` (chosen by the target, at ``pos``, not yet decoded):
        cut the MTP cache at ``pos`` and return the logits for position ``pos + 1``."""
        if pos > self.synced or pos == 0:
            raise LocalspecError(f"internal error: MTP draft at {pos}, mirrored {self.synced}")
        llama_cpp.llama_memory_seq_rm(self.memory, 0, pos, -1)
        self._pos0 = pos
        self._chain = [(last, self.hidden[pos - 1])]
        return self._step(last, pos, self.hidden[pos - 1])

    def next_step(self, token: int, pos: int) -> np.ndarray:
        """Feed the drafted ``token`` at ``pos`` with the head's own last hidden state."""
        if self.chained:
            return self._chained_step(token, pos)
        return self._step(token, pos, self._head_state)

    def _step(self, token: int, pos: int, h: np.ndarray) -> np.ndarray:
        self._batch.clear()
        self._batch.add(token, pos, h, output=True)
        self._decode()
        return self._read_output(0)

    def _chained_step(self, token: int, pos: int) -> np.ndarray:
        """Draft step i = ``pos - pos0`` under head i: cut the cache at the draft start and
        re-add the whole draft prefix, since head i has no K/V in the draft region yet.

        Every entry is an output (llama.cpp outputs only the last): some MTP graphs (hy_v3)
        expose ``h_nextn`` before selecting the output rows, so with a single output the
        masked read would return the first entry's state instead of the last one's."""
        head = pos - self._pos0
        if not 0 < head < self.n_heads or head != len(self._chain):
            raise LocalspecError(f"internal error: chained MTP step {head} of {self.n_heads}")
        self._chain.append((token, self._head_state))
        llama_cpp.llama_memory_seq_rm(self.memory, 0, self._pos0, -1)
        self._batch.clear()
        for t, (tok, h) in enumerate(self._chain):
            self._batch.add(tok, self._pos0 + t, h, output=True)
        nextn_ext.llama_set_nextn_layer_offset(self.ctx, head)
        try:
            self._decode()
        finally:
            nextn_ext.llama_set_nextn_layer_offset(self.ctx, 0)
        return self._read_output(len(self._chain) - 1)

    def _read_output(self, i: int) -> np.ndarray:
        """Keep the head's output state of batch entry ``i`` (the next step's h) and return
        the logits of the last output."""
        self._head_state = nextn_ext.nextn_row(self.ctx, i, self.n_embd)
        logits = llama_cpp.llama_get_logits_ith(self.ctx, -1)
        return np.ctypeslib.as_array(logits, shape=(self.n_vocab,))


def check_nextn(path: Path) -> None:
    """Refuse a GGUF without NextN layers before loading it (cheap: the header only)."""
    info = gguf_info(path)
    if info.n_layer_nextn <= 0:
        raise LocalspecError(
            f"{path.name} ({info.architecture}) has no NextN (MTP) layers "
            f"({info.architecture}.nextn_predict_layers is absent or 0), "
            "so --mode draft-mtp has nothing to draft with",
            "use the model's -MTP GGUF variant (e.g. a Qwen3.5/3.6 '-MTP' file), "
            "or --mode draft-self / ngram-simple",
        )
    if info.architecture not in SUPPORTED_ARCHS:
        raise LocalspecError(
            f"{path.name}: llama.cpp has no MTP draft graph for '{info.architecture}'",
            f"draft-mtp supports {', '.join(SUPPORTED_ARCHS)}; use --mode draft-self",
        )
