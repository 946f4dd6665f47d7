"""`localspec bench --rate`: request latency when requests arrive at a given rate.

The concurrency bench keeps N clients busy (a closed loop: a client sends its next request
when its last answer came back), which measures throughput. A server's users do not wait
for each other: their requests arrive when they arrive, and what each one sees is how long
its answer took. Here the requests of a level arrive at random at ``rate`` requests per
second (a Poisson process: exponential gaps), each sent at its time whatever is still
running, queued by the server when its slots are busy (an open loop). What is measured is
each request's end-to-end latency from its arrival, as the background articles measure
speculation (it pays at a low request rate, where the machine has room, and costs at a high
one, where every rejected draft token delays the other requests).

Every configuration gets the same arrivals (the same times, prompts and seeds), scaled from
one sequence of unit gaps per repeat, so that two rates differ only by their speed. The
senders are the concurrency bench's (``concurrency.Sender``): localspec's configurations
and llama.cpp's server alike."""

from __future__ import annotations

import argparse
import math
import statistics
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from localspec.argtypes import distinct_list
from localspec.concurrency import (
    CONFIGS,
    LOAD_AWARE,
    NATIVE_PREFIX,
    PLAIN,
    Config,
    Request,
    Sender,
    Span,
    Timing,
    join_all,
    percentile,
    stop_all,
)

MAX_RATE = 1000.0  # requests per second: beyond that the sending threads are the load


def request_rate(item: str) -> float:
    """One item of ``--rate``: requests per second, above 0."""
    try:
        value = float(item)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{item!r} is not a rate (requests per second, e.g. 0.2)"
        ) from None
    if not (0 < value <= MAX_RATE and math.isfinite(value)):
        raise argparse.ArgumentTypeError(
            f"{item} requests per second is out of range: each must be above 0 and at most "
            f"{MAX_RATE:g}"
        )
    return value


rate_list = distinct_list(request_rate, "request rates per second such as 0.1,0.2,0.4")


@dataclass(frozen=True)
class Arrival:
    at_s: float  # seconds from the level's start
    request: Request


def arrival_plan(rate: float, n_requests: int, n_prompts: int, repeat: int) -> list[Arrival]:
    """``n_requests`` arrivals at ``rate`` per second, the first at 0: the repeat's unit
    exponential gaps over ``rate``. Request i asks prompt ``repeat + i`` (modulo the set),
    so that consecutive requests ask for different kinds of text."""
    gaps = np.random.default_rng(repeat).exponential(1.0, n_requests)
    gaps[0] = 0.0
    times = np.cumsum(gaps) / rate
    return [
        Arrival(float(t), Request((repeat + i) % n_prompts, 1000 * repeat + i))
        for i, t in enumerate(times)
    ]


def run_arrivals(send: Sender, plan: Sequence[Arrival], stop: threading.Event) -> Timing:
    """Send each request at its arrival time on a thread of its own (whatever is still
    running): the tokens generated, the wall time until the last answer, and each request's
    span from its arrival. A failure stops the sending and is raised here; so is Ctrl-C,
    once the requests in flight stopped (``stop``)."""
    spans: list[Span] = []
    errors: list[BaseException] = []
    threads: list[threading.Thread] = []

    def one(i: int, arrival: Arrival) -> None:
        try:
            n = send(arrival.request)
            spans.append(Span(i, arrival.at_s, time.perf_counter() - t0, n))
        except BaseException as exc:  # raised below, in the caller's thread
            errors.append(exc)
            stop.set()

    t0 = time.perf_counter()
    try:
        for i, arrival in enumerate(plan):
            if stop.wait(max(0.0, arrival.at_s - (time.perf_counter() - t0))):
                break
            thread = threading.Thread(
                target=one, args=(i, arrival), name=f"bench-request-{i}", daemon=True
            )
            thread.start()
            threads.append(thread)
    except KeyboardInterrupt:  # while waiting for the next arrival
        stop_all(threads, stop)
        raise
    join_all(threads, stop)
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return Timing(sum(s.tokens for s in spans), wall, tuple(sorted(spans, key=lambda s: s.client)))


@dataclass(frozen=True)
class RateRun:
    """One configuration's requests at one rate."""

    config: str
    rate: float
    repeat: int
    tokens: int
    wall_s: float
    latencies_s: tuple[float, ...]
    tokens_each: tuple[int, ...]

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0


def run_rate(
    configs: Sequence[Config],
    rate: float,
    n_requests: int,
    n_prompts: int,
    repeats: int,
    stop: threading.Event,
) -> Iterator[RateRun]:
    """Every configuration at one rate, ``repeats`` times, interleaved: each repeat sends
    the same arrivals to every configuration, the order rotated by the repeat."""
    for repeat in range(repeats):
        plan = arrival_plan(rate, n_requests, n_prompts, repeat)
        shift = repeat % len(configs)
        for config in [*configs[shift:], *configs[:shift]]:
            timing = run_arrivals(config.send, plan, stop)
            yield RateRun(
                config.name,
                rate,
                repeat,
                timing.tokens,
                timing.wall_s,
                timing.latencies_s,
                tuple(s.tokens for s in timing.spans),
            )


@dataclass(frozen=True)
class RatePoint:
    """One configuration at one rate, over its repeats: request latency from arrival."""

    config: str
    rate: float
    mean_s: float
    p50_s: float
    p95_s: float
    per_token_ms: float  # median of each request's latency over its tokens
    tokens_per_s: float  # every token over the runs' wall time (at most the offered load)
    requests: int

    def to_dict(self) -> dict[str, object]:
        return {
            "config": self.config,
            "rate": self.rate,
            "latency_mean_s": round(self.mean_s, 3),
            "latency_p50_s": round(self.p50_s, 3),
            "latency_p95_s": round(self.p95_s, 3),
            "latency_per_token_ms": round(self.per_token_ms, 2),
            "tokens_per_s": round(self.tokens_per_s, 2),
            "requests": self.requests,
        }


def summarise_rates(runs: Sequence[RateRun]) -> list[RatePoint]:
    """One point per configuration and rate, in the order they first ran."""
    keys = list(dict.fromkeys((r.config, r.rate) for r in runs))
    points = []
    for config, rate in keys:
        mine = [r for r in runs if (r.config, r.rate) == (config, rate)]
        latencies = [x for r in mine for x in r.latencies_s]
        per_token = [
            1000 * x / n
            for r in mine
            for x, n in zip(r.latencies_s, r.tokens_each, strict=True)
            if n > 0
        ]
        wall = sum(r.wall_s for r in mine)
        points.append(
            RatePoint(
                config,
                rate,
                statistics.fmean(latencies) if latencies else 0.0,
                percentile(latencies, 50),
                percentile(latencies, 95),
                statistics.median(per_token) if per_token else 0.0,
                sum(r.tokens for r in mine) / wall if wall > 0 else 0.0,
                len(latencies),
            )
        )
    return points


def mean_latencies(points: Sequence[RatePoint], config: str) -> dict[float, float]:
    return {p.rate: p.mean_s for p in points if p.config == config}


def rate_meaning(points: Sequence[RatePoint]) -> list[str]:
    """What the figures say, one line each: the quickest configuration at each rate, and
    load-aware speculation's mean latency against plain batching's and llama-server's best."""
    lines = []
    plain = mean_latencies(points, PLAIN)
    for rate in sorted({p.rate for p in points}):
        here = [p for p in points if p.rate == rate and p.config in CONFIGS]
        if here:
            best = min(here, key=lambda p: p.mean_s)
            lines.append(
                f"{rate:g} requests/s: {best.config} answers soonest "
                f"(mean {best.mean_s:.2f} s, p95 {best.p95_s:.2f} s)"
            )
        mine = next((p for p in here if p.config == LOAD_AWARE), None)
        if mine is None:
            continue
        versus = []
        if plain.get(rate):
            versus.append(f"{plain[rate] / mine.mean_s:.2f}x sooner than plain batching")
        native = [p for p in points if p.rate == rate and p.config.startswith(NATIVE_PREFIX)]
        fastest = min(native, key=lambda p: p.mean_s, default=None)
        if fastest is not None and mine.mean_s > 0:
            versus.append(
                f"{fastest.mean_s / mine.mean_s:.2f}x sooner than llama-server's best "
                f"({fastest.config})"
            )
        if versus:
            lines.append(f"{rate:g} requests/s: load-aware {', '.join(versus)} (mean latency)")
    return lines
