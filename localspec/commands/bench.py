"""`localspec bench` and `localspec doctor`."""

from __future__ import annotations

import argparse
import json
import platform
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

from rich.table import Table

from localspec import argtypes as at
from localspec import bench, native
from localspec.arrivals import rate_list
from localspec.commands.bench_concurrency import run_concurrency
from localspec.commands.bench_fim import run_fim
from localspec.commands.bench_output import (
    check_outputs,
    nothing_measured,
    parse_list,
    write_text,
)
from localspec.commands.bench_rate import DEFAULT_SLOTS, REQUESTS_PER_RATE, run_rate_bench
from localspec.commands.bench_scenarios import run_scenarios
from localspec.commands.flags import add_model_flags, add_spec_flags, engine_options
from localspec.commands.flags import spec_for as run_spec_for
from localspec.concurrency import concurrency_list
from localspec.errors import LocalspecError
from localspec.hardware import machine_load
from localspec.progress import report_console
from localspec.prompts import PromptCase, select_prompts

CELL_MODES = "none,ngram-simple"  # --modes without --scenarios
CELL_PROMPTS = "code-edit,code,qa,summary,creative,french"
SCENARIO_MODES = "suffix+ngram-simple"  # with: each is also compared with none, ngram-simple


def run(args: argparse.Namespace) -> int:
    from localspec.api import Engine
    from localspec.modes import canonical, neural_part

    check_load_flags(args)
    if args.fim:
        return run_fim(args)
    if args.rate is not None:
        return run_rate_bench(args)
    if args.concurrency is not None:
        return run_concurrency(args)
    given = args.modes is not None
    if args.scenarios is not None:
        if args.prompts is not None:
            raise LocalspecError(
                "--prompts does not apply to --scenarios (they bring their own requests)",
                "drop --prompts, or bench the prompts in a run of their own",
            )
        modes = parse_list(args.modes if given else SCENARIO_MODES, "--modes", canonical)
        return run_scenarios(args, modes)
    modes = [canonical(m) for m in parse_list(args.modes if given else CELL_MODES, "--modes")]
    neural = {neural_part(m) for m in modes} - {None}
    if len(neural) > 1:
        raise LocalspecError(
            f"--modes: one neural drafter per run ({', '.join(sorted(neural))} given)",
            "bench the others in a second run",
        )
    if "draft-model" in neural and args.draft is None:
        raise LocalspecError("--modes draft-model needs a draft model (-md)")
    temps = parse_list(args.temps, "--temps", at.temperature)
    prompts = select_prompts(args.prompts if args.prompts is not None else CELL_PROMPTS)
    check_outputs(args)
    args.mode = next(iter(neural), "ngram-simple")
    options = engine_options(args)
    console = report_console(stderr=True)  # progress; the results go to standard output
    machine = machine_load()
    console.print(machine.describe())
    interrupted = False
    with Engine.load(**options) as engine:
        ceiling = engine.verify_cost().ceiling()
        runs: list[bench.Run] = []
        native_runs: list[bench.NativeCellRun] = []
        tool = NativeCells(args, engine, options) if args.native else None
        spec_for = partial(run_spec_for, args)
        cells_run = bench.run_cells(
            engine, modes, prompts, temps, args.n_predict, args.repeat, spec_for=spec_for,
            native=tool,
        )  # fmt: skip
        try:
            for run in cells_run:
                if isinstance(run, bench.NativeCellRun):
                    native_runs.append(run)
                    label, speed = f"native {run.mode}", run.run.tokens_per_s
                else:
                    runs.append(run)
                    label, speed = run.mode, run.tokens_per_s
                console.print(
                    f"  [{run.repeat + 1}/{args.repeat}] {label:13} {run.prompt:18} "
                    f"T={run.temperature:g} {speed:6.1f} tok/s"
                )
        except KeyboardInterrupt:
            interrupted = True
            console.print("[yellow]interrupted: the runs so far follow[/]")
        cells = bench.flag_noise(bench.summarise(runs), ceiling)
        cells = add_native_figures(cells, native_runs, runs, engine.target.detokenize)
    report(args, report_console(), cells, ceiling, engine.target_path.name, machine, interrupted)
    if tool is not None and tool.error is not None:
        raise LocalspecError(f"the native runs failed: {tool.error.message}", tool.error.hint)
    return 130 if interrupted else 0


class NativeCells:
    """llama.cpp's tool on a cell's prompt (rendered with the same chat template), with the
    seed localspec's run of that repeat had; after a failure it runs no more, and the bench
    goes on with localspec's runs (``error`` says why)."""

    def __init__(self, args, engine, options) -> None:  # type: ignore[no-untyped-def]
        from localspec.hardware import default_threads

        self.args, self.engine = args, engine
        self.settings = native.NativeSettings(
            Path(args.native),
            engine.target_path,
            engine.draft.path if engine.draft else None,
            args.n_predict,
            engine.target.options.n_threads or default_threads(),
            options["n_ctx"],
            options["spec"].n_max,
            engine.target.flash_attn,
        )
        self.error: LocalspecError | None = None

    def __call__(
        self, mode: str, case: PromptCase, temperature: float, seed: int
    ) -> native.NativeRun | None:
        from dataclasses import replace

        from localspec.engine.prompting import render_chat

        if self.error is not None or not native.supported(mode):
            return None
        settings = replace(self.settings, n_max=run_spec_for(self.args, mode).n_max)
        text = render_chat(self.engine.target, case.messages)
        try:
            return native.run(settings, mode, text, temperature, seed=seed)
        except LocalspecError as exc:  # the tool broke mid-way: keep what was measured
            self.error = exc
            return None


def add_native_figures(
    cells: Sequence[bench.Cell],
    native_runs: Sequence[bench.NativeCellRun],
    runs: Sequence[bench.Run],
    text_of: Callable[[Sequence[int]], str],
) -> list[bench.Cell]:
    """Each cell with the median of the tool's runs of it, and at temperature 0 how many of
    its prompts the tool answered with another text than localspec's plain decoding
    (``runs``: the cells' runs, plain ones included)."""
    from dataclasses import replace
    from statistics import median

    out = []
    for cell in cells:
        mine = [
            r
            for r in native_runs
            if (r.mode, r.kind, r.temperature) == (cell.mode, cell.kind, cell.temperature)
        ]
        if not mine:
            out.append(cell)
            continue
        by_prompt: dict[str, list[native.NativeRun]] = {}
        for r in mine:
            by_prompt.setdefault(r.prompt, []).append(r.run)
        greedy = not cell.temperature
        out.append(
            replace(
                cell,
                native_tokens_per_s=median(r.run.tokens_per_s for r in mine),
                native_drafted=sum(r.run.drafted for r in mine),
                native_texts=native_texts(text_of, by_prompt, runs) if greedy else None,
            )
        )
    return out


def native_texts(
    text_of: Callable[[Sequence[int]], str],
    by_prompt: dict[str, list[native.NativeRun]],
    runs: Sequence[bench.Run],
) -> tuple[int, int] | None:
    """(prompts the tool answered with another text than localspec's plain decoding, prompts
    compared): greedy answers, which a near tie can part. ``text_of``: tokens to text."""
    plain = {r.prompt: r.tokens for r in runs if r.mode == "none" and not r.temperature}
    parted = compared = 0
    for name, native_runs in by_prompt.items():
        texts = [r.text for r in native_runs if r.text is not None]
        if name not in plain or not texts:
            continue
        reference = text_of(plain[name])
        compared += 1
        parted += any(native.parts_from(text, reference) for text in texts)
    return (parted, compared) if compared else None


def report(args, console, cells, ceiling, model, machine, partial) -> None:  # type: ignore[no-untyped-def]
    header = (
        f"localspec bench: {model}, {args.n_predict} tokens, {args.repeat} repeat(s), "
        f"{' '.join(filter(None, (platform.machine(), platform.processor())))}, "
        f"ceiling {ceiling:.2f}x, "
        f"machine {'busy' if machine.busy else 'quiet'}"
        + (", interrupted: partial" if partial else "")
    )
    table = Table(title=header)
    for col in (
        "mode",
        "kind",
        "T",
        "tok/s med",
        "speedup (min-max)",
        "predicted",
        "accept",
        "L",
        "draft %",
        "exact",
        "native",
    ):
        table.add_column(col)
    for c in sorted(cells, key=lambda c: (c.mode, c.kind, c.temperature)):
        table.add_row(
            c.mode,
            c.kind,
            f"{c.temperature:g}",
            f"{c.tokens_per_s_median:.1f}",
            bench.speedup_text(c, ceiling),
            bench.predicted_text(c),
            f"{100 * c.acceptance_rate:.0f}%",
            f"{c.mean_acceptance_length:.2f}",
            f"{100 * c.draft_share:.0f}%",
            c.exact_match or "-",
            bench.native_text(c),
        )
    console.print(table)
    console.print(f"ceiling on this machine (batch vs one-token throughput): {ceiling:.2f}x")
    meanings = [
        m
        for m in (bench.meaning(mode, cells, ceiling) for mode in sorted({c.mode for c in cells}))
        if m
    ] + bench.native_lines(cells)
    for line in meanings:
        console.print(f"  {line}")
    for c in cells:
        if c.noisy:
            console.print(
                f"  [yellow]noisy[/]: {c.mode} {c.kind} T={c.temperature:g}: {'; '.join(c.noise)}"
            )
    console.print(f"  {machine.describe()}")
    if nothing_measured(args, console, bool(cells)):
        return
    if args.json:
        write_text(
            args.json,
            json.dumps(
                {
                    "model": model,
                    "n_tokens": args.n_predict,
                    "repeat": args.repeat,
                    "ceiling": ceiling,
                    "machine": machine.to_dict(),
                    "cells": [c.to_dict() for c in cells],
                    "native_ratio": {
                        mode: round(g, 3) for mode, (g, *_) in bench.native_ratios(cells).items()
                    },
                    "meaning": meanings,
                    "partial": partial,  # Ctrl-C: the runs measured so far
                },
                indent=2,
            ),
        )
    if args.markdown:
        write_text(
            args.markdown,
            bench.markdown(cells, f"**{header}**", ceiling)
            + "\n"
            + "\n".join(f"- {m}" for m in meanings)
            + "\n",
        )
    if args.plot:
        bench.plot(cells, args.plot, header)


def check_load_flags(args: argparse.Namespace) -> None:
    """--concurrency and --rate are two benches; --requests belongs to either, --parallel
    to --rate (--concurrency loads as many slots as its most clients)."""
    if args.rate is not None and args.concurrency is not None:
        raise LocalspecError(
            "--rate and --concurrency are two different benches",
            "run them one at a time: --concurrency keeps N clients busy (throughput), "
            "--rate sends requests at random times (latency)",
        )
    if args.requests is not None and args.rate is None and args.concurrency is None:
        raise LocalspecError(
            "--requests applies to --concurrency and --rate only",
            "add --concurrency 1,2,4 or --rate 0.1,0.2, or drop it",
        )
    if args.parallel is not None and args.rate is None:
        why = " (--concurrency loads as many slots as its most clients)"
        raise LocalspecError(
            "--parallel applies to --rate only" + (why if args.concurrency else ""),
            "add --rate 0.1,0.2, or drop it",
        )


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("bench", help="every mode vs plain decoding (and native llama.cpp)")
    add_model_flags(p, mode=False)  # it measures --modes, a list
    add_spec_flags(p)
    p.add_argument(
        "--modes",
        default=None,
        help="comma-separated modes: none, ngram-simple, suffix, draft-model, draft-self, "
        f"draft-mtp, or chains written with + (ngram-simple+draft-self); default {CELL_MODES}, "
        f"with --scenarios {SCENARIO_MODES} (always compared with none and ngram-simple)",
    )
    p.add_argument(
        "--scenarios",
        default=None,
        metavar="NAMES",
        help="run multi-request scenarios instead of prompts: regenerate, regenerate-code, "
        "batch, docstrings, agent, unrelated (comma-separated), or all; each request's "
        "speedup over plain decoding and over ngram-simple",
    )
    p.add_argument(
        "--prompts",
        default=None,
        help=f"prompt kinds or a prompt file (default {CELL_PROMPTS}); with --fim, the names "
        "of the completions to run (default all)",
    )
    p.add_argument(
        "--concurrency",
        type=concurrency_list,
        default=None,
        metavar="N,N,...",
        help="run the concurrency bench instead: for each N, N clients at once sending "
        "requests back to back, plain batching vs fixed and load-aware speculation of the "
        "one --modes mode (default ngram-simple) on one engine with max(N) slots; aggregate "
        "tok/s, p50/p95 latency; with --native, llama-server too",
    )
    p.add_argument(
        "--fim",
        action="store_true",
        help="run the code-completion bench instead: fill-in-the-middle requests as editors "
        "send them, time to the whole completion, plain vs the one --modes mode (default "
        "ngram-simple); with --native, llama-server's /infill on the same requests",
    )
    p.add_argument(
        "--rate",
        type=rate_list,
        default=None,
        metavar="R,R,...",
        help="run the arrival-rate bench instead: for each R, requests arriving at random at R "
        "per second, each sent when it arrives whatever is still running, on one engine with "
        "--parallel slots; plain batching vs fixed and load-aware speculation of the one "
        "--modes mode (default ngram-simple); mean, p50 and p95 latency from arrival; with "
        "--native, llama-server with as many slots",
    )
    p.add_argument(
        "--requests",
        type=at.count,
        default=None,
        help="with --concurrency: requests each client sends in one batch (default 2); with "
        f"--rate: requests per rate (default {REQUESTS_PER_RATE})",
    )
    p.add_argument(
        "--parallel",
        type=at.slots,
        default=None,
        metavar="N",
        help=f"with --rate: the engine's slots (and llama-server's -np; default {DEFAULT_SLOTS})",
    )
    p.add_argument(
        "--temps",
        default="0",
        help="comma-separated temperatures (default 0; --concurrency: the first one)",
    )
    p.add_argument(
        "-n", "--n-predict", type=at.count, default=128, help="tokens per run (default 128)"
    )
    p.add_argument("--repeat", type=at.count, default=3, help="interleaved repeats (default 3)")
    p.add_argument("--json", default=None, metavar="OUT", help="write JSON results")
    p.add_argument("--markdown", default=None, metavar="OUT.md", help="write a table")
    p.add_argument(
        "--plot",
        default=None,
        metavar="OUT.png",
        help="write a PNG plot (needs matplotlib: pip install localspec[plot])",
    )
    p.add_argument(
        "--native",
        default=None,
        metavar="DIR",
        help="also run llama.cpp's llama-speculative-simple from DIR "
        "(scripts/build-llama-cpp-tools builds it); with --concurrency, its llama-server",
    )
    p.set_defaults(handler=run)
