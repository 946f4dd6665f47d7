"""`localspec bench --scenarios`: multi-request scenarios (``localspec/scenarios.py``), each
request's speedup over plain decoding and over ngram-simple, in one run."""

from __future__ import annotations

import argparse
import json

from rich.console import Console

from localspec import scenarios as sc
from localspec.commands.bench_output import (
    check_outputs,
    markdown_table,
    nothing_measured,
    print_table,
    write_text,
)
from localspec.commands.flags import engine_options
from localspec.errors import LocalspecError
from localspec.hardware import machine_load
from localspec.measure import unearned
from localspec.modes import neural_part
from localspec.progress import report_console


def run_scenarios(args: argparse.Namespace, modes: list[str]) -> int:
    from localspec.api import Engine

    chosen = sc.select_scenarios(args.scenarios)
    if args.native is not None or args.plot is not None:
        raise LocalspecError(
            "--native and --plot apply to single prompts, not to --scenarios",
            "drop them, or bench the scenarios in a run of their own",
        )
    check_outputs(args)
    neural = {neural_part(m) for m in modes} - {None}
    args.mode = next(iter(neural), "ngram-simple")
    console = report_console(stderr=True)  # progress; the results go to standard output
    machine = machine_load()
    console.print(machine.describe())
    runs: list[sc.RequestRun] = []
    interrupted = False
    with Engine.load(**engine_options(args)) as engine:
        for mode in modes:
            if not engine.mode_available(mode):
                raise LocalspecError(
                    f"--modes {mode}: not available with the loaded models",
                    f"use one of: {', '.join(engine.available_modes())}",
                )
        model = engine.target_path.name
        try:
            for r in sc.run_scenarios(engine, modes, chosen, args.n_predict, args.repeat):
                console.print(
                    f"  [{r.repeat + 1}/{args.repeat}] {r.scenario:10} #{r.index:<2} "
                    f"{r.mode:20} {r.tokens_per_s:6.1f} tok/s"
                )
                runs.append(r)
        except KeyboardInterrupt:
            interrupted = True
            console.print("[yellow]interrupted: the requests so far follow[/]")
    cells = sc.summarise_requests(runs)
    header = (
        f"localspec bench --scenarios: {model}, at most {args.n_predict} tokens a request, "
        f"{args.repeat} repeat(s), machine {'busy' if machine.busy else 'quiet'}"
        + (", interrupted: partial" if interrupted else "")
    )
    results = report_console()
    report(results, header, cells)
    lines = [line for mode in modes for line in sc.headline(cells, mode)]
    for line in lines:
        results.print(f"  {line}")
    results.print(f"  {machine.describe()}")
    if nothing_measured(args, results, bool(runs)):
        return 130 if interrupted else 0
    if args.json:
        data = {
            "model": model,
            "max_tokens": args.n_predict,
            "repeat": args.repeat,
            "machine": machine.to_dict(),
            "requests": [c.to_dict() for c in cells],
            "meaning": lines,
            "partial": interrupted,  # Ctrl-C: the requests measured so far
        }
        write_text(args.json, json.dumps(data, indent=2))
    if args.markdown:
        write_text(args.markdown, markdown_table(header, COLUMNS, rows(cells), lines))
    return 130 if interrupted else 0


COLUMNS = ("scenario", "request", "mode", "tok/s", "vs plain (min-max)", "vs ngram-simple",
           "accept", "from memory")  # fmt: skip


def rows(cells: list[sc.RequestCell]) -> list[tuple[str, ...]]:
    out = []
    for c in cells:
        if c.mode == sc.PLAIN:
            continue
        lookup = "-" if c.mode == sc.LOOKUP else f"{c.vs_lookup[0]:.2f}x"
        # faster than plain with nothing accepted: the machine's speed moved, not the mode
        noise = " noisy" if unearned(c.vs_plain[0], c.acceptance_rate > 0) else ""
        out.append(
            (
                c.scenario,
                str(c.index),
                c.mode,
                f"{c.tokens_per_s:.1f}",
                f"{c.vs_plain[0]:.2f}x ({c.vs_plain[1]:.2f}-{c.vs_plain[2]:.2f}){noise}",
                lookup,
                f"{100 * c.acceptance_rate:.0f}%",
                f"{100 * c.from_memory:.0f}%",
            )
        )
    return out


def report(console: Console, header: str, cells: list[sc.RequestCell]) -> None:
    print_table(console, header, COLUMNS, rows(cells))
