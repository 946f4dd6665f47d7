"""`localspec probe`: measure which drafting configuration is fastest for this target, on
this machine, for these kinds of prompt.

Every configuration (a compatible draft model at a few draft lengths, the draftless modes)
is measured against plain decoding of the same target, prompt by prompt, in one run, plain
and speculative back to back so machine noise hits both alike. Speedups are aggregated by
geometric mean over prompts (a ratio of speeds), overall and per prompt kind.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from localspec.api import Engine
from localspec.engine.loop import SpecConfig
from localspec.fileops import atomic_path
from localspec.prompts import PromptCase
from localspec.sources import cache_dir

WORTH_IT = 1.03  # below this mean speedup, speculation is not worth recommending

# Draftless modes probe measures (when the target supports them: draft-mtp needs NextN layers).
MEASURABLE_DRAFTLESS = ("ngram-simple", "draft-self", "draft-mtp")


@dataclass(frozen=True)
class ProbeConfig:
    mode: str
    n_max: int
    draft: str | None = None  # path of the draft model for draft-model

    @property
    def label(self) -> str:
        who = f" {Path(self.draft).name}" if self.draft else ""
        return f"{self.mode}{who} n={self.n_max}"


@dataclass(frozen=True)
class Measurement:
    config: ProbeConfig
    prompt: str
    kind: str
    tokens_per_s: float
    plain_tokens_per_s: float
    acceptance_rate: float
    mean_acceptance_length: float
    acceptance_per_position: tuple[float, ...]

    @property
    def speedup(self) -> float:
        return self.tokens_per_s / self.plain_tokens_per_s if self.plain_tokens_per_s else 0.0


@dataclass(frozen=True)
class Ranked:
    config: ProbeConfig
    speedup: float  # geometric mean over prompts
    by_kind: dict[str, float]
    acceptance_rate: float
    mean_acceptance_length: float
    tokens_per_s: float
    plain_tokens_per_s: float


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
) -> Iterator[Measurement]:
    """For each prompt: plain decoding, then each configuration, back to back."""
    gen = dict(chat=True, max_tokens=n_tokens, temperature=temperature, seed=seed)
    for case in prompts:
        plain = engine.generate(case.text, mode="none", **gen)  # type: ignore[arg-type]
        for config in configs:
            spec = SpecConfig(n_max=config.n_max, adaptive=False)
            r = engine.generate(case.text, mode=config.mode, spec=spec, **gen)  # type: ignore[arg-type]
            s = r.stats
            yield Measurement(
                config,
                case.name,
                case.kind,
                s.tokens_per_s,
                plain.stats.tokens_per_s,
                s.acceptance_rate,
                s.mean_acceptance_length,
                s.acceptance_per_position,
            )


def rank(measurements: Sequence[Measurement]) -> list[Ranked]:
    by_config: dict[ProbeConfig, list[Measurement]] = {}
    for m in measurements:
        by_config.setdefault(m.config, []).append(m)
    ranked = []
    for config, ms in by_config.items():
        kinds = sorted({m.kind for m in ms})
        ranked.append(
            Ranked(
                config=config,
                speedup=geomean([m.speedup for m in ms]),
                by_kind={k: geomean([m.speedup for m in ms if m.kind == k]) for k in kinds},
                acceptance_rate=sum(m.acceptance_rate for m in ms) / len(ms),
                mean_acceptance_length=sum(m.mean_acceptance_length for m in ms) / len(ms),
                tokens_per_s=sum(m.tokens_per_s for m in ms) / len(ms),
                plain_tokens_per_s=sum(m.plain_tokens_per_s for m in ms) / len(ms),
            )
        )
    return sorted(ranked, key=lambda r: r.speedup, reverse=True)


def best_per_config_family(ranking: Sequence[Ranked]) -> list[Ranked]:
    """Keep the best draft length of each (mode, draft): the table users need."""
    seen: set[tuple[str, str | None]] = set()
    kept = []
    for r in ranking:
        key = (r.config.mode, r.config.draft)
        if key not in seen:
            seen.add(key)
            kept.append(r)
    return kept


def recommendation(ranking: Sequence[Ranked]) -> str:
    if not ranking:
        return "nothing could be measured"
    best = ranking[0]
    lines = []
    if best.speedup >= WORTH_IT:
        lines.append(f"use {best.config.label}: {best.speedup:.2f}x plain decoding overall")
    else:
        lines.append(
            f"don't speculate on this machine for these prompts: the best, "
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


def probe_file(target: Path) -> Path:
    st = target.stat()
    key = hashlib.sha256(f"{os.path.realpath(target)}|{st.st_size}|{st.st_mtime_ns}".encode())
    return cache_dir() / "probe" / f"{target.stem}-{key.hexdigest()[:16]}.json"


def save(target: Path, ranking: Sequence[Ranked], measurements: Sequence[Measurement]) -> Path:
    dest = probe_file(target)
    best = ranking[0] if ranking else None
    data = {
        "target": str(target),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "winner": {**asdict(best.config), "speedup": best.speedup} if best else None,
        "ranking": [ranked_dict(r) for r in ranking],
        "measurements": [
            {
                **asdict(m.config),
                **{k: v for k, v in asdict(m).items() if k != "config"},
                "speedup": m.speedup,
            }
            for m in measurements
        ],
    }
    with atomic_path(dest) as tmp:
        tmp.write_text(json.dumps(data, indent=2))
    return dest


def measurement_dict(m: Measurement) -> dict[str, object]:
    fields = {k: v for k, v in asdict(m).items() if k != "config"}
    return {"config": m.config.label, **asdict(m.config), **fields, "speedup": round(m.speedup, 3)}


def ranked_dict(r: Ranked) -> dict[str, object]:
    return {
        "config": r.config.label,
        **asdict(r.config),
        "speedup": round(r.speedup, 3),
        "by_kind": {k: round(v, 3) for k, v in r.by_kind.items()},
        "acceptance_rate": round(r.acceptance_rate, 4),
        "mean_acceptance_length": round(r.mean_acceptance_length, 3),
        "tokens_per_s": round(r.tokens_per_s, 2),
        "plain_tokens_per_s": round(r.plain_tokens_per_s, 2),
    }


def saved_choice(target: Path) -> ProbeConfig | None:
    """The saved winner for this target, ``ProbeConfig('none', 0)`` when the probe found
    that speculation does not pay here, or None when no probe was saved."""
    try:
        data = json.loads(probe_file(target).read_text())
    except (OSError, ValueError):
        return None
    winner = data.get("winner")
    if not winner:
        return None
    if winner.get("speedup", 0) < WORTH_IT:
        return ProbeConfig("none", 0)
    return ProbeConfig(winner["mode"], int(winner["n_max"]), winner.get("draft"))


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
