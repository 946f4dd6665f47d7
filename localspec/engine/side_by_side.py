"""The slots' rounds planned side by side, so that a draft model drafts for all of them at
once: one decode of the draft model per draft position, with a row for every slot still
drafting, where drafting one slot after another would reload the draft's weights once per
slot and position.

Each slot's round is a generator (``SpeculativeLoop.plan_steps``) that yields the draft
decodes it needs (``DecodeRequest``); the rounds are advanced together, their requests of
one position decoded in one batch (``StepBatch`` on the draft context), and each round is
given its drafting time: its own work, and its share of the shared decodes by rows. What a
pass of n rows costs the draft model (``DraftPassCost``) prices the drafts the scheduler's
budget sizes before they are made.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from localspec.engine.costs import DraftPassCost, VerifyCost
from localspec.engine.drafting import DecodeRequest, Steps
from localspec.engine.loop import RoundPlan
from localspec.engine.model_context import ModelContext
from localspec.engine.step_batch import BatchPart, StepBatch


@dataclass
class PlannedRound:
    """A slot's round being planned: its steps, the draft decode it waits for, its plan
    once made, and the drafting time that is its own."""

    slot: int
    steps: Steps[RoundPlan]
    request: DecodeRequest | None = None
    plan: RoundPlan | None = None
    spent: float = 0.0


class SideBySideDrafts:
    """``draft``: the draft model's context (None: no drafter decodes anything); ``cost``:
    the target's calibrated curve once measured, the shape a draft pass is priced by."""

    def __init__(
        self,
        draft: ModelContext | None,
        n_slots: int,
        cost: Callable[[], VerifyCost | None],
    ) -> None:
        self.n_slots = n_slots
        self.cost = cost
        self.passes = DraftPassCost()
        self.decodes = 0  # draft decodes shared by several slots' drafts
        self.rows = 0  # and the rows they held
        self._batch = StepBatch(draft) if draft is not None else None

    def plan(
        self, rounds: list[PlannedRound], failed: Callable[[int, BaseException], None]
    ) -> list[tuple[int, RoundPlan]]:
        """Every round to its plan (``failed(slot, error)`` for one that raised), the plans
        by slot, each with its own drafting time."""
        waiting = [r for r in rounds if self._advance(r, None, failed)]
        while waiting:
            rows = self._decode(waiting, failed)
            waiting = [
                r for r, row in zip(waiting, rows, strict=True) if self._advance(r, row, failed)
            ]
        return [(r.slot, replace(r.plan, draft_s=r.spent)) for r in rounds if r.plan is not None]

    def seconds(self, cost: VerifyCost, one_row: float) -> Callable[[Sequence[int]], float]:
        """What drafting the given lengths costs (one per slot, 0: none) when the draft
        model drafts for every slot at once: a pass per draft position, as wide as the
        slots still drafting there. ``one_row``: the one-row step before any was timed."""
        by_rows = [
            self.passes.seconds(n, cost, one_row) if n else 0.0 for n in range(self.n_slots + 1)
        ]

        def seconds(lengths: Sequence[int]) -> float:
            drafting = sorted((k for k in lengths if k), reverse=True)
            total, position = 0.0, 0
            for width in range(len(drafting), 0, -1):  # the widest passes come first
                deepest = drafting[width - 1]
                total += by_rows[width] * (deepest - position)
                position = deepest
            return total

        return seconds

    def free(self) -> None:
        if self._batch is not None:
            self._batch.free()

    def _advance(
        self,
        round_: PlannedRound,
        row: np.ndarray | None,
        failed: Callable[[int, BaseException], None],
    ) -> bool:
        """Run a round to its next draft decode (True) or to its plan (False)."""
        t0 = time.perf_counter()
        try:
            round_.request = round_.steps.send(row)  # type: ignore[arg-type]
            return True
        except StopIteration as done:
            round_.plan = done.value
            return False
        except BaseException as exc:
            failed(round_.slot, exc)
            return False
        finally:
            round_.spent += time.perf_counter() - t0

    def _decode(
        self, rounds: list[PlannedRound], failed: Callable[[int, BaseException], None]
    ) -> list[np.ndarray | None]:
        """The rows for the rounds' requests: one decode for all that fit a batch, any other
        alone (a long catch-up, or the only round drafting). A failed decode fails the
        rounds it served (None)."""
        assert self._batch is not None
        rows: list[np.ndarray | None] = [None] * len(rounds)
        shared: list[int] = []
        room = self._batch.capacity
        for i, r in enumerate(rounds):
            assert r.request is not None
            if len(r.request.tokens) <= room and len(rounds) > 1:
                shared.append(i)
                room -= len(r.request.tokens)
                continue
            t0 = time.perf_counter()
            try:
                rows[i] = r.request.sequence.decode(r.request.tokens)[0].copy()
            except BaseException as exc:
                failed(r.slot, exc)
                continue
            r.spent += time.perf_counter() - t0
            self._timed(len(r.request.tokens), time.perf_counter() - t0)
        if shared:
            self._decode_together([rounds[i] for i in shared], shared, rows, failed)
        return rows

    def _decode_together(
        self,
        rounds: list[PlannedRound],
        at: list[int],
        rows: list[np.ndarray | None],
        failed: Callable[[int, BaseException], None],
    ) -> None:
        assert self._batch is not None
        parts = []
        for r in rounds:
            assert r.request is not None
            parts.append(BatchPart(r.request.sequence, r.request.tokens, 1))
        t0 = time.perf_counter()
        try:
            decoded = self._batch.decode(parts)
        except BaseException as exc:
            for r in rounds:
                failed(r.slot, exc)
            return
        elapsed = time.perf_counter() - t0
        total = sum(len(p.tokens) for p in parts)
        self._timed(total, elapsed)
        for i, r, part, part_rows in zip(at, rounds, parts, decoded, strict=True):
            rows[i] = part_rows[0].copy()  # views of one buffer: the next decode overwrites it
            r.spent += elapsed * len(part.tokens) / total
        self.decodes += 1
        self.rows += total

    def _timed(self, rows: int, seconds: float) -> None:
        cost = self.cost()
        if cost is not None and rows <= self.n_slots:  # a catch-up is no drafting pass
            self.passes.observe(rows, seconds, cost)
