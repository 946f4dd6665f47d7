"""The measurement protocol and its noise bounds, with synthetic timings (no llama.cpp)."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest

from localspec import measure, probe
from localspec.engine.costs import VerifyCost
from localspec.engine.spec_memory import SpecMemory
from localspec.engine.stats import Stats
from localspec.measure import Budget, Pair, judge, needs_more, predicted_speedup, shown
from localspec.probe import Measurement, rank
from localspec.probe_results import ProbeConfig
from localspec.prompts import PromptCase

CEILING = 3.0


def test_a_pair_is_taken_against_the_mean_of_its_neighbours() -> None:
    pair = Pair(50.0, 120.0, 70.0)
    assert pair.plain == 60.0 and pair.ratio == 2.0
    assert pair.drift == pytest.approx(20 / 60)


def test_steady_pairs_give_the_median_and_its_spread() -> None:
    verdict = judge([Pair(60, 120, 60), Pair(61, 130, 59), Pair(60, 125, 62)], CEILING, 2.05)
    assert verdict.measured == pytest.approx(125 / 61)
    assert verdict.low == pytest.approx(2.0) and verdict.high == pytest.approx(130 / 60)
    assert not verdict.noisy and verdict.best == verdict.measured


def test_a_pair_whose_plain_runs_moved_is_set_aside() -> None:
    # the second pair saw a busy spell: plain 60 -> 20 tok/s; its 4.5x ratio is not used
    verdict = judge([Pair(60, 120, 60), Pair(60, 180, 20), Pair(60, 126, 60)], CEILING, None)
    assert verdict.measured == pytest.approx(2.05) and not verdict.noisy


def test_figures_above_the_ceiling_are_noisy_and_never_printed() -> None:
    verdict = judge([Pair(5, 200, 5.5), Pair(5, 210, 5.2)], CEILING, 2.1)
    assert verdict.noisy and "ceiling" in verdict.reasons[0]
    assert verdict.best == 2.1  # ranked by the prediction instead
    text = shown(verdict.measured, verdict.low, verdict.high, verdict.noisy, CEILING)
    assert "noisy" in text and "40" not in text and text.count("x") == 1  # only "3.00x"


def test_plain_decoding_that_moves_in_every_pair_is_noisy() -> None:
    verdict = judge([Pair(60, 100, 30), Pair(30, 90, 60)], CEILING, 1.5)
    assert verdict.noisy and "moved" in verdict.reasons[0]


def test_repeats_without_an_agreeing_majority_are_noisy() -> None:
    verdict = judge([Pair(60, 60, 60), Pair(60, 120, 60)], CEILING, None)
    assert verdict.noisy and "repeats disagree" in verdict.reasons[0]
    # a busy spell slowed one speculative run: the agreeing majority is the figure
    majority = judge([Pair(60, 120, 60), Pair(60, 50, 60), Pair(60, 123, 60)], CEILING, None)
    assert not majority.noisy and majority.measured == pytest.approx(2.025)
    assert majority.low == pytest.approx(50 / 60)  # the spread still shows it


def test_disagreement_with_the_prediction_is_re_measured_then_noisy() -> None:
    close = judge([Pair(60, 120, 60), Pair(60, 121, 60)], CEILING, 1.8)
    assert not close.noisy  # within 25%
    far = judge([Pair(60, 120, 60), Pair(60, 121, 60)], CEILING, 1.5)
    assert far.noisy and "far from the predicted 1.50x" in far.reasons[0]
    assert far.best == 1.5
    assert needs_more([Pair(60, 120, 60), Pair(60, 121, 60)], 4, predicted=1.5)


def test_more_pairs_while_the_spread_is_wide() -> None:
    assert needs_more([Pair(60, 120, 60)], 4)  # fewer than two
    assert not needs_more([Pair(60, 120, 60), Pair(60, 121, 60)], 4)  # tight
    wide = [Pair(60, 100, 60), Pair(60, 130, 60)]
    assert needs_more(wide, 4) and not needs_more(wide, 2)
    assert not needs_more([*wide, Pair(60, 102, 60)], 4)  # two of three agree
    drifting = [Pair(60, 120, 60), Pair(60, 120, 20)]  # only one steady pair so far
    assert needs_more(drifting, 4)
    # one steady pair that the clock-free prediction confirms is enough; one it does not, not
    assert not needs_more([Pair(60, 120, 60)], 4, predicted=2.05)
    assert needs_more([Pair(60, 120, 60)], 4, predicted=2.5)


def test_the_prediction_uses_the_draft_lengths_and_the_cost_curve() -> None:
    cost = VerifyCost(np.array([1, 2, 3, 4, 5]), np.array([0.010, 0.016, 0.020, 0.024, 0.030]))
    # 10 rounds: 2 without a draft, 4 with 2 drafted tokens, 4 with 4; 30 tokens emitted
    stats = Stats(n_tokens=30, rounds=10, verifications=8, drafted=24, drafted_at=(8, 8, 4, 4))
    target = 2 * 0.010 + 4 * 0.020 + 4 * 0.030
    assert measure.target_seconds(stats, cost) == pytest.approx(target)
    # plain decoding too takes the first token from the prompt's pass: 29 one-token steps
    assert predicted_speedup(stats, cost, 0.0) == pytest.approx(29 * 0.010 / target)
    with_draft = 29 * 0.010 / (target + 0.002 * (24 + 8))
    assert predicted_speedup(stats, cost, 0.002) == pytest.approx(with_draft)
    assert predicted_speedup(Stats(), cost, 0.0) is None
    assert predicted_speedup(Stats(n_tokens=1), cost, 0.0) is None


def test_a_prediction_never_passes_the_ceiling_nor_one_without_acceptance() -> None:
    cost = VerifyCost(np.arange(1, 10), 0.010 + 0.002 * np.arange(9) ** 1.2)
    rng = np.random.default_rng(0)
    for _ in range(200):
        k, rounds = int(rng.integers(1, 9)), int(rng.integers(1, 20))
        drafting = int(rng.integers(0, rounds + 1))  # rounds that verified k drafted tokens
        accepted = [int(rng.integers(0, k + 1)) for _ in range(drafting)]
        n_tokens = 1 + rounds + sum(accepted)  # the prompt's token, one per round, the kept
        stats = Stats(
            n_tokens=n_tokens,
            rounds=rounds,
            verifications=drafting,
            drafted=k * drafting,
            accepted=sum(accepted),
            drafted_at=(drafting,) * k,
        )
        predicted = predicted_speedup(stats, cost, 0.0)
        assert predicted is not None and predicted <= cost.ceiling() + 1e-9
        if not sum(accepted):
            assert predicted <= 1.0 + 1e-9


def test_the_budget_pays_for_extra_pairs_pro_rata(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = itertools.count(0.0, 10.0)  # every reading: 10 s later
    monkeypatch.setattr(measure.time, "monotonic", lambda: next(clock))
    budget = Budget(100.0, n_cells=4)  # start at 0
    assert budget.allows_more()  # 10 s used of the 25 s due for the first cell
    assert budget.allows_more()  # 20 s
    assert not budget.allows_more()  # 30 s > 25 s
    budget.cell_done()
    assert budget.allows_more()  # 40 s of the 50 s due for two cells


def fake(config: ProbeConfig, ratio: float, predicted: float | None, ceiling: float) -> Measurement:
    pairs = (Pair(10.0, 10 * ratio, 10.0), Pair(10.0, 10 * ratio, 10.0))
    verdict = judge(pairs, ceiling, predicted)
    return Measurement(config, "p", "qa", pairs, verdict, 0.5, 2.0, (0.5,))


def test_noisy_configurations_rank_by_their_prediction_or_last() -> None:
    reliable = fake(ProbeConfig("draft-model", 4, "/d.gguf"), 1.2, 1.25, 3.0)
    # measured 5x on a 3x-ceiling machine: noisy; predicted 1.5x
    predicted = fake(ProbeConfig("ngram-simple", 8), 5.0, 1.5, 3.0)
    unknown = fake(ProbeConfig("draft-self", 4), 5.0, None, 3.0)  # noisy, nothing else
    ranking = rank([unknown, reliable, predicted])
    assert [r.config.mode for r in ranking] == ["ngram-simple", "draft-model", "draft-self"]
    assert ranking[0].noisy and ranking[0].speedup == pytest.approx(1.5)
    assert not ranking[1].noisy and ranking[2].noisy
    # what --mode auto runs, and what is recommended, is the best reliable measurement
    assert probe.chosen(ranking) is ranking[1] and probe.measured_winner(ranking) is ranking[1]
    advice = probe.recommendation(ranking)
    assert "best estimate is ngram-simple n=8" in advice and "use draft-model" in advice
    only_noisy = rank([unknown, predicted])
    assert probe.measured_winner(only_noisy) is None and probe.chosen(only_noisy) is only_noisy[0]
    assert probe.recommendation(only_noisy).startswith("no configuration could be measured")


# ----- the protocol against a simulated busy machine --------------------------------------


@dataclass
class Run:
    stats: Stats


class BusyMachine:
    """Decoding whose speed follows a load that changes between runs (bursts of a competing
    process), with true speedups per mode: the stand-in for a real engine in this one
    pure-logic test of the protocol."""

    def __init__(self, speedups: dict[str, float], loads: Iterator[float]) -> None:
        self.speedups, self.loads = speedups, loads
        self.memory = SpecMemory()  # what probe clears before each run

    def generate(self, _text: str, mode: str, **_kw: object) -> Run:
        speedup = self.speedups.get(mode, 1.0)
        speed = 60.0 * speedup / next(self.loads)
        # one drafted token a round, as many rounds as the true speedup implies on the cost
        # curve below (a verify of 2 tokens costs 1.2 steps): the prediction is the truth
        rounds = 64 if mode == "none" else round(64 / (1.2 * speedup))
        drafted = 0 if mode == "none" else rounds
        return Run(
            Stats(
                n_tokens=65,  # the prompt's token, and one per round or drafted token
                gen_ms=64_000 / speed,
                rounds=rounds,
                verifications=drafted,
                drafted=drafted,
                drafted_at=(drafted,) if drafted else (),
                accepted_at=(drafted,) if drafted else (),
            )
        )

    def verify_cost(self, n_max: int | None = None) -> VerifyCost:
        return VerifyCost(np.array([1, 2, 16]), np.array([0.01, 0.012, 0.04]))  # ceiling 4x

    def draft_step_seconds(self) -> None:
        return None


def test_interleaving_ranks_right_where_back_to_back_runs_do_not() -> None:
    from localspec.probe import measure as probe_measure

    truth = {"ngram-simple": 1.6, "draft-self": 1.3}
    prompt = PromptCase("p", "code-edit", "en", "text")
    configs = [ProbeConfig("draft-self", 4), ProbeConfig("ngram-simple", 4)]

    # the old protocol: one plain run, then each configuration back to back; a competing
    # job that halves the speed during the last run flips the ranking
    machine = BusyMachine(truth, iter([1.0, 1.0, 2.0]))
    plain = 60.0 / next(machine.loads)
    naive = {c.mode: 60.0 * truth[c.mode] / next(machine.loads) / plain for c in configs}
    assert naive["draft-self"] > naive["ngram-simple"]

    # the protocol, on a machine where a third of all runs are slowed down 2.5x at random
    for seed in range(30):
        rng = random.Random(seed)
        loads = (2.5 if rng.random() < 0.33 else 1.0 for _ in iter(int, 1))
        machine = BusyMachine(truth, loads)
        found = list(probe_measure(machine, configs, [prompt], 64, 0.0, max_pairs=6))  # type: ignore[arg-type]
        assert rank(found)[0].config.mode == "ngram-simple", seed
        for m in found:  # each figure is the truth or flagged, never a silent error
            right = math.isclose(m.verdict.measured, truth[m.config.mode], rel_tol=0.1)
            assert m.verdict.noisy or right, (seed, m.verdict)
