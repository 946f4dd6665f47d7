"""The adaptive controller on the real F16 target and its Q4_0 draft (every draft of a code
edit acceptable): what a desktop's other work does to its measurements must not stop it."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from localspec import Engine
from localspec.drafters.draft_model import DraftModelDrafter
from localspec.engine.costs import VerifyCost
from localspec.engine.drafting import Draft, Steps
from localspec.engine.model_context import common_prefix_length
from localspec.prompts import builtin_prompts, suite_prompts

STALL_S = 1.0  # another program takes the cores for a second


def code_edit() -> list[dict[str, str]]:
    return next(p for p in builtin_prompts() if p.kind == "code-edit").messages


@pytest.mark.slow
def test_a_stall_in_the_first_draft_does_not_freeze_speculation(
    qwen_cpu_pair: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The draft model's first guess or draft is stalled (as when the desktop runs something
    else for a second): measured alone, it says drafting costs a second a token, which no
    draft could pay. The controller must not believe one measurement: the answer still
    drafts."""
    real, real_steps = DraftModelDrafter.propose, DraftModelDrafter.propose_steps
    stalled: list[DraftModelDrafter] = []

    def stall(drafter: DraftModelDrafter, n_max: int) -> None:
        if n_max > 0 and drafter not in stalled:
            stalled.append(drafter)
            time.sleep(STALL_S)

    def propose(self: DraftModelDrafter, context: Sequence[int], n_max: int) -> Draft:
        stall(self, n_max)  # a shadow check's guess
        return real(self, context, n_max)

    def propose_steps(self: DraftModelDrafter, context: Sequence[int], n_max: int) -> Steps[Draft]:
        stall(self, n_max)  # a draft (or the opening's one-token probe)
        return (yield from real_steps(self, context, n_max))

    monkeypatch.setattr(DraftModelDrafter, "propose", propose)
    monkeypatch.setattr(DraftModelDrafter, "propose_steps", propose_steps)
    result = qwen_cpu_pair.generate(code_edit(), max_tokens=96, temperature=0.0, mode="draft-model")
    assert stalled, "the stall was not injected"
    assert result.stats.accepted > 0, result.stats


@pytest.mark.slow
def test_a_cost_curve_measured_while_busy_does_not_freeze_speculation(
    qwen_f16_path: Path, qwen_q4_0_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The verify costs are measured once, at the first request: on a busy desktop the
    batches come out slower than they are (here by 60%), and by that curve a short draft
    kept whole does not pay. The draft is right at every check of the answer's opening, and
    the draft model cannot check later (it would first have to catch up): the opening must
    end in a verified draft, whose measured cost shows that drafting pays."""
    real = VerifyCost.measure.__func__  # type: ignore[attr-defined]

    def busy(cls: type[VerifyCost], backend: object, max_size: int) -> VerifyCost:
        curve = real(cls, backend, max_size)
        return VerifyCost(curve.sizes, curve.seconds * np.where(curve.sizes > 1, 1.6, 1.0))

    monkeypatch.setattr(VerifyCost, "measure", classmethod(busy))
    with Engine.load(qwen_f16_path, draft=qwen_q4_0_path, mode="draft-model") as engine:
        result = engine.generate(code_edit(), max_tokens=96, temperature=0.0)
    assert result.stats.accepted > 0, result.stats


@pytest.mark.slow
def test_a_draft_model_that_costs_its_answers_sits_the_next_one_out(
    qwen_f16_path: Path, qwen_q4_0_path: Path
) -> None:
    """On a curve where every row costs a step, no draft repays what the draft model spends
    reading each prompt and guessing: after two such answers the third goes without it (it
    reads no prompt, makes no check), and its text is the target's own."""
    prompts = ["def fibonacci(n):", "The capital of France is", "import numpy as np\n# mean"]
    with Engine.load(qwen_f16_path, draft=qwen_q4_0_path, mode="draft-model") as engine:
        step = float(engine.verify_cost()(np.array([1]))[0])
        sizes = np.array([1, 2, 4, 8, 16, 32, 64])
        engine.use_cost(VerifyCost(sizes, step * sizes.astype(float)))
        results = [engine.generate(p, max_tokens=12, temperature=0.0) for p in prompts]
        plain = engine.generate(prompts[-1], max_tokens=12, temperature=0.0, mode="none")
        assert engine.draft is not None
        held = common_prefix_length(engine.draft.tokens, engine.target.tokens)
    assert [r.stats.shadow_checks > 0 for r in results] == [True, True, False]
    assert held < results[-1].stats.n_prompt  # the draft model never read the third prompt
    assert results[-1].tokens == plain.tokens


@pytest.mark.slow
def test_a_seeded_answer_does_not_check_a_draft_model_whose_catch_up_is_dear(
    qwen_f16_path: Path, qwen_q4_0_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A seeded answer runs on modelled costs (identical requests, identical schedules),
    and those must say what catching up costs a draft model: on a curve where a batched row
    costs a quarter of a step, a check after a paused stretch would first decode that stretch, a
    dozen steps' worth for a guess worth one. The draft model is only ever asked to draft
    from where it stands (the target's last token or two), never to catch up a pause."""
    real = DraftModelDrafter.propose_steps
    behind: list[int] = []

    def propose_steps(self: DraftModelDrafter, context: Sequence[int], n_max: int):  # type: ignore[no-untyped-def]
        behind.append(len(context) - self.held(context))
        return real(self, context, n_max)

    monkeypatch.setattr(DraftModelDrafter, "propose_steps", propose_steps)
    letter = next(p for p in suite_prompts() if p.name == "fr-lettre-resiliation").messages
    with Engine.load(qwen_f16_path, draft=qwen_q4_0_path, mode="draft-model") as engine:
        step = float(engine.verify_cost()(np.array([1]))[0])
        sizes = np.array([1, 2, 4, 8, 16, 32, 64])
        engine.use_cost(VerifyCost(sizes, step * (1 + 0.25 * (sizes - 1.0))))
        result = engine.generate(letter, max_tokens=96, temperature=0.7, seed=2)
    assert behind, "the draft model was never asked"
    assert result.stats.n_tokens > 40, result.stats
    assert max(behind) <= 2, behind


@pytest.mark.slow
def test_a_draft_model_that_breaks_off_early_drafts_the_rest_of_a_code_edit(
    qwen_cpu_pair: Engine,
) -> None:
    """On a compute-bound CPU (two rows cost two steps, a draft token half a step: drafting
    pays only above ~95% acceptance), the F16 target and its Q4_0 draft agree on nearly
    every token of a code edit, but an early draft breaks off after a few right tokens. The
    draft model cannot check once paused: one such draft must not end the answer's
    drafting. Greedy, so the schedule is the modelled one: the same on any machine."""
    edit = next(p for p in suite_prompts() if p.name == "ts-request-timeout").messages
    engine = qwen_cpu_pair
    step = float(engine.verify_cost()(np.array([1]))[0])
    sizes = np.array([1, 2, 4, 8, 16, 32, 64])
    engine.use_cost(VerifyCost(sizes, step * np.array([1.0, 2.08, 2.38, 3.27, 4.91, 9.0, 17.0])))
    engine._draft_step = 0.5 * step
    try:
        result = engine.generate(edit, max_tokens=160, temperature=0.0, mode="draft-model")
    finally:
        engine._cost = engine._draft_step = None
    stats = result.stats
    assert stats.accepted > 0.6 * stats.n_tokens, stats
