"""The load-aware draft budget on hand-built cost curves: one generation drafts as the
adaptive controller would, a full batch on a compute-bound machine drafts nothing, and draft
tokens go where they are most likely to be accepted."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from localspec.engine.adaptive import MARGIN, AdaptiveController
from localspec.engine.budget import DraftDemand, allocate, predicted_gain
from localspec.engine.costs import DraftPassCost, VerifyCost
from localspec.engine.step_batch import padding, passes

N_MAX = 16
SIZES = np.array([1, 2, 3, 4, 5, 6, 8, 9, 12, 13, 16, 17, 24, 32, 48, 64, 128])


def cpu_curve() -> VerifyCost:
    """A small CPU: a batch of b rows costs about what b/3 one-row steps cost up to 12 rows,
    then grows linearly (the batch ceiling is ~3x), with a staircase at multiples of 4."""
    steps = np.ceil(SIZES / 4)
    seconds = 0.03 * (1 + 0.25 * (SIZES - 1)) + 0.004 * steps
    return VerifyCost(SIZES, seconds)


def flat_curve() -> VerifyCost:
    """A memory-bound GPU: any batch up to 64 rows costs one step."""
    return VerifyCost(SIZES, np.where(SIZES <= 64, 0.01, 0.01 * SIZES / 64))


def demand(acceptance: float, cap: int = N_MAX, **kw) -> DraftDemand:  # type: ignore[no-untyped-def]
    return DraftDemand(np.full(N_MAX, acceptance), cap, **kw)


def test_one_generation_drafts_what_its_controller_would() -> None:
    rng = np.random.default_rng(3)
    for curve in (cpu_curve(), flat_curve()):
        controller = AdaptiveController(N_MAX, curve)
        for _ in range(200):
            acceptance = rng.uniform(0.0, 1.0, N_MAX + 1) ** rng.uniform(0.2, 3.0)
            expected = controller._best_length(MARGIN, acceptance=acceptance)
            [got] = allocate([DraftDemand(acceptance, N_MAX)], 1, curve)
            assert got == expected, acceptance


def test_a_full_batch_on_a_cpu_drafts_nothing_and_a_gpu_drafts_everywhere() -> None:
    slots = [demand(0.7) for _ in range(8)]
    assert allocate(slots[:1], 1, cpu_curve())[0] > 0  # alone, drafting pays
    assert allocate(slots, 8, cpu_curve()) == [0] * 8  # eight wide, the batch is the gain
    assert all(k > 0 for k in allocate(slots, 8, flat_curve()))


def test_the_predicted_gain_is_the_budgets_own_arithmetic() -> None:
    """Perfect drafts of four tokens: on a flat curve the step gives five times the tokens
    for its one pass; on the CPU, eight generations wide, free drafts still gain and drafts
    that cost a step's share each lose; no drafts, no gain."""
    free = [demand(1.0) for _ in range(8)]
    paid = [demand(1.0, seconds_per_token=0.03) for _ in range(8)]
    assert predicted_gain(free[:1], 1, flat_curve(), [4]) == pytest.approx(5.0)
    assert predicted_gain(free, 8, cpu_curve(), [4] * 8) > 1.0
    assert predicted_gain(paid, 8, cpu_curve(), [4] * 8) < 1.0
    assert predicted_gain(paid, 8, cpu_curve(), [0] * 8) == pytest.approx(1.0)


def test_tokens_go_to_the_likeliest_drafts_first() -> None:
    lengths = allocate([demand(0.3), demand(0.95), demand(0.6)], 3, cpu_curve())
    assert lengths[1] == max(lengths) and lengths[1] > 0
    assert lengths[0] <= lengths[2] <= lengths[1]


def test_pinned_lengths_caps_and_the_batch_size_are_kept() -> None:
    slots = [demand(0.9, pinned=0), demand(0.9, cap=3), demand(0.9, pinned=5), demand(0.9)]
    lengths = allocate(slots, 4, flat_curve(), max_rows=4 + 12)
    assert lengths[0] == 0 and lengths[1] <= 3 and lengths[2] == 5
    assert sum(lengths) <= 12


def test_a_generation_that_was_drafting_keeps_drafting_at_the_margin() -> None:
    """Hysteresis: at a gain below the margin a new drafter stays off, a running one stays on."""
    curve = cpu_curve()
    for acceptance in np.linspace(0.2, 0.6, 41):
        off = allocate([demand(acceptance)], 1, curve)[0]
        on = allocate([demand(acceptance, drafting=True)], 1, curve)[0]
        assert on >= off
    assert any(
        allocate([demand(a, drafting=True)], 1, curve)[0] > 0
        and allocate([demand(a)], 1, curve)[0] == 0
        for a in np.linspace(0.2, 0.6, 41)
    )


def test_a_costly_drafter_drafts_less() -> None:
    free = allocate([demand(0.8)], 1, cpu_curve())[0]
    costly = allocate([demand(0.8, seconds_per_token=0.02)], 1, cpu_curve())[0]
    assert costly < free


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(0.0, 1.0), min_size=1, max_size=8),
    st.integers(0, 4),
    st.sampled_from(["cpu", "flat"]),
)
@example([0.0, 0.0, 0.75, 0.625], 0, "cpu")  # hysteresis dropped a drafter the prefix needed
def test_the_budget_never_predicts_less_than_plain_batched_decoding(
    acceptances: list[float], prefill: int, kind: str
) -> None:
    curve = cpu_curve() if kind == "cpu" else flat_curve()
    slots = [demand(a) for a in acceptances]
    base = len(slots) + prefill
    lengths = allocate(slots, base, curve, max_rows=base + 64)
    assert all(0 <= k <= N_MAX for k in lengths) and sum(lengths) <= 64

    def speed(ks: list[int]) -> float:
        tokens = sum(s.expected_tokens()[k] for s, k in zip(slots, ks, strict=True))
        return tokens / float(curve(np.array([base + sum(ks)]))[0])

    assert speed(lengths) >= speed([0] * len(slots))


def test_pinned_drafts_that_fill_the_batch_leave_no_room() -> None:
    slots = [demand(0.9, pinned=10), demand(0.99)]
    assert allocate(slots, 2, flat_curve(), max_rows=2 + 8) == [10, 0]


def test_a_pinned_length_needs_no_estimates() -> None:
    """A fixed-length request (adaptive drafting off) is pinned and has no acceptance
    estimates: its expected tokens count no accepted draft, and it keeps its length."""
    from localspec.engine.budget import DraftDemand, allocate

    pinned = DraftDemand(np.zeros(0), 8, pinned=8)
    assert pinned.expected_tokens().shape == (9,)
    free = DraftDemand(np.full(8, 0.9), 8, drafting=True)
    lengths = allocate([pinned, free], 2, lambda n: np.asarray(n, dtype=float) * 0.0 + 1.0)
    assert lengths[0] == 8


def test_passes_follow_llama_cpps_split_of_a_batch_over_several_caches() -> None:
    """Equal rows per sequence in one pass, only consecutive sequence ids together."""
    assert passes({0: 1, 1: 1, 2: 1, 3: 1}, 512, 4) == [4]
    assert passes({0: 1, 1: 1, 3: 1}, 512, 4) == [2, 1]  # an id skipped: another pass
    assert passes({0: 3, 1: 3}, 512, 4) == [6]
    assert passes({0: 1, 1: 8}, 512, 4) == [2, 7]  # the longer one's rest runs alone
    assert passes({0: 1, 1: 1, 2: 64, 3: 1}, 512, 4) == [4, 63]
    assert passes({0: 300, 1: 300}, 512, 2) == [512, 88]
    assert passes({0: 600}, 512, 1) == [512, 88]  # one cache: plain chunks of the batch
    assert passes({2: 5}, 512, 4) == [5]


def test_a_step_in_several_passes_gives_drafts_of_equal_length() -> None:
    """Two generations whose drafts differ in length pay a second pass: the budget prices
    the step as llama.cpp runs it and finds the common length, or no drafts."""
    curve = flat_curve()

    def seconds(lengths: list[int]) -> float:
        rows = passes({0: 1 + lengths[0], 1: 1 + lengths[1]}, 512, 2)
        return float(np.sum(curve(np.array(rows))))

    slots = [demand(0.95, cap=8), demand(0.5, cap=8)]
    lengths = allocate(slots, 2, curve, step_seconds=seconds)
    assert lengths[0] == lengths[1] > 0
    assert len(passes({0: 1 + lengths[0], 1: 1 + lengths[1]}, 512, 2)) == 1


def test_a_draft_model_drafting_for_all_in_one_batch_is_priced_per_pass() -> None:
    """Four generations whose draft model costs 0.4 of a step a token: drafted one after
    another, four drafts cost more than they save; drafted together (one pass per position,
    which on a memory-bound GPU costs what one row costs), they pay."""
    curve = flat_curve()
    step = float(curve(np.array([1]))[0])
    demands = [demand(0.95, 8, seconds_per_token=0.4 * step, drafting=True) for _ in range(4)]
    one_by_one = allocate(demands, 4, curve)
    together = allocate(
        demands, 4, curve, draft_seconds=lambda lengths: 0.4 * step * max(lengths, default=0)
    )
    assert sum(one_by_one) < sum(together)
    assert all(k > 0 for k in together)


def test_the_draft_pass_cost_follows_the_target_curve_shape() -> None:
    curve = cpu_curve()
    passes_cost = DraftPassCost()
    assert passes_cost.seconds(1, curve, fallback=0.01) == 0.01  # nothing timed yet
    one, three = curve(np.array([1, 3]))
    for _ in range(3):
        passes_cost.observe(3, 0.002 * three / one, curve)  # a 3-row pass: 3 rows' worth
    assert passes_cost.seconds(1, curve, fallback=1.0) == pytest.approx(0.002)
    assert (
        abs(passes_cost.seconds(2, curve, fallback=1.0) - 0.002 * curve(np.array([2]))[0] / one)
        < 1e-12
    )


def test_padding_evens_the_answering_sequences_to_the_longest() -> None:
    assert padding({0: 1, 1: 3}, [0, 1]) == {0: 2}
    assert padding({0: 1, 1: 1, 2: 5, 3: 2}, [0, 1, 2, 3]) == {0: 4, 1: 4, 3: 3}
    assert padding({0: 4, 1: 4}, [0, 1]) == {}  # even already
    assert padding({0: 1, 1: 8, 2: 64}, [0, 1]) == {0: 7}  # a prompt chunk is not padded
    assert padding({0: 1, 1: 8}, [0]) == {}  # the long one may not pad: nothing to even to
    assert passes({0: 1 + 2, 1: 3}, 512, 4) == [6]  # evened: one pass, not [2, 2]


def test_a_wide_step_drafts_only_past_its_margin() -> None:
    """Four generations, one with a likely draft: the step gains a little, drafted; asked for
    a wider margin than that gain, it runs plain."""
    cost = VerifyCost(np.array([1, 4, 6, 8, 16]), np.array([1.0, 1.0, 1.1, 1.6, 2.5]))
    demands = [DraftDemand(np.zeros(0), 0, pinned=0)] * 3 + [
        DraftDemand(np.array([0.7, 0.7]), 2, drafting=True)
    ]
    drafted = allocate(demands, 4, cost)
    assert drafted[3] > 0
    gain = predicted_gain(demands, 4, cost, drafted)
    assert 1.0 < gain < 1.2
    assert allocate(demands, 4, cost, step_margin=gain - 1 + 0.01) == [0, 0, 0, 0]


def test_a_step_wider_than_the_calibration_costs_its_rows() -> None:
    """Calibrated up to 49 rows, 48 and 49 on one stair: a step of 264 rows is priced at
    the upper half's cost per row (the last two sizes' slope, 0, priced it as 49 rows,
    and a shared step padded to 8 x 33 rows ran 4x slower than predicted)."""
    sizes = np.array([1, 2, 4, 8, 16, 24, 32, 48, 49])
    seconds = np.array([0.040, 0.049, 0.053, 0.079, 0.121, 0.194, 0.240, 0.357, 0.357])
    cost = VerifyCost(sizes, seconds)
    per_row = (0.357 - 0.240) / (49 - 32)  # from the first size past half the largest
    assert cost(np.array([264]))[0] == pytest.approx(0.357 + per_row * (264 - 49))
    assert cost(np.array([48]))[0] == pytest.approx(0.357)  # inside: as measured


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=N_MAX), st.booleans()),
        min_size=1,
        max_size=8,
    ),
    st.integers(0, 4),
    st.sampled_from(["cpu", "flat"]),
    st.booleans(),
    st.sampled_from([0.0, 0.01, 0.07]),
)
def test_the_bounds_that_skip_trials_never_change_the_budget(
    slots: list[tuple[list[float], bool]], prefill: int, kind: str, in_passes: bool, margin: float
) -> None:
    """The cheap bounds only skip what cannot pay: a step's drafts (``_may_pay``), the
    ranking's longer prefixes and the longer common lengths (``_Ceiling``). The budget is the
    one every trial finds, priced on the curve or as llama.cpp's passes."""
    from localspec.engine import budget

    curve = cpu_curve() if kind == "cpu" else flat_curve()
    demands = [DraftDemand(np.array(a), len(a), drafting=d) for a, d in slots]
    base = len(demands) + prefill

    def seconds(lengths: list[int]) -> float:
        rows = passes({i: 1 + k for i, k in enumerate(lengths)}, 512, len(lengths))
        return float(np.sum(curve(np.array(rows + [prefill] * bool(prefill)))))

    kw = {"step_margin": margin, "step_seconds": seconds if in_passes else None}
    bounded = allocate(demands, base, curve, max_rows=base + 64, **kw)
    whole, ceiling = budget._may_pay, budget._Ceiling.reach
    try:
        budget._may_pay = lambda *a: True  # type: ignore[assignment]
        budget._Ceiling.reach = lambda self, tokens, rows: np.full(len(rows), np.inf)  # type: ignore[method-assign]
        assert allocate(demands, base, curve, max_rows=base + 64, **kw) == bounded
    finally:
        budget._may_pay, budget._Ceiling.reach = whole, ceiling  # type: ignore[method-assign]
