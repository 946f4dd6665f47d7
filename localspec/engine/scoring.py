"""The log-probability of each token of a given text under the target: what OpenAI's legacy
completions return with ``echo`` and ``logprobs`` (and ``max_tokens: 0``), and what
evaluation harnesses (lm-eval's ``loglikelihood``) ask a server for.

The text is decoded from the start of the cache with a logits row for every position, in
chunks of PREFILL_CHUNK tokens (a 512-token batch would hold 512 rows of the vocabulary:
300 MB for Qwen's 152k tokens); row i of a chunk is the distribution of the token after it.
"""

from __future__ import annotations

from collections.abc import Sequence

from localspec.engine.loop import TokenLogprob
from localspec.engine.model_context import PREFILL_CHUNK, ModelContext
from localspec.engine.verify import token_logprobs
from localspec.errors import LocalspecError


def score_tokens(
    context: ModelContext, tokens: Sequence[int], top: int
) -> list[TokenLogprob | None]:
    """For each of ``tokens``, its log-probability given the ones before it and the ``top``
    most likely tokens there (None for the first token: nothing comes before it)."""
    if len(tokens) > context.n_ctx:
        raise LocalspecError(
            f"the text has {len(tokens)} tokens but the context holds {context.n_ctx}",
            "shorten it or raise the context size (-c / --ctx-size)",
        )
    context.trim(0)  # every position's row is needed: nothing cached is reused
    scores: list[TokenLogprob | None] = [None]
    for start in range(0, len(tokens), PREFILL_CHUNK):
        chunk = tokens[start : start + PREFILL_CHUNK]
        rows = context.decode(chunk, all_logits=True)  # valid until the next decode
        for i, row in enumerate(rows):
            after = start + i + 1
            if after < len(tokens):
                scores.append(token_logprobs(row, tokens[after], top))
    return scores
