"""`localspec probe`: rank draft candidates and draftless modes by measured speedup."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from localspec import probe
from localspec.api import Engine
from localspec.catalog import load_catalog
from localspec.commands.pairs import Candidate, gather_candidates, judge, unique
from localspec.errors import LocalspecError
from localspec.gguf_info import gguf_info
from localspec.pairing import draftless_modes
from localspec.prompts import select_prompts
from localspec.sources import resolve_model


def parse_lengths(text: str) -> list[int]:
    try:
        lengths = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise LocalspecError(
            f"--lengths {text!r}: not a list of integers", "e.g. --lengths 4,8,16"
        ) from None
    if not lengths or lengths[0] < 1:
        raise LocalspecError(f"--lengths {text!r}: lengths must be >= 1")
    return lengths


def cmd_probe(args: argparse.Namespace) -> int:
    prompts = select_prompts(args.prompts)
    lengths = parse_lengths(args.lengths)
    catalog = load_catalog()
    target = resolve_model(args.target, catalog)
    info = gguf_info(target)
    args.scan = args.scan or []
    candidates, notes = gather_candidates(args, catalog)
    rows = judge(target, unique(candidates, target), args.ctx_size)
    compatible = [c for c, v, _ in rows if v is not None and v.compatible]
    rejected = [
        (c.label, "; ".join(v.reasons) if v else (problem or "unreadable"))
        for c, v, problem in rows
        if v is None or not v.compatible
    ]
    draftless = [m for m, ok, _ in draftless_modes(info) if ok and m in probe.MEASURABLE_DRAFTLESS]
    unavailable = [
        (m, why if not ok else "not measurable in this version of localspec")
        for m, ok, why in draftless_modes(info)
        if m not in draftless
    ]
    console = Console(stderr=args.json)
    measurements: list[probe.Measurement] = []
    interrupted = False
    try:
        for m in run_all(args, target, draftless, compatible, prompts, lengths, console):
            measurements.append(m)
    except KeyboardInterrupt:
        interrupted = True
        console.print("[yellow]interrupted: partial results follow[/]")
    ranking = probe.rank(measurements)
    report(args, console, target, ranking, measurements, rejected, unavailable, notes)
    if args.save and ranking and not interrupted:
        console.print(f"saved for --mode auto: {probe.save(target, ranking, measurements)}")
    if args.export and ranking:
        print(
            probe.export_command(
                ranking[0].config
                if ranking[0].speedup >= probe.WORTH_IT
                else probe.ProbeConfig("none", 0),
                target,
                args.export,
            )
        )
    return 130 if interrupted else 0


def run_all(
    args,
    target: Path,
    draftless: list[str],
    compatible: list[Candidate],
    prompts,
    lengths,  # type: ignore[no-untyped-def]
    console: Console,
):
    gen = dict(n_tokens=args.n_predict, temperature=args.temp, seed=args.seed)
    options = dict(n_ctx=args.ctx_size, n_threads=args.threads, n_gpu_layers=args.gpu_layers)
    console.print(
        f"probing {target.name}: {len(prompts)} prompt(s), {args.n_predict} tokens, "
        f"draft lengths {lengths}"
    )
    for mode in draftless:  # draft-self derives its draft on first use (printed)
        with Engine.load(target, mode=mode, **options) as engine:
            configs = [probe.ProbeConfig(mode, n) for n in lengths]
            yield from announce(probe.measure(engine, configs, prompts, **gen), console)
    for c in compatible:
        assert c.path is not None
        with Engine.load(
            target, draft=c.path, n_gpu_layers_draft=args.gpu_layers_draft, **options
        ) as engine:
            configs = [probe.ProbeConfig("draft-model", n, str(c.path)) for n in lengths]
            yield from announce(probe.measure(engine, configs, prompts, **gen), console)


def announce(measurements, console: Console):  # type: ignore[no-untyped-def]
    for m in measurements:
        console.print(
            f"  {m.config.label:40} {m.prompt:18} {m.speedup:5.2f}x "
            f"(accept {100 * m.acceptance_rate:.0f}%)"
        )
        yield m


def report(args, console, target, ranking, measurements, rejected, unavailable, notes) -> None:  # type: ignore[no-untyped-def]
    best = probe.best_per_config_family(ranking)
    if args.json:
        print(
            json.dumps(
                {
                    "target": str(target),
                    "ranking": [probe.ranked_dict(r) for r in best],
                    "all_lengths": [probe.ranked_dict(r) for r in ranking],
                    "measurements": [probe.measurement_dict(m) for m in measurements],
                    "incompatible": [{"candidate": c, "why": why} for c, why in rejected],
                    "unavailable_modes": [{"mode": m, "why": why} for m, why in unavailable],
                    "recommendation": probe.recommendation(ranking),
                    "notes": notes,
                },
                indent=2,
            )
        )
        return
    table = Table(title=f"probe: {target.name} (speedup vs plain decoding, same run)")
    kinds = sorted({m.kind for m in measurements})
    for col in ("rank", "configuration", "speedup", *kinds, "accept", "L", "tok/s"):
        table.add_column(col)
    for i, r in enumerate(best, 1):
        table.add_row(
            str(i),
            r.config.label,
            f"{r.speedup:.2f}x",
            *[f"{r.by_kind.get(k, 0):.2f}x" for k in kinds],
            f"{100 * r.acceptance_rate:.0f}%",
            f"{r.mean_acceptance_length:.2f}",
            f"{r.tokens_per_s:.1f}",
        )
    console.print(table)
    for c, why in rejected:
        console.print(f"[red]not usable[/]: {c}: {why}")
    for m, why in unavailable:
        console.print(f"[dim]not measured[/]: {m}: {why}")
    for note in notes:
        console.print(f"note: {note}")
    console.print(f"[bold]recommendation[/]: {probe.recommendation(ranking)}")
    sys.stdout.flush()
