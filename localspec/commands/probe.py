"""`localspec probe`: rank draft candidates and draftless modes by measured speedup."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from localspec import argtypes as at
from localspec import probe
from localspec.api import Engine
from localspec.catalog import Catalog, load_catalog
from localspec.commands.flags import add_machine_flags
from localspec.commands.pairs import Candidate, gather_candidates, judge, unique, unreadable
from localspec.derivation.gguf_info import gguf_info
from localspec.engine.model_context import ContextOptions
from localspec.errors import LocalspecError
from localspec.hardware import MachineLoad, machine_load
from localspec.measure import Budget, shown
from localspec.pairing import MAX_USEFUL_SIZE_RATIO, draftless_modes
from localspec.probe_results import WORTH_IT, ProbeConfig
from localspec.progress import plural, report_console
from localspec.prompts import KINDS, PromptCase, select_prompts
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
    most = ContextOptions.n_batch - 1  # a draft is verified in one batch with one more token
    if lengths[-1] > most:
        raise LocalspecError(
            f"--lengths {text!r}: a draft holds at most {most} tokens (one verification batch)",
            "e.g. --lengths 4,8,16",
        )
    return lengths


@dataclass
class ProbeRun:
    """Everything a probe found, for the report."""

    target: Path
    machine: MachineLoad
    measurements: list[probe.Measurement] = field(default_factory=list)
    rejected: list[tuple[str, str]] = field(default_factory=list)
    unavailable: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    ceiling: float = 0.0
    started: float = field(default_factory=time.monotonic)

    @property
    def ranking(self) -> list[probe.Ranked]:
        return probe.rank(self.measurements)


def run(args: argparse.Namespace) -> int:
    prompts = select_prompts(args.prompts)
    lengths = parse_lengths(args.lengths)
    wanted = parse_modes(args.modes)
    catalog = load_catalog()
    target = resolve_model(args.target, catalog)
    # stdout holds only what a script keeps: the JSON report, or the exported command
    console = report_console(stderr=args.json or args.export is not None)
    run = ProbeRun(target, machine_load())
    draftless, compatible = plan(args, run, catalog, wanted)
    console.print(run.machine.describe())
    interrupted = False
    try:
        for m in run_all(args, run, draftless, compatible, prompts, lengths, console):
            run.measurements.append(m)
    except KeyboardInterrupt:
        interrupted = True
        console.print("[yellow]interrupted: partial results follow[/]")
    ranking = run.ranking
    winner = probe.chosen(ranking)
    export = None
    if args.export and winner is not None:
        chosen = winner.config if winner.speedup >= WORTH_IT else ProbeConfig("none", 0)
        export = probe.export_command(chosen, target, args.export)
    report(args, console, run, export)
    if args.save and ranking and not interrupted:
        saved = probe.save(target, ranking, run.measurements, run.notes)
        console.print(f"saved for --mode auto: {saved}")
        if probe.measured_winner(ranking) is None:
            console.print("[yellow]nothing was measured reliably: --mode auto will not use it[/]")
    if export is not None and not args.json:  # with --json, a field of the report
        print(export)
    return 130 if interrupted else 0


def plan(
    args: argparse.Namespace, run: ProbeRun, catalog: Catalog, wanted: set[str]
) -> tuple[list[str], list[Candidate]]:
    """What to measure: the draftless modes the target supports and the compatible drafts;
    what cannot be measured, and why, goes into ``run``."""
    info = gguf_info(run.target)
    args.scan = args.scan or []
    candidates, run.notes = (
        gather_candidates(args, catalog) if "draft-model" in wanted else ([], [])
    )
    if (problem := unreadable(candidates)) is not None:  # before minutes of measuring
        raise problem
    rows = judge(run.target, unique(candidates, run.target), args.ctx_size)
    run.rejected = [
        (c.label, "; ".join(v.reasons) if v else (problem or "unreadable"))
        for c, v, problem in rows
        if v is None or not v.compatible
    ]
    supported = draftless_modes(info)
    draftless = [
        m for m, ok, _ in supported if ok and m in probe.MEASURABLE_DRAFTLESS and m in wanted
    ]
    run.unavailable = [
        (m, why if not ok else "not measurable in this version of localspec")
        for m, ok, why in supported
        if m not in draftless and m in wanted
    ]
    compatible = []
    for c, v, _ in rows:
        if v is None or not v.compatible:
            continue
        if v.size_ratio >= MAX_USEFUL_SIZE_RATIO:  # each drafted token costs a target step
            run.unavailable.append(
                (
                    f"draft-model {c.label}",
                    f"the draft is {100 * v.size_ratio:.0f}% of the target's size: it cannot "
                    "pay (pass it with --candidates to measure it anyway)",
                )
            )
            if c.label not in args.candidates:
                continue
        compatible.append(c)
    return draftless, compatible


def parse_modes(text: str) -> set[str]:
    modes = {m.strip() for m in text.split(",") if m.strip()}
    known = {*probe.MEASURABLE_DRAFTLESS, "draft-model"}
    if not modes or modes - known:
        raise LocalspecError(
            f"--modes {text!r}: unknown mode(s) {', '.join(sorted(modes - known)) or '(none)'}",
            f"choose among {', '.join(sorted(known))}",
        )
    return modes


def run_all(
    args: argparse.Namespace,
    run: ProbeRun,
    draftless: list[str],
    compatible: list[Candidate],
    prompts: list[PromptCase],
    lengths: list[int],
    console: Console,
) -> Iterator[probe.Measurement]:
    n_cells = (len(draftless) + len(compatible)) * len(lengths) * len(prompts)
    budget = Budget(args.budget, n_cells)
    gen = dict(
        n_tokens=args.n_predict,
        temperature=args.temperature,
        seed=args.seed,
        max_pairs=args.repeat,
        budget=budget,
    )
    options = dict(
        n_ctx=args.ctx_size,
        n_threads=args.threads,
        n_gpu_layers=args.gpu_layers,
        flash_attn=args.flash_attn,
    )
    console.print(
        f"probing {run.target.name}: {len(prompts)} prompt(s), {args.n_predict} tokens, "
        f"draft lengths {lengths}, {args.repeat} runs at most per cell, budget {args.budget:g} s"
    )
    engines = [(mode, None) for mode in draftless] + [("draft-model", c.path) for c in compatible]
    cost = None
    for mode, draft in engines:  # draft-self derives its draft on first use (printed)
        with Engine.load(
            run.target, draft, mode, n_gpu_layers_draft=args.gpu_layers_draft, **options
        ) as engine:
            if cost is None:  # one calibration of the target serves every engine
                cost = engine.verify_cost(max(lengths))
                run.ceiling = cost.ceiling()
                console.print(
                    f"ceiling of this machine for drafts up to {max(lengths)} tokens: "
                    f"{run.ceiling:.2f}x"
                )
                if (note := probe.compute_bound_note(cost)) is not None:
                    console.print(f"note: {note}")
                    run.notes.append(note)
            engine.use_cost(cost)
            configs = [ProbeConfig(mode, n, str(draft) if draft else None) for n in lengths]
            for m in probe.measure(engine, configs, prompts, **gen):  # type: ignore[arg-type]
                announce(m, run.ceiling, console)
                yield m


def announce(m: probe.Measurement, ceiling: float, console: Console) -> None:
    v = m.verdict
    predicted = f", predicted {v.predicted:.2f}x" if v.predicted is not None else ""
    console.print(
        f"  {m.config.label} on {m.prompt}: "
        f"{shown(v.measured, v.low, v.high, v.noisy, ceiling)}{predicted} "
        f"(accept {100 * m.acceptance_rate:.0f}%, {plural(v.n_pairs, 'run')})"
        + (f" [yellow]{'; '.join(v.reasons)}[/]" if v.noisy else ""),
        highlight=False,
    )


def report(
    args: argparse.Namespace, console: Console, run: ProbeRun, export: str | None = None
) -> None:
    ranking = run.ranking
    best = probe.best_per_config_family(ranking)
    winner = probe.chosen(ranking)
    elapsed = time.monotonic() - run.started
    if args.json:
        print(
            json.dumps(
                {
                    "target": str(run.target),
                    "machine": run.machine.to_dict(),
                    "ceiling": round(run.ceiling, 3),
                    "seconds": round(elapsed, 1),
                    "winner": probe.ranked_dict(winner) if winner else None,
                    "ranking": [probe.ranked_dict(r) for r in best],
                    "all_lengths": [probe.ranked_dict(r) for r in ranking],
                    "measurements": [probe.measurement_dict(m) for m in run.measurements],
                    "incompatible": [{"candidate": c, "why": why} for c, why in run.rejected],
                    "unavailable_modes": [{"mode": m, "why": why} for m, why in run.unavailable],
                    "recommendation": probe.recommendation(ranking),
                    "export": export,
                    "notes": run.notes,
                },
                indent=2,
            )
        )
        return
    ceiling = f"; ceiling {run.ceiling:.2f}x" if run.ceiling else ""  # none before calibration
    table = Table(title=f"probe: {run.target.name} (speedup vs plain decoding, same run{ceiling})")
    kinds = sorted({m.kind for m in run.measurements})
    table.add_column("#", no_wrap=True)
    table.add_column("configuration", overflow="fold", ratio=3, min_width=16)
    table.add_column("speedup", no_wrap=True)
    table.add_column("measured (min-max)", ratio=2, min_width=10)
    for col in ("predicted", *kinds, "accept", "L"):
        table.add_column(col, no_wrap=True)
    for i, r in enumerate(best, 1):
        table.add_row(
            str(i),
            r.config.label,
            f"{r.speedup:.2f}x",
            shown(r.measured, r.low, r.high, r.noisy, run.ceiling),
            f"{r.predicted:.2f}x" if r.predicted is not None else "-",
            *[f"{r.by_kind.get(k, 0):.2f}x" for k in kinds],
            f"{100 * r.acceptance_rate:.0f}%",
            f"{r.mean_acceptance_length:.2f}",
        )
    console.print(table)
    console.print(
        "speedup: the measured median where it is reliable, else the prediction; "
        "--mode auto runs the best reliable row"
    )
    for c, why in run.rejected:
        console.print(f"[red]not usable[/]: {c}: {why}")
    for m, why in run.unavailable:
        console.print(f"[dim]not measured[/]: {m}: {why}")
    for note in run.notes:
        console.print(f"note: {note}")
    console.print(f"[bold]recommendation[/]: {probe.recommendation(ranking)}")
    console.print(f"probe took {elapsed:.0f} s; {run.machine.describe()}")
    sys.stdout.flush()


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("probe", help="rank drafts and modes by measured speedup")
    p.add_argument("target", help="target model: a .gguf path or a catalog name")
    p.add_argument(
        "--candidates",
        type=lambda t: [x for x in t.split(",") if x],
        default=[],
        help="comma-separated draft candidates (paths or names)",
    )
    p.add_argument(
        "--scan",
        action="append",
        default=[],
        metavar="DIR",
        help="also consider every .gguf under DIR",
    )
    p.add_argument(
        "--no-hf-cache",
        action="store_true",
        help="do not consider the GGUFs in the Hugging Face cache",
    )
    p.add_argument(
        "--prompts",
        default="code-edit,qa",
        help=f"prompt kinds ({','.join(KINDS)}), suite, suite:tune, suite:held-out, or a file",
    )
    p.add_argument("--lengths", default="4,8,16", help="draft lengths to try")
    p.add_argument(
        "--modes",
        default="ngram-simple,suffix+ngram-simple,draft-self,draft-mtp,draft-model",
        help="what to measure (default: every mode the target supports and every draft; "
        "suffix+ngram-simple drafts each prompt with the answers to the prompts probed before "
        "it remembered, as a server would)",
    )
    p.add_argument(
        "--repeat",
        type=at.integer(2, 50),
        default=4,
        help="speculative runs per configuration and prompt at most, 2-50, each between two "
        "plain runs (default 4; 2 are made unless the first agrees with the prediction, more while "
        "their spread is wide)",
    )
    p.add_argument(
        "--budget",
        type=at.real(1.0, 86400.0),
        default=150.0,
        metavar="SECONDS",
        help="time for repeats beyond the first two (default 150)",
    )
    p.add_argument("-n", "--n-predict", type=at.count, default=128, help="tokens per run")
    p.add_argument(
        "--temp", dest="temperature", type=at.temperature, default=0.0, help="temperature"
    )
    p.add_argument("-s", "--seed", type=at.seed, default=0, help="seed for sampling")
    add_machine_flags(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument(
        "--save", action="store_true", help="remember the winner for --mode auto (run, chat, serve)"
    )
    p.add_argument(
        "--export",
        choices=("llama-server", "vllm"),
        default=None,
        help="print the winner as a llama-server command or a vLLM config (alone on stdout: "
        "the table goes to stderr)",
    )
    p.set_defaults(handler=run)
