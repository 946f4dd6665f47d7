"""Parallel slots: several generations verified in one batch per step.

One thread owns llama.cpp. Each step it sizes the drafts of the slots whose drafter pays
for every token (a draft model) by the budget, asks every decoding slot's loop for its
round (``SpeculativeLoop.plan_steps``: the draft its own controller wants; a draft model
drafts for all slots at once, ``side_by_side.py``), cuts the lookups' drafts to what pays
for the whole batch (``budget.allocate``: at one generation nothing is cut; on a
compute-bound batch drafts go first), adds a chunk of any prompt still being read, decodes
everything in one ``llama_decode`` (``StepBatch``), and hands each slot its rows
(``SpeculativeLoop.finish``). Callers submit requests from any thread and read their events
from a queue; a request whose caller left is dropped at the next step, its slot freed.

Prompts are read in PREFILL_CHUNK-aligned chunks, at most ``PREFILL_TOKENS_BUSY`` tokens a
step while other slots are answering (a long prompt delays a streaming answer by one chunk
per step, never by its whole length), as much as a batch holds when no slot is answering. A
request goes to the free slot whose cache holds the longest prefix of its prompt (a
conversation's next turn lands where its history is cached), else the least recently used.
A prompt whose start another slot holds, or is reading, is not read twice: the request
waits for that read and copies that slot's cache (n answers to one prompt, requests under
one long system prompt).
"""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import numpy as np

from localspec.engine.budget import DraftDemand, allocate, predicted_gain
from localspec.engine.costs import VerifyCost
from localspec.engine.drafting import is_stepped
from localspec.engine.lookup_rest import LookupRest
from localspec.engine.loop import RoundEvent, RoundPlan, SpeculativeLoop
from localspec.engine.model_context import PREFILL_CHUNK, ModelContext, common_prefix_length
from localspec.engine.prompt_cache import MIN_TOKENS, PromptCache
from localspec.engine.side_by_side import PlannedRound, SideBySideDrafts
from localspec.engine.step_batch import BatchPart, StepBatch, padding, passes
from localspec.errors import LocalspecError

PREFILL_TOKENS_BUSY = 2 * PREFILL_CHUNK
# the predicted gain a slot that did not draft last step must add before a shared step
# verifies its draft (no flapping). A lone controller's 5% margin is too wide here: a shared
# step's gains are small fractions of a wide step, and a slot cut once stayed cut
# (docs/benchmarks.md: 1% of the wanted drafts verified at 4 clients, where fixed-length
# speculation gained 4%)
SHARED_STEP_MARGIN = 0.01
# the predicted gain a shared step must show to verify drafts at all, for each generation
# beside the first: a wide step's prediction is least sure (a curve calibrated on one
# sequence, the acceptance of the drafts it picked as the best), and where the gains are a
# few percent the errors decided (docs/benchmarks.md: 0.95x plain batching at 8 clients)
WIDE_STEP_MARGIN = 0.01
# what a resting draft model's drafts, all accepted, must add to a step before it wakes: it
# then reads its prompt and the answer so far, which flapping would pay again and again
WAKE_MARGIN = 0.05
# room a sequence must have left in its context to be priced as paddable (more than a draft)
PAD_ROOM = 64
# llama.cpp copies a sequence's whole cache, used or not (about 60 ms for the 0.5B's 4,096
# cells on a 2-core CPU, the read of some 20 prompt tokens): a copy must save the read of at
# least this share of a slot's context, and MIN_TOKENS
COPY_SHARE = 1 / 64
RECHECK_RESTS = 16  # steps a decision that every draft model rests is reused unpriced
DONE = object()  # the last item of a request's event queue
T = TypeVar("T")


@dataclass(frozen=True)
class _Result:
    """What ``BatchScheduler.call``'s work returned, in its request's queue."""

    value: Any


@dataclass
class SlotWork:
    """A started generation: its loop, and what to do once it ends (its drafter, grammar
    and memory)."""

    loop: SpeculativeLoop
    close: Callable[[], None]


@dataclass
class SlotRequest:
    """A generation waiting for (or holding) a slot. ``start(target, draft)`` runs on the
    scheduler's thread with the slot's sequences and returns the generation; its events,
    an exception, then ``DONE`` arrive in ``events``. A ``start`` that returns None did its
    whole work there (scoring a text in a free slot) and put its result in ``events``."""

    tokens: list[int]
    start: Callable[[ModelContext, ModelContext | None], SlotWork | None]
    cancelled: Callable[[], bool] | None = None
    reproducible: bool = False  # its prompt is read as afresh (``ModelContext.evaluate``)
    events: queue.SimpleQueue[object] = field(default_factory=queue.SimpleQueue)
    _left: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        """The caller has gone: the slot is freed at the next step."""
        self._left.set()

    def gone(self) -> bool:
        return self._left.is_set() or (self.cancelled is not None and self.cancelled())


@dataclass
class Slot:
    index: int
    target: ModelContext
    draft: ModelContext | None
    request: SlotRequest | None = None
    work: SlotWork | None = None
    pending: list[int] = field(default_factory=list)  # prompt tokens still to read
    kept: int = 0  # prompt tokens the cache already held
    drafting: bool = False  # its last round verified a draft (the budget's hysteresis)
    used_at: float = 0.0

    @property
    def answering(self) -> bool:
        return self.work is not None and not self.pending


@dataclass(frozen=True)
class StepFigures:
    """The last step, for /metrics and the server's log."""

    slots_busy: int = 0
    rows: int = 0
    drafted: int = 0  # draft tokens verified
    wanted: int = 0  # draft tokens the slots' controllers asked for
    prefill: int = 0
    resting: int = 0  # draft models resting: at this load their drafts could not pay


@dataclass
class StepTotals:
    """Counts since the engine loaded: steps, those shared by several generations, and the
    draft tokens the slots' controllers asked for and those verified in shared steps."""

    steps: int = 0
    shared_steps: int = 0
    rows: int = 0
    wanted_shared: int = 0
    drafted_shared: int = 0
    prompt_rows: int = 0  # prompt tokens read (what the slots' and the host caches lacked)
    moves: int = 0  # caches moved to close a gap between busy sequence ids
    copies: int = 0  # prompts copied from another slot's cache rather than read again
    pad_rows: int = 0  # rows decoded only to even a step's parts (one pass, not several)
    lookup_rests: int = 0  # shared steps whose lookups rested (``lookup_rest.py``)
    # the same two counts by how many generations answered in the step
    wanted_by_width: Counter[int] = field(default_factory=Counter)
    drafted_by_width: Counter[int] = field(default_factory=Counter)


class BatchScheduler:
    def __init__(
        self,
        target: ModelContext,
        draft: ModelContext | None,
        n_slots: int,
        cost: Callable[[], VerifyCost | None],
        prompt_cache: PromptCache | None = None,
    ) -> None:
        """``cost``: the target's calibrated cost curve once measured (None before);
        ``prompt_cache``: where a slot's cache goes when another prompt replaces it, and
        where a prompt's start is looked for beyond the slots."""
        self.slots = [
            Slot(i, target.sequence(i), draft.sequence(i) if draft is not None else None)
            for i in range(n_slots)
        ]
        self.cost = cost
        recurrent = target.max_rollback is not None  # its states are not saved and restored
        self.prompt_cache = None if recurrent else prompt_cache
        self.copies_caches = not recurrent  # one slot's cache into another (``copy_from``)
        self.figures = StepFigures()
        self.totals = StepTotals()
        self.resting = 0  # draft models resting now (``_rest_draft_models``)
        self._rested_beside: list[SpeculativeLoop] = []  # the generations they all rested beside
        self._rest_age = 0  # steps since that was priced
        self._lookups = LookupRest()
        self._batch = StepBatch(target)
        self.drafts = SideBySideDrafts(draft, len(self.slots), cost)
        self._waiting: deque[SlotRequest] = deque()
        self._changed = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None

    # ----- callers' side -------------------------------------------------------------------

    def submit(self, request: SlotRequest) -> None:
        with self._changed:
            if self._closed:
                raise LocalspecError("this Engine is closed", "load the model again")
            self._waiting.append(request)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="localspec-slots", daemon=True
                )
                self._thread.start()
            self._changed.notify_all()

    def call(self, tokens: list[int], work: Callable[[ModelContext, ModelContext | None], T]) -> T:
        """``work(target, draft)`` on the scheduler's thread, with a free slot's sequences
        (the one whose cache holds the longest prefix of ``tokens``): its result, or its
        exception, here. What decodes outside a generation runs there too: one thread
        computes (``compute_thread.py``)."""

        def start(target: ModelContext, draft: ModelContext | None) -> None:
            request.events.put(_Result(work(target, draft)))

        request = SlotRequest(tokens, start)
        self.submit(request)
        results = []
        while (item := request.events.get()) is not DONE:
            if isinstance(item, BaseException):
                raise item
            results.append(item.value)
        return results[0]  # type: ignore[no-any-return]

    @property
    def queued(self) -> int:
        return len(self._waiting)

    @property
    def busy(self) -> int:
        return sum(s.work is not None for s in self.slots)

    def close(self, timeout: float = 30.0) -> bool:
        """Stop: every request ends (its caller gets ``GenerationCancelled``-free ``DONE``
        after an error saying why); False if the thread is still in a step after
        ``timeout`` seconds."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                return False
        self._batch.free()
        self.drafts.free()
        return True

    # ----- the scheduler's thread ----------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._closed and not self._waiting and not self.busy:
                    self._changed.wait()
                if self._closed:
                    break
            try:
                self._admit()
                if self.busy:
                    self._step()
            except BaseException as exc:  # a bug of the step itself: no caller waits forever
                for slot in self.slots:
                    if slot.work is not None:
                        self._end(slot, exc)
        closing = LocalspecError("the engine was closed while this request ran")
        for slot in self.slots:
            if slot.work is not None:
                self._end(slot, closing)
        with self._changed:
            waiting, self._waiting = list(self._waiting), deque()
        for request in waiting:
            request.events.put(closing)
            request.events.put(DONE)

    def _admit(self) -> None:
        """Waiting requests into free slots, each where its prompt's prefix is cached; the
        ones whose prompt was read just before answer their first token once all are in
        (a draft model rests or not by the load they make together)."""
        self._drop_gone()  # a slot whose caller just left holds the prefix its next one wants
        ready: list[tuple[Slot, np.ndarray]] = []
        held: list[SlotRequest] = []  # waiting for a read under way of their prompt's start
        while True:
            with self._changed:
                free = [s for s in self.slots if s.work is None]
                if not free or not self._waiting:
                    break
                request = self._waiting.popleft()
            if request.gone():
                request.events.put(DONE)
                continue
            if self._read_elsewhere(request):
                held.append(request)
                continue
            slot = max(
                free,
                key=lambda s: (common_prefix_length(s.target.tokens, request.tokens), -s.used_at),
            )
            row = self._start(slot, request)
            if row is not None:
                ready.append((slot, row))
        if held:
            with self._changed:
                self._waiting.extendleft(reversed(held))
        if ready:
            self._rest_draft_models()
        for slot, row in ready:
            try:
                assert slot.work is not None
                self._emit(slot, slot.work.loop.first(row))
            except BaseException as exc:
                self._end(slot, exc)

    def _read_elsewhere(self, request: SlotRequest) -> bool:
        """Whether a slot is reading a prompt that starts as ``request``'s does, for enough
        more than any cache holds now (``_least_copied``): the request waits for that read
        (its slot then copies it) rather than reading the same tokens beside it."""
        if not self.copies_caches:
            return False
        tokens, reproducible = request.tokens, request.reproducible
        # a read as afresh serves any request; another, only those that are not
        reading = [
            s.request
            for s in self.slots
            if s.pending and s.request is not None and (s.request.reproducible or not reproducible)
        ]
        if not reading:
            return False
        held = max(s.target.reusable(tokens, reproducible) for s in self.slots)
        if self.prompt_cache is not None:
            held = max(held, self.prompt_cache.longest(tokens))
        least = self._least_copied()
        return any(common_prefix_length(r.tokens, tokens) - held >= least for r in reading)

    def _least_copied(self) -> int:
        """The fewest prompt tokens a copy of another slot's cache must save reading."""
        return max(MIN_TOKENS, int(self.slots[0].target.n_ctx * COPY_SHARE))

    def _copy_shared(self, slot: Slot, request: SlotRequest) -> None:
        """Give ``slot`` the cache of a busy slot that holds enough more of the request's
        prompt than its own (as the request may reuse it; ``_least_copied``): one copy where
        reading them would take a pass a chunk."""
        if not self.copies_caches:
            return
        tokens, reproducible = request.tokens, request.reproducible
        best, most = None, slot.target.reusable(tokens, reproducible) + self._least_copied() - 1
        for other in self.slots:
            if other is not slot and other.work is not None:
                shared = other.target.reusable(tokens, reproducible)
                if shared > most:
                    best, most = other, shared
        if best is not None:
            slot.target.copy_from(best.target)
            self.totals.copies += 1

    def _drop_gone(self) -> None:
        """Free the slots whose caller left (an editor's middle cut short by the server)."""
        for slot in self.slots:
            if slot.work is not None and slot.request is not None and slot.request.gone():
                self._end(slot)

    def _start(self, slot: Slot, request: SlotRequest) -> np.ndarray | None:
        """The request into ``slot``; the logits row after its prompt when the slot's
        cache kept it (the same prompt, read just before), else None: its prompt is read."""
        slot.request, slot.used_at, slot.drafting = request, time.monotonic(), False
        try:
            if self.prompt_cache is not None:
                self.prompt_cache.swap_in(slot.target, request.tokens)
            self._copy_shared(slot, request)
            slot.work = request.start(slot.target, slot.draft)
            if slot.work is None:  # done at once
                self._end(slot)
                return None
            loop = slot.work.loop
            slot.kept, row = slot.target.reuse_prefix(loop.prompt, loop.reproducible)
            loop.recorder.n_cached = slot.kept
            slot.pending = list(loop.prompt[slot.kept :]) if row is None else []
            return row
        except BaseException as exc:  # the request's own error (a bad grammar, a full cache)
            self._end(slot, exc)
            return None

    def _step(self) -> None:
        self._drop_gone()
        self._close_gaps()
        self._rest_draft_models()
        caps = self._paid_draft_caps()
        resting = self._lookups.resting(sum(s.answering for s in self.slots))
        if resting:  # a fixed length asked for is drafted all the same
            adaptive = [s.index for s in self.slots if s.answering and s.work.loop.spec.adaptive]
            caps = {**dict.fromkeys(adaptive, 0), **caps}
        plans = self._plans(caps)
        room = self._batch.capacity - sum(len(p.batch) for _, p in plans)
        chunks = self._chunks(room, busy=bool(plans))
        wanted = sum(len(p.draft) for _, p in plans)
        plans = self._budget(plans, chunks)
        parts = [BatchPart(s.target, p.batch, len(p.batch)) for s, p in plans]
        parts += [BatchPart(s.target, c, 1 if len(c) == len(s.pending) else 0) for s, c in chunks]
        if not parts:
            return
        parts = self._evened(parts, len(plans))
        t0 = time.perf_counter()
        try:
            rows = self._batch.decode(parts)
        except BaseException as exc:
            for slot, _ in [*plans, *chunks]:
                self._end(slot, exc)
            return
        step_s = time.perf_counter() - t0
        alone = len(parts) == 1
        cost = self.cost()
        rows_by_seq = {p.sequence.seq_id: p.rows for p in parts}
        # alone, its controller observes the step as ever; a step llama.cpp ran as several
        # passes is no point of the curve
        if cost is not None and not alone and len(self._passes(rows_by_seq)) == 1:
            cost.observe(sum(rows_by_seq.values()), step_s)
        told: list[float | None] = [None] * len(plans)
        if not alone and cost is not None and plans:  # each slot's share: its rows alone
            told = cost(np.array([len(plan.batch) for _, plan in plans])).tolist()
        for (slot, plan), part_rows, seconds in zip(plans, rows, told, strict=False):
            self._finish(slot, plan, part_rows, t0, seconds)
        for (slot, chunk), part_rows in zip(chunks, rows[len(plans) :], strict=True):
            self._prefilled(slot, chunk, part_rows)
        t = self.totals
        t.steps += 1
        t.prompt_rows += sum(len(c) for _, c in chunks)
        t.rows += sum(len(p.tokens) for p in parts)
        t.pad_rows += sum(p.pad for p in parts)
        drafted = sum(len(p.draft) for _, p in plans)
        t.wanted_by_width[len(plans)] += wanted
        t.drafted_by_width[len(plans)] += drafted
        if len(plans) > 1:
            if resting:
                t.lookup_rests += 1
            else:
                self._lookups.note(wanted, drafted)
            t.shared_steps += 1
            t.wanted_shared += wanted
            t.drafted_shared += drafted
        self.figures = StepFigures(
            self.busy,
            sum(len(p.tokens) for p in parts),
            sum(len(p.draft) for _, p in plans),
            wanted,
            sum(len(c) for _, c in chunks),
            self.resting,
        )

    def _close_gaps(self) -> None:
        """Keep the busy slots' sequence ids consecutive: llama.cpp runs a step in one pass
        only for sequences whose ids follow each other (``step_batch.passes``), so the last
        busy slot's cache moves into a free id below it (one copy of its cache, where the gap
        would cost a pass every step). Recurrent models' states are not moved."""
        if self.slots[0].target.max_rollback is not None:
            return
        while True:
            by_id = sorted(self.slots, key=lambda s: s.target.seq_id)
            busy = [s for s in by_id if s.work is not None]
            if len(busy) < 2 or busy[-1].target.seq_id - busy[0].target.seq_id < len(busy):
                return
            gap = next(s for s in by_id[by_id.index(busy[0]) :] if s.work is None)
            busy[-1].target.move_to(gap.target)
            self.totals.moves += 1

    def _plans(self, caps: dict[int, int]) -> list[tuple[Slot, RoundPlan]]:
        """Each answering slot's round (or its end, when its context is full); ``caps``: the
        draft lengths sized before drafting, by slot index. The rounds run side by side:
        a draft model's decodes of every slot at one draft position go in one batch."""
        rounds = []
        for slot in self.slots:
            if not slot.answering:
                continue
            assert slot.work is not None
            loop = slot.work.loop
            try:
                if loop.context_full():
                    self._emit(slot, loop.end_at_length())
                    continue
                rounds.append(PlannedRound(slot.index, loop.plan_steps(caps.get(slot.index))))
            except BaseException as exc:
                self._end(slot, exc)
        planned = self.drafts.plan(rounds, lambda i, exc: self._end(self.slots[i], exc))
        return [(self.slots[i], plan) for i, plan in planned]

    def _chunks(self, room: int, busy: bool) -> list[tuple[Slot, list[int]]]:
        """Prompt chunks for this step: aligned on PREFILL_CHUNK positions (as a reproducible
        evaluation reads them), oldest request first."""
        budget = min(room, PREFILL_TOKENS_BUSY) if busy else room
        chunks = []
        for slot in sorted((s for s in self.slots if s.pending), key=lambda s: s.used_at):
            position = slot.target.n_past
            size = PREFILL_CHUNK - position % PREFILL_CHUNK
            while size + PREFILL_CHUNK <= budget and size < len(slot.pending):
                size += PREFILL_CHUNK
            size = min(size, len(slot.pending))
            if size > budget:
                break
            chunks.append((slot, slot.pending[:size]))
            budget -= size
        return chunks

    def _passes(self, rows_by_seq: dict[int, int]) -> list[int]:
        return passes(rows_by_seq, self._batch.capacity, len(self.slots))

    def _priced(self, rows: dict[int, int], paddable: list[int], by_rows: list[float]) -> float:
        """What a step of ``rows[seq_id]`` rows costs as llama.cpp runs it, or evened by
        padding the ``paddable`` sequences where that costs less."""
        uneven = self._pass_seconds(rows, by_rows)
        evened = self._evened_rows(rows, paddable)
        return uneven if evened is None else min(uneven, self._pass_seconds(evened, by_rows))

    def _pass_seconds(self, rows: dict[int, int], by_rows: list[float]) -> float:
        """The curve (``by_rows``: seconds by row count) at each pass of such a step."""
        return sum(by_rows[n] for n in self._passes(rows))

    def _evened_rows(self, rows: dict[int, int], paddable: list[int]) -> dict[int, int] | None:
        """``rows`` with the ``paddable`` sequences padded to the longest of them; None
        when they are even already or the pads would not fit the batch."""
        pads = padding(rows, paddable)
        if not pads or sum(rows.values()) + sum(pads.values()) > self._batch.capacity:
            return None
        return {seq: n + pads.get(seq, 0) for seq, n in rows.items()}

    def _paddable(self, sequences: Sequence[ModelContext], rows: int = PAD_ROOM) -> list[int]:
        """The sequences that may take ``rows`` pad rows: room left in their context, and a
        cache that can forget them (not a recurrent state)."""
        return [
            seq.seq_id
            for seq in sequences
            if seq.max_rollback is None and seq.n_ctx - seq.n_past >= rows
        ]

    def _evened(self, parts: list[BatchPart], answering: int) -> list[BatchPart]:
        """The step's parts, the answering slots' ones padded to equal lengths where one
        pass of them costs less than llama.cpp's passes of uneven ones."""
        cost = self.cost()
        if cost is None or answering < 2:
            return parts
        rows = {p.sequence.seq_id: p.rows for p in parts}
        longest = max(p.rows for p in parts[:answering])
        evened = self._evened_rows(
            rows, self._paddable([p.sequence for p in parts[:answering]], longest)
        )
        if evened is None:
            return parts
        by_rows = cost(np.arange(self._batch.capacity + 1)).tolist()
        if self._pass_seconds(evened, by_rows) >= self._pass_seconds(rows, by_rows):
            return parts
        return [replace(p, pad=evened[p.sequence.seq_id] - p.rows) for p in parts]

    def _step_seconds(
        self,
        drafting: Sequence[Slot],
        chunks: list[tuple[Slot, list[int]]],
        cost: VerifyCost,
    ) -> Callable[[Sequence[int]], float]:
        """The step's predicted seconds for given draft lengths of the ``drafting`` slots:
        the curve at each pass llama.cpp will make of it, or of it evened by pad rows where
        that is cheaper (``_evened`` pads such a step)."""
        prefill = {slot.target.seq_id: len(chunk) for slot, chunk in chunks}
        answering = [slot.target.seq_id for slot in drafting]
        paddable = self._paddable([slot.target for slot in drafting]) if len(drafting) > 1 else []
        # the curve at every pass size, once a step: the budget asks for hundreds of steps
        by_rows = cost(np.arange(self._batch.capacity + 1)).tolist()

        def seconds(lengths: Sequence[int]) -> float:
            rows = dict(prefill)
            rows.update((seq, 1 + k) for seq, k in zip(answering, lengths, strict=True))
            return self._priced(rows, paddable, by_rows)

        return seconds

    def _paid_draft_caps(self) -> dict[int, int]:
        """Draft lengths for the slots whose drafter pays for every token (a draft model),
        sized by the budget before they draft when other generations share the step: a
        draft the step would cut costs its drafting all the same. The other slots count
        with their one row here; their drafts (lookups: free) are cut once made."""
        answering = [s for s in self.slots if s.answering]
        cost = self.cost()
        if cost is None or len(answering) < 2:
            return {}
        demands, paying = [], {}
        for slot in answering:
            assert slot.work is not None
            loop = slot.work.loop
            paid = loop.control.paid_draft() if loop.drafter is not None else None
            wanted = loop.draft_length() if paid is not None else 0
            if paid is None or not wanted:
                demands.append(DraftDemand(np.zeros(0), 0, pinned=0))
                continue
            acceptance, per_token = paid
            paying[slot.index] = len(demands)
            n_min = max(1, loop.spec.n_min)
            demands.append(DraftDemand(acceptance, wanted, per_token, slot.drafting, None, n_min))
        if not paying:
            return {}
        one_row = min(d.seconds_per_token for d in demands if d.cap)
        lengths = self._drafted_side_by_side(demands, answering, cost, SHARED_STEP_MARGIN, one_row)
        return {index: lengths[i] for index, i in paying.items()}

    def _drafted_side_by_side(
        self,
        demands: list[DraftDemand],
        slots: list[Slot],
        cost: VerifyCost,
        margin: float,
        one_row: float,
    ) -> list[int]:
        """The budget's lengths for ``slots``' drafts before a draft model makes them (side
        by side: its passes priced as well as the target's)."""
        return allocate(
            demands,
            len(slots),
            cost,
            self._batch.capacity,
            add_margin=margin,
            step_seconds=self._step_seconds(slots, [], cost),
            draft_seconds=self.drafts.seconds(cost, one_row),
        )

    def _rest_draft_models(self) -> None:
        """Tell each busy slot whose drafter pays for every token (a draft model) whether it
        rests: it does while not even drafts of which every token were accepted would pay
        for their drafting and their rows beside the other generations (a batch already as
        wide as pays). A resting draft model reads no prompt and makes no shadow checks,
        work nothing would use; it catches up when the load lets it draft again, or when it
        is left alone, if its drafts could still repay the catch-up. Without a calibrated
        curve or a draft cost (a controller starts from the calibration's), it works as
        ever."""
        busy = [s for s in self.slots if s.work is not None]
        loops = [s.work.loop for s in busy if s.work is not None]
        paid = [loop for loop in loops if is_stepped(loop.drafter)]
        if self._still_resting(loops):
            return
        known = [p[1] for loop in paid if (p := loop.control.paid_draft()) is not None]
        cost = self.cost()
        if cost is None or not known or len(loops) < 2:
            for loop in paid:  # alone, it wakes where its own drafts could repay the catch-up
                idle = loop.drafter_rests or not loop.drafter_begun
                loop.drafter_rests = idle and not loop.control.catch_up_pays(
                    loop.drafter_behind(), loop.tokens_left()
                )
            self._note_rests(loops, paid)
            return
        per_token = float(np.median(known))
        demands = [DraftDemand(np.zeros(0), 0, pinned=0) for _ in loops]
        for i, loop in enumerate(loops):
            if loop not in paid:
                continue
            if loop.drafter_rests and not loop.control.catch_up_pays(
                loop.drafter_behind(), loop.tokens_left()
            ):
                continue  # too near its end to repay the catch-up: it rests to the end
            cap = max(0, min(loop.spec.n_max, loop.target.n_ctx - loop.target.n_past - 1))
            demands[i] = DraftDemand(np.ones(cap), cap, per_token, not loop.drafter_rests)
        lengths = self._drafted_side_by_side(demands, busy, cost, WAKE_MARGIN, per_token)
        # computed only in a step where some prompt is still unread
        unread_any = any(not loop.drafter_begun for loop in paid)
        saved = self._saved_per_token(loops, demands, busy, cost, per_token) if unread_any else 0.0
        for loop, length in zip(loops, lengths, strict=True):
            if loop in paid:
                # a prompt not read yet is read only if the drafts expected at this load could
                # repay the read: every slot waits while the draft model reads
                unread = not loop.drafter_begun and not loop.control.catch_up_pays(
                    loop.drafter_behind(), loop.tokens_left(), saved
                )
                loop.drafter_rests = length == 0 or unread
        self._note_rests(loops, paid)

    def _still_resting(self, loops: list[SpeculativeLoop]) -> bool:
        """Whether the last decision holds without pricing it again: every draft model
        rested beside the same generations, and a rest only deepens while they run (fewer
        tokens left to repay a catch-up, more to catch up with). Priced again every
        RECHECK_RESTS steps all the same (the curve and the draft costs are refined)."""
        last = self._rested_beside
        if len(loops) != len(last) or any(a is not b for a, b in zip(loops, last, strict=True)):
            return False
        self._rest_age += 1
        return self._rest_age < RECHECK_RESTS

    def _note_rests(self, loops: list[SpeculativeLoop], paid: list[SpeculativeLoop]) -> None:
        self.resting = sum(loop.drafter_rests for loop in paid)
        all_rest = bool(paid) and self.resting == len(paid)
        self._rested_beside, self._rest_age = (loops if all_rest else []), 0

    def _saved_per_token(
        self,
        loops: list[SpeculativeLoop],
        awake: list[DraftDemand],
        slots: list[Slot],
        cost: VerifyCost,
        one_row: float,
    ) -> float:
        """What the drafts expected at this load save a drafting slot per token it writes:
        its share of the time the whole step saves against plain batched decoding. Each
        draft model that could draft (``awake``: those not resting to the end) drafts as
        its controller's acceptance estimates say (a new answer's: the prior) — not as if
        kept whole, which at a few generations would have every prompt read for drafts the
        budget then never verifies."""
        demands = []
        for loop, demand in zip(loops, awake, strict=True):
            paid = loop.control.paid_draft() if demand.cap else None
            if paid is None:
                demands.append(demand)
                continue
            demands.append(replace(demand, acceptance=paid[0], drafting=True))
        lengths = self._drafted_side_by_side(demands, slots, cost, 0.0, one_row)
        drafting = sum(length > 0 for length in lengths)
        if not drafting:
            return 0.0
        step_seconds = self._step_seconds(slots, [], cost)
        gain = predicted_gain(
            demands,
            len(slots),
            cost,
            lengths,
            step_seconds,
            self.drafts.seconds(cost, one_row),
        )
        plain_step = step_seconds([0] * len(slots))
        return plain_step * max(0.0, 1 - 1 / gain) / drafting

    def _budget(
        self,
        plans: list[tuple[Slot, RoundPlan]],
        chunks: list[tuple[Slot, list[int]]],
    ) -> list[tuple[Slot, RoundPlan]]:
        """Cut the drafts to what pays for the whole step (none cut when one generation is
        alone: its controller's choice is already the best for it)."""
        cost = self.cost()
        prefill_rows = sum(len(chunk) for _, chunk in chunks)
        if (
            cost is None
            or (len(plans) == 1 and not prefill_rows)
            or not any(p.draft for _, p in plans)
        ):
            return plans
        demands = []
        for slot, plan in plans:
            assert slot.work is not None
            odds = slot.work.loop.control.verification_odds(plan.draft) if plan.draft else None
            cap = len(plan.draft)
            if odds is None:
                demands.append(DraftDemand(np.zeros(0), cap, pinned=cap))
            else:
                demands.append(DraftDemand(odds, cap, drafting=slot.drafting, n_min=1))
        lengths = allocate(
            demands,
            len(plans) + prefill_rows,
            cost,
            self._batch.capacity,
            add_margin=SHARED_STEP_MARGIN,
            step_margin=WIDE_STEP_MARGIN * (len(plans) - 1),
            step_seconds=self._step_seconds([slot for slot, _ in plans], chunks, cost),
        )
        cut = []
        for (slot, plan), length in zip(plans, lengths, strict=True):
            assert slot.work is not None
            cut.append((slot, slot.work.loop.cut(plan, length)))
        return cut

    def _finish(
        self, slot: Slot, plan: RoundPlan, rows: np.ndarray, t0: float, told: float | None
    ) -> None:
        assert slot.work is not None
        slot.drafting = bool(plan.draft)
        try:
            self._emit(slot, slot.work.loop.finish(plan, rows, t0, told))
        except BaseException as exc:
            self._end(slot, exc)

    def _prefilled(self, slot: Slot, chunk: list[int], rows: np.ndarray) -> None:
        del slot.pending[: len(chunk)]
        assert slot.work is not None
        loop = slot.work.loop
        if slot.pending:
            if loop.reproducible:  # whole chunks at fixed positions so far: a copy may keep them
                slot.target.prefilled = slot.target.n_past
            return
        try:
            slot.target.note_prefilled(loop.prompt, slot.kept, rows[-1], loop.reproducible)
            self._emit(slot, loop.first(rows[-1]))
        except BaseException as exc:
            self._end(slot, exc)

    def _emit(self, slot: Slot, event: RoundEvent) -> None:
        assert slot.request is not None and slot.work is not None
        slot.request.events.put(event)
        if slot.work.loop.output.done:
            self._end(slot)

    def _end(self, slot: Slot, error: BaseException | None = None) -> None:
        """The slot's generation is over (finished, failed, or its caller left)."""
        request, work = slot.request, slot.work
        slot.request, slot.work, slot.pending, slot.drafting = None, None, [], False
        try:
            if work is not None:
                work.close()
        except BaseException as exc:
            error = error or exc
        if request is not None:
            if error is not None:
                request.events.put(error)
            request.events.put(DONE)
