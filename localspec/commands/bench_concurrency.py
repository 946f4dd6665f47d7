"""`localspec bench --concurrency 1,2,4,8`: aggregate throughput and request latency with
several clients at once (``localspec/concurrency.py``), plain batching against fixed and
load-aware speculation on one Engine, and with ``--native DIR`` against llama-server."""

from __future__ import annotations

import argparse
import json
import platform
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np
from rich.console import Console

from localspec import argtypes as at
from localspec import bench, native
from localspec import concurrency as cc
from localspec import native_server as ns
from localspec.arrivals import RatePoint, RateRun
from localspec.commands.bench_output import (
    check_outputs,
    markdown_table,
    nothing_measured,
    parse_list,
    print_table,
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
    levels: list[int] = args.concurrency
    per_client = args.requests or REQUESTS_PER_CLIENT

    def here(load: Load, configs: Sequence[cc.Config], level: int) -> Iterator[cc.BatchRun]:
        n_prompts = len(load.prompts)
        return cc.run_level(configs, level, load.requests, n_prompts, load.repeats, load.stop)

    def native_slots(level: int) -> int:  # llama-server -np N for N clients
        return level

    measured = measure_levels(args, levels, max(levels), per_client, here, native_slots, batch_line)
    header = title(args, measured, "--concurrency", f"{per_client} request(s) per client")
    points = cc.summarise(measured.runs)
    report(args, report_console(), header, measured, points)
    return measured.exit_code()


def title(args: argparse.Namespace, measured: Measured[R], bench_flag: str, load: str) -> str:
    """The report's first line: what ran, on what, and how quiet the machine was."""
    return (
        f"localspec bench {bench_flag}: {measured.model}, {measured.mode} "
        f"(n-max {measured.n_max}), {args.n_predict} tokens, T={measured.load.temperature:g}, "
        f"{load}, {args.repeat} repeat(s), "
        f"{' '.join(filter(None, (platform.machine(), platform.processor())))}, "
        f"machine {'busy' if measured.machine.busy else 'quiet'}"
        + (", interrupted: partial" if measured.partial else "")
    )


def batch_line(run: cc.BatchRun) -> str:
    return (
        f"{plural(run.concurrency, 'client'):>10} {run.config:20} {run.tokens_per_s:7.1f} "
        f"tok/s ({run.tokens} tokens in {run.wall_s:.1f} s; "
        f"in flight {run.in_flight_tokens_per_s:.1f})"
    )


R = TypeVar("R", cc.BatchRun, RateRun)
Level = TypeVar("Level", int, float)


@dataclass
class Measured(Generic[R]):
    """A load bench's runs, and what its report says of them."""

    model: str
    mode: str
    n_max: int
    load: Load
    machine: MachineLoad
    runs: list[R]
    curve: VerifyCost | None
    interrupted: bool
    failure: LocalspecError | None

    @property
    def partial(self) -> bool:
        return self.interrupted or self.failure is not None

    def exit_code(self) -> int:
        if self.failure is not None:
            raise LocalspecError(f"the bench stopped: {self.failure.message}", self.failure.hint)
        return 130 if self.interrupted else 0


def measure_levels(
    args: argparse.Namespace,
    levels: Sequence[Level],
    slots: int,
    requests: int,
    here: Callable[[Load, Sequence[cc.Config], Level], Iterator[R]],
    native_slots: Callable[[Level], int],
    line: Callable[[R], str],
) -> Measured[R]:
    """Load one engine with ``slots`` slots and run its configurations at every level
    (``here``), with ``--native`` llama-server's too (``native_slots(level)`` slots),
    interleaved with them; each run's progress ``line`` on standard error. Ctrl-C or a
    failing llama-server ends the levels early and keeps what was measured."""
    from localspec.api import Engine

    mode = check_args(args)
    temperature = parse_list(args.temps, "--temps", at.temperature)[0]
    prompts = select_prompts(args.prompts if args.prompts is not None else PROMPTS)
    check_outputs(argparse.Namespace(**{**vars(args), "native": None}))  # not the cells' tool
    if args.native is not None:
        ns.check_server(Path(args.native))
    args.mode = mode
    options = {**engine_options(args), "parallel": slots}
    spec = options["spec"]
    console = report_console(stderr=True)  # progress; the results go to standard output
    machine = machine_load()
    console.print(machine.describe())
    settings = GenerationSettings(max_tokens=args.n_predict, temperature=temperature)
    stop = threading.Event()
    curve: VerifyCost | None = None
    runs: list[R] = []
    interrupted, failure = False, None
    load = Load(prompts, requests, args.repeat, args.n_predict, temperature, mode, stop)
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
                n = native_slots(level)
                level_runs = with_native(load, configs, server, texts, n, level, here)
                with closing(level_runs):  # its servers stop at once however the loop ends
                    for run in level_runs:
                        console.print(f"  [{run.repeat + 1}/{args.repeat}] {line(run)}")
                        runs.append(run)
        except KeyboardInterrupt:
            stop.set()
            interrupted = True
            console.print("[yellow]interrupted: the runs so far follow[/]")
        except LocalspecError as exc:  # llama-server failed mid-way: keep what was measured
            stop.set()
            failure = exc
    return Measured(model, mode, spec.n_max, load, machine, runs, curve, interrupted, failure)


def curve_line(curve: VerifyCost) -> str:
    """The calibrated batch costs, in one-row steps: what the load-aware budget priced by."""
    one = float(curve.seconds[0])
    shown = [n for n in (2, 4, 8, 16, 48) if n <= curve.sizes[-1]]
    steps = ", ".join(f"{n} rows {float(curve(np.array([n]))[0]) / one:.1f}" for n in shown)
    return f"cost curve (one-row step {1000 * one:.1f} ms; in steps): {steps}"


@dataclass(frozen=True)
class Load:
    """What is sent: requests over ``prompts`` (``requests`` per client with
    ``--concurrency``, per rate with ``--rate``), how long, sampled how, drafted by which
    ``mode``; ``stop`` set by Ctrl-C or a failure."""

    prompts: Sequence[PromptCase]
    requests: int
    repeats: int
    n_tokens: int
    temperature: float
    mode: str
    stop: threading.Event


def with_native(
    load: Load,
    configs: Sequence[cc.Config],
    server: ns.ServerSettings | None,
    texts: Sequence[str],
    slots: int,
    level: Level,
    run: Callable[[Load, Sequence[cc.Config], Level], Iterator[R]],
) -> Iterator[R]:
    """The runs at one level: ``configs``, and with ``server`` llama-server plain and with
    its own speculation (``slots`` slots each), all interleaved by ``run`` (each repeat runs
    every configuration, the order rotated). A bench takes many minutes, over which a shared
    machine's speed drifts by more than the gaps it measures; runs of the two servers next to
    localspec's keep that drift out of their ratio. Both servers are up for the level, warmed,
    and stopped when it ends however it ends: an idle llama-server takes no CPU."""
    with ExitStack() as stack:
        natives = [] if server is None else native_configs(load, server, texts, slots, stack)
        yield from run(load, [*configs, *natives], level)


def native_configs(
    load: Load, server: ns.ServerSettings, texts: Sequence[str], slots: int, stack: ExitStack
) -> list[cc.Config]:
    """llama-server plain, and with its own speculation, each a server of its own with
    ``slots`` slots, started (stopped with ``stack``) and warmed up."""
    schemas = [p.schema for p in load.prompts]
    configs = []
    for native_mode in ("none", load.mode):
        name = cc.NATIVE_PREFIX + ("plain" if native_mode == "none" else native_mode)
        url = stack.enter_context(ns.running_server(server, slots, native_mode))
        warm = ns.server_sender(url, texts, schemas, WARM_UP_TOKENS, load.temperature, load.stop)
        cc.run_batch(warm, [[cc.Request(0, 0)]], load.stop)
        send = ns.server_sender(url, texts, schemas, load.n_tokens, load.temperature, load.stop)
        configs.append(cc.Config(name, send))
    return configs


def check_args(args: argparse.Namespace) -> str:
    """The one speculative mode that fixed and load-aware speculation use."""
    from localspec.modes import canonical, neural_part

    flag = "--rate" if getattr(args, "rate", None) is not None else "--concurrency"
    if args.scenarios is not None:
        raise LocalspecError(
            f"{flag} and --scenarios are two different benches",
            "run them one at a time",
        )
    if args.no_adaptive:
        raise LocalspecError(
            f"--no-adaptive does not apply to {flag}: it measures fixed-length and "
            "load-aware (adaptive) speculation both",
            "drop --no-adaptive",
        )
    given = args.modes is not None
    listed = parse_list(args.modes, "--modes", canonical) if given else []
    modes = [m for m in listed if m != "none"]
    if given and len(modes) != 1:
        raise LocalspecError(
            f"--modes with {flag}: give the one speculative mode to measure "
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


def report(
    args: argparse.Namespace,
    console: Console,
    header: str,
    measured: Measured[cc.BatchRun],
    points: Sequence[cc.Point],
) -> None:
    print_table(console, header, COLUMNS, rows(points))
    lines = cc.meaning(points)
    lines.append(
        "in flight: tok/s while every client still had work (before the batch's drain, "
        "where the requests left run fewer at once)"
    )
    lines.append(
        "shared drafts: of the draft tokens the slots' controllers wanted in steps shared "
        "with other clients, the share verified (the rest cut to what pays for the step)"
    )
    print_footer(console, lines, measured)
    if nothing_measured(args, console, bool(measured.runs)):
        return
    if args.json:
        data = {
            **common_json(args, measured),
            "requests_per_client": measured.load.requests,
            "concurrency": args.concurrency,
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
                for r in measured.runs
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
            "partial": measured.partial,  # Ctrl-C: the batches measured so far
        }
        write_text(args.json, json.dumps(data, indent=2))
    if args.markdown:
        write_text(args.markdown, markdown_table(header, COLUMNS, rows(points), lines))
    if args.plot and points:
        plot(points, args.plot, header)


def print_footer(console: Console, lines: Sequence[str], measured: Measured[R]) -> None:
    """What the figures say, then the machine's load and the cost curve the budget used."""
    for line in lines:
        console.print(f"  {line}")
    console.print(f"  {measured.machine.describe()}")
    if measured.curve is not None:
        console.print(f"  {curve_line(measured.curve)}")


def common_json(args: argparse.Namespace, measured: Measured[R]) -> dict[str, object]:
    """What a load bench's JSON says of its set-up: the model, the load, the machine, and
    the calibrated batch costs the shared budget priced steps by."""
    curve = measured.curve
    return {
        "model": measured.model,
        "mode": measured.mode,
        "n_tokens": args.n_predict,
        "temperature": measured.load.temperature,
        "repeat": args.repeat,
        "machine": measured.machine.to_dict(),
        "cost_curve": None
        if curve is None
        else {
            "rows": [int(n) for n in curve.sizes],
            "seconds": [round(float(t), 5) for t in curve.seconds],
        },
    }


def plot(points: Sequence[cc.Point], path: str, title: str) -> None:
    """Aggregate tok/s against the number of clients, one line per configuration (native
    dashed), the crossover marked."""
    with config_plot(path, title, "concurrent clients", "aggregate tok/s (median)") as ax:
        config_lines(ax, points, lambda p: p.concurrency, lambda p: p.tokens_per_s)
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


P = TypeVar("P", cc.Point, RatePoint)


def config_lines(
    ax: Any, points: Sequence[P], x: Callable[[P], float], y: Callable[[P], float]
) -> None:
    """One line per configuration, in the report's order, llama-server's dashed."""
    for config in sorted({p.config for p in points}, key=order):
        mine = sorted((p for p in points if p.config == config), key=x)
        style = "--" if config.startswith(cc.NATIVE_PREFIX) else "-"
        ax.plot([x(p) for p in mine], [y(p) for p in mine], style, marker="o", label=config)


@contextmanager
def config_plot(path: str, title: str, x_label: str, y_label: str) -> Iterator[Any]:
    """A figure's axes to draw on; with its labels, title and legend, written whole to
    ``path`` on the way out (a full disk leaves no half image)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    try:
        yield ax
        ax.set_xlabel(x_label)
        ax.set_ylabel(y_label)
        ax.set_title(title, wrap=True, fontsize=8)
        ax.legend()
        fig.tight_layout()
        with atomic_path(Path(path)) as tmp:
            fig.savefig(tmp, dpi=110, format=bench.plot_format(path))
    finally:
        plt.close(fig)
