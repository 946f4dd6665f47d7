"""`localspec bench --concurrency 1,2,4,8`: aggregate throughput and request latency with
several clients at once (``localspec/concurrency.py``), plain batching against fixed and
load-aware speculation on one Engine, and with ``--native DIR`` against llama-server."""

from __future__ import annotations

import argparse
import json
import platform
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from localspec import argtypes as at
from localspec import bench, native
from localspec import concurrency as cc
from localspec import native_server as ns
from localspec.commands.bench_output import (
    check_outputs,
    nothing_measured,
    parse_list,
    write_text,
)
from localspec.commands.flags import engine_options
from localspec.engine.costs import VerifyCost
from localspec.engine.prompting import render_chat
from localspec.engine.settings import GenerationSettings
from localspec.errors import LocalspecError
from localspec.fileops import atomic_path
from localspec.hardware import MachineLoad, machine_load
from localspec.progress import plural, report_console
from localspec.prompts import PromptCase, select_prompts

PROMPTS = "code-edit,code,qa,summary,creative,french"  # a mix: copying edits and free text
DEFAULT_MODE = "ngram-simple"
WARM_UP_TOKENS = 8
REQUESTS_PER_CLIENT = 2  # a closed loop: a client that finishes early sends its next one


def run_concurrency(args: argparse.Namespace) -> int:
    from localspec.api import Engine

    levels: list[int] = args.concurrency
    mode = check_args(args)
    temperature = parse_list(args.temps, "--temps", at.temperature)[0]
    prompts = select_prompts(args.prompts if args.prompts is not None else PROMPTS)
    check_outputs(argparse.Namespace(**{**vars(args), "native": None}))  # not the cells' tool
    if args.native is not None:
        ns.check_server(Path(args.native))
    args.mode = mode
    per_client = args.requests or REQUESTS_PER_CLIENT
    options = {**engine_options(args), "parallel": max(levels)}
    spec = options["spec"]
    console = report_console(stderr=True)  # progress; the results go to standard output
    machine = machine_load()
    console.print(machine.describe())
    settings = GenerationSettings(max_tokens=args.n_predict, temperature=temperature)
    stop = threading.Event()
    curve: VerifyCost | None = None
    runs: list[cc.BatchRun] = []
    interrupted, failure = False, None
    load = Load(prompts, per_client, args.repeat, args.n_predict, temperature)
    with Engine.load(**options) as engine:
        model = engine.target_path.name
        server = server_settings(args, engine, options) if args.native else None
        texts = [render_chat(engine.target, p.messages) for p in prompts]
        try:
            warm = settings.but(max_tokens=WARM_UP_TOKENS)
            for config in cc.engine_configs(engine, prompts, warm, mode, spec, stop):
                cc.run_batch(config.send, [[cc.Request(0, 0)]], stop)
            configs = cc.engine_configs(engine, prompts, settings, mode, spec, stop)
            curve = engine.verify_cost(spec.n_max).frozen()  # the warm-up calibrated it
            console.print(f"  {curve_line(curve)}")
            for level in levels:
                batches = measure(load, configs, level, stop)
                if server is not None:
                    batches = chain(batches, measure_native(load, server, texts, mode, level, stop))
                for run in batches:
                    console.print(
                        f"  [{run.repeat + 1}/{args.repeat}] {plural(level, 'client'):>10} "
                        f"{run.config:20} {run.tokens_per_s:7.1f} tok/s "
                        f"({run.tokens} tokens in {run.wall_s:.1f} s; "
                        f"in flight {run.in_flight_tokens_per_s:.1f})"
                    )
                    runs.append(run)
        except KeyboardInterrupt:
            stop.set()
            interrupted = True
            console.print("[yellow]interrupted: the batches so far follow[/]")
        except LocalspecError as exc:  # llama-server failed mid-way: keep what was measured
            stop.set()
            failure = exc
    points = cc.summarise(runs)
    header = (
        f"localspec bench --concurrency: {model}, {mode} (n-max {spec.n_max}), "
        f"{args.n_predict} tokens, T={temperature:g}, {per_client} request(s) per client, "
        f"{args.repeat} repeat(s), "
        f"{' '.join(filter(None, (platform.machine(), platform.processor())))}, "
        f"machine {'busy' if machine.busy else 'quiet'}"
        + (", interrupted: partial" if interrupted or failure else "")
    )
    partial = interrupted or failure is not None
    report(args, report_console(), header, model, load, points, runs, machine, partial, curve)
    if failure is not None:
        raise LocalspecError(f"the bench stopped: {failure.message}", failure.hint)
    return 130 if interrupted else 0


def curve_line(curve: VerifyCost) -> str:
    """The calibrated batch costs, in one-row steps: what the load-aware budget priced by."""
    one = float(curve.seconds[0])
    shown = [n for n in (2, 4, 8, 16, 48) if n <= curve.sizes[-1]]
    steps = ", ".join(f"{n} rows {float(curve(np.array([n]))[0]) / one:.1f}" for n in shown)
    return f"cost curve (one-row step {1000 * one:.1f} ms; in steps): {steps}"


@dataclass(frozen=True)
class Load:
    """What every client sends: its requests over ``prompts``, how many, how long."""

    prompts: Sequence[PromptCase]
    per_client: int
    repeats: int
    n_tokens: int
    temperature: float


def measure(
    load: Load, configs: Sequence[cc.Config], level: int, stop: threading.Event
) -> Iterator[cc.BatchRun]:
    """localspec's configurations at one concurrency, interleaved."""
    return cc.run_level(configs, level, load.per_client, len(load.prompts), load.repeats, stop)


def measure_native(
    load: Load,
    server: ns.ServerSettings,
    texts: Sequence[str],
    mode: str,
    level: int,
    stop: threading.Event,
) -> Iterator[cc.BatchRun]:
    """llama-server plain, then with its own speculation, each on a server of its own with
    ``level`` slots (two servers at once would share the cores even while one waits)."""
    schemas = [p.schema for p in load.prompts]
    for native_mode in ("none", mode):
        name = cc.NATIVE_PREFIX + ("plain" if native_mode == "none" else native_mode)
        with ns.running_server(server, level, native_mode) as url:
            warm = ns.server_sender(url, texts, schemas, WARM_UP_TOKENS, load.temperature, stop)
            cc.run_batch(warm, [[cc.Request(0, 0)]], stop)
            send = ns.server_sender(url, texts, schemas, load.n_tokens, load.temperature, stop)
            config = cc.Config(name, send)
            yield from measure(load, [config], level, stop)


def check_args(args: argparse.Namespace) -> str:
    """The one speculative mode that fixed and load-aware speculation use."""
    from localspec.modes import canonical, neural_part

    if args.scenarios is not None:
        raise LocalspecError(
            "--concurrency and --scenarios are two different benches",
            "run them one at a time",
        )
    if args.no_adaptive:
        raise LocalspecError(
            "--no-adaptive does not apply to --concurrency: it measures fixed-length and "
            "load-aware (adaptive) speculation both",
            "drop --no-adaptive",
        )
    given = args.modes is not None
    listed = parse_list(args.modes, "--modes", canonical) if given else []
    modes = [m for m in listed if m != "none"]
    if given and len(modes) != 1:
        raise LocalspecError(
            "--modes with --concurrency: give the one speculative mode to measure "
            f"(plain decoding is always measured; got {', '.join(modes) or 'none'})",
            "e.g. --modes ngram-simple",
        )
    mode = modes[0] if modes else DEFAULT_MODE
    if "draft-model" in mode.split("+") and args.draft is None:
        raise LocalspecError("--modes draft-model needs a draft model (-md)")
    if neural_part(mode) == "draft-mtp":
        raise LocalspecError(
            "draft-mtp runs one generation at a time: it has no concurrency to measure",
            "use another mode, e.g. --modes ngram-simple",
        )
    if args.native is not None and not native.supported(mode):
        raise LocalspecError(
            f"--native: llama-server has no counterpart of {mode}",
            "bench ngram-simple or draft-model against it, or drop --native",
        )
    return mode


def server_settings(args, engine, options) -> ns.ServerSettings:  # type: ignore[no-untyped-def]
    from localspec.hardware import default_threads

    return ns.ServerSettings(
        Path(args.native),
        engine.target_path,
        engine.draft.path if engine.draft else None,
        engine.target.options.n_threads or default_threads(),
        options["n_ctx"],
        options["spec"].n_max,
        engine.target.flash_attn,
    )


# ----- the report --------------------------------------------------------------------------

COLUMNS = ("clients", "config", "tok/s (min-max)", "vs plain", "in flight", "p50 latency",
           "p95 latency", "requests", "shared drafts")  # fmt: skip


def rows(points: Sequence[cc.Point]) -> list[tuple[str, ...]]:
    plain = cc.speeds(points, cc.PLAIN)
    out = []
    for p in sorted(points, key=lambda p: (p.concurrency, order(p.config))):
        base = plain.get(p.concurrency)
        out.append(
            (
                str(p.concurrency),
                p.config,
                f"{p.tokens_per_s:.1f} ({p.tokens_per_s_min:.1f}-{p.tokens_per_s_max:.1f})",
                f"{p.tokens_per_s / base:.2f}x" if base else "-",
                f"{p.in_flight:.1f}",
                f"{p.p50_s:.2f} s",
                f"{p.p95_s:.2f} s",
                str(p.requests),
                "-" if p.shared_draft is None else f"{100 * p.shared_draft:.0f}%",
            )
        )
    return out


def order(config: str) -> tuple[int, bool, str]:
    """plain, fixed, load-aware, then llama-server's: plain first."""
    if config in cc.CONFIGS:
        return (cc.CONFIGS.index(config), False, "")
    return (len(cc.CONFIGS), config != cc.NATIVE_PREFIX + "plain", config)


def report(  # type: ignore[no-untyped-def]
    args,
    console: Console,
    header: str,
    model: str,
    load: Load,
    points,
    runs,
    machine: MachineLoad,
    partial: bool,
    curve: VerifyCost | None = None,
) -> None:
    table = Table(title=header)
    for col in COLUMNS:
        table.add_column(col)
    for row in rows(points):
        table.add_row(*row)
    console.print(table)
    lines = cc.meaning(points)
    lines.append(
        "in flight: tok/s while every client still had work (before the batch's drain, "
        "where the requests left run fewer at once)"
    )
    lines.append(
        "shared drafts: of the draft tokens the slots' controllers wanted in steps shared "
        "with other clients, the share verified (the rest cut to what pays for the step)"
    )
    for line in lines:
        console.print(f"  {line}")
    console.print(f"  {machine.describe()}")
    if curve is not None:
        console.print(f"  {curve_line(curve)}")
    if nothing_measured(args, console, bool(runs)):
        return
    if args.json:
        data = {
            "model": model,
            "n_tokens": args.n_predict,
            "requests_per_client": load.per_client,
            "temperature": load.temperature,
            "repeat": args.repeat,
            "concurrency": args.concurrency,
            "machine": machine.to_dict(),
            # what the shared budget priced steps by: the target's calibrated batch costs
            "cost_curve": None
            if curve is None
            else {
                "rows": [int(n) for n in curve.sizes],
                "seconds": [round(float(t), 5) for t in curve.seconds],
            },
            "points": [p.to_dict() for p in points],
            "batches": [
                {
                    "config": r.config,
                    "concurrency": r.concurrency,
                    "repeat": r.repeat,
                    "tokens": r.tokens,
                    "wall_s": round(r.wall_s, 3),
                    "tokens_per_s": round(r.tokens_per_s, 2),
                    "in_flight_tokens_per_s": round(r.in_flight_tokens_per_s, 2),
                }
                for r in runs
            ],
            "crossover": cc.crossover(points),
            "native_ratio": {
                str(n): round(ratio, 3) for n, (ratio, _) in cc.native_ratios(points).items()
            },
            "native_ratio_in_flight": {
                str(n): round(ratio, 3)
                for n, (ratio, _) in cc.native_ratios(points, in_flight=True).items()
            },
            "meaning": lines,
            "partial": partial,  # Ctrl-C: the batches measured so far
        }
        write_text(args.json, json.dumps(data, indent=2))
    if args.markdown:
        write_text(args.markdown, markdown(header, points) + "".join(f"- {x}\n" for x in lines))
    if args.plot and points:
        plot(points, args.plot, header)


def markdown(header: str, points: Sequence[cc.Point]) -> str:
    lines = [f"**{header}**", "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row) + " |" for row in rows(points)]
    return "\n".join(lines) + "\n\n"


def plot(points: Sequence[cc.Point], path: str, title: str) -> None:
    """Aggregate tok/s against the number of clients, one line per configuration (native
    dashed), the crossover marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for config in sorted({p.config for p in points}, key=order):
        mine = sorted((p for p in points if p.config == config), key=lambda p: p.concurrency)
        ax.plot(
            [p.concurrency for p in mine],
            [p.tokens_per_s for p in mine],
            "--" if config.startswith(cc.NATIVE_PREFIX) else "-",
            marker="o",
            label=config,
        )
    n = cc.crossover(points)
    if n is not None:
        ax.axvline(n, color="grey", linestyle=":", linewidth=1)
        ax.annotate(
            f"crossover: plain > fixed at {n}",
            (n, cc.speeds(points, cc.PLAIN)[n]),
            textcoords="offset points",
            xytext=(6, -14),
            fontsize=8,
        )
    levels = sorted({p.concurrency for p in points})
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(n) for n in levels])
    ax.set_xlabel("concurrent clients")
    ax.set_ylabel("aggregate tok/s (median)")
    ax.set_title(title, wrap=True, fontsize=8)
    ax.legend()
    fig.tight_layout()
    with atomic_path(Path(path)) as tmp:  # a full disk leaves no half image
        fig.savefig(tmp, dpi=110, format=bench.plot_format(path))
    plt.close(fig)
