"""`localspec probe`: measure which drafting configuration is fastest for this target, on
this machine, for these kinds of prompt.

Every configuration (a compatible draft model at a few draft lengths, the draftless modes)
is measured against plain decoding of the same target, prompt by prompt, with the protocol
of ``measure.py``: each speculative run sandwiched between plain runs, repeated while the
spread is wide and the time budget allows, checked against this machine's ceiling, and
shown beside a speedup predicted from acceptance and the calibrated cost curves. Speedups
are aggregated by geometric mean over prompts (a ratio of speeds), overall and per kind.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from localspec.api import Engine
from localspec.drafters.suffix import SuffixDrafter
from localspec.engine.costs import VerifyCost
from localspec.engine.loop import SpecConfig
from localspec.engine.stats import Stats
from localspec.measure import (
    MIN_PAIRS,
    Budget,
    Pair,
    Verdict,
    draft_step_for,
    judge,
    needs_more,
    predicted_speedup,
    steady,
    undrafted,
    unearned,
)
from localspec.modes import parse_mode
from localspec.probe_results import WORTH_IT, ProbeConfig, write
from localspec.prompts import PromptCase

# a target whose best batch saves under this is compute-bound here: verifying n drafted
# tokens costs most of their n one-token steps, so only drafts that cost nothing pay
COMPUTE_BOUND_CEILING = 2.0
MAX_PAIRS = 4  # default --repeat: speculative runs per (configuration, prompt) at most

# Draftless modes probe measures (when the target supports them: draft-mtp needs NextN layers).
MEASURABLE_DRAFTLESS = ("ngram-simple", "suffix+ngram-simple", "draft-self", "draft-mtp")


@dataclass(frozen=True)
class Measurement:
    """One configuration on one prompt: its pairs of runs and what they say."""

    config: ProbeConfig
    prompt: str
    kind: str
    pairs: tuple[Pair, ...]
    verdict: Verdict
    acceptance_rate: float
    mean_acceptance_length: float
    acceptance_per_position: tuple[float, ...]

    @property
    def speedup(self) -> float:
        return self.verdict.best

    @property
    def _kept(self) -> Sequence[Pair]:
        """The pairs the speedup was judged on: a pair set aside as unsteady (its plain runs
        apart) does not move the rates shown beside it either."""
        return steady(self.pairs) or self.pairs

    @property
    def tokens_per_s(self) -> float:
        return statistics.median(p.speculative for p in self._kept)

    @property
    def plain_tokens_per_s(self) -> float:
        return statistics.median(p.plain for p in self._kept)


@dataclass(frozen=True)
class Ranked:
    config: ProbeConfig
    speedup: float  # geometric mean over prompts of each cell's trusted figure
    by_kind: dict[str, float]
    acceptance_rate: float
    mean_acceptance_length: float
    tokens_per_s: float
    plain_tokens_per_s: float
    measured: float = 0.0  # geometric mean of the measured medians
    low: float = 0.0  # ... of the spreads' ends
    high: float = 0.0
    predicted: float | None = None
    noisy: bool = False  # some cell could not be measured reliably


def geomean(values: Sequence[float]) -> float:
    values = [v for v in values if v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else 0.0


def measure(
    engine: Engine,
    configs: Sequence[ProbeConfig],
    prompts: Sequence[PromptCase],
    n_tokens: int,
    temperature: float,
    seed: int = 0,
    max_pairs: int = MAX_PAIRS,
    budget: Budget | None = None,
) -> Iterator[Measurement]:
    """For each prompt and configuration: plain, speculative, plain, speculative, plain...
    (the plain run closing one pair opens the next), at least two pairs, more while the
    ratios spread wide and the budget allows.

    Every run is a fresh request, except that a mode with the suffix drafter finds in its
    memory the plain answers to the prompts probed before (as a server would have them): on
    unrelated prompts it shows what the memory costs, on a file of similar requests what it
    gains."""
    gen = dict(chat=True, max_tokens=n_tokens, temperature=temperature, seed=seed)
    # one curve for the ceiling and every prediction: sized for the longest draft probed (a
    # curve calibrated again later, on a machine busier or quieter, would not compare)
    cost = engine.verify_cost(max(c.n_max for c in configs))
    ceiling = cost.ceiling()
    draft_step = engine.draft_step_seconds()
    earlier: list[np.ndarray] = []  # the prompts probed so far, with their plain answers

    def plain_speed(case: PromptCase) -> float:
        engine.memory.clear()
        return engine.generate(
            case.messages, mode="none", grammar=case.grammar, **gen
        ).stats.tokens_per_s  # type: ignore[arg-type]

    def remember_earlier(config: ProbeConfig) -> None:
        engine.memory.clear()
        if SuffixDrafter.name in parse_mode(config.mode):
            for doc in earlier:
                engine.memory.add(doc)

    for case in prompts:
        before = plain_speed(case)
        answered = engine.memory.documents()
        for config in configs:
            spec = SpecConfig(n_max=config.n_max, adaptive=False)
            pairs: list[Pair] = []
            runs: list[Stats] = []
            predicted = None
            while _another(pairs, max_pairs, predicted, budget):
                remember_earlier(config)
                r = engine.generate(
                    case.messages, mode=config.mode, spec=spec, grammar=case.grammar, **gen
                )  # type: ignore[arg-type]
                after = plain_speed(case)
                pairs.append(Pair(before, r.stats.tokens_per_s, after))
                runs.append(r.stats)
                before = after
                predicted = predicted_speedup(
                    runs[0], cost, draft_step_for(config.mode, runs[0], draft_step)
                )
            if budget is not None:
                budget.cell_done()
            yield cell(config, case, pairs, runs, ceiling, predicted)
        earlier.extend(answered)


def _another(
    pairs: Sequence[Pair], max_pairs: int, predicted: float | None, budget: Budget | None
) -> bool:
    if not pairs:
        return True
    if not needs_more(pairs, max_pairs, predicted):
        return False
    # the first MIN_PAIRS are always measured; the budget pays for more
    return len(pairs) < MIN_PAIRS or budget is None or budget.allows_more()


def cell(
    config: ProbeConfig,
    case: PromptCase,
    pairs: Sequence[Pair],
    runs: Sequence[Stats],
    ceiling: float,
    predicted: float | None,
) -> Measurement:
    first = runs[0]
    verdict = judge(pairs, ceiling, predicted)
    if why := unearned(verdict.measured, any(s.accepted for s in runs)):
        verdict = replace(verdict, reasons=(*verdict.reasons, why))
    if why := undrafted(verdict.measured, config.mode, any(s.drafted for s in runs)):
        verdict = replace(verdict, reasons=(*verdict.reasons, why))
    return Measurement(
        config,
        case.name,
        case.kind,
        tuple(pairs),
        verdict,
        statistics.fmean(s.acceptance_rate for s in runs),
        statistics.fmean(s.mean_acceptance_length for s in runs),
        first.acceptance_per_position,
    )


def rank(measurements: Sequence[Measurement]) -> list[Ranked]:
    """By trusted speedup: the measured one where the measurements agree, else the
    prediction from acceptance and the calibrated costs (see ``measure.Verdict.best``)."""
    by_config: dict[ProbeConfig, list[Measurement]] = {}
    for m in measurements:
        by_config.setdefault(m.config, []).append(m)
    ranked = []
    for config, ms in by_config.items():
        kinds = sorted({m.kind for m in ms})
        predictions = [m.verdict.predicted for m in ms]
        ranked.append(
            Ranked(
                config=config,
                speedup=geomean([m.speedup for m in ms]),
                by_kind={k: geomean([m.speedup for m in ms if m.kind == k]) for k in kinds},
                acceptance_rate=sum(m.acceptance_rate for m in ms) / len(ms),
                mean_acceptance_length=sum(m.mean_acceptance_length for m in ms) / len(ms),
                tokens_per_s=sum(m.tokens_per_s for m in ms) / len(ms),
                plain_tokens_per_s=sum(m.plain_tokens_per_s for m in ms) / len(ms),
                measured=geomean([m.verdict.measured for m in ms]),
                low=geomean([m.verdict.low for m in ms]),
                high=geomean([m.verdict.high for m in ms]),
                predicted=None if None in predictions else geomean(predictions),  # type: ignore[arg-type]
                noisy=any(m.verdict.noisy for m in ms),
            )
        )
    # a noisy configuration is ranked by its prediction; one with no prediction, only by a
    # noisy measurement, never above a figure that can be trusted
    return sorted(ranked, key=lambda r: (r.noisy and r.predicted is None, -r.speedup))


def measured_winner(ranking: Sequence[Ranked]) -> Ranked | None:
    """The best configuration whose speedup was measured reliably (what ``--mode auto``
    runs: an estimate ranked above it is not acted on)."""
    return next((r for r in ranking if not r.noisy), None)


def chosen(ranking: Sequence[Ranked]) -> Ranked | None:
    """What is saved as the winner: the measured one, else the best estimate (refused by
    ``--mode auto``)."""
    return measured_winner(ranking) or (ranking[0] if ranking else None)


def best_per_config_family(ranking: Sequence[Ranked]) -> list[Ranked]:
    """Keep the best draft length of each (mode, draft): the table users need. When that
    best is only an estimate, the family's best measured length is kept too: it may be the
    row ``--mode auto`` runs, and the table must show what the advice names."""
    seen: set[tuple[str, str | None]] = set()
    measured: set[tuple[str, str | None]] = set()
    kept = []
    for r in ranking:
        key = (r.config.mode, r.config.draft)
        if key not in seen or (not r.noisy and key not in measured):
            kept.append(r)
        seen.add(key)
        if not r.noisy:
            measured.add(key)
    return kept


def recommendation(ranking: Sequence[Ranked]) -> str:
    if not ranking:
        return "nothing could be measured"
    estimate, best = ranking[0], measured_winner(ranking)
    lines = []
    if estimate.noisy:
        lines.append(
            f"the best estimate is {estimate.config.label} at {estimate.speedup:.2f}x, but its "
            "runs spread too widely to measure it reliably (other work on the machine, or "
            "runs too short): rerun when it is quieter, or give it more time with --budget"
        )
    if best is None:
        lines[0] = "no configuration could be measured reliably: " + lines[0]
        return "\n".join(lines)
    which = "the best measured reliably" if estimate.noisy else "the best"
    if best.speedup >= WORTH_IT:
        lines.append(f"use {best.config.label}: {best.speedup:.2f}x plain decoding overall")
    else:
        lines.append(
            f"don't speculate on this machine for these prompts: {which}, "
            f"{best.config.label}, gives {best.speedup:.2f}x"
        )
    for kind, speedup in sorted(best.by_kind.items()):
        if speedup < WORTH_IT:
            kind_best = max(ranking, key=lambda r: r.by_kind.get(kind, 0.0))
            if kind_best.by_kind.get(kind, 0.0) < WORTH_IT:
                lines.append(
                    f"for {kind} prompts: don't speculate (best {kind_best.by_kind[kind]:.2f}x)"
                )
            else:
                lines.append(
                    f"for {kind} prompts: use {kind_best.config.label} "
                    f"({kind_best.by_kind[kind]:.2f}x)"
                )
    return "\n".join(lines)


# ----- saved results, for --mode auto -----------------------------------------------------------


def save(
    target: Path,
    ranking: Sequence[Ranked],
    measurements: Sequence[Measurement],
    notes: Sequence[str] = (),
) -> Path:
    data = {
        "target": str(target),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "notes": list(notes),
        "winner": ranked_dict(winner) if (winner := chosen(ranking)) else None,
        "ranking": [ranked_dict(r) for r in ranking],
        "measurements": [measurement_dict(m) for m in measurements],
    }
    return write(target, data)


def measurement_dict(m: Measurement) -> dict[str, object]:
    return {
        "config": m.config.label,
        **asdict(m.config),
        "prompt": m.prompt,
        "kind": m.kind,
        **m.verdict.to_dict(),
        "runs": [
            [round(p.plain_before, 2), round(p.speculative, 2), round(p.plain_after, 2)]
            for p in m.pairs
        ],
        "tokens_per_s": round(m.tokens_per_s, 2),
        "plain_tokens_per_s": round(m.plain_tokens_per_s, 2),
        "acceptance_rate": round(m.acceptance_rate, 4),
        "mean_acceptance_length": round(m.mean_acceptance_length, 3),
        "acceptance_per_position": [round(a, 4) for a in m.acceptance_per_position],
    }


def ranked_dict(r: Ranked) -> dict[str, object]:
    return {
        "config": r.config.label,
        **asdict(r.config),
        "speedup": round(r.speedup, 3),
        "measured": round(r.measured, 3),
        "spread": [round(r.low, 3), round(r.high, 3)],
        "predicted": None if r.predicted is None else round(r.predicted, 3),
        "noisy": r.noisy,
        "by_kind": {k: round(v, 3) for k, v in r.by_kind.items()},
        "acceptance_rate": round(r.acceptance_rate, 4),
        "mean_acceptance_length": round(r.mean_acceptance_length, 3),
        "tokens_per_s": round(r.tokens_per_s, 2),
        "plain_tokens_per_s": round(r.plain_tokens_per_s, 2),
    }


# ----- past one machine -------------------------------------------------------------------------


def export_command(config: ProbeConfig, target: Path, kind: str) -> str:
    """The equivalent llama-server command line, or vLLM speculative config."""
    if kind == "llama-server":
        parts = ["llama-server", "-m", str(target)]
        if config.mode == "none":
            return " ".join(parts)
        if config.mode == "draft-self":
            return "# draft-self (layer skipping) has no llama-server equivalent"
        if config.mode == "draft-model":
            parts += ["-md", str(config.draft), "--spec-type", "draft-simple"]
        else:
            parts += ["--spec-type", config.mode]
        return " ".join([*parts, "--spec-draft-n-max", str(config.n_max)])
    if kind == "vllm":
        if config.mode == "none":
            return "# no speculative config: plain decoding was fastest"
        if config.mode == "draft-self":
            return "# draft-self (layer skipping) has no vLLM equivalent"
        if config.mode == "draft-mtp":
            spec = {"method": "mtp", "num_speculative_tokens": config.n_max}
        elif config.mode == "draft-model":
            spec: dict[str, object] = {
                "model": str(config.draft),
                "num_speculative_tokens": config.n_max,
            }
        else:
            spec = {
                "method": "ngram",
                "num_speculative_tokens": config.n_max,
                "prompt_lookup_max": 12,
                "prompt_lookup_min": 4,
            }
        return f"vllm serve {target} --speculative-config '{json.dumps(spec)}'"
    raise ValueError(kind)


def compute_bound_note(cost: VerifyCost) -> str | None:
    """What the calibration says about drafting on this target, when it is compute-bound
    (None otherwise): how much a batch costs, and what a draft model's token may cost."""
    ceiling = cost.ceiling()
    if ceiling >= COMPUTE_BOUND_CEILING:
        return None
    size, seconds = cost.ceiling_batch()
    steps = seconds / float(cost.seconds[0])
    share = cost.break_even_draft_cost()
    return (
        f"this target is compute-bound on this machine: a batch of {size} tokens costs "
        f"{steps:.1f} one-token steps (ceiling {ceiling:.2f}x); a draft model pays only if "
        f"its token costs under {share:.0%} of a target step even with every draft accepted, "
        "so the drafts that pay here are the free ones (ngram-simple, suffix: lookups)"
    )
