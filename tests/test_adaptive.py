"""The adaptive controller on synthetic costs: pure logic, no llama.cpp."""

import numpy as np

from localspec.engine.adaptive import AdaptiveController
from localspec.engine.costs import VerifyCost

SIZES = np.array([1, 2, 4, 8, 16, 32, 49])
CPU = VerifyCost(SIZES, 0.022 + 0.008 * (SIZES - 1))  # compute-bound: a batch costs more
GPU = VerifyCost(SIZES, 0.010 + 0.0002 * (SIZES - 1))  # memory-bound: a batch costs the same


def drive(ctl: AdaptiveController, cost: VerifyCost, accept, rounds: int = 60) -> list[int]:
    lengths = []
    for _ in range(rounds):
        k = ctl.next_draft_length()
        ctl.observe(k, accept(k), 0.0, float(cost(np.array([k + 1]))[0]))
        lengths.append(k)
    return lengths


def test_pauses_when_nothing_is_accepted_and_probes_rarely() -> None:
    ctl = AdaptiveController(16, VerifyCost(SIZES, CPU.seconds.copy()))
    drive(ctl, CPU, lambda k: 0)
    assert ctl.paused and ctl.pauses >= 1
    lengths = drive(ctl, CPU, lambda k: 0, 200)
    assert lengths.count(0) >= 190  # nearly all plain rounds, with rare probes


def test_full_acceptance_drafts_long_on_cpu() -> None:
    ctl = AdaptiveController(48, VerifyCost(SIZES, CPU.seconds.copy()))
    drive(ctl, CPU, lambda k: k)
    assert not ctl.paused and ctl.n_draft >= 24


def test_moderate_acceptance_prefers_short_drafts_on_cpu_long_on_gpu() -> None:
    rng = np.random.default_rng(0)

    def geometric(k: int, a: float = 0.6) -> int:
        n = 0
        while n < k and rng.random() < a:
            n += 1
        return n

    cpu = AdaptiveController(16, VerifyCost(SIZES, CPU.seconds.copy()))
    gpu = AdaptiveController(16, VerifyCost(SIZES, GPU.seconds.copy()))
    drive(cpu, CPU, geometric, 200)
    drive(gpu, GPU, geometric, 200)
    assert gpu.n_draft > cpu.n_draft


def test_disabled_controller_always_drafts_n_max() -> None:
    ctl = AdaptiveController(8, CPU, enabled=False)
    drive(ctl, CPU, lambda k: 0)
    assert ctl.next_draft_length() == 8 and not ctl.paused


def test_each_answer_learns_its_own_acceptance() -> None:
    ctl = AdaptiveController(16, VerifyCost(SIZES, CPU.seconds.copy()), n_start=4)
    drive(ctl, CPU, lambda k: 0, 40)
    assert ctl.paused
    ctl.start()  # the next prompt, still one the drafter cannot do
    probe = ctl.next_draft_length()
    assert ctl.paused and 0 < probe <= 4  # it opens with a single short probe
    ctl.observe(probe, 0, 0.0, float(CPU(np.array([probe + 1]))[0]))
    assert sum(k > 0 for k in drive(ctl, CPU, lambda k: 0, 40)) <= 3  # and stops again soon

    ctl.start()  # a prompt that suits the drafter: drafting resumes at once
    lengths = drive(ctl, CPU, lambda k: k, 40)
    assert not ctl.paused and sum(lengths[-10:]) >= 10 * 4


def test_a_draft_that_must_catch_up_does_not_probe_mid_answer() -> None:
    ctl = AdaptiveController(16, VerifyCost(SIZES, CPU.seconds.copy()), n_start=4)
    ctl.note_catch_up(0.1 * float(CPU(np.array([1]))[0]))  # a tenth of a step per token
    ctl.note_catch_up(None)  # a cached prompt shows nothing: what was measured stays
    lengths = drive(ctl, CPU, lambda k: 0, 200)
    assert ctl.paused
    assert sum(k > 0 for k in lengths) <= 1 + 2  # the first round and a short exploration
    fast = AdaptiveController(16, VerifyCost(SIZES, CPU.seconds.copy()), n_start=4)
    fast.note_catch_up(0.001 * float(CPU(np.array([1]))[0]))  # a GPU-like catch-up: probes pay
    assert sum(k > 0 for k in drive(fast, CPU, lambda k: 0, 200)) > 3
