"""`localspec bench --rate 0.1,0.2,0.4`: request latency under random arrivals
(``localspec/arrivals.py``), plain batching against fixed and load-aware speculation on one
Engine with ``--parallel`` slots, and with ``--native DIR`` against llama-server with as
many."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator, Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from localspec import arrivals as ar
from localspec import bench
from localspec import concurrency as cc
from localspec import native_server as ns
from localspec.commands.bench_concurrency import (
    Load,
    Measured,
    common_json,
    measure_levels,
    measure_native,
    order,
    print_footer,
    title,
)
from localspec.commands.bench_output import nothing_measured, write_text
from localspec.fileops import atomic_path
from localspec.progress import report_console

DEFAULT_SLOTS = 4  # as `localspec serve`
REQUESTS_PER_RATE = 16


def run_rate_bench(args: argparse.Namespace) -> int:
    rates: list[float] = args.rate
    slots = args.parallel or DEFAULT_SLOTS
    requests = args.requests or REQUESTS_PER_RATE

    def here(load: Load, configs: Sequence[cc.Config], rate: float) -> Iterator[ar.RateRun]:
        return ar.run_rate(configs, rate, load.requests, len(load.prompts), load.repeats, load.stop)

    def there(
        load: Load, server: ns.ServerSettings, texts: Sequence[str], rate: float
    ) -> Iterator[ar.RateRun]:
        return measure_native(load, server, texts, rate, slots, here)

    measured = measure_levels(args, rates, slots, requests, here, there, rate_line)
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
    table = Table(title=header)
    for col in COLUMNS:
        table.add_column(col)
    for row in rows(points):
        table.add_row(*row)
    console.print(table)
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
        write_text(args.markdown, markdown(header, points) + "".join(f"- {x}\n" for x in lines))
    if args.plot and points:
        plot(points, args.plot, header)


def markdown(header: str, points: Sequence[ar.RatePoint]) -> str:
    lines = [f"**{header}**", "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row) + " |" for row in rows(points)]
    return "\n".join(lines) + "\n\n"


def plot(points: Sequence[ar.RatePoint], path: str, title: str) -> None:
    """Mean request latency against the request rate, one line per configuration (native
    dashed): where speculation shortens answers, and where it starts to cost."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for config in sorted({p.config for p in points}, key=order):
        mine = sorted((p for p in points if p.config == config), key=lambda p: p.rate)
        ax.plot(
            [p.rate for p in mine],
            [p.mean_s for p in mine],
            "--" if config.startswith(cc.NATIVE_PREFIX) else "-",
            marker="o",
            label=config,
        )
    ax.set_xlabel("requests per second (random arrivals)")
    ax.set_ylabel("mean request latency (s)")
    ax.set_title(title, wrap=True, fontsize=8)
    ax.legend()
    fig.tight_layout()
    with atomic_path(Path(path)) as tmp:  # a full disk leaves no half image
        fig.savefig(tmp, dpi=110, format=bench.plot_format(path))
    plt.close(fig)
