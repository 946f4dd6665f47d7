"""Repetition penalties in pure numpy, against llama.cpp's rule written out token by token."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from localspec.engine.penalties import PenalizedRows, Penalties
from localspec.errors import LocalspecError

VOCAB = 12


def llama_rule(row: np.ndarray, window: list[int], p: Penalties) -> np.ndarray:
    """``llama_sampler_penalties_apply``: each token seen c times in the window."""
    out = row.astype(np.float32).copy()
    for token in set(window):
        c = window.count(token)
        logit = out[token]
        logit = logit * np.float32(p.repeat) if logit <= 0 else logit / np.float32(p.repeat)
        out[token] = logit - (np.float32(c * p.frequency) + np.float32(p.presence))
    return out


penalties = st.builds(
    Penalties,
    repeat=st.floats(0.5, 2.0),
    frequency=st.floats(-2.0, 2.0),
    presence=st.floats(-2.0, 2.0),
    last_n=st.sampled_from([-1, 1, 3, 8, 64]),
)
tokens = st.lists(st.integers(0, VOCAB - 1), max_size=20)
rows = st.lists(st.floats(-20, 20, width=32), min_size=VOCAB, max_size=VOCAB)


@given(p=penalties, row=rows, window=tokens)
def test_a_row_is_penalized_as_llama_cpp_penalizes_it(p, row, window) -> None:  # type: ignore[no-untyped-def]
    row = np.array(row, dtype=np.float32)
    expected = llama_rule(row, list(p.window(window)), p)
    np.testing.assert_allclose(p.apply(row, p.window(window)), expected, rtol=1e-6, atol=1e-5)


@given(p=penalties, context=tokens.filter(bool), draft=tokens, seed=st.integers(0, 99))
def test_a_draft_s_row_has_the_window_plain_decoding_has_there(p, context, draft, seed) -> None:  # type: ignore[no-untyped-def]
    """Row i of a verified batch follows the context and the draft's first i tokens: the
    window plain decoding would have had when it wrote that token."""
    batch = np.random.default_rng(seed).normal(size=(len(draft) + 1, VOCAB)).astype(np.float32)
    penalized = PenalizedRows(batch, context, draft, p)
    for i in range(len(draft) + 1):
        plain_window = p.window([*context, *draft[:i]])
        np.testing.assert_array_equal(penalized[i], p.apply(batch[i], plain_window))


def test_what_is_off_and_what_is_refused() -> None:
    assert not Penalties().active
    assert not Penalties(repeat=1.3, last_n=0).active
    assert Penalties(presence=0.1).active and Penalties(repeat=0.9).active
    row = np.array([1.0, 2.0, -1.0], dtype=np.float32)
    np.testing.assert_array_equal(Penalties(repeat=2.0).apply(row, []), row)
    for wrong, words in (
        (Penalties(repeat=0.0), "repeat penalty must be a number > 0"),
        (Penalties(frequency=float("nan")), "frequency penalty"),
        (Penalties(last_n=-2), "must be >= -1"),
    ):
        with pytest.raises(LocalspecError, match=words):
            wrong.validate()


def test_a_neural_draft_is_penalized_as_the_target_will_penalize_it() -> None:
    """Each draft row is penalized by the context and the draft's tokens before it, as the
    target's row for that token will be: a draft model that drafted token 0 once does not
    draft it again where the penalty puts token 1 first (its q is the target's p)."""
    from localspec.drafters.neural import NeuralDrafter
    from localspec.engine.verify import SamplingParams

    row = np.array([2.0, 1.9, 1.5], dtype=np.float32)
    penalized = SamplingParams(penalties=Penalties(repeat=1.5))
    drafter = NeuralDrafter(None, penalized)
    # token 1 seen in the context; then 0 (2.0), then 2 (1.5 above 2.0/1.5 and 1.9/1.5), then 0
    draft = drafter.draft_from(row, lambda _token, _n: row, 3, context=[1])
    assert draft.tokens == [0, 2, 0]
    free = NeuralDrafter(None, SamplingParams())
    assert free.draft_from(row, lambda _token, _n: row, 3, context=[1]).tokens == [0, 0, 0]


def test_a_logit_bias_is_added_to_every_row_plain_or_drafted() -> None:
    from localspec.drafters.neural import NeuralDrafter
    from localspec.engine.logit_bias import BiasedRows, LogitBias
    from localspec.engine.verify import SamplingParams

    bias = LogitBias(((0, -math.inf), (2, 0.5)))
    row = np.array([2.0, 1.9, 1.5], dtype=np.float32)
    np.testing.assert_array_equal(bias.apply(row), np.array([-np.inf, 1.9, 2.0], np.float32))
    rows = BiasedRows([row, row], bias)
    assert len(rows) == 2 and rows[1][0] == -np.inf and rows[0][2] == 2.0
    drafter = NeuralDrafter(None, SamplingParams(logit_bias=bias))
    assert drafter.draft_from(row, lambda _token, _n: row, 2).tokens == [2, 2]
