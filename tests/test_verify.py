"""The acceptance maths, without llama.cpp: speculative sampling must reproduce the target's
processed distribution exactly, whatever the draft."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chisquare

from localspec.engine.verify import (
    SamplingParams,
    TokenDraws,
    accept_greedy,
    accept_sampling,
    acceptance_odds,
    draw_margin,
    probabilities,
    residual,
    sample,
)

VOCAB = 10
DRAWS = 100_000


class IidDraws(TokenDraws):
    """Independent uniforms from one generator, whatever the position: the distribution tests
    draw many times at the same position."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def uniform(self, position: int, purpose: int = TokenDraws.PICK) -> float:
        return float(self.rng.random())


def logits_for(probs: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(probs)


def first_token_distribution(p_logits, q_probs, params, draws=DRAWS, seed=0) -> np.ndarray:
    """Empirical distribution of the first emitted token when a one-token draft drawn from q
    is verified against the target row p (rows: p at position 0, and a bonus row)."""
    rng = np.random.default_rng(seed)
    rows = np.stack([p_logits, p_logits])
    counts = np.zeros(VOCAB)
    draft_tokens = (
        rng.choice(VOCAB, size=draws, p=q_probs) if q_probs is not None else np.zeros(draws, int)
    )
    for x in draft_tokens:
        n_acc, nxt = accept_sampling(
            [int(x)], [q_probs] if q_probs is not None else None, rows, params, IidDraws(rng), 0
        )
        token = int(x) if n_acc == 1 else nxt
        assert 0 <= token < VOCAB
        counts[token] += 1
    return counts / draws


def assert_matches(observed: np.ndarray, expected: np.ndarray) -> None:
    support = expected > 0
    assert observed[~support].sum() == 0, "a token outside the target's support was emitted"
    stat = chisquare(observed[support] * DRAWS, expected[support] * DRAWS)
    tv = 0.5 * np.abs(observed - expected).sum()
    assert stat.pvalue > 1e-3, (stat, observed, expected)
    assert tv < 0.01, tv


TARGET = np.array([0.30, 0.20, 0.15, 0.10, 0.08, 0.07, 0.05, 0.03, 0.015, 0.005])


@pytest.mark.parametrize("case", ["different", "equal", "zero-mass", "one-hot"])
def test_rejection_sampling_follows_target(case: str) -> None:
    params = SamplingParams(temperature=1.0)
    q = {
        "different": np.array([0.02, 0.05, 0.05, 0.3, 0.3, 0.1, 0.1, 0.04, 0.02, 0.02]),
        "equal": TARGET.copy(),
        # the draft has no mass where the target has most of it
        "zero-mass": np.array([0.0, 0.0, 0.0, 0.25, 0.25, 0.2, 0.1, 0.1, 0.05, 0.05]),
        "one-hot": None,
    }[case]
    observed = first_token_distribution(logits_for(TARGET), q, params)
    assert_matches(observed, probabilities(logits_for(TARGET), params))


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7, top_k=4),
        SamplingParams(temperature=1.3, top_p=0.8),
        SamplingParams(temperature=1.0, min_p=0.2),
    ],
)
def test_truncation_applies_to_both_distributions(params: SamplingParams) -> None:
    draft_logits = logits_for(np.array([0.05, 0.05, 0.4, 0.2, 0.1, 0.1, 0.04, 0.03, 0.02, 0.01]))
    q = probabilities(draft_logits, params)
    expected = probabilities(logits_for(TARGET), params)
    assert (expected > 0).sum() < VOCAB  # the mask really removes tokens
    observed = first_token_distribution(logits_for(TARGET), q, params)
    assert_matches(observed, expected)


def test_top_k_and_top_p_masks() -> None:
    row = logits_for(TARGET)
    assert (probabilities(row, SamplingParams(1.0, top_k=3)) > 0).sum() == 3
    kept = probabilities(row, SamplingParams(1.0, top_p=0.6))
    assert set(np.flatnonzero(kept)) == {0, 1, 2}  # 0.30 + 0.20 + 0.15 is the first >= 0.6
    assert np.isclose(kept.sum(), 1.0)


def test_sample_never_returns_out_of_range_id() -> None:
    rng = np.random.default_rng(1)
    probs = np.zeros(VOCAB)
    probs[-1] = 1.0
    assert {sample(probs, rng.random()) for _ in range(1000)} == {VOCAB - 1}
    for _ in range(1000):
        assert (
            0
            <= sample(probabilities(rng.normal(size=VOCAB), SamplingParams(1.0)), rng.random())
            < VOCAB
        )


def test_greedy_accepts_matching_prefix_and_takes_target_token() -> None:
    rows = np.full((4, VOCAB), -1.0)
    for i, best in enumerate([3, 5, 7, 9]):
        rows[i, best] = 1.0
    assert accept_greedy([3, 5, 7], rows) == (3, 9)  # full accept: bonus token
    assert accept_greedy([3, 4, 7], rows) == (1, 5)  # mismatch at 1: target's token
    assert accept_greedy([], rows) == (0, 3)  # no draft: plain decoding


def test_residual_of_one_hot_removes_rejected_token() -> None:
    r = residual(TARGET, None, 0)
    assert r[0] == 0 and np.isclose(r.sum(), 1.0)
    assert np.allclose(r[1:], TARGET[1:] / TARGET[1:].sum())


def test_multi_token_draft_keeps_joint_distribution() -> None:
    """Two positions: the pair (token 1, token 2) must follow p1 x p2 when the target's second
    row does not depend on the first token (a simplification that keeps the test exact)."""
    params = SamplingParams(temperature=1.0)
    p2 = np.array([0.05, 0.05, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.2])
    q = np.array([0.1] * 10)
    rows = np.stack([logits_for(TARGET), logits_for(p2), logits_for(p2)])
    rng = np.random.default_rng(3)
    counts = np.zeros(VOCAB)
    for _ in range(DRAWS):
        d = [int(rng.choice(VOCAB, p=q)), int(rng.choice(VOCAB, p=q))]
        n_acc, nxt = accept_sampling(d, [q, q], rows, params, IidDraws(rng), 0)
        second = d[1] if n_acc == 2 else (nxt if n_acc == 1 else None)
        if second is not None:
            counts[second] += 1
    total = counts.sum()  # second tokens emitted (the first was accepted)
    assert chisquare(counts, p2 * total).pvalue > 1e-3
    assert 0.5 * np.abs(counts / total - p2).sum() < 0.01


def naive_probabilities(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The textbook pipeline (full sorts, no shortcuts): the reference for the fast one."""
    scaled = logits.astype(np.float64) / params.temperature
    if params.top_k:
        kth = np.sort(scaled)[-params.top_k]
        scaled = np.where(scaled >= kth, scaled, -np.inf)
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    if params.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        keep_n = int(np.searchsorted(np.cumsum(probs[order]), params.top_p)) + 1
        kept = np.zeros_like(probs)
        kept[order[:keep_n]] = probs[order[:keep_n]]
        probs = kept / kept.sum()
    if params.min_p:
        probs = np.where(probs >= params.min_p * probs.max(), probs, 0.0)
    return probs / probs.sum()


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(0.7),
        SamplingParams(0.7, top_k=40),
        SamplingParams(1.0, top_k=5000),  # more than the window under the maximum holds
        SamplingParams(0.7, top_p=0.9),
        SamplingParams(1.3, top_p=0.999),  # the mass is spread: the thresholds must widen
        SamplingParams(0.7, top_k=40, top_p=0.95, min_p=0.05),
        SamplingParams(0.8, min_p=0.1),
    ],
)
def test_fast_truncation_equals_full_sort_on_a_large_vocabulary(params: SamplingParams) -> None:
    rng = np.random.default_rng(3)
    for spread in (0.5, 3.0, 20.0):  # flat to peaked rows
        row = (rng.standard_normal(151_936) * spread).astype(np.float32)
        expected = naive_probabilities(row, params)
        got = probabilities(row, params)
        assert np.array_equal(got > 0, expected > 0)
        assert np.allclose(got, expected, rtol=1e-9, atol=1e-15)


def test_blockwise_sampling_follows_a_distribution_spread_over_blocks() -> None:
    rng = np.random.default_rng(4)
    probs = np.zeros(20_000)
    ids = np.array([0, 2047, 2048, 9000, 9001, 19_999])  # block edges, empty blocks between
    probs[ids] = [0.1, 0.2, 0.05, 0.3, 0.25, 0.1]
    draws = np.array([sample(probs, rng.random()) for _ in range(50_000)])
    assert set(np.unique(draws)) <= set(ids)  # never a token of probability 0
    counts = np.array([(draws == i).sum() for i in ids])
    assert chisquare(counts, probs[ids] * draws.size).pvalue > 1e-3


def test_a_seed_picks_the_same_tokens_whatever_a_lookup_drafted() -> None:
    """One-hot drafts are judged by the target's own draw at that position: the output is
    what plain sampling with the same seed gives, token for token, for any draft."""
    rng = np.random.default_rng(7)
    params = SamplingParams(temperature=0.8)
    rows = rng.normal(size=(6, VOCAB)) * 2
    draws = TokenDraws(seed=1234)
    plain = [sample(probabilities(rows[i], params), draws.uniform(10 + i)) for i in range(6)]
    for _ in range(200):
        draft = [int(t) for t in rng.integers(0, VOCAB, size=5)]
        right = int(rng.integers(0, 6))
        draft[:right] = plain[:right]  # a right prefix, then anything
        n_acc, nxt = accept_sampling(draft, None, rows, params, draws, position=10)
        assert [*draft[:n_acc], nxt] == plain[: n_acc + 1]
    assert TokenDraws(seed=1234).uniform(3) == draws.uniform(3) != draws.uniform(4)


def test_a_draws_margin_is_its_distance_to_the_nearer_edge_of_its_token() -> None:
    probs = np.array([0.2, 0.0, 0.5, 0.3])  # intervals: [0, 0.2), [0.2, 0.7), [0.7, 1)
    assert draw_margin(probs, 0.25) == pytest.approx((0.05, 0))  # token 2, near its lower edge
    assert draw_margin(probs, 0.65) == pytest.approx((0.05, 3))  # near its upper edge
    assert draw_margin(probs, 0.1) == pytest.approx((0.1, 2))  # the first token: one edge only
    assert draw_margin(np.array([0.0, 1.0]), 0.3) == (float("inf"), 1)  # nothing else to draw
    rng = np.random.default_rng(3)
    p = rng.dirichlet(np.ones(300))
    for u in rng.random(200):
        margin, beyond = draw_margin(p, u)
        assert beyond != sample(p, u)
        step = margin + 1e-9
        assert {sample(p, max(u - step, 0.0)), sample(p, min(u + step, 1 - 1e-12))} & {beyond}


def test_each_position_a_draft_reaches_reports_its_chance_of_acceptance() -> None:
    """The chance is sum(min(p, q)) over the drafter's draws (one-hot q: p of the drafted
    token), for every position verification reached, the rejected one included; averaged
    over the draws it is how often the position is accepted."""
    params = SamplingParams(temperature=1.0)
    q = np.array([0.1] * 10)
    rows = np.stack([logits_for(TARGET)] * 4)
    expected = float(np.minimum(TARGET, q).sum())
    rng = np.random.default_rng(5)
    accepted, reached = 0, 0
    for _ in range(20_000):
        draft = [int(t) for t in rng.choice(VOCAB, size=3, p=q)]
        odds: list[float] = []
        n_acc, _ = accept_sampling(draft, [q] * 3, rows, params, IidDraws(rng), 0, odds)
        assert len(odds) == min(n_acc + 1, 3)
        assert odds == pytest.approx([expected] * len(odds))
        accepted += n_acc
        reached += len(odds)
    assert accepted / reached == pytest.approx(expected, abs=0.01)
    odds = []
    n_acc, _ = accept_sampling([0, 9], None, rows, params, TokenDraws(seed=3), 0, odds)
    assert odds[0] == pytest.approx(TARGET[0]) and len(odds) == min(n_acc + 1, 2)
    assert acceptance_odds(TARGET, None, 9) == pytest.approx(TARGET[9])
