"""`localspec bench --rate 0.1,0.2,0.4`: request latency under random arrivals
(``localspec/arrivals.py``), plain batching against fixed and load-aware speculation on one
Engine with ``--parallel`` slots, and with ``--native DIR`` against llama-server with as
many."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator, Sequence

from rich.console import Console

from localspec import arrivals as ar
from localspec import concurrency as cc
from localspec.commands.bench_concurrency import (
    Load,
    Measured,
    common_json,
    config_lines,
    config_plot,
    measure_levels,
    order,
    print_footer,
    title,
)
from localspec.commands.bench_output import (
    markdown_table,
    nothing_measured,
    print_table,
    write_text,
)
from localspec.commands.serve import DEFAULT_PARALLEL
from localspec.progress import report_console

DEFAULT_SLOTS = DEFAULT_PARALLEL  # the slots `localspec serve` answers with
REQUESTS_PER_RATE = 16


def run_rate_bench(args: argparse.Namespace) -> int:
    rates: list[float] = args.rate
    slots = args.parallel or DEFAULT_SLOTS
    requests = args.requests or REQUESTS_PER_RATE

    def here(load: Load, configs: Sequence[cc.Config], rate: float) -> Iterator[ar.RateRun]:
        return ar.run_rate(configs, rate, load.requests, len(load.prompts), load.repeats, load.stop)

    def native_slots(rate: float) -> int:  # llama-server with as many slots at every rate
        return slots

    measured = measure_levels(args, rates, slots, requests, here, native_slots, rate_line)
    load = f"{requests} requests per rate, {slots} slots"
    header = title(args, measured, "--rate", load)
    points = ar.summarise_rates(measured.runs)
    report(args, report_console(), header, measured, points, slots)
    return measured.exit_code()


def rate_line(run: ar.RateRun) -> str:
    mean = sum(run.latencies_s) / len(run.latencies_s) if run.latencies_s else 0.0
    return (
        f"{run.rate:g} requests/s {run.config:20} mean latency {mean:6.2f} s "
        f"({len(run.latencies_s)} requests, {run.tokens} tokens in {run.wall_s:.1f} s)"
    )


COLUMNS = ("requests/s", "config", "mean latency", "vs plain", "p50 latency", "p95 latency",
           "ms per token", "tok/s", "requests")  # fmt: skip


def rows(points: Sequence[ar.RatePoint]) -> list[tuple[str, ...]]:
    plain = ar.mean_latencies(points, cc.PLAIN)
    out = []
    for p in sorted(points, key=lambda p: (p.rate, order(p.config))):
        base = plain.get(p.rate)
        out.append(
            (
                f"{p.rate:g}",
                p.config,
                f"{p.mean_s:.2f} s",
                f"{base / p.mean_s:.2f}x" if base and p.mean_s > 0 else "-",
                f"{p.p50_s:.2f} s",
                f"{p.p95_s:.2f} s",
                f"{p.per_token_ms:.1f}",
                f"{p.tokens_per_s:.1f}",
                str(p.requests),
            )
        )
    return out


def report(
    args: argparse.Namespace,
    console: Console,
    header: str,
    measured: Measured[ar.RateRun],
    points: Sequence[ar.RatePoint],
    slots: int,
) -> None:
    print_table(console, header, COLUMNS, rows(points))
    lines = ar.rate_meaning(points)
    lines.append(
        "latency: from a request's arrival to its last token, queueing included; vs plain: "
        "plain batching's mean latency over this one's (above 1: sooner)"
    )
    print_footer(console, lines, measured)
    if nothing_measured(args, console, bool(measured.runs)):
        return
    if args.json:
        data = {
            **common_json(args, measured),
            "requests_per_rate": measured.load.requests,
            "slots": slots,
            "rates": args.rate,
            "points": [p.to_dict() for p in points],
            "runs": [
                {
                    "config": r.config,
                    "rate": r.rate,
                    "repeat": r.repeat,
                    "tokens": r.tokens,
                    "wall_s": round(r.wall_s, 3),
                    "latencies_s": [round(x, 3) for x in r.latencies_s],
                }
                for r in measured.runs
            ],
            "meaning": lines,
            "partial": measured.partial,  # Ctrl-C: the runs measured so far
        }
        write_text(args.json, json.dumps(data, indent=2))
    if args.markdown:
        write_text(args.markdown, markdown_table(header, COLUMNS, rows(points), lines))
    if args.plot and points:
        plot(points, args.plot, header)


def plot(points: Sequence[ar.RatePoint], path: str, title: str) -> None:
    """Mean request latency against the request rate, one line per configuration (native
    dashed): where speculation shortens answers, and where it starts to cost."""
    x_label = "requests per second (random arrivals)"
    with config_plot(path, title, x_label, "mean request latency (s)") as ax:
        config_lines(ax, points, lambda p: p.rate, lambda p: p.mean_s)
