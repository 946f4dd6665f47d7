"""Parallel slots on the real model: several generations verified in one batch per step.

Each generation must give what it gives alone (greedy: the target's argmax; seeded
sampling: the same draws), up to the near ties a differently batched pass may tip; a client
that leaves frees its slot without disturbing the others; the draft budget cuts drafts that
do not pay when the batch is shared."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import llama_cpp
import numpy as np
import pytest

from localspec import Engine
from localspec.engine.costs import VerifyCost
from localspec.engine.loop import SpecConfig
from localspec.engine.model_context import ContextOptions, ModelContext, common_prefix_length
from localspec.engine.step_batch import BatchPart, StepBatch
from localspec.errors import LocalspecError
from localspec.lossless import compare
from localspec.prompts import builtin_prompts

PROMPTS = [
    "def fibonacci(n):",
    "Write a haiku about the sea.",
    "The capital of France is",
    "import numpy as np\n# compute the mean of a list\n",
]
# a prompt whose answer copies from it: ngram-simple drafts, and its drafts are accepted
COPYING = (
    "Repeat this list exactly, twice:\nalpha, beta, gamma, delta, epsilon, zeta, eta, theta, "
    "iota, kappa, lambda, mu, nu, xi, omicron, pi, rho, sigma, tau\n"
)


@pytest.fixture(scope="module")
def slots(qwen_path: Path) -> Iterator[Engine]:
    with Engine.load(qwen_path, mode="ngram-simple", parallel=4) as engine:
        yield engine


@contextmanager
def rows_a_step(engine: Engine, rows: int) -> Iterator[None]:
    """A cost curve where up to ``rows`` rows cost one step and more cost in proportion."""
    real = engine.verify_cost()
    step = float(real(np.array([1]))[0])
    sizes = np.array([1, 2, 3, 4, 5, 8, 16, 17, 32, 64, 128])
    engine.use_cost(VerifyCost(sizes, step * np.maximum(1, sizes / rows)))
    try:
        yield
    finally:
        engine.use_cost(real)


def plain_reference(qwen: Engine, prompt: str, tokens: int, **kw: object):  # type: ignore[no-untyped-def]
    return qwen.generate(prompt, max_tokens=tokens, mode="none", record_margins=True, **kw)


def test_generations_in_one_batch_give_what_each_gives_alone(qwen: Engine, slots: Engine) -> None:
    before = slots.scheduler().totals.shared_steps
    got = slots.generate_many([*PROMPTS, COPYING], max_tokens=40)
    assert slots.scheduler().totals.shared_steps > before + 20  # really answered together
    for prompt, result in zip([*PROMPTS, COPYING], got, strict=True):
        ref = plain_reference(qwen, prompt, 40)
        report = compare(ref.tokens, ref.margins, result.tokens, ref.runners_up)
        assert report.ok, (prompt, report)
        assert result.finish_reason == "length" and len(result.tokens) == 40
    assert got[-1].stats.accepted > 0  # the copying answer was drafted, in a shared batch


def test_penalized_generations_in_one_batch_give_what_each_gives_alone(
    qwen: Engine, slots: Engine
) -> None:
    """Each slot's rows are penalized by its own context and draft, whatever runs beside."""
    penalized = {"repeat_penalty": 1.3, "frequency_penalty": 0.2, "repeat_last_n": 32}
    prompts = [*PROMPTS[:2], COPYING]
    got = slots.generate_many(prompts, max_tokens=32, **penalized)
    for prompt, result in zip(prompts, got, strict=True):
        ref = plain_reference(qwen, prompt, 32, **penalized)
        report = compare(ref.tokens, ref.margins, result.tokens, ref.runners_up)
        assert report.ok, (prompt, report)
    free = plain_reference(qwen, COPYING, 32)
    assert free.tokens != got[-1].tokens  # the penalty was applied


def test_a_cache_moved_to_close_a_gap_keeps_its_answer(qwen: Engine, qwen_path: Path) -> None:
    """The second of four generations ends first: the last one's cache moves into its
    sequence id (one pass per step again), and every answer is still what it is alone."""
    lengths = [40, 6, 40, 40]
    prompts = [*PROMPTS[:3], COPYING]
    got: dict[int, list[int]] = {}
    # a fresh engine, the requests admitted one after the other: the i-th takes slot i (a
    # used engine places them by the prefixes its slots cache, and the short one could
    # take the last id, where its end leaves no gap)
    with Engine.load(qwen_path, mode="ngram-simple", parallel=4) as fresh:

        def one(i: int) -> None:
            events = fresh.stream(prompts[i], max_tokens=lengths[i])
            got[i] = [t for event in events for t in event.tokens]

        threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
        for i, thread in enumerate(threads):
            thread.start()
            deadline = time.monotonic() + 60
            while fresh.scheduler().busy + len(got) <= i and time.monotonic() < deadline:
                time.sleep(0.005)
        for thread in threads:
            thread.join(300)
        assert fresh.scheduler().totals.moves > 0
    for i, prompt in enumerate(prompts):
        ref = plain_reference(qwen, prompt, lengths[i])
        report = compare(ref.tokens, ref.margins, got[i], ref.runners_up)
        assert report.ok, (prompt, report)


def test_pad_rows_even_a_step_and_leave_no_trace_in_the_cache(qwen_path: Path) -> None:
    """A step of one row beside three, the short part padded to three: the real rows' logits
    are those of the uneven step (up to a batch's float differences), and the pads are gone
    from the cache: the next token decodes as if they had never been."""
    context = ModelContext(qwen_path, ContextOptions(n_ctx=1024, n_seq=2))
    batch = StepBatch(context)
    try:
        seqs = [context.sequence(0), context.sequence(1)]
        for seq, prompt in zip(seqs, ["def add(a, b):", "The sea is"], strict=True):
            seq.decode(seq.tokenize(prompt))
        starts = [seq.n_past for seq in seqs]
        mem = llama_cpp.llama_get_memory(context.ctx)
        short, long = [220], [262, 470, 264]

        def step(pad: int) -> list[np.ndarray]:
            parts = [BatchPart(seqs[0], short, 1, pad), BatchPart(seqs[1], long, 3)]
            rows = [r.copy() for r in batch.decode(parts)]
            assert llama_cpp.llama_memory_seq_pos_max(mem, 0) == seqs[0].n_past - 1  # no pads
            nxt = batch.decode([BatchPart(seqs[0], [int(np.argmax(rows[0][0]))], 1)])[0].copy()
            for seq, start in zip(seqs, starts, strict=True):
                seq.trim(start)
            return [*rows, nxt]

        uneven, evened = step(0), step(2)
        for a, b in zip(uneven, evened, strict=True):  # the same rows, up to float noise
            assert a.shape == b.shape
            assert np.abs(a - b).max() < 0.5
            picked = b[np.arange(len(b)), a.argmax(axis=-1)]
            assert np.all(b.max(axis=-1) - picked < 0.5)  # a's choice is b's or a near tie
    finally:
        batch.free()
        context.close()


def test_an_uneven_shared_step_is_padded_and_answers_stay_as_alone(
    qwen: Engine, slots: Engine
) -> None:
    """A copying answer drafting beside a prose one that drafts nothing, on a curve where
    one pass of equal parts costs less than two of uneven ones (a memory-bound machine's:
    whether a CPU's does depends on the CPU): the prose part is padded, and both answers are
    what they are alone."""
    totals = slots.scheduler().totals
    before = totals.pad_rows
    with rows_a_step(slots, 64):
        got = slots.generate_many([COPYING, PROMPTS[1]], max_tokens=48)
    assert totals.pad_rows > before
    for prompt, result in zip([COPYING, PROMPTS[1]], got, strict=True):
        ref = plain_reference(qwen, prompt, 48)
        report = compare(ref.tokens, ref.margins, result.tokens, ref.runners_up)
        assert report.ok, (prompt, report)


def test_a_seeded_answer_does_not_depend_on_what_else_runs(slots: Engine) -> None:
    settings = dict(max_tokens=24, temperature=0.8, seed=1234, record_margins=True)
    alone = slots.generate(PROMPTS[1], **settings)
    others = [p for p in PROMPTS if p != PROMPTS[1]]
    together = slots.generate_many([PROMPTS[1], *others], **settings)[0]
    report = compare(alone.tokens, alone.margins, together.tokens, alone.runners_up)
    assert report.identical or (report.near_tie and report.margin is not None)


def test_a_client_that_leaves_frees_its_slot_and_disturbs_no_one(
    qwen: Engine, slots: Engine
) -> None:
    scheduler = slots.scheduler()
    results: dict[str, object] = {}

    def short() -> None:
        results["short"] = slots.generate(PROMPTS[0], max_tokens=48)

    stream = slots.stream("Write a long essay about rivers.", max_tokens=600)
    next(stream)
    worker = threading.Thread(target=short)
    worker.start()
    for _ in range(5):
        next(stream)
    stream.close()  # the client goes away mid-answer
    worker.join(120)
    steps = scheduler.totals.steps
    for _ in range(200):  # within a step or so of the other answer's end
        if scheduler.busy == 0:
            break
        threading.Event().wait(0.02)
    assert scheduler.busy == 0, scheduler.totals.steps - steps
    ref = plain_reference(qwen, PROMPTS[0], 48)
    short_result = results["short"]
    report = compare(ref.tokens, ref.margins, short_result.tokens, ref.runners_up)  # type: ignore[attr-defined]
    assert report.ok


def test_drafts_are_cut_when_a_shared_batch_makes_them_cost(slots: Engine) -> None:
    """Four rows a step: one generation alone drafts (its controller's choice: a drafted
    row is free), four together verify no draft (the four rows already fill the step; any
    draft row costs its share)."""
    with rows_a_step(slots, 4):
        totals = slots.scheduler().totals
        wanted, drafted = totals.wanted_by_width[4], totals.drafted_by_width[4]
        alone = slots.generate(COPYING, max_tokens=48)
        assert alone.stats.drafted > 0  # alone, a free second row pays
        slots.generate_many([COPYING] * 4, max_tokens=48)
        assert totals.wanted_by_width[4] > wanted  # the controllers asked for drafts...
        assert totals.drafted_by_width[4] == drafted  # ...and the steps of four verified none


def test_lookups_rest_while_a_wide_step_cuts_every_draft(slots: Engine) -> None:
    """Four rows a step: four copying generations want drafts step after step and the steps
    of four verify none. After a few such steps their lookups rest (nothing looked up,
    nothing priced) and then look again; the answers are whole and still verify no draft."""
    with rows_a_step(slots, 4):
        totals = slots.scheduler().totals
        rests, drafted = totals.lookup_rests, totals.drafted_by_width[4]
        steps = totals.shared_steps
        answers = slots.generate_many([COPYING] * 4, max_tokens=48)
        assert [len(a.tokens) for a in answers] == [48] * 4
        assert totals.drafted_by_width[4] == drafted
        shared = totals.shared_steps - steps
        assert 0 < totals.lookup_rests - rests < shared  # rested, and looked again between


def test_scoring_and_closing_with_slots(qwen: Engine, qwen_path: Path) -> None:
    engine = Engine.load(qwen_path, mode="ngram-simple", parallel=2)
    text = "The quick brown fox jumps over the lazy dog."
    scored = engine.score(text, top=2)
    alone = qwen.score(text, top=2)
    assert [t for t, _ in scored] == [t for t, _ in alone]
    for (_, mine), (_, theirs) in zip(scored, alone, strict=True):
        assert (mine is None) == (theirs is None)
        if mine is not None and theirs is not None:
            assert abs(mine[0] - theirs[0]) < 0.05
    stream = engine.stream(PROMPTS[0], max_tokens=400)
    next(stream)
    engine.close()  # a stream still open: it ends, the models are freed
    with pytest.raises(LocalspecError, match="closed"):
        list(stream)
    with pytest.raises(LocalspecError, match="closed"):
        engine.generate("x", max_tokens=2)


def test_parallel_is_checked_before_loading(qwen_path: Path) -> None:
    with pytest.raises(LocalspecError, match="parallel"):
        Engine.load(qwen_path, parallel=0)
    with pytest.raises(LocalspecError, match="parallel"):
        Engine.load(qwen_path, parallel="4")  # type: ignore[arg-type]
    with pytest.raises(LocalspecError, match="generate_many takes a list"):
        Engine.generate_many(None, "one prompt")  # type: ignore[arg-type]


@pytest.mark.slow
def test_sampling_in_shared_steps_keeps_the_distribution(qwen: Engine, slots: Engine) -> None:
    """Four clients at once, each drawing with its own seed while the memory drafts what an
    earlier answer said (rejection sampling in shared steps): each second colour comes as
    often as plain sampling alone draws it."""
    from concurrent.futures import ThreadPoolExecutor

    from scipy.stats import chi2_contingency

    from tests.test_suffix_real import _second_colours

    plain, _ = _second_colours(qwen, "none", range(80))
    shared = slots.scheduler().totals.shared_steps
    slots.memory.clear()
    with ThreadPoolExecutor(4) as pool:
        parts = list(
            pool.map(
                lambda s: _second_colours(slots, "suffix", range(s, s + 20)), range(1000, 1080, 20)
            )
        )
    spec = sum((counts for counts, _ in parts), start=Counter())
    assert sum(drafted for _, drafted in parts) >= 40  # the memory drafted throughout
    assert slots.scheduler().totals.shared_steps > shared + 40  # ...in shared steps
    names = sorted(set(plain) | set(spec))
    assert len(names) >= 2, (plain, spec)
    table = np.array([[plain[n] for n in names], [spec[n] for n in names]]) + 0.5
    assert chi2_contingency(table).pvalue > 1e-3, (plain, spec)
    slots.memory.clear()


@pytest.fixture(scope="module")
def pair_slots(qwen_f16_path: Path, qwen_q4_0_path: Path) -> Iterator[Engine]:
    """The F16 target and its Q4_0 draft (drafting pays alone) with three slots."""
    with Engine.load(
        qwen_f16_path, draft=qwen_q4_0_path, mode="draft-model", parallel=3, n_ctx=1024
    ) as engine:
        yield engine


def code_edit() -> list[dict[str, str]]:
    return next(p for p in builtin_prompts() if p.kind == "code-edit").messages


@pytest.mark.slow
def test_a_draft_model_drafts_for_every_slot_in_one_batch(pair_slots: Engine) -> None:
    """Three slots drafting at once (a fixed length: every round drafts): the draft model
    decodes their draft tokens of a position together (one batch, not three decodes), and
    each answer is what the target gives alone, up to a measured near tie."""
    reference = pair_slots.generate(code_edit(), max_tokens=48, mode="none", record_margins=True)
    drafts = pair_slots.scheduler().drafts
    decodes, rows = drafts.decodes, drafts.rows
    fixed = SpecConfig(n_max=4, adaptive=False)
    results = pair_slots.generate_many([code_edit()] * 3, max_tokens=48, spec=fixed)
    assert all(r.stats.drafted > 0 for r in results), [r.stats for r in results]
    assert drafts.decodes - decodes >= 10
    assert (drafts.rows - rows) / (drafts.decodes - decodes) >= 2.0  # one at a time: none
    for result in results:
        report = compare(reference.tokens, reference.margins, result.tokens, reference.runners_up)
        assert report.ok, report


@pytest.mark.slow
def test_a_draft_model_drafts_only_what_a_shared_step_verifies(pair_slots: Engine) -> None:
    """A draft model pays for every token it drafts, verified or not: in a step shared with
    other generations its draft is sized by the budget before it is made. On a curve where
    every row costs a step, three generations together verify no draft, so the draft model
    must be asked for none (lookups draft for nothing and are cut once made instead)."""
    real = pair_slots.verify_cost()
    step = float(real(np.array([1]))[0])
    sizes = np.array([1, 2, 3, 4, 5, 8, 16, 17, 32, 64])
    # whether this pair's drafts pay alone depends on the machine (how much cheaper the Q4_0
    # step is than the F16 one): on a curve where any batch costs one step, they do
    pair_slots.use_cost(VerifyCost(sizes, np.full(sizes.size, step)))
    try:
        alone = pair_slots.generate(code_edit(), max_tokens=48)
        assert alone.stats.drafted > 0  # alone, the pair's drafts pay
        pair_slots.generate_many([code_edit()] * 3, max_tokens=24)  # each controller timed
        pair_slots.use_cost(VerifyCost(sizes, step * sizes.astype(float)))
        totals = pair_slots.scheduler().totals
        wanted, steps = totals.wanted_by_width[3], totals.steps
        results = pair_slots.generate_many([code_edit()] * 3, max_tokens=48)
    finally:
        pair_slots.use_cost(real)
    assert all(r.stats.n_tokens == 48 for r in results)
    assert totals.steps - steps >= 40  # the three answered together
    assert totals.wanted_by_width[3] == wanted  # nothing drafted in steps of three


@pytest.mark.slow
def test_a_draft_model_reads_a_prompt_only_where_drafting_beside_others_repays_it(
    pair_slots: Engine,
) -> None:
    """On a curve where every batch costs one step, drafts kept whole pay beside other
    generations, so the draft models stay awake; but every slot waits while one reads its
    prompt. Reproducible answers (modelled costs, as the server gives every greedy request)
    of 8 tokens to long prompts cannot repay that read (each slot's share of what its drafts
    save, over 8 tokens): their prompts are not read, and their
    text is the target's own (greedy: up to a measured near tie). Answers of 64 tokens to
    short prompts can: they are read."""
    by_name = {p.name: p.messages for p in builtin_prompts()}
    long = [by_name[n] for n in ("add-docstring", "summarize-caching", "extract-order")]
    short = [by_name[n] for n in ("binary-search", "lru-cache", "tcp-vs-udp")]
    real = pair_slots.verify_cost()
    step = float(real(np.array([1]))[0])
    sizes = np.array([1, 2, 3, 4, 5, 8, 16, 17, 32, 64])
    plain = [
        pair_slots.generate(m, max_tokens=8, mode="none", reproducible=True, record_margins=True)
        for m in long
    ]
    pair_slots.use_cost(VerifyCost(sizes, np.full(sizes.size, step)))
    try:
        answers = pair_slots.generate_many(long, max_tokens=8, reproducible=True)
        unread = _prompts_unread(pair_slots, [a.stats.n_prompt for a in answers])
        pair_slots.generate_many(short, max_tokens=64, reproducible=True)
        read_now = _prompts_unread(pair_slots, [16] * 3)
    finally:
        pair_slots.use_cost(real)
    # the first request may be admitted a moment before the others: alone, its read pays
    assert unread >= 2, unread
    for p, a in zip(plain, answers, strict=True):
        report = compare(p.tokens, p.margins, a.tokens, p.runners_up)
        assert report.ok, report
    assert read_now == 0, read_now


@pytest.mark.slow
def test_a_new_slot_prices_its_first_prompt_read_from_the_calibration(pair_slots: Engine) -> None:
    """Slots whose controllers have timed no draft yet (their own settings: new controllers)
    still know what the draft model's tokens and catch-up cost, from the calibration: three
    short answers to a long prompt, together, leave it unread (no draft they could make,
    with the acceptance expected of a new answer, repays reading it beside the others);
    and so does a lone answer too short to repay the read even with drafts kept whole."""
    new = SpecConfig(n_max=11)
    prompts = [_tagged(code_edit(), f"request {i}") for i in range(3)]
    answers = pair_slots.generate_many(prompts, max_tokens=8, spec=new)
    # the first request may be admitted alone for a moment: there, its read is judged alone
    assert _prompts_unread(pair_slots, [a.stats.n_prompt for a in answers]) >= 2
    lone = _tagged(code_edit(), "alone")
    alone = pair_slots.generate(lone, max_tokens=4, spec=SpecConfig(n_max=9))
    tokens = pair_slots.tokenize_prompt(lone)
    slot = max(
        pair_slots.scheduler().slots, key=lambda s: common_prefix_length(s.target.tokens, tokens)
    )
    assert slot.draft is not None
    held = common_prefix_length(slot.draft.tokens, slot.target.tokens)
    assert held < alone.stats.n_prompt, (held, alone.stats.n_prompt)


@pytest.mark.slow
def test_a_draft_model_that_holds_the_prompt_works_even_for_a_short_answer(
    pair_slots: Engine,
) -> None:
    """Reading a prompt the draft model's cache already holds (the same request again, a
    chat's earlier turns) costs it a token or two: on a curve where the pair's drafts pay
    alone, an answer too short to repay a whole read (left unread just above) still drafts
    or checks when the draft holds its prompt."""
    real = pair_slots.verify_cost()
    step = float(real(np.array([1]))[0])
    sizes = np.array([1, 2, 3, 4, 5, 8, 16, 17, 32, 64])
    held = _tagged(code_edit(), "held")
    pair_slots.generate(held, max_tokens=2, spec=SpecConfig(n_max=4, adaptive=False))
    pair_slots.use_cost(VerifyCost(sizes, np.full(sizes.size, step)))
    try:
        again = pair_slots.generate(held, max_tokens=4, spec=SpecConfig(n_max=9))
    finally:
        pair_slots.use_cost(real)
    assert again.stats.drafted + again.stats.shadow_checks > 0, again.stats


def _tagged(messages: list[dict[str, str]], tag: str) -> list[dict[str, str]]:
    """The same request, its user message starting with ``tag``: no cache holds its prompt."""
    tagged = [dict(m) for m in messages]
    tagged[-1]["content"] = f"({tag})\n{tagged[-1]['content']}"
    return tagged


def _prompts_unread(engine: Engine, lengths: list[int]) -> int:
    """Slots whose draft cache holds less of the target's context than the shortest of
    ``lengths`` (their draft model did not read the prompt)."""
    held = [
        common_prefix_length(slot.draft.tokens, slot.target.tokens)
        for slot in engine.scheduler().slots
        if slot.draft is not None
    ]
    return sum(n < min(lengths) for n in held)


@pytest.mark.slow
def test_a_draft_model_rests_while_the_load_leaves_no_room_for_drafts(
    pair_slots: Engine,
) -> None:
    """On a curve where one extra row is free alone but every row beyond two costs half a
    step, no draft can pay beside another generation, even one accepted whole: the draft
    model then reads no prompt and makes no checks for an answer that starts beside others.
    Alone again, it wakes: it reads the prompt, catches up with the answer so far, and
    drafts; the answer stays the target's own."""
    real = pair_slots.verify_cost()
    step = float(real(np.array([1]))[0])
    sizes = np.array([1, 2, 3, 4, 5, 8, 16, 17, 32, 64])
    # long enough that, alone again, its drafts repay the catch-up with the prompt and the
    # answer so far (a shorter answer rests to its end)
    reference = pair_slots.generate(code_edit(), max_tokens=200, mode="none", record_margins=True)
    # controllers of their own (one per settings and slot): the answers of other tests, lost
    # to their prompt reads, would have the long answer's slot sit it out
    own = SpecConfig(n_max=12)
    pair_slots.use_cost(VerifyCost(sizes, np.full(sizes.size, step)))
    try:
        pair_slots.generate_many([code_edit()] * 3, max_tokens=16, spec=own)  # each one timed
        pair_slots.use_cost(VerifyCost(sizes, step * np.maximum(1.0, sizes / 2)))
        shorts = ["Write a haiku about the sea.", "Name three rivers of Europe and their seas."]
        with ThreadPoolExecutor(3) as pool:
            first = [pool.submit(pair_slots.generate, p, max_tokens=12, spec=own) for p in shorts]
            time.sleep(0.3)  # the long answer starts while both others are busy
            long = pair_slots.generate(code_edit(), max_tokens=200, spec=own)
            answers = [f.result() for f in first]
    finally:
        pair_slots.use_cost(real)
    held = {
        slot.index: common_prefix_length(slot.draft.tokens, slot.target.tokens)
        for slot in pair_slots.scheduler().slots
        if slot.draft is not None
    }
    n_prompt = {r.stats.n_prompt for r in answers}
    # at most the first short answer, alone for a moment, had its prompt read
    unread = [i for i, n in held.items() if n < min(n_prompt)]
    assert len(unread) >= 1, (held, n_prompt)
    assert long.stats.drafted > 0  # woke once alone
    report = compare(reference.tokens, reference.margins, long.tokens, reference.runners_up)
    assert report.ok, report
