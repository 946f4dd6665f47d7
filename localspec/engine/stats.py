"""Statistics of one generation: what was drafted, what was accepted, where the time went.

Counts follow llama.cpp's definitions: ``drafted`` is its "#gen tokens" (draft tokens sent
to verification), ``accepted`` its "#acc tokens". Tokens cut off by a stop (EOS, stop
string, max_tokens) are not counted as accepted, so the counts always equal what can be
recomputed from the emitted tokens: ``accepted == number of emitted tokens from a draft``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class Stats:
    """A snapshot of the running statistics (carried by every RoundEvent)."""

    n_prompt: int = 0
    n_cached: int = 0  # prompt tokens whose cache was reused (not read again)
    n_tokens: int = 0  # emitted tokens
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0  # target passes after the prompt
    verifications: int = 0  # rounds that verified a non-empty draft
    drafted_at: tuple[int, ...] = ()  # per draft position i (0-based): how often it was drafted
    accepted_at: tuple[int, ...] = ()  # ... and how often it was accepted
    prefill_ms: float = 0.0
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    ttft_ms: float = 0.0
    gen_ms: float = 0.0  # time after the prompt was processed
    draft_length: int = 0  # the adaptive controller's draft length now
    paused: bool = False  # the adaptive controller has paused speculation
    pauses: int = 0
    shadow_checks: int = 0  # guesses scored against the target while paused
    # per drafter (a chain has several): (name, drafted, accepted, verifications)
    by_drafter: tuple[tuple[str, int, int, int], ...] = ()

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def acceptance_per_position(self) -> tuple[float, ...]:
        return tuple(
            a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at, strict=True)
        )

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens gained per verification: accepted drafts per verification + 1."""
        return 1.0 + self.accepted / self.verifications if self.verifications else 1.0

    @property
    def tokens_per_s(self) -> float:
        """Generation speed, prompt processing excluded (as llama.cpp's "eval time"); 0 for
        a single token, which comes with the prompt's pass (its time is only sampling)."""
        timed = self.gen_ms > 0 and self.n_tokens > 1
        return self.n_tokens / (self.gen_ms / 1000) if timed else 0.0

    def by_drafter_dict(self) -> dict[str, dict[str, float]]:
        """Per drafter of a chain: what it drafted, what was kept, in how many verifications."""
        return {
            name: {
                "drafted": drafted,
                "accepted": accepted,
                "verifications": verifications,
                "acceptance_rate": round(accepted / drafted, 4) if drafted else 0.0,
            }
            for name, drafted, accepted, verifications in self.by_drafter
        }

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["drafted_at"] = list(self.drafted_at)
        data["accepted_at"] = list(self.accepted_at)
        data["by_drafter"] = self.by_drafter_dict()
        data.update(
            acceptance_rate=round(self.acceptance_rate, 4),
            acceptance_per_position=[round(a, 4) for a in self.acceptance_per_position],
            mean_acceptance_length=round(self.mean_acceptance_length, 4),
            tokens_per_s=round(self.tokens_per_s, 3),
        )
        for key in ("prefill_ms", "draft_ms", "verify_ms", "ttft_ms", "gen_ms"):
            data[key] = round(data[key], 3)
        return data


def combined(parts: Sequence[Stats]) -> Stats:
    """The stats of generations of one prompt that ran side by side (a request's several
    choices): the prompt counted once, what was generated and drafted summed, the times as
    the longest took (they ran together; the speed is then the request's)."""
    first = parts[0]
    if len(parts) == 1:
        return first

    def summed(name: str) -> Any:
        return sum(getattr(p, name) for p in parts)

    def by_position(name: str) -> tuple[int, ...]:
        rows = [getattr(p, name) for p in parts]
        width = max(len(r) for r in rows)
        return tuple(sum(r[i] for r in rows if i < len(r)) for i in range(width))

    drafters: dict[str, list[int]] = {}
    for p in parts:
        for name, *counts in p.by_drafter:
            total = drafters.setdefault(name, [0, 0, 0])
            for i, count in enumerate(counts):
                total[i] += count
    times = ("prefill_ms", "draft_ms", "verify_ms", "ttft_ms", "gen_ms")
    return replace(
        first,
        **{name: summed(name) for name in ("n_tokens", "drafted", "accepted", "rounds")},
        **{name: summed(name) for name in ("verifications", "pauses", "shadow_checks")},
        **{name: max(getattr(p, name) for p in parts) for name in times},
        drafted_at=by_position("drafted_at"),
        accepted_at=by_position("accepted_at"),
        paused=any(p.paused for p in parts),
        by_drafter=tuple((name, *counts) for name, counts in drafters.items()),  # type: ignore[misc]
    )


@dataclass
class StatsRecorder:
    """Mutable counters for the loop; ``snapshot()`` freezes them into ``Stats``."""

    n_prompt: int = 0
    n_cached: int = 0
    n_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0
    verifications: int = 0
    drafted_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)
    by_drafter: dict[str, list[int]] = field(default_factory=dict)
    draft_s: float = 0.0
    verify_s: float = 0.0
    t_start: float = field(default_factory=time.perf_counter)
    t_prefilled: float | None = None
    t_first: float | None = None

    def record_round(self, n_drafted: int, n_accepted: int, drafter: str = "") -> None:
        """One verification pass: ``n_accepted`` of ``n_drafted`` tokens were kept and emitted
        (``drafter``: who drafted them)."""
        self.rounds += 1
        if n_drafted == 0:
            return
        self.verifications += 1
        counts = self.by_drafter.setdefault(drafter, [0, 0, 0])
        counts[0] += n_drafted
        counts[1] += n_accepted
        counts[2] += 1
        self.drafted += n_drafted
        self.accepted += n_accepted
        while len(self.drafted_at) < n_drafted:
            self.drafted_at.append(0)
            self.accepted_at.append(0)
        for i in range(n_drafted):
            self.drafted_at[i] += 1
        for i in range(n_accepted):
            self.accepted_at[i] += 1

    def snapshot(
        self, draft_length: int = 0, paused: bool = False, pauses: int = 0, shadow_checks: int = 0
    ) -> Stats:
        now = time.perf_counter()
        prefilled = self.t_prefilled or now
        return Stats(
            n_prompt=self.n_prompt,
            n_cached=self.n_cached,
            n_tokens=self.n_tokens,
            drafted=self.drafted,
            accepted=self.accepted,
            rounds=self.rounds,
            verifications=self.verifications,
            drafted_at=tuple(self.drafted_at),
            accepted_at=tuple(self.accepted_at),
            prefill_ms=(prefilled - self.t_start) * 1000,
            draft_ms=self.draft_s * 1000,
            verify_ms=self.verify_s * 1000,
            ttft_ms=((self.t_first or now) - self.t_start) * 1000,
            gen_ms=(now - prefilled) * 1000,
            draft_length=draft_length,
            paused=paused,
            pauses=pauses,
            shadow_checks=shadow_checks,
            by_drafter=tuple((name, *counts) for name, counts in self.by_drafter.items()),  # type: ignore[misc]
        )
