"""The adaptive controller on synthetic costs: pure logic, no llama.cpp."""

from collections.abc import Callable

import numpy as np
import pytest

from localspec.drafters.chain import ChainController, ChainedDrafter
from localspec.engine import adaptive
from localspec.engine.adaptive import (
    SETTLED_SAMPLES,
    SHADOW_STREAK,
    AdaptiveController,
    FixedLengthController,
    ShadowCheck,
)
from localspec.engine.costs import ModelledTimes, VerifyCost, calibration_order
from localspec.engine.drafting import Draft

SIZES = np.array([1, 2, 4, 8, 16, 32, 49])
CPU = VerifyCost(SIZES, 0.022 + 0.008 * (SIZES - 1))  # compute-bound: a batch costs more
GPU = VerifyCost(SIZES, 0.010 + 0.0002 * (SIZES - 1))  # memory-bound: a batch costs the same
# as measured on the 2-core test machine (qwen2.5-coder-0.5b Q4_K_M): a batch of 2 costs two
# steps, a batch of 16 seven
SMALL_CPU = VerifyCost(SIZES, np.array([0.020, 0.042, 0.052, 0.085, 0.140, 0.250, 0.360]))
STEP = float(CPU(np.array([1]))[0])
# a 2-core CPU with AVX-512 (the F16 0.5B target): two rows cost two steps, a batch pays
# only when wide, so a draft model costing half a step a token pays only above ~90%
WIDE_PAYS = VerifyCost(SIZES, STEP * np.array([1.0, 2.08, 2.38, 3.27, 4.91, 9.0, 13.0]))


def controller(n_max: int = 16, cost: VerifyCost = CPU, **kwargs) -> AdaptiveController:
    return AdaptiveController(n_max, VerifyCost(SIZES, cost.seconds.copy()), **kwargs)


def kept_at(acceptance: float, seed: int) -> Callable[[int], int]:
    """An acceptor for ``drive``: each drafted token kept with ``acceptance``, until one is
    not."""
    rng = np.random.default_rng(seed)

    def kept(k: int) -> int:
        n = 0
        while n < k and rng.random() < acceptance:
            n += 1
        return n

    return kept


def drive(
    ctl: AdaptiveController,
    cost: VerifyCost,
    accept: Callable[[int], int],
    rounds: int = 60,
    draft_per_token: float = 0.0,
) -> list[int]:
    """Run ``rounds`` rounds as the loop does; a plain round with a shadow check is recorded
    as -1. ``accept(k)``: how many of k drafted (or guessed) tokens the target agrees with."""
    lengths = []
    shadow: tuple[int, int, int] | None = None  # tokens guessed, agreed, position checked
    for _ in range(rounds):
        n_asked = ctl.proposal_length()  # a draft without a match's evidence, as asked
        k = ctl.fit(Draft([0] * n_asked)) if n_asked else 0
        if k == 0 and shadow is None and (n := ctl.shadow_length()):
            shadow = (n, accept(n), 0)
        if k == 0 and shadow is not None:
            n, agreed, position = shadow
            draft_s = draft_per_token * n if position == 0 else 0.0
            ctl.observe(0, 0, draft_s, float(cost(np.array([1]))[0]))
            follow = position < agreed and position + 1 < n
            ctl.observe_shadow(
                ShadowCheck(float(position < agreed), draft_s, position, not follow, n)
            )
            shadow = (n, agreed, position + 1) if follow and ctl.paused else None
            lengths.append(-1)
            continue
        shadow = None
        ctl.observe(k, accept(k), draft_per_token * k, float(cost(np.array([k + 1]))[0]))
        lengths.append(k)
    return lengths


def test_a_lookup_that_never_matches_costs_no_verification() -> None:
    ctl = controller(cost=SMALL_CPU)
    lengths = drive(ctl, SMALL_CPU, lambda k: 0, 200)
    assert ctl.paused and max(lengths) <= 0  # only plain rounds, each with a free check
    assert lengths.count(-1) == 200 and ctl.shadow_checks == 200


def test_a_lookup_right_only_on_its_first_token_is_never_verified() -> None:
    # prose at T > 0: the token after a matched n-gram is often right, the rest seldom is.
    # Shadow rounds follow the whole guess, so the controller sees position 2 fail before it
    # risks a verify batch (with first-token checks only it resumed after every streak).
    # The first check guesses one token (the guess's cost is not known yet), and the
    # estimates' optimistic prior may resume once then.
    ctl = controller(16, SMALL_CPU)
    lengths = drive(ctl, SMALL_CPU, lambda k: min(k, 1), 200)
    assert sum(k > 0 for k in lengths) <= 1 and ctl.paused
    assert ctl.acceptance()[1] < 0.2 < 0.8 < ctl.acceptance()[0]


def test_guesses_grow_to_a_whole_draft_only_when_they_cost_next_to_nothing() -> None:
    guessed: list[int] = []

    def accept(k: int) -> int:
        if k:  # a guess (nothing is drafted here: every guess is wrong)
            guessed.append(k)
        return 0

    drive(controller(16, SMALL_CPU), SMALL_CPU, accept, 10, draft_per_token=0.0)
    assert guessed == [1, 2, 4, 8, 16, 16, 16, 16, 16, 16]  # a lookup: doubling, up to n_max
    guessed.clear()
    drive(controller(16, SMALL_CPU), SMALL_CPU, accept, 100, draft_per_token=0.4 * STEP)
    assert guessed and set(guessed) == {1}  # a neural drafter: one token per check


def test_full_acceptance_drafts_long_on_cpu() -> None:
    ctl = controller(48)
    lengths = drive(ctl, CPU, lambda k: k)
    assert not ctl.paused and ctl.draft_length >= 24
    first = [k for k in lengths if k > 0][:3]
    assert first[0] <= 4 and first[1] <= 2 * (first[0] + 1)  # it resumes short, then doubles


def test_a_drafter_that_pays_per_token_grows_its_drafts_gently() -> None:
    # a neural draft's long drafts save little verification time and a rejected one costs
    # all its steps: it grows by the resume length, a lookup doubles
    free, paying = controller(48, GPU), controller(48, GPU)
    free_drafts = [k for k in drive(free, GPU, lambda k: k, 12) if k > 0]
    paying_drafts = [k for k in drive(paying, GPU, lambda k: k, 12, 0.05 * STEP) if k > 0]
    assert free_drafts[:3] == [4, 10, 22]
    assert paying_drafts[:3] == [4, 9, 14]


def test_sampled_drafts_are_judged_by_their_odds_not_by_their_luck() -> None:
    # at temperature > 0 a draft model's drafts are kept a few times in a row by chance
    # while each token had a 60% chance: the odds, not the outcomes, say drafting loses
    def verified(odds: bool) -> AdaptiveController:
        ctl = controller(16, SMALL_CPU)
        step = float(SMALL_CPU(np.array([1]))[0])
        for _ in range(4):
            k = max(ctl.draft_length, 1)
            told = [0.6] * k if odds else None
            ctl.observe(k, k, 0.3 * step * k, float(SMALL_CPU(np.array([k + 1]))[0]), told)
        return ctl

    lucky, judged = verified(odds=False), verified(odds=True)
    assert lucky.pauses == 1 and lucky.draft_length > 9 and lucky.acceptance()[0] > 0.9
    assert judged.pauses == 4 and judged.draft_length == 4 and judged.acceptance()[0] < 0.7


def test_moderate_acceptance_prefers_short_drafts_on_cpu_long_on_gpu() -> None:
    rng = np.random.default_rng(0)

    def geometric(k: int, a: float = 0.6) -> int:
        n = 0
        while n < k and rng.random() < a:
            n += 1
        return n

    cpu, gpu = controller(16, CPU), controller(16, GPU)
    drive(cpu, CPU, geometric, 200)
    drive(gpu, GPU, geometric, 200)
    assert gpu.draft_length > cpu.draft_length


def test_fixed_length_controller_always_drafts_n_max() -> None:
    ctl = FixedLengthController(8)
    drive(ctl, CPU, lambda k: 0)
    assert (
        ctl.proposal_length() == 8
        and ctl.fit(Draft([1] * 8)) == 8
        and not ctl.paused
        and not ctl.shadow_length()
    )


def test_each_answer_learns_its_own_acceptance() -> None:
    ctl = controller()
    drive(ctl, CPU, lambda k: 0, 40)
    assert ctl.paused
    ctl.start()  # a prompt that suits the drafter: drafting resumes after a check or two
    lengths = drive(ctl, CPU, lambda k: k, 40)
    assert lengths[0] == -1 and not ctl.paused and sum(lengths[-10:]) >= 10 * 4


def test_a_cheap_drafter_resumes_on_a_streak_of_right_guesses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the estimates (prior 0.8) do not yet justify drafting, but three right guesses in a row
    # do, where a short draft kept whole would pay (drafts at 0.05 of a step per token)
    monkeypatch.setattr(adaptive, "PRIOR_ACCEPT", 0.2)  # a gloomy prior (0.1)
    ctl = controller(16, SMALL_CPU)
    lengths = drive(ctl, SMALL_CPU, lambda k: k, 30, draft_per_token=0.05 * STEP)
    assert lengths[: SHADOW_STREAK + 1] == [-1] * SHADOW_STREAK + [4]


def test_a_marginal_drafter_keeps_checking_but_does_not_draft() -> None:
    # 0.4 of a step per drafted token on this CPU curve: a 4-token draft loses even when
    # kept whole (no streak resume) and a perfect 16-token one gains ~20%, less than noisy
    # estimates can vouch for; after the opening it keeps checking within the budget
    ctl = controller(16, SMALL_CPU)
    lengths = drive(ctl, SMALL_CPU, lambda k: k, 200, draft_per_token=0.4 * STEP)
    assert lengths[:5] == [-1] * 5 and max(lengths) <= 0
    assert 5 + 195 / 18 - 2 <= lengths.count(-1) <= 5 + 195 / 18 + 2


def test_a_draft_that_must_catch_up_checks_only_in_the_answer_opening() -> None:
    ctl = controller(16)
    ctl.note_catch_up(0.1 * STEP)  # a tenth of a step per token: a CPU draft model
    ctl.note_catch_up(None)  # a cached prompt shows nothing: what was measured stays
    lengths = drive(ctl, CPU, lambda k: 0, 200, draft_per_token=0.4 * STEP)
    # the opening's evidence (every step: a check, then one-token probes, as a batch of
    # two costs a third of a step more than one here) ends at the second miss; none after
    assert ctl.paused and lengths[:3] == [-1, 1, 0] and max(lengths[2:]) == 0
    ctl.start()
    assert ctl.next_draft_length() == 1  # the next answer starts with a probe again

    fast = controller(16)
    fast.note_catch_up(0.001 * STEP)  # a GPU-like catch-up: checks continue, spaced
    lengths = drive(fast, CPU, lambda k: 0, 200, draft_per_token=0.4 * STEP)
    # after the opening, each check costs 0.4 step: the budget (2.5%) allows one in 16
    # (the opening: a check, then a probe; afterwards only checks)
    assert 2 + 198 / 16 - 2 <= lengths.count(-1) <= 2 + 198 / 16 + 2
    assert lengths[1] == 1 and max(lengths[2:]) == 0


def test_the_opening_verifies_one_token_drafts_where_a_pair_of_rows_costs_little() -> None:
    # a check and a verified one-token draft cost the drafter the same token and tell the
    # same; the verified one keeps the token when right, for what two rows cost over one
    pair = controller(16)  # two rows: 1.36 steps, under the prior's 0.8 step a token is worth
    pair.note_catch_up(0.1 * STEP)
    lengths = drive(pair, CPU, lambda k: k, 6, draft_per_token=0.4 * STEP)
    assert lengths[0] == -1 and lengths[1:3] == [1, 1]  # a check times the drafter
    assert not pair.paused and lengths[3] == pair._resume  # kept: drafting resumes
    assert pair.shadow_checks == 1 and pair.pauses == 0

    steep = controller(16, SMALL_CPU)  # two rows cost two steps: checks stay cheaper
    steep.note_catch_up(0.1 * STEP)
    assert drive(steep, SMALL_CPU, lambda k: 0, 5, draft_per_token=0.4 * STEP)[:2] == [-1, -1]

    cut = controller(16)  # a probe a shared step cut still counts towards the opening
    cut.note_catch_up(0.1 * STEP)
    drive(cut, CPU, lambda k: 1, 1, draft_per_token=0.4 * STEP)
    for _ in range(adaptive.OPENING_CHECKS - 1):
        assert cut.next_draft_length() == 1 and cut.fit(Draft([0])) == 1
        cut.note_draft_time(1, 0.4 * STEP)
        cut.observe(0, 0, 0.0, STEP)
    assert cut.next_draft_length() == 0 and cut.shadow_length() == 0 and cut.paused


def test_a_modelled_schedule_catches_up_at_the_calibrated_batched_rate() -> None:
    """Seeded answers run on modelled costs: a draft model's catch-up there is its step at
    the target's batched rate (the same kernels), dear on a CPU, next to nothing on a GPU;
    a lookup has nothing to catch up."""
    times = ModelledTimes(CPU, {"draft-model": 0.4 * STEP})
    share = float(CPU(np.array([49]))[0]) / 49 / STEP
    assert times.catch_up("draft-model") == pytest.approx(0.4 * STEP * share)
    assert times.catch_up("ngram-simple") is None
    cpu, gpu = controller(16), controller(16, GPU)
    cpu.note_catch_up(times.catch_up("draft-model"))
    gpu.note_catch_up(ModelledTimes(GPU, {"draft-model": 0.004}).catch_up("draft-model"))
    assert not cpu._catch_up_is_cheap() and gpu._catch_up_is_cheap()


def test_hopeless_drafter_stops_checking() -> None:
    ctl = controller(4)
    lengths = drive(ctl, CPU, lambda k: k, 20, draft_per_token=2.0 * STEP)  # slower than a step
    # even right guesses cannot make drafting pay: said once its cost is measured thrice
    # (a check, then probes: see test_the_opening_verifies_one_token_drafts_where_...)
    assert lengths == [-1] + [1] * (SETTLED_SAMPLES - 1) + [0] * (20 - SETTLED_SAMPLES)
    assert ctl.hopeless and not ctl.shadow_length() and ctl.next_draft_length() == 0


# the 1.5B target on this machine: a five-row verify costs three and a half steps
STEEP_SIZES = np.array([1, 2, 3, 5, 9, 17, 49])
STEEP = VerifyCost(STEEP_SIZES, np.array([0.0357, 0.0595, 0.0797, 0.123, 0.251, 0.307, 0.8]))


def speed_over_plain(lengths: list[int], kept: Callable[[int], int], cost: VerifyCost) -> float:
    step = float(cost(np.array([1]))[0])
    tokens = sum(1 if k <= 0 else kept(k) + 1 for k in lengths)
    seconds = sum(step if k <= 0 else float(cost(np.array([k + 1]))[0]) for k in lengths)
    return tokens / seconds * step


def test_streaks_that_never_verify_back_off_and_stay_near_plain_speed() -> None:
    """Code on a compute-bound target: a lookup's guesses run three tokens right, again and
    again, and every verified draft loses its first token. Each streak used to resume (and
    lose three steps): 0.62x plain. A losing resume doubles what the next one needs."""
    ctl = AdaptiveController(16, VerifyCost(STEEP_SIZES, STEEP.seconds.copy()))

    def accept(k: int) -> int:
        return min(k, 3) if ctl.paused else 0  # guesses while paused, verified drafts else

    lengths = drive(ctl, STEEP, accept, 300)
    assert sum(k > 0 for k in lengths) <= 4
    assert speed_over_plain(lengths, lambda k: 0, STEEP) >= 0.98


def test_a_draft_that_pays_clears_the_back_off() -> None:
    ctl = AdaptiveController(16, VerifyCost(STEEP_SIZES, STEEP.seconds.copy()))
    verified: list[int] = []

    def accept(k: int) -> int:
        if ctl.paused:
            return min(k, 3)
        verified.append(k)
        return 0 if len(verified) <= 2 else k  # two losing drafts, then the text copies

    lengths = drive(ctl, STEEP, accept, 300)
    assert max(lengths) == 16 and not ctl.paused  # copying at full length again


def test_one_stalled_measurement_does_not_make_a_drafter_hopeless() -> None:
    """The desktop stalls the draft model's first guess for a second: its cost is the
    median of what it measured since, not that one second."""
    ctl = controller(16, SMALL_CPU)
    timings = [1.0]  # the stalled one, then what a draft token really costs

    def observe_guess(right: bool) -> None:
        draft_s = timings.pop() if timings else 0.05 * STEP
        ctl.observe(0, 0, draft_s, STEP)
        ctl.observe_shadow(ShadowCheck(float(right), draft_s))

    observe_guess(True)
    assert not ctl.hopeless  # one measurement is no verdict
    for _ in range(SHADOW_STREAK):
        observe_guess(True)
    assert not ctl.hopeless and ctl.next_draft_length() > 0


def test_an_opening_of_right_guesses_always_ends_in_a_verified_draft() -> None:
    """A draft model on a CPU, every guess right, but a cost curve measured while the desktop
    was busy says a short draft kept whole would not pay. No check follows the opening (the
    draft would first have to catch up): its last check verifies a draft rather than leave
    the answer plain on the curve's word, and the verified rounds show drafting pays."""
    pessimistic = VerifyCost(SIZES, np.array([0.020, 0.055, 0.085, 0.13, 0.2, 0.35, 0.5]))
    ctl = controller(16, pessimistic)
    ctl.note_catch_up(0.1 * STEP)
    lengths = drive(ctl, SMALL_CPU, lambda k: k, 40, 0.1 * STEP)
    assert lengths[:5] == [-1] * 5  # the opening's checks
    assert max(lengths) > 0 and not ctl.paused


def test_a_rejected_draft_does_not_end_the_opening() -> None:
    # a draft model on a CPU (catching up is expensive, so no checks after the opening):
    # its first draft is rejected (a file's first line is not a copy yet), then it copies;
    # still in step, it keeps checking and drafts again
    ctl = controller(16, SMALL_CPU)
    ctl.note_catch_up(0.1 * STEP)
    drafts = []

    def accept(k: int) -> int:
        if k == 1:  # a check: always right
            return 1
        drafts.append(k)
        return 0 if len(drafts) == 1 else k

    lengths = drive(ctl, SMALL_CPU, accept, 60, 0.1 * STEP)
    first = next(i for i, k in enumerate(lengths) if k > 0)
    assert lengths[first + 1] == -1 and max(lengths) == 16 and not ctl.paused


def test_one_early_rejection_does_not_end_the_drafting_of_a_drafter_that_cannot_check() -> None:
    """A draft model on a compute-bound CPU (catching up is dear: a pause ends the answer's
    drafting; drafting pays only above about 90% acceptance): its checks and first draft are
    right, its second, longer draft breaks off at its second token, and the copy goes on.
    Nine tokens of ten kept say little about 90% against 98%: it drafts on, short, and the
    answer is drafted to its end."""
    ctl = controller(16, WIDE_PAYS)
    ctl.note_catch_up(0.1 * STEP)
    drafts: list[int] = []

    def accept(k: int) -> int:
        if k > 1:  # checks and the opening's one-token probes are right
            drafts.append(k)
        return 1 if len(drafts) == 2 and k > 1 else k

    lengths = drive(ctl, WIDE_PAYS, accept, 60, 0.5 * STEP)
    second = [i for i, k in enumerate(lengths) if k > 1][1]
    assert lengths[second] > 4, lengths  # the draft that broke off
    assert lengths[-30:] == [16] * 30 and not ctl.paused, lengths


@pytest.mark.parametrize("acceptance", [0.5, 0.7])
def test_a_drafter_that_cannot_check_pauses_once_its_tokens_say_drafting_loses(
    acceptance: float,
) -> None:
    """The same drafter where its drafts are kept half or seven times in ten: drafting on
    for evidence stops within FINAL_PAUSE_EVIDENCE tokens tried, and the pause holds."""
    for seed in range(4):
        ctl = controller(16, WIDE_PAYS)
        ctl.note_catch_up(0.1 * STEP)
        lengths = drive(ctl, WIDE_PAYS, kept_at(acceptance, seed), 120, 0.5 * STEP)
        assert sum(k for k in lengths if k > 0) <= adaptive.FINAL_PAUSE_EVIDENCE + 16, lengths
        assert ctl.paused and all(k <= 0 for k in lengths[-60:]), lengths


class StubDrafter:
    """A drafter that always (or never) has a one-token guess."""

    def __init__(self, name: str, has_guess: bool) -> None:
        self.name, self.has_guess = name, has_guess

    def begin(self, prompt: object) -> None: ...

    def propose(self, context: object, n_max: int) -> Draft:
        return Draft([7] * n_max) if self.has_guess and n_max else Draft()

    def accepted(self, n_accepted: int) -> None: ...

    def close(self) -> None: ...


def test_a_chain_checks_each_paused_drafter_and_credits_the_guesser() -> None:
    lookup, neural = StubDrafter("ngram-simple", False), StubDrafter("draft-self", True)
    chain = ChainedDrafter([lookup, neural], [None, None])
    parts = [controller(16, SMALL_CPU), controller(16, SMALL_CPU)]
    parts[1].note_catch_up(0.001 * STEP)  # checks may continue after the opening
    control = ChainController(chain, parts)
    for _ in range(200):
        assert control.proposal_length() == 0  # both paused: nothing verified
        if n := control.shadow_length():
            guess = chain.propose([1, 2, 3], n)
            control.observe(0, 0, 0.4 * STEP, STEP)
            control.observe_shadow(ShadowCheck(0.0 if guess.tokens else None, 0.4 * STEP))
        else:
            control.observe(0, 0, 0.0, STEP)
    assert parts[0].shadow_checks == 0  # the lookup never had a guess
    # the neural drafter: its two opening misses, then one check per 16 steps (2.5% budget)
    assert 2 + 198 / 16 - 2 <= parts[1].shadow_checks <= 2 + 198 / 16 + 2


class FixedDrafter:
    """A lookup that always drafts the same tokens on a key of ``match`` tokens."""

    def __init__(self, name: str, tokens: list[int], match: int) -> None:
        self.name, self.draft = name, Draft(tokens, match=match)

    def begin(self, prompt: object) -> None: ...

    def propose(self, context: object, n_max: int) -> Draft:
        return self.draft.truncated(n_max)

    def accepted(self, n_accepted: int) -> None: ...

    def close(self) -> None: ...


def test_a_draft_its_controller_declines_leaves_the_round_to_the_next_drafter() -> None:
    """A weak memory match while the memory's drafter is paused must not hide the strong
    match the prompt lookup after it has: the lookup's draft is verified."""
    memory = FixedDrafter("suffix", [1, 2, 3, 4], match=4)
    prompt = FixedDrafter("ngram-simple", [5] * 16, match=adaptive.STRONG_MATCH)
    chain = ChainedDrafter([memory, prompt], [None, None])
    control = ChainController(chain, [seen_lookup(), seen_lookup()])
    draft = chain.propose([1, 2, 3], control.proposal_length())
    assert draft.source == "ngram-simple" and control.fit(draft) >= 8
    # when no drafter's controller would verify its draft, the first one's is checked
    chain.drafters[1] = FixedDrafter("ngram-simple", [5] * 16, match=4)
    draft = chain.propose([1, 2, 3], control.proposal_length())
    assert draft.source == "suffix" and control.fit(draft) == 0
    # a shadow guess is only scored: the lookup on the longest key makes it, the first on a tie
    assert chain.propose([1, 2, 3], control.shadow_length() or 1).source == "suffix"
    chain.drafters[1] = FixedDrafter("ngram-simple", [5] * 16, match=7)
    assert chain.propose([1, 2, 3], control.shadow_length() or 1).source == "ngram-simple"


def strong(n: int) -> Draft:
    return Draft([5] * n, match=adaptive.STRONG_MATCH)


def seen_lookup(cost: VerifyCost = SMALL_CPU) -> AdaptiveController:
    """A lookup's controller in an answer's opening: paused, its guesses known to be free."""
    ctl = controller(48, cost)
    ctl.observe_shadow(ShadowCheck(0.0, 0.0, n_guessed=8))
    return ctl


def test_a_strong_match_is_verified_at_once_a_weak_one_only_checked() -> None:
    ctl = seen_lookup()
    assert ctl.paused and ctl.proposal_length() == 48  # a lookup is asked for a whole draft
    assert ctl.fit(Draft([5] * 48, match=4)) == 0  # a 4-token key: evidence for a check only
    long = ctl.fit(strong(48))
    assert long >= 8  # copied text: long at once, as llama.cpp drafts it
    assert ctl.fit(strong(3)) == 3  # never more than the match offers


def test_strong_drafts_that_break_off_shrink_and_leave_the_pause_alone() -> None:
    ctl = seen_lookup()
    first = ctl.fit(strong(48))
    for _ in range(12):
        k = ctl.fit(strong(48))
        if k == 0:
            break
        ctl.observe(k, 1, 0.0, float(SMALL_CPU(np.array([k + 1]))[0]))
    assert ctl.fit(strong(48)) < min(first, 4)
    assert ctl.paused  # judged on their own evidence: the pause still stands
    ctl.start()  # a new answer believes strong matches again
    assert ctl.fit(strong(48)) == first


def test_strong_drafts_kept_whole_grow_to_the_longest() -> None:
    ctl = seen_lookup(GPU)
    for _ in range(10):
        k = ctl.fit(strong(48))
        ctl.observe(k, k, 0.0, float(GPU(np.array([k + 1]))[0]))
    assert ctl.fit(strong(48)) == 48


def test_strong_guesses_that_the_target_follows_bring_strong_drafts_back() -> None:
    """After strong drafts broke off, strong matches are only checked; checks the target
    follows (text being copied again) are strong evidence, and strong drafts resume."""
    ctl = seen_lookup()
    for _ in range(12):
        k = ctl.fit(strong(48))
        if k == 0:
            break
        ctl.observe(k, 0, 0.0, float(SMALL_CPU(np.array([k + 1]))[0]))
    assert ctl.fit(strong(48)) == 0
    weak_before = ctl.acceptance().copy()
    for _ in range(3):  # three shadow rounds on strong guesses, followed to their end
        for position in range(8):
            ctl.observe(0, 0, 0.0, float(SMALL_CPU(np.array([1]))[0]))
            check = ShadowCheck(1.0, 0.0, position, position == 7, 8, adaptive.STRONG_MATCH)
            ctl.observe_shadow(check)
    assert ctl.fit(strong(48)) >= 8
    assert ctl.paused and np.array_equal(ctl.acceptance(), weak_before)  # weak estimates alone


def test_a_draft_resumed_mid_guess_is_evidence_about_that_depth() -> None:
    """Resumed two tokens into a followed guess, a draft rejected at its first token says
    that position 2 of such guesses fails, not position 0 (which the guesses showed right)."""
    ctl = seen_lookup()
    step = float(SMALL_CPU(np.array([1]))[0])
    for position in range(3):  # a guess the target follows for three tokens
        ctl.observe(0, 0, 0.0, step)
        ctl.observe_shadow(ShadowCheck(1.0, 0.0, position, False, 8))
        if not ctl.paused:
            break
    assert not ctl.paused, "three right guesses resume speculation"
    depth = position + 1
    before = ctl.acceptance().copy()
    k = ctl.fit(Draft([5] * 8, match=4))
    ctl.observe(k, 0, 0.0, float(SMALL_CPU(np.array([k + 1]))[0]))
    after = ctl.acceptance()
    assert after[depth] < before[depth]  # the depth the resume was judged at learns
    assert after[0] >= 0.9 * before[0]  # position 0 only decays


def drafting_lookup(cost: VerifyCost = SMALL_CPU) -> AdaptiveController:
    """A lookup's controller drafting copied text (weak matches, every draft kept whole)."""
    ctl = seen_lookup(cost)
    for _ in range(40):
        k = ctl.fit(Draft([5] * 48, match=8)) if not ctl.paused else 0
        if k == 0 and (n := ctl.shadow_length()):
            ctl.observe(0, 0, 0.0, float(cost(np.array([1]))[0]))
            ctl.observe_shadow(ShadowCheck(1.0, 0.0, 0, True, n, 8))
            continue
        ctl.observe(k, k, 0.0, float(cost(np.array([k + 1]))[0]))
    assert not ctl.paused
    return ctl


def test_a_key_length_whose_drafts_fail_is_checked_not_verified() -> None:
    """Four-token keys that recur by chance: after their drafts fail, a draft on such a key
    is not verified (its first token is checked for free instead), while drafts on longer
    keys, which keep picking the copy up, still are."""
    ctl = drafting_lookup(GPU)
    k = ctl.fit(Draft([5] * 48, match=4))  # a chance match, rejected at its first token
    assert k > 0
    ctl.observe(k, 0, 0.0, float(GPU(np.array([k + 1]))[0]))
    assert not ctl.paused
    assert ctl.fit(Draft([5] * 48, match=4)) == 0
    assert ctl.shadow_length() == 1 and ctl.shadow_length() == 0  # one free check, once
    assert ctl.fit(Draft([5] * 48, match=8)) > 0


def test_right_checks_bring_a_declined_key_length_back() -> None:
    ctl = drafting_lookup()
    for _ in range(2):
        k = ctl.fit(Draft([5] * 48, match=4))
        ctl.observe(k, 0, 0.0, float(SMALL_CPU(np.array([k + 1]))[0]))
    for _ in range(6):
        if ctl.fit(Draft([5] * 48, match=4)):
            break
        n = ctl.shadow_length()
        ctl.observe(0, 0, 0.0, float(SMALL_CPU(np.array([1]))[0]))
        ctl.observe_shadow(ShadowCheck(1.0, 0.0, 0, True, n, 4))
    assert ctl.fit(Draft([5] * 48, match=4)) > 0
    assert not ctl.paused  # the checks of declined drafts touch nothing else


# the 1.5B Q4_K_M target on a 2-core CPU with AVX-512: every row of a short batch costs most
# of a step (eight rows seven steps), only wide batches pay
ROWS_COST = VerifyCost(SIZES, STEP * np.array([1.0, 1.82, 3.09, 6.87, 9.7, 14.9, 19.4]))


def checked_key(ctl: AdaptiveController, key: int, outcomes: list[float]) -> None:
    """Checks of drafts on ``key``-token matches (as ``fit`` declines them): what their
    first tokens did."""
    for acceptance in outcomes:
        ctl.observe(0, 0, 0.0, STEP)
        ctl.observe_shadow(ShadowCheck(acceptance, 0.0, 0, True, 1, key))


@pytest.mark.parametrize("cost", [ROWS_COST, GPU], ids=["rows-cost-steps", "batch-is-free"])
def test_a_doubtful_first_token_is_checked_before_a_batch_is_risked_on_it(
    cost: VerifyCost,
) -> None:
    """Copied text, then keys whose first token is right four times in five. Where every row
    costs most of a step, a draft rejected at its first token loses its whole batch: its
    first token is checked in the plain step (free for a lookup) and the rest drafted on the
    next. Where a batch costs a step, the draft is verified at once."""
    ctl = drafting_lookup(cost)
    checked_key(ctl, 4, [1.0, 1.0, 0.0, 1.0, 1.0])
    k = ctl.fit(Draft(list(range(10, 58)), match=4))
    if cost is GPU:
        assert k > 0
        return
    assert k == 0 and ctl.shadow_length() == 1  # its first token, checked
    checked_key(ctl, 4, [1.0])  # ... and taken: the next lookup goes on with the copy
    before = ctl.acceptance().copy()
    k = ctl.fit(Draft(list(range(11, 59)), match=5))
    assert k > 0  # the rest of the draft, one token in
    ctl.observe(k, 0, 0.0, float(cost(np.array([k + 1]))[0]))
    after = ctl.acceptance()
    assert after[1] < before[1]  # evidence about the depth it was drafted at
    assert after[0] >= 0.9 * before[0]


def test_a_checked_first_token_that_is_not_taken_leaves_the_next_draft_judged_afresh() -> None:
    ctl = drafting_lookup(ROWS_COST)
    checked_key(ctl, 4, [1.0, 1.0, 0.0, 1.0, 1.0])
    assert ctl.fit(Draft(list(range(10, 58)), match=4)) == 0
    checked_key(ctl, 4, [0.0])  # the target chose another token: another match, or none
    assert ctl.fit(Draft(list(range(70, 118)), match=4)) == 0  # judged afresh: checked


def copy_after_edits(cost: VerifyCost, first_kept: float, seed: int, rounds: int = 400) -> float:
    """Speed over plain decoding (by ``cost``) of a lookup drafting a copy that an edit
    breaks now and then: each draft (a 6-token key) keeps its first token with chance
    ``first_kept``, and everything after a right first token; a verified draft ends where
    the copy is left, and the next one starts afresh."""
    rng = np.random.default_rng(seed)
    ctl = controller(16, cost)
    ctl.observe_shadow(ShadowCheck(0.0, 0.0, n_guessed=8))  # a lookup: its guesses are free
    step = float(cost(np.array([1]))[0])
    tokens, seconds, at = 0, 0.0, 0
    right = rng.random() < first_kept
    for _ in range(rounds):
        k = ctl.fit(Draft(list(range(at, at + 16)), match=6))
        if k == 0:  # a plain step, and a check of the draft's first token when asked
            n = ctl.shadow_length()
            ctl.observe(0, 0, 0.0, step)
            if n:
                ctl.observe_shadow(ShadowCheck(float(right), 0.0, 0, True, n, 6))
            tokens, seconds, at = tokens + 1, seconds + step, at + 1
            if not right:  # the target wrote something else: another place, another try
                at, right = at + 1000, rng.random() < first_kept
            continue
        kept = k if right else 0
        batch = float(cost(np.array([k + 1]))[0])
        ctl.observe(k, kept, 0.0, batch)
        tokens, seconds = tokens + kept + 1, seconds + batch
        at, right = at + 1000, rng.random() < first_kept
    return tokens / seconds * step


@pytest.mark.parametrize("seed", [0, 1])
def test_checking_doubtful_first_tokens_first_pays_where_rows_cost_steps(seed: int) -> None:
    """Copies picked back up after edits, on a target whose every batch row costs most of
    a step: verifying each draft at once risked its batch on a first token right three
    times in five (0.95-1.05x plain); checking that token first, for free, and drafting
    the rest once it is taken runs near the copy's speed."""
    assert copy_after_edits(ROWS_COST, 0.6, seed) > 1.4
    assert copy_after_edits(SMALL_CPU, 0.6, seed) > 1.8
    assert copy_after_edits(GPU, 0.6, seed) > 7.0  # a free batch: verified at once


def test_key_length_odds_lean_on_the_overall_estimate_until_they_have_evidence() -> None:
    odds = adaptive.KeyLengthOdds(11)
    assert odds.first_token(4, 0.7) == pytest.approx(0.7)
    assert odds.first_token(12, 0.7) == 0.7  # a strong key is not theirs to judge
    odds.record(4, 0.0)
    odds.record(4, 0.0)
    assert odds.first_token(4, 0.7) < 0.3
    assert odds.first_token(6, 0.7) == pytest.approx(0.7)
    odds.record(0, 1.0)  # not a lookup's draft: ignored
    assert odds.first_token(0, 0.7) == 0.7


def test_a_draft_cut_before_verification_still_tells_what_drafting_costs() -> None:
    """A shared step may cut a draft model's whole draft: its drafting time is all it
    teaches, and it is what sizes the slot's later drafts before they are made."""
    ctl = controller()
    assert ctl.paid_draft() is None  # nothing timed yet
    step = float(CPU(np.array([1]))[0])
    ctl.note_draft_time(4, 4 * 0.3 * step)  # a draft model: a third of a step a token
    paid = ctl.paid_draft()
    assert paid is not None
    acceptance, per_token = paid
    assert per_token == pytest.approx(0.3 * step) and len(acceptance) >= 16
    lookup = controller()
    lookup.note_draft_time(16, 0.0)
    assert lookup.paid_draft() is None  # a lookup's drafts are judged once made


def test_a_drafter_that_costs_its_answers_sits_the_next_ones_out() -> None:
    """A drafter that reads every prompt (a draft model) and whose answers it costs (the
    prompt read and its guesses, no draft repaying them) sits answers out after two such
    answers in a row: one, then two, then four; an answer it pays for clears that."""
    ctl = controller(16)
    ctl.note_catch_up(0.1 * STEP)  # a CPU draft model: reading a prompt costs
    worked = []

    def answer(kept: Callable[[int], int]) -> None:
        ctl.start()
        worked.append(not ctl.sits_out)
        if ctl.sits_out:
            return  # the loop neither reads the prompt nor asks for guesses
        ctl.note_prompt_read(40 * 0.1 * STEP)
        drive(ctl, CPU, kept, 40, draft_per_token=0.4 * STEP)

    for _ in range(12):
        answer(lambda k: 0)
    assert worked == [True, True, False, True, False, False, True] + [False] * 4 + [True]
    while not worked[-1] or len(worked) == 12:  # eight answers out, then a copy
        answer(lambda k: k)  # the drafts pay for the prompt read
    assert len(worked) == 12 + 8 + 1 and ctl._ledger.net > 0
    answer(lambda k: 0)
    answer(lambda k: 0)
    assert worked[-3:] == [True, True, True]  # one loss after a paying answer: no sitting out


def test_a_lookup_never_sits_an_answer_out() -> None:
    ctl = controller(16)  # no catch-up: a lookup reads the prompt for nothing
    for _ in range(6):
        ctl.start()
        assert not ctl.sits_out
        ctl.note_prompt_read(0.001)
        drive(ctl, CPU, lambda k: 0, 20)


def test_a_catch_up_pays_only_with_enough_answer_left_to_draft() -> None:
    ctl = controller(16)
    ctl.note_catch_up(0.1 * STEP)
    drive(ctl, CPU, lambda k: k, 10, draft_per_token=0.1 * STEP)  # its costs measured
    assert ctl.catch_up_pays(300, None)  # no limit: the answer may run on
    assert ctl.catch_up_pays(300, 2000)
    assert not ctl.catch_up_pays(300, 5)  # five tokens cannot repay 300 caught up
    assert FixedLengthController(4).catch_up_pays(300, 5)
    # beside other generations, what a token saves is the slot's share of the batch's gain:
    # a prompt that pays its read alone may not at that load
    assert ctl.catch_up_pays(300, 400)
    assert not ctl.catch_up_pays(300, 400, saved_per_token=0.02 * STEP)
    assert ctl.catch_up_pays(300, 400, saved_per_token=0.2 * STEP)


def test_a_drafter_that_cannot_check_once_paused_drafts_on_while_drafting_pays() -> None:
    """A draft model whose catch-up is dear checks nothing after a pause: pausing ends its
    drafting for the answer. At 90% acceptance, where drafting pays a little, it must not
    stop on a margin (a short unlucky run) but only where drafting is predicted to lose:
    answers that started drafting draft to their end."""
    drafted = []
    for seed in range(6):
        ctl = controller(16, CPU)
        ctl.note_catch_up(0.1 * STEP)
        lengths = drive(ctl, CPU, kept_at(0.9, seed), 300, draft_per_token=0.3 * STEP)
        drafted.append(sum(k > 0 for k in lengths))
    started = [n for n in drafted if n > 0]
    assert sum(n > 250 for n in started) >= 3, drafted  # with a 5% margin: 1 of 4


def one_token_copy(beyond: bool) -> list[int]:
    """A lookup whose second token kept failing (k settles at 1 on a compute-bound CPU),
    then a copy: every draft kept whole. Returns the lengths drafted once the copy starts;
    ``beyond``: the loop scores the drafter's token after each draft kept whole."""
    ctl = controller(48, CPU)
    ctl.observe_shadow(ShadowCheck(0.0, 0.0, n_guessed=8))
    lengths = []
    for r in range(40):
        copying = r >= 16
        k = ctl.fit(Draft([5] * 48, match=6)) if not ctl.paused else 0
        if k == 0:
            ctl.observe(0, 0, 0.0, STEP)
            if n := ctl.shadow_length():
                ctl.observe_shadow(ShadowCheck(1.0, 0.0, 0, True, n, 6))
            continue
        kept = k if copying else min(k, 1)
        after = float(copying) if beyond and kept == k else None
        ctl.observe(k, kept, 0.0, float(CPU(np.array([k + 1]))[0]), None, after)
        if copying:
            lengths.append(k)
    return lengths


def test_the_token_after_a_draft_kept_whole_is_evidence_about_the_next_position() -> None:
    """Drafting one token a round, position 2 is never reached: without the bonus row's
    word on the drafter's next token its estimate stays where the failures left it, and a
    copy kept whole round after round drafts one token at a time for a dozen rounds."""
    without, scored = one_token_copy(beyond=False), one_token_copy(beyond=True)
    assert without[:12] == [1] * 12
    assert max(scored[:10]) > 4
    assert sum(scored) > sum(without)


def test_the_position_after_a_draft_is_scored_only_when_the_draft_was_kept_whole() -> None:
    estimate = adaptive.AcceptanceEstimate(8, 0.8)
    estimate.record_round(2, 2, beyond=1.0)
    assert list(estimate.tried[:4]) == [1, 1, 1, 0] and estimate.accepted[2] == 1.0
    estimate.record_round(2, 1, beyond=1.0)  # rejected at its second token: nothing beyond
    assert estimate.tried[2] == pytest.approx(0.9)


def test_the_calibration_times_short_batches_most_in_rounds_over_every_size() -> None:
    """Each round visits every size still to be timed, so a machine whose speed drifts
    during the calibration moves every size alike; short batches, which decide most rounds
    and whose one-row step is the most noisy, are timed most (each size's median is kept)."""
    sizes = [1, 2, 6, 8, 17, 24, 32]
    order = calibration_order(sizes)
    assert order == [1, 2, 6, 8, 17, 24, 32, 1, 2, 6, 8, 17, 1, 2, 6]
    assert calibration_order([1]) == [1, 1, 1]
