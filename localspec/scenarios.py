"""Multi-request scenarios for `localspec bench --scenarios`: request sequences whose answers
repeat what the model wrote in earlier requests (``prompts/scenarios.toml``: regenerate, of prose
and of code, batch, docstrings, agent), for the suffix drafter's memory.

Every mode runs each scenario from an empty memory, its requests in order, so request i of a
mode has what that mode's own requests 1..i-1 left. Modes and repeats are interleaved as in
the single-request bench, and each request's speedup is computed per repeat against the plain
run of the same request in the same repeat (and against ngram-simple alone), then summarised
by its median and range."""

from __future__ import annotations

import statistics
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import resources

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from localspec.api import Engine
from localspec.errors import LocalspecError
from localspec.measure import unearned
from localspec.progress import plural

PLAIN, LOOKUP = "none", "ngram-simple"  # what every memory mode is compared with
# the first request of each scenario where the memory is expected to pay (docs/benchmarks.md)
SPEEDUP_FROM = {
    "regenerate": 2,
    "regenerate-code": 2,
    "agent": 2,
    "batch": 3,
    "docstrings": 3,
    "unrelated": 2,
}


@dataclass(frozen=True)
class Scenario:
    name: str
    about: str
    temperature: float
    prompts: tuple[str, ...]

    @classmethod
    def from_table(cls, raw: dict[str, object]) -> Scenario:
        template = str(raw["template"])
        items = raw.get("items")
        if isinstance(items, list):
            prompts = tuple(template.replace("{item}", str(item)) for item in items)
        else:
            prompts = (template,) * int(raw.get("repeat", 1))  # type: ignore[call-overload]
        return cls(str(raw["name"]), str(raw["about"]), float(raw["temperature"]), prompts)  # type: ignore[arg-type]


def all_scenarios() -> list[Scenario]:
    text = resources.files("localspec.prompts").joinpath("scenarios.toml").read_text("utf-8")
    return [Scenario.from_table(raw) for raw in tomllib.loads(text)["scenario"]]


def select_scenarios(names: str) -> list[Scenario]:
    """``all`` or comma-separated scenario names."""
    known = {s.name: s for s in all_scenarios()}
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    if wanted == ["all"]:
        return list(known.values())
    unknown = [n for n in wanted if n not in known]
    if unknown or not wanted:
        raise LocalspecError(
            f"--scenarios {names!r}: unknown scenario {unknown[0] if unknown else '(none)'}",
            f"choose from {', '.join(known)}, or all",
        )
    return [known[n] for n in wanted]


@dataclass(frozen=True)
class RequestRun:
    scenario: str
    mode: str
    repeat: int
    index: int  # 1-based position of the request in its scenario
    n_tokens: int
    tokens_per_s: float
    drafted: int
    accepted: int
    from_memory: int  # accepted tokens the suffix drafter drafted


def run_scenarios(
    engine: Engine,
    modes: Sequence[str],
    scenarios: Sequence[Scenario],
    n_tokens: int,
    repeats: int,
    seed: int = 0,
) -> Iterator[RequestRun]:
    """Per repeat and scenario, each mode (order rotated by the repeat) runs the whole
    sequence from an empty memory."""
    order = [PLAIN, LOOKUP, *[m for m in modes if m not in (PLAIN, LOOKUP)]]
    for repeat in range(repeats):
        shift = repeat % len(order)
        for scenario in scenarios:
            for mode in order[shift:] + order[:shift]:
                engine.memory.clear()
                for index, prompt in enumerate(scenario.prompts, 1):
                    r = engine.generate(
                        [{"role": "user", "content": prompt}],
                        chat=True,
                        max_tokens=n_tokens,
                        temperature=scenario.temperature,
                        seed=seed + 1000 * repeat + index,  # a regeneration: another draw
                        mode=mode,
                    )
                    s = r.stats
                    memory = dict((name, acc) for name, _, acc, _ in s.by_drafter)
                    yield RequestRun(
                        scenario.name,
                        mode,
                        repeat,
                        index,
                        s.n_tokens,
                        s.tokens_per_s,
                        s.drafted,
                        s.accepted,
                        memory.get("suffix", 0),
                    )


@dataclass(frozen=True)
class RequestCell:
    """One request of one scenario in one mode, over the repeats."""

    scenario: str
    mode: str
    index: int
    tokens_per_s: float  # median
    vs_plain: tuple[float, float, float]  # median, min, max of per-repeat ratios
    vs_lookup: tuple[float, float, float]
    acceptance_rate: float
    from_memory: float  # share of the output the memory drafted

    def to_dict(self) -> dict[str, object]:
        return {
            "scenario": self.scenario,
            "mode": self.mode,
            "request": self.index,
            "tokens_per_s": round(self.tokens_per_s, 2),
            "vs_plain": [round(x, 3) for x in self.vs_plain],
            "vs_ngram_simple": [round(x, 3) for x in self.vs_lookup],
            "acceptance_rate": round(self.acceptance_rate, 3),
            "from_memory": round(self.from_memory, 3),
        }


def summarise_requests(runs: Sequence[RequestRun]) -> list[RequestCell]:
    by_key = {(r.scenario, r.mode, r.repeat, r.index): r for r in runs}
    cells = []
    keys = sorted({(r.scenario, r.mode, r.index) for r in runs})
    for scenario, mode, index in keys:
        mine = [r for r in runs if (r.scenario, r.mode, r.index) == (scenario, mode, index)]
        vs_plain, vs_lookup = [], []
        for r in mine:
            for base, out in ((PLAIN, vs_plain), (LOOKUP, vs_lookup)):
                other = by_key.get((scenario, base, r.repeat, index))
                if other is not None and other.tokens_per_s > 0:
                    out.append(r.tokens_per_s / other.tokens_per_s)
        drafted = sum(r.drafted for r in mine)
        cells.append(
            RequestCell(
                scenario,
                mode,
                index,
                statistics.median(r.tokens_per_s for r in mine),
                _spread(vs_plain),
                _spread(vs_lookup),
                sum(r.accepted for r in mine) / drafted if drafted else 0.0,
                sum(r.from_memory for r in mine) / max(sum(r.n_tokens for r in mine), 1),
            )
        )
    return cells


def _spread(ratios: Sequence[float]) -> tuple[float, float, float]:
    if not ratios:
        return (0.0, 0.0, 0.0)
    return (statistics.median(ratios), min(ratios), max(ratios))


def headline(cells: Sequence[RequestCell], mode: str) -> list[str]:
    """Per scenario: the median speedup of ``mode`` over the requests from the one where the
    memory is expected to pay (SPEEDUP_FROM) on."""
    lines = []
    for scenario in dict.fromkeys(c.scenario for c in cells):
        start = SPEEDUP_FROM.get(scenario, 2)
        later = [c for c in cells if (c.scenario, c.mode) == (scenario, mode) and c.index >= start]
        if not later:
            continue
        plain = statistics.median(c.vs_plain[0] for c in later)
        lookup = statistics.median(c.vs_lookup[0] for c in later)
        noisy = sum(bool(unearned(c.vs_plain[0], c.acceptance_rate > 0)) for c in later)
        caveat = f"; {plural(noisy, 'request')} of them noisy" if noisy else ""
        lines.append(
            f"{scenario}, requests {start}-{max(c.index for c in later)}: {mode} "
            f"{plain:.2f}x plain, {lookup:.2f}x ngram-simple (median{caveat})"
        )
    return lines
