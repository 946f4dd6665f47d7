"""`localspec bench`: every (mode, prompt kind, temperature) cell against plain decoding of the
same target, in one process, interleaved over repeats so that machine noise hits every cell
alike. Speedups are computed per repeat from the raw timings of the plain run of the same
prompt and temperature in the same repeat, then summarised (median, min-max)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path

from localspec.api import Engine
from localspec.engine.costs import VerifyCost
from localspec.engine.loop import SpecConfig
from localspec.fileops import atomic_path
from localspec.lossless import compare
from localspec.measure import (
    CEILING_SLACK,
    draft_step_for,
    predicted_speedup,
    shown,
    undrafted,
    unearned,
)
from localspec.native import NativeRun
from localspec.prompts import PromptCase


@dataclass(frozen=True)
class Run:
    mode: str
    prompt: str
    kind: str
    temperature: float
    repeat: int
    n_tokens: int
    gen_ms: float
    tokens_per_s: float
    drafted: int
    accepted: int
    mean_acceptance_length: float
    acceptance_per_position: tuple[float, ...]
    draft_ms: float
    verify_ms: float
    tokens: tuple[int, ...] = field(repr=False, default=())
    margins: tuple[float, ...] = field(repr=False, default=())
    runners_up: tuple[tuple[int, ...], ...] = field(repr=False, default=())
    # plain decoding's cost for these tokens over this run's, priced on the calibrated cost
    # curve (``measure.predicted_speedup``): the figure the clock's noise does not move
    predicted: float | None = None


@dataclass(frozen=True)
class NativeCellRun:
    """llama.cpp's own tool on one prompt of a cell, run among localspec's runs of it."""

    mode: str
    prompt: str
    kind: str
    temperature: float
    repeat: int
    run: NativeRun


# llama.cpp's tool on (mode, prompt, temperature, repeat); None: no run (no counterpart, or
# the tool failed earlier)
NativeTool = Callable[[str, PromptCase, float, int], NativeRun | None]


@dataclass(frozen=True)
class Cell:
    mode: str
    kind: str
    temperature: float
    tokens_per_s_min: float
    tokens_per_s_median: float
    speedup_median: float
    speedup_min: float
    speedup_max: float
    acceptance_rate: float
    mean_acceptance_length: float
    acceptance_per_position: list[float]
    draft_share: float
    # at temperature 0: "identical", "near tie" or "DIVERGED (gap g)", g the plain run's
    # top-2 logit gap where the outputs part
    exact_match: str | None
    native_tokens_per_s: float | None = None
    native_drafted: int | None = None  # tokens the native tool drafted over the cell's runs
    # at temperature 0: (prompts whose answer from the native tool parts from plain decoding's,
    # prompts compared); its verify batches can tip a near tie, and it then times another text
    native_texts: tuple[int, int] | None = None
    drafted: int = 0  # tokens drafted and verified over the cell's runs
    predicted_median: float | None = None  # the median of the runs' ``Run.predicted``
    noise: tuple[str, ...] = ()  # why the cell's figure cannot be trusted (empty: it can)

    @property
    def noisy(self) -> bool:
        return bool(self.noise)

    @property
    def native_ratio(self) -> float | None:
        """localspec's tokens/s over llama.cpp's own tool's on the same cell (None: no
        native figure)."""
        if not self.native_tokens_per_s:
            return None
        return self.tokens_per_s_median / self.native_tokens_per_s

    def to_dict(self) -> dict[str, object]:
        ratio = self.native_ratio
        return {
            **asdict(self),
            "native_ratio": None if ratio is None else round(ratio, 3),
            "noise": list(self.noise),
            "noisy": self.noisy,
        }


def native_ratios(cells: Sequence[Cell]) -> dict[str, tuple[float, float, float, int]]:
    """Per mode, against llama.cpp's own tool: (geometric mean, lowest, highest, cells)."""
    by_mode: dict[str, list[float]] = {}
    for c in cells:
        if c.native_ratio is not None:
            by_mode.setdefault(c.mode, []).append(c.native_ratio)
    return {
        mode: (statistics.geometric_mean(r), min(r), max(r), len(r)) for mode, r in by_mode.items()
    }


def native_text(c: Cell) -> str:
    """A cell's native column: llama.cpp's tok/s and localspec's ratio to it (and whether the
    tool drafted at all: where it did not, it ran plain decoding)."""
    ratio = c.native_ratio
    if ratio is None:
        return "-"
    drafted = ", no drafts" if c.native_drafted == 0 else ""
    other = ""
    if c.native_texts is not None and c.native_texts[0]:
        other = f", another text: {c.native_texts[0]} of {c.native_texts[1]}"
    return f"{c.native_tokens_per_s:.1f} ({ratio:.2f}x{drafted}{other})"


def native_lines(cells: Sequence[Cell]) -> list[str]:
    lines = [
        f"{mode} vs llama.cpp's own: {g:.2f}x geometric mean over {n} cell(s) ({lo:.2f}-{hi:.2f})"
        for mode, (g, lo, hi, n) in sorted(native_ratios(cells).items())
    ]
    parted = sum(c.native_texts is not None and c.native_texts[0] > 0 for c in cells)
    if parted:
        lines.append(
            f"llama.cpp's tool wrote another answer than plain decoding in {parted} cell(s) "
            "('another text': a near tie went the other way, so the ratio compares two texts)"
        )
    return lines


def run_cells(
    engine: Engine,
    modes: Sequence[str],
    prompts: Sequence[PromptCase],
    temps: Sequence[float],
    n_tokens: int,
    repeats: int,
    seed: int = 0,
    spec_for: Callable[[str], SpecConfig] | None = None,
    native: NativeTool | None = None,
) -> Iterator[Run | NativeCellRun]:
    """Interleave: repeat > prompt > temperature > plain, each mode and, with ``native``,
    llama.cpp's tool in each mode, in an order that rotates with the repeat (a machine that
    slows down over consecutive runs, as a burstable VM does, would otherwise always penalise
    the modes that run after plain decoding, and a tool run minutes after localspec's would
    compare two moments of the machine)."""
    modes = [m for m in modes if m != "none"]
    order = [(False, "none"), *[(False, m) for m in modes]]
    order += [(True, m) for m in modes] if native is not None else []
    grammars = {case.name: case.grammar for case in prompts}  # converted once
    cost, draft_step = engine.verify_cost(), engine.draft_step_seconds()
    one = partial(_run, engine, n_tokens, spec_for, cost, draft_step)
    for repeat in range(repeats):
        shift = repeat % len(order)
        for case in prompts:
            for temp in temps:
                for tool, mode in order[shift:] + order[:shift]:
                    if not tool:
                        yield one(case, grammars[case.name], mode, temp, seed + repeat, repeat)
                    elif native is not None and (ran := native(mode, case, temp, seed + repeat)):
                        yield NativeCellRun(mode, case.name, case.kind, temp, repeat, ran)


def _run(
    engine: Engine,
    n_tokens: int,
    spec_for: Callable[[str], SpecConfig] | None,
    cost: VerifyCost,
    draft_step: float | None,
    case: PromptCase,
    grammar: str | None,
    mode: str,
    temp: float,
    seed: int,
    repeat: int,
) -> Run:
    """One of localspec's runs of a cell: a fresh request, timed."""
    engine.memory.clear()  # each cell is a fresh request, not a repeat
    r = engine.generate(
        case.messages,
        chat=True,
        max_tokens=n_tokens,
        temperature=temp,
        seed=seed,
        mode=mode,
        spec=spec_for(mode) if spec_for else None,
        record_margins=(mode == "none" and temp == 0),
        grammar=grammar,
    )
    s = r.stats
    return Run(
        mode,
        case.name,
        case.kind,
        temp,
        repeat,
        s.n_tokens,
        s.gen_ms,
        s.tokens_per_s,
        s.drafted,
        s.accepted,
        s.mean_acceptance_length,
        s.acceptance_per_position,
        s.draft_ms,
        s.verify_ms,
        tuple(r.tokens),
        tuple(r.margins),
        tuple(r.runners_up),
        None if mode == "none" else predicted_speedup(s, cost, draft_step_for(mode, s, draft_step)),
    )


def summarise(runs: Sequence[Run]) -> list[Cell]:
    plain = {(r.prompt, r.temperature, r.repeat): r for r in runs if r.mode == "none"}
    groups: dict[tuple[str, str, float], list[Run]] = {}
    for r in runs:
        groups.setdefault((r.mode, r.kind, r.temperature), []).append(r)
    cells = []
    for (mode, kind, temp), rs in groups.items():
        speedups = [
            r.tokens_per_s / plain[(r.prompt, r.temperature, r.repeat)].tokens_per_s
            for r in rs
            if plain.get((r.prompt, r.temperature, r.repeat))
        ]
        drafted = sum(r.drafted for r in rs)
        busy = sum(r.draft_ms + r.verify_ms for r in rs)
        cells.append(
            Cell(
                mode=mode,
                kind=kind,
                temperature=temp,
                tokens_per_s_min=min(r.tokens_per_s for r in rs),
                tokens_per_s_median=statistics.median(r.tokens_per_s for r in rs),
                speedup_median=statistics.median(speedups) if speedups else 0.0,
                speedup_min=min(speedups, default=0.0),
                speedup_max=max(speedups, default=0.0),
                acceptance_rate=sum(r.accepted for r in rs) / drafted if drafted else 0.0,
                mean_acceptance_length=statistics.mean(r.mean_acceptance_length for r in rs),
                acceptance_per_position=mean_positions([r.acceptance_per_position for r in rs]),
                draft_share=sum(r.draft_ms for r in rs) / busy if busy else 0.0,
                exact_match=exact_match(rs, plain) if temp == 0 else None,
                drafted=drafted,
                predicted_median=median_of(r.predicted for r in rs),
            )
        )
    return cells


def median_of(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def flag_noise(cells: Sequence[Cell], ceiling: float) -> list[Cell]:
    """A median no drafting could reach on this machine is a measurement error (the machine
    changed speed between a cell's runs and its plain runs): flag it, never report it plain."""
    flagged = []
    for c in cells:
        if c.mode == "none":
            flagged.append(c)
            continue
        if c.speedup_median > ceiling * CEILING_SLACK:
            reason = f"median {c.speedup_median:.2f}x above this machine's {ceiling:.2f}x ceiling"
            c = replace(c, noise=(*c.noise, reason))
        if why := unearned(c.speedup_median, c.acceptance_rate > 0):
            c = replace(c, noise=(*c.noise, why))
        if why := undrafted(c.speedup_median, c.mode, c.drafted > 0):
            c = replace(c, noise=(*c.noise, why))
        flagged.append(c)
    return flagged


def mean_positions(rows: Sequence[Sequence[float]]) -> list[float]:
    width = max((len(r) for r in rows), default=0)
    cols = [[r[i] for r in rows if i < len(r)] for i in range(width)]
    return [round(statistics.mean(c), 4) for c in cols]


def exact_match(runs: Sequence[Run], plain: dict[tuple[str, float, int], Run]) -> str:
    worst = "identical"
    for r in runs:
        p = plain.get((r.prompt, r.temperature, r.repeat))
        if p is None:  # an interrupted bench: this repeat's plain run never came
            continue
        report = compare(p.tokens, p.margins, r.tokens, p.runners_up)
        if not report.ok:  # the gap says how far from a tie (near ties are below 0.25)
            gap = "" if report.margin is None else f" (gap {report.margin:.2f})"
            return f"DIVERGED{gap}"
        if not report.identical:
            worst = "near tie"
    return worst


def meaning(mode: str, cells: Sequence[Cell], ceiling: float | None) -> str:
    """One plain-language line per mode."""
    mine = [c for c in cells if c.mode == mode and not c.noisy]
    if mode == "none" or not mine:
        return ""
    best = max(mine, key=lambda c: c.speedup_median)
    worst = min(mine, key=lambda c: c.speedup_median)
    if best.speedup_median < 1.0:
        why = (
            "the draft costs nearly a target step on this compute-bound CPU"
            if "draft-model" in mode or "draft-self" in mode
            else "little of the output repeats its context"
        )
        return f"{mode}: slower than plain everywhere here ({why})"
    text = f"{mode}: up to {best.speedup_median:.2f}x on {best.kind}"
    if ceiling:
        text += f" ({100 * best.speedup_median / ceiling:.0f}% of the {ceiling:.2f}x ceiling)"
    if worst.speedup_median < 0.97:
        text += f"; loses on {worst.kind} ({worst.speedup_median:.2f}x)"
    return text


def plot(cells: Sequence[Cell], path: str, title: str) -> None:
    """Speedup by mode and prompt kind, with the 1.0 line marked (matplotlib, optional)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [c for c in cells if c.mode != "none"]
    labels = sorted({f"{c.kind}\nT={c.temperature:g}" for c in shown})
    modes = sorted({c.mode for c in shown})
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(labels) * max(1, len(modes))), 4))
    width = 0.8 / max(1, len(modes))
    for i, mode in enumerate(modes):
        values = {f"{c.kind}\nT={c.temperature:g}": c for c in shown if c.mode == mode}
        xs = [j + i * width for j in range(len(labels))]
        heights = [values[lab].speedup_median if lab in values else 0 for lab in labels]
        low = [
            h - (values[lab].speedup_min if lab in values else 0)
            for h, lab in zip(heights, labels, strict=True)
        ]
        high = [
            (values[lab].speedup_max if lab in values else 0) - h
            for h, lab in zip(heights, labels, strict=True)
        ]
        ax.bar(xs, heights, width, label=mode, yerr=[low, high], capsize=3)
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="plain decoding")
    ax.set_xticks([j + width * (len(modes) - 1) / 2 for j in range(len(labels))], labels)
    ax.set_ylabel("speedup vs plain (median, min-max)")
    ax.set_title(title, wrap=True)  # the machine line can be longer than the plot
    ax.legend()
    fig.tight_layout()
    with atomic_path(Path(path)) as tmp:  # a full disk leaves no half image
        fig.savefig(tmp, dpi=110, format=plot_format(path))
    plt.close(fig)


def plot_format(path: str) -> str:
    """The image format a ``--plot`` path asks for, by its extension (png by default)."""
    return Path(path).suffix.lstrip(".").lower() or "png"


def speedup_text(c: Cell, ceiling: float) -> str:
    if c.mode == "none":
        return "1.00x"
    return shown(c.speedup_median, c.speedup_min, c.speedup_max, c.noisy, ceiling)


def predicted_text(c: Cell) -> str:
    """The cell's clock-free speedup: its runs priced on the calibrated cost curve."""
    return "-" if c.predicted_median is None else f"{c.predicted_median:.2f}x"


def markdown(cells: Sequence[Cell], header: str, ceiling: float) -> str:
    lines = [
        header,
        "",
        "| mode | kind | T | tok/s (median) | speedup (median, min-max) | predicted | "
        "accept | L | draft share | exact match | native tok/s (localspec/native) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in sorted(cells, key=lambda c: (c.mode, c.kind, c.temperature)):
        native = native_text(c)
        lines.append(
            f"| {c.mode} | {c.kind} | {c.temperature:g} | {c.tokens_per_s_median:.1f} | "
            f"{speedup_text(c, ceiling)} | {predicted_text(c)} | "
            f"{100 * c.acceptance_rate:.0f}% | {c.mean_acceptance_length:.2f} | "
            f"{100 * c.draft_share:.0f}% | {c.exact_match or '-'} | {native} |"
        )
    return "\n".join(lines) + "\n"
