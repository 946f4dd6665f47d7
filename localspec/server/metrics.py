"""Prometheus metrics of the server (its own registry, so several apps can coexist)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from localspec.engine.scheduler import StepFigures
from localspec.engine.stats import Stats


class ServerMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "localspec_requests", "HTTP requests", ["endpoint", "status"], registry=r
        )
        self.prompt_tokens = Counter("localspec_prompt_tokens", "prompt tokens", registry=r)
        self.tokens = Counter("localspec_generated_tokens", "generated tokens", registry=r)
        self.drafted = Counter("localspec_drafted_tokens", "drafted tokens verified", registry=r)
        self.accepted = Counter("localspec_accepted_tokens", "drafted tokens accepted", registry=r)
        self.verifications = Counter("localspec_verifications", "draft verifications", registry=r)
        self.drafted_at = Counter(
            "localspec_drafted_at_position",
            "tokens drafted at each draft position",
            ["position"],
            registry=r,
        )
        self.accepted_at = Counter(
            "localspec_accepted_at_position",
            "tokens accepted at each draft position",
            ["position"],
            registry=r,
        )
        self.acceptance_at = Gauge(
            "localspec_acceptance_per_position",
            "acceptance rate at each draft position (all requests)",
            ["position"],
            registry=r,
        )
        self.mean_acceptance_length = Gauge(
            "localspec_mean_acceptance_length",
            "accepted tokens per verification + 1 (all requests)",
            registry=r,
        )
        self.tokens_per_s = Histogram(
            "localspec_tokens_per_second",
            "generation speed per request",
            buckets=(1, 2, 5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 500),
            registry=r,
        )
        self.queue_depth = Gauge(
            "localspec_queue_depth", "requests waiting for the engine", registry=r
        )
        self.slots = Gauge("localspec_slots", "parallel slots (--parallel)", registry=r)
        self.slots_busy = Gauge(
            "localspec_slots_busy", "slots holding a generation (last step)", registry=r
        )
        self.batch_rows = Gauge(
            "localspec_batch_rows", "rows decoded together in the last step", registry=r
        )
        self.draft_budget = Gauge(
            "localspec_draft_budget",
            "draft tokens verified in the last step (the load-aware budget's choice)",
            registry=r,
        )
        self.draft_wanted = Gauge(
            "localspec_draft_wanted",
            "draft tokens the slots' controllers asked for in the last step",
            registry=r,
        )
        self.drafts_resting = Gauge(
            "localspec_draft_models_resting",
            "slots whose draft model rests at this load (its drafts could not pay; last step)",
            registry=r,
        )
        self._totals = [0.0, 0.0]  # accepted, verifications
        self._at: dict[int, list[int]] = {}

    def record_step(self, slots: int, figures: StepFigures | None) -> None:
        """The scheduler's last step (None: one generation at a time, no scheduler)."""
        self.slots.set(slots)
        if figures is not None:
            self.slots_busy.set(figures.slots_busy)
            self.batch_rows.set(figures.rows)
            self.draft_budget.set(figures.drafted)
            self.draft_wanted.set(figures.wanted)
            self.drafts_resting.set(figures.resting)

    def record(self, stats: Stats) -> None:
        self.prompt_tokens.inc(stats.n_prompt)
        self.tokens.inc(stats.n_tokens)
        self.drafted.inc(stats.drafted)
        self.accepted.inc(stats.accepted)
        self.verifications.inc(stats.verifications)
        if stats.tokens_per_s:
            self.tokens_per_s.observe(stats.tokens_per_s)
        for i, (d, a) in enumerate(zip(stats.drafted_at, stats.accepted_at, strict=True), 1):
            self.drafted_at.labels(str(i)).inc(d)
            self.accepted_at.labels(str(i)).inc(a)
            totals = self._at.setdefault(i, [0, 0])
            totals[0] += d
            totals[1] += a
            self.acceptance_at.labels(str(i)).set(totals[1] / totals[0] if totals[0] else 0)
        self._totals[0] += stats.accepted
        self._totals[1] += stats.verifications
        if self._totals[1]:
            self.mean_acceptance_length.set(1 + self._totals[0] / self._totals[1])
