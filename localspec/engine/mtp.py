"""The MTP (NextN) draft context: the target's own multi-token-prediction head, run by llama.cpp.

As llama.cpp's ``draft-mtp`` driver (``common/speculative.cpp``) does it:

* the target model is loaded with ``load_mtp`` and a second context of type
  ``LLAMA_CONTEXT_TYPE_MTP`` is created on the same model; for qwen35/qwen35moe it has its
  own small KV cache holding only the NextN block (``ctx_other`` is not retained);
* the target outputs its final hidden state ``h`` (after the output norm) for every batch
  token (``llama_set_embeddings_nextn(ctx, true, masked=false)``);
* the MTP cache at position p holds the pair (h_{p-1}, x_p): after every target decode the
  new tokens are fed, each with the target's hidden state of the position before it
  (``mirror``, a ``Backend`` listener). Feeding a position again first cuts the MTP cache
  there, which is also how a rejected draft is rolled back: no separate bookkeeping;
* drafting runs the head autoregressively: (h_{p-1}, x_p) -> x_{p+1}; the head's own output
  state becomes the h of the next step.

The hidden states are kept for every position (``n_ctx x n_embd`` float32) so that a new
generation that reuses the cached prompt prefix can resume feeding where it differs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import llama_cpp
import numpy as np

from localspec.engine import nextn_ext
from localspec.engine.backend import Backend
from localspec.engine.llama_lib import recent_log
from localspec.errors import LocalspecError
from localspec.gguf_info import gguf_info
from localspec.hardware import default_threads

# architectures with an MTP draft graph in the vendored llama.cpp (LLM_GRAPH_TYPE_DECODER_MTP)
# and their own MTP KV cache; tested here on tiny qwen35/qwen35moe files. Models with several
# NextN heads (step35, mimo2, hy_v3) draft with their first head, reused autoregressively.
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
TESTED_ARCHS = ("qwen35", "qwen35moe")


class MtpContext:
    def __init__(self, target: Backend) -> None:
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
        target.listeners.append(self.mirror)

    @staticmethod
    def _new_context(target: Backend) -> llama_cpp.llama_context_p:
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = target.n_ctx
        params.n_batch = params.n_ubatch = target.n_batch
        params.n_seq_max = 1
        params.n_threads = params.n_threads_batch = target.options.n_threads or default_threads()
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
        llama_cpp.llama_memory_seq_rm(self.memory, 0, start, -1)
        for chunk in range(0, n, self._capacity):
            self._batch.clear()
            for i in range(chunk, min(n, chunk + self._capacity)):
                pos = start + i
                h = self.hidden[pos - 1] if pos > 0 else np.zeros(self.n_embd, np.float32)
                self._batch.add(tokens[i], pos, h)
            self._decode()
        self.synced = start + n

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
        return self._step(last, pos, self.hidden[pos - 1])

    def next_step(self, token: int, pos: int) -> np.ndarray:
        """Feed the drafted ``token`` at ``pos`` with the head's own last hidden state."""
        return self._step(token, pos, self._head_state)

    def _step(self, token: int, pos: int, h: np.ndarray) -> np.ndarray:
        self._batch.clear()
        self._batch.add(token, pos, h, output=True)
        self._decode()
        self._head_state = nextn_ext.nextn_row(self.ctx, 0, self.n_embd)
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
