"""`localspec bench --concurrency`: throughput and latency with several clients at once.

N client threads each send requests in a closed loop (the next one as soon as its last
answer came back) over a mixed prompt set, against one Engine loaded with as many parallel
slots as the largest N. What is compared at each N: plain batched decoding, fixed-length
speculation and the load-aware speculation (drafts cut to what pays for the whole step,
``engine/budget.py``): speculation wins alone, where a step's cost hardly grows with its
rows, and loses where a shared step is already compute-bound and every rejected draft token
is paid for by the other clients. Where plain batching overtakes fixed speculation (the
crossover) says where that happens on this machine.

A batch is one configuration's N clients sending their requests; its throughput is every
generated token over its wall time. A batch ends with a drain: clients that sent their last
request wait for the others, and fewer than N requests run. Speculation that finishes some
requests early lengthens that drain (the requests left are those it could not speed), so
the batch's throughput is also given *in flight*: over the time every client still had
work, the whole load the bench names. Within each concurrency the configurations run the same
requests, in an order that rotates with the repeat, so that a machine slowing down (another
process, a burstable VM) does not always fall on the same one. The senders are plain
callables, so the same measurement drives llama.cpp's own server (``native_server.py``)."""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from localspec.argtypes import MAX_SLOTS, distinct_list
from localspec.progress import plural

if TYPE_CHECKING:
    from localspec.api import Engine
    from localspec.engine.loop import SpecConfig
    from localspec.engine.settings import GenerationSettings
    from localspec.prompts import PromptCase

PLAIN, FIXED, LOAD_AWARE = "plain", "fixed", "load-aware"
NOTABLE_SPREAD = 0.05  # a spread of plain batching's repeats worth a line of its own
CONFIGS = (PLAIN, FIXED, LOAD_AWARE)
NATIVE_PREFIX = "native "  # llama-server's configurations: "native plain", "native ngram-simple"
MAX_CONCURRENCY = MAX_SLOTS  # as many as an Engine has slots
STOP_WAIT_S = 10.0  # after Ctrl-C, how long the clients' requests get to end


def client_count(item: str) -> int:
    """One item of ``--concurrency``: a whole number of clients, 1..MAX_CONCURRENCY."""
    try:
        value = int(item)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{item!r} is not a whole number of clients (e.g. 1,2,4,8)"
        ) from None
    if not 1 <= value <= MAX_CONCURRENCY:
        raise argparse.ArgumentTypeError(
            f"{value} clients is out of range: each must be between 1 and {MAX_CONCURRENCY}"
        )
    return value


concurrency_list = distinct_list(client_count, "client counts such as 1,2,4,8")


# ----- the requests ----------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    prompt: int  # index into the prompt set
    seed: int  # a sampled answer's draw: the same in every configuration


def client_plan(
    n_clients: int, per_client: int, n_prompts: int, repeat: int
) -> list[list[Request]]:
    """Each client's requests: client c's j-th request is prompt ``repeat + c + j * N``
    (modulo the set), so that N clients at once ask for different kinds of text, and a
    repeat shifts which client gets which prompt."""
    return [
        [
            Request((repeat + c + j * n_clients) % n_prompts, 1000 * repeat + 100 * c + j)
            for j in range(per_client)
        ]
        for c in range(n_clients)
    ]


Sender = Callable[[Request], int]  # sends one request, returns the tokens generated


@dataclass(frozen=True)
class Config:
    """One configuration under test. ``counters``: (wanted, verified) draft tokens of shared
    steps so far (``StepTotals``), for the share of wanted drafts a shared step kept."""

    name: str
    send: Sender
    counters: Callable[[], tuple[int, int]] | None = None


@dataclass(frozen=True)
class Span:
    """One request as its client saw it: when it was sent and answered (seconds from the
    batch's start), and the tokens it generated."""

    client: int
    start_s: float
    end_s: float
    tokens: int


@dataclass(frozen=True)
class Timing:
    """What a batch's clients measured."""

    tokens: int
    wall_s: float
    spans: tuple[Span, ...]

    @property
    def latencies_s(self) -> tuple[float, ...]:
        return tuple(s.end_s - s.start_s for s in self.spans)

    def in_flight_tokens_per_s(self) -> float:
        """Tokens per second while every client still had work: up to the first answer
        after which a client had nothing left to send. A request running across that
        moment counts the share of its tokens that its time before it holds (its tokens
        spread evenly over it; no client streams to say more)."""
        clients = {s.client for s in self.spans}
        if not clients:
            return 0.0
        until = min(max(s.end_s for s in self.spans if s.client == c) for c in clients)
        tokens = 0.0
        for s in self.spans:
            took = s.end_s - s.start_s
            inside = min(s.end_s, until) - s.start_s
            if inside > 0:
                tokens += s.tokens * (inside / took if took > 0 else 1.0)
        return tokens / until if until > 0 else 0.0


@dataclass(frozen=True)
class BatchRun:
    """One configuration's N clients, each sending its requests."""

    config: str
    concurrency: int
    repeat: int
    tokens: int
    wall_s: float
    latencies_s: tuple[float, ...]
    wanted_shared: int = 0  # draft tokens asked for in shared steps
    drafted_shared: int = 0  # of those, the ones verified
    in_flight_tokens_per_s: float = 0.0  # while every client had work (``Timing``)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0


def run_batch(send: Sender, plan: Sequence[Sequence[Request]], stop: threading.Event) -> Timing:
    """One thread per client, each sending its requests back to back: the tokens generated,
    the wall time of the whole batch and each request's span. A client's failure stops the
    others and is raised here; so is Ctrl-C, once the clients stopped (``stop``)."""
    spans: list[Span] = []
    errors: list[BaseException] = []

    def client(c: int) -> None:
        try:
            for request in plan[c]:
                if stop.is_set():
                    return
                start = time.perf_counter() - t0
                n = send(request)
                spans.append(Span(c, start, time.perf_counter() - t0, n))
        except BaseException as exc:  # raised below, in the caller's thread
            errors.append(exc)
            stop.set()

    threads = [
        threading.Thread(target=client, args=(c,), name=f"bench-client-{c}", daemon=True)
        for c in range(len(plan))
    ]
    t0 = time.perf_counter()
    for thread in threads:
        thread.start()
    join_all(threads, stop)
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return Timing(sum(s.tokens for s in spans), wall, tuple(spans))


def join_all(threads: Sequence[threading.Thread], stop: threading.Event) -> None:
    """Wait for the requests' threads. Ctrl-C sets ``stop``, gives the requests in flight
    STOP_WAIT_S to end (their senders see ``stop``), and is raised."""
    try:
        for thread in threads:
            thread.join()
    except KeyboardInterrupt:
        stop_all(threads, stop)
        raise


def stop_all(threads: Sequence[threading.Thread], stop: threading.Event) -> None:
    """Ctrl-C: set ``stop`` and give the requests in flight STOP_WAIT_S to end."""
    stop.set()
    deadline = time.monotonic() + STOP_WAIT_S
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))


def run_level(
    configs: Sequence[Config],
    n_clients: int,
    per_client: int,
    n_prompts: int,
    repeats: int,
    stop: threading.Event,
) -> Iterator[BatchRun]:
    """Every configuration at one concurrency, ``repeats`` times, interleaved: each repeat
    runs the same requests in every configuration, the order rotated by the repeat."""
    for repeat in range(repeats):
        plan = client_plan(n_clients, per_client, n_prompts, repeat)
        shift = repeat % len(configs)
        for config in [*configs[shift:], *configs[:shift]]:
            before = config.counters() if config.counters else (0, 0)
            timing = run_batch(config.send, plan, stop)
            after = config.counters() if config.counters else (0, 0)
            yield BatchRun(
                config.name,
                n_clients,
                repeat,
                timing.tokens,
                timing.wall_s,
                timing.latencies_s,
                after[0] - before[0],
                after[1] - before[1],
                timing.in_flight_tokens_per_s(),
            )


# ----- localspec's configurations --------------------------------------------------------


def engine_configs(
    engine: Engine,
    prompts: Sequence[PromptCase],
    settings: GenerationSettings,
    mode: str,
    spec: SpecConfig,
    stop: threading.Event,
) -> list[Config]:
    """plain (mode none), fixed (``mode`` drafting ``spec.n_max`` every round) and load-aware
    (``mode`` with the adaptive controller, whose drafts a shared step cuts to what pays)."""
    counters = None
    if engine.parallel > 1:
        totals = engine.scheduler().totals

        def counters() -> tuple[int, int]:
            return totals.wanted_shared, totals.drafted_shared

    def sender(s: GenerationSettings) -> Sender:
        def send(request: Request) -> int:
            prompt = prompts[request.prompt]
            n = 0
            one = s.but(seed=request.seed, grammar=prompt.grammar)
            events = engine.stream(prompt.messages, one)
            with closing(events):  # leaving early (Ctrl-C) frees the slot at once
                for event in events:
                    n += len(event.tokens)
                    if stop.is_set():
                        break
            return n

        return send

    fixed = settings.but(mode=mode, spec=replace(spec, adaptive=False))
    load_aware = settings.but(mode=mode, spec=replace(spec, adaptive=True))
    return [
        Config(PLAIN, sender(settings.but(mode="none")), counters),
        Config(FIXED, sender(fixed), counters),
        Config(LOAD_AWARE, sender(load_aware), counters),
    ]


# ----- the summary -----------------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    """One configuration at one concurrency, over its repeats."""

    config: str
    concurrency: int
    tokens_per_s: float  # median of the batches' aggregate tok/s
    tokens_per_s_min: float
    tokens_per_s_max: float
    p50_s: float  # request latency percentiles, every request of every repeat
    p95_s: float
    requests: int
    shared_draft: float | None  # verified / wanted draft tokens in shared steps (None: none)
    in_flight: float = 0.0  # median of the batches' tok/s while every client had work

    def speed(self, in_flight: bool = False) -> float:
        """Its aggregate tok/s, or its tok/s in flight."""
        return self.in_flight if in_flight else self.tokens_per_s

    def to_dict(self) -> dict[str, object]:
        return {
            "config": self.config,
            "concurrency": self.concurrency,
            "tokens_per_s": round(self.tokens_per_s, 2),
            "tokens_per_s_min": round(self.tokens_per_s_min, 2),
            "tokens_per_s_max": round(self.tokens_per_s_max, 2),
            "latency_p50_s": round(self.p50_s, 3),
            "latency_p95_s": round(self.p95_s, 3),
            "requests": self.requests,
            "in_flight_tokens_per_s": round(self.in_flight, 2),
            "shared_draft_share": (
                None if self.shared_draft is None else round(self.shared_draft, 3)
            ),
        }


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default); 0 for no values."""
    return float(np.percentile(values, q)) if len(values) else 0.0


def summarise(runs: Sequence[BatchRun]) -> list[Point]:
    """One point per configuration and concurrency, in the order they first ran."""
    keys = list(dict.fromkeys((r.config, r.concurrency) for r in runs))
    points = []
    for config, n in keys:
        mine = [r for r in runs if (r.config, r.concurrency) == (config, n)]
        speeds = [r.tokens_per_s for r in mine]
        latencies = [x for r in mine for x in r.latencies_s]
        wanted = sum(r.wanted_shared for r in mine)
        points.append(
            Point(
                config,
                n,
                statistics.median(speeds),
                min(speeds),
                max(speeds),
                percentile(latencies, 50),
                percentile(latencies, 95),
                len(latencies),
                sum(r.drafted_shared for r in mine) / wanted if wanted else None,
                statistics.median(r.in_flight_tokens_per_s for r in mine),
            )
        )
    return points


def speeds(points: Sequence[Point], config: str, in_flight: bool = False) -> dict[int, float]:
    """Per concurrency, ``config``'s aggregate tok/s (or its tok/s in flight)."""
    return {p.concurrency: p.speed(in_flight) for p in points if p.config == config}


def crossover(points: Sequence[Point], fast: str = PLAIN, slow: str = FIXED) -> int | None:
    """The smallest concurrency where ``fast`` (plain batching) beats ``slow`` (fixed
    speculation) in aggregate tok/s; None where it never does (or either is missing)."""
    a, b = speeds(points, fast), speeds(points, slow)
    return next((n for n in sorted(a) if n in b and a[n] > b[n]), None)


def native_ratios(points: Sequence[Point], in_flight: bool = False) -> dict[int, tuple[float, str]]:
    """Per concurrency: localspec's load-aware tok/s over the best native configuration's,
    and that configuration's name (``in_flight``: their tok/s in flight)."""
    mine = speeds(points, LOAD_AWARE, in_flight)
    out = {}
    for n, speed in mine.items():
        native = [p for p in points if p.concurrency == n and p.config.startswith(NATIVE_PREFIX)]
        best = max(native, key=lambda p: p.speed(in_flight), default=None)
        if best is not None and best.speed(in_flight) > 0:
            out[n] = (speed / best.speed(in_flight), best.config)
    return out


def repeats_spread(points: Sequence[Point]) -> tuple[float, int] | None:
    """The widest spread of plain batching's repeats, (max - min) / min of their aggregate
    tok/s, and the concurrency where it was (None: plain batching did not run; 0 with one
    repeat). Each repeat sends the requests in another order (with few requests a client,
    other prompts), and the machine moves between repeats (on a shared host, with its
    neighbours): every configuration's median carries as much."""
    spreads = [
        ((p.tokens_per_s_max - p.tokens_per_s_min) / p.tokens_per_s_min, p.concurrency)
        for p in points
        if p.config == PLAIN and p.tokens_per_s_min > 0
    ]
    return max(spreads) if spreads else None


def meaning(points: Sequence[Point]) -> list[str]:
    """What the figures say, one line each: the crossover, the best configuration per
    concurrency, and the comparison with llama.cpp's server."""
    lines = []
    levels = sorted({p.concurrency for p in points})
    plain, fixed = speeds(points, PLAIN), speeds(points, FIXED)
    both = sorted(set(plain) & set(fixed))
    if both:
        n = crossover(points)
        if n is not None:
            lines.append(
                f"crossover: plain batching beats fixed speculation from {plural(n, 'client')} "
                f"({plain[n]:.1f} vs {fixed[n]:.1f} tok/s)"
            )
        else:
            lines.append(
                "no crossover: fixed speculation is ahead of plain batching up to "
                f"{plural(both[-1], 'client')}"
            )
    for n in levels:
        here = [p for p in points if p.concurrency == n and p.config in CONFIGS]
        if not here:
            continue
        best = max(here, key=lambda p: p.tokens_per_s)
        base = plain.get(n)
        versus = f", {best.tokens_per_s / base:.2f}x plain" if base and best.config != PLAIN else ""
        lines.append(
            f"{plural(n, 'client')}: {best.config} is fastest "
            f"({best.tokens_per_s:.1f} tok/s{versus})"
        )
    spread = repeats_spread(points)
    if spread is not None and spread[0] > NOTABLE_SPREAD:
        lines.append(
            f"spread: plain batching's repeats at {plural(spread[1], 'client')} differ by "
            f"{spread[0]:.0%}: configurations closer than that are not told apart by this run"
        )
    in_flight = native_ratios(points, in_flight=True)
    for n, (ratio, config) in sorted(native_ratios(points).items()):
        line = f"{plural(n, 'client')}: load-aware {ratio:.2f}x llama-server's best ({config})"
        if n > 1 and n in in_flight:
            line += f"; in flight {in_flight[n][0]:.2f}x ({in_flight[n][1]})"
        lines.append(line)
    return lines
