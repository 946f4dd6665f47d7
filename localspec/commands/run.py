"""`localspec run`: generate from a prompt, print as it streams, report statistics."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from localspec.api import Engine
from localspec.engine.loop import SpecConfig
from localspec.errors import LocalspecError
from localspec.modes import parse_mode


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of ``Engine.load`` from the shared model and spec flags."""
    from localspec.api import resolve_mode
    from localspec.catalog import load_catalog
    from localspec.drafters.ngram import NgramParams

    mode = resolve_mode(args.mode, args.draft is not None)
    spec = spec_for(args, mode)
    ngram = NgramParams(
        args.spec_ngram_simple_size_n,
        args.spec_ngram_simple_size_m,
        args.spec_ngram_simple_min_hits,
        min(args.spec_ngram_simple_min_n, args.spec_ngram_simple_size_n),
    )
    return dict(
        target=args.target or load_catalog().default_model,
        draft=args.draft,
        mode=mode,
        n_ctx=args.ctx_size,
        n_threads=args.threads,
        n_gpu_layers=args.gpu_layers,
        n_gpu_layers_draft=args.gpu_layers_draft,
        spec=spec,
        ngram=ngram,
        self_layers=args.spec_self_layers,
        self_quant=args.spec_self_quant,
    )


def spec_for(args: argparse.Namespace, mode: str) -> SpecConfig:
    """The speculation settings of the flags for ``mode``. Without --spec-draft-n-max, a mode
    that starts with the n-gram lookup drafts up to its size-m (48), a neural one 16."""
    n_max = args.spec_draft_n_max
    if n_max is None:
        n_max = args.spec_ngram_simple_size_m if mode.startswith("ngram-simple") else 16
    return SpecConfig(
        n_max=n_max,
        n_min=args.spec_draft_n_min,
        p_min=args.spec_draft_p_min,
        adaptive=not args.no_adaptive,
    )


def load_engine(args: argparse.Namespace) -> Engine:
    return Engine.load(**engine_options(args))


def read_prompt(args: argparse.Namespace) -> tuple[str, bool]:
    """The prompt text and whether to apply the chat template."""
    from localspec.prompts import default_prompt

    if args.file is not None:
        try:
            return args.file.read_text(encoding="utf-8"), args.chat or bool(args.system)
        except (OSError, UnicodeDecodeError) as exc:
            raise LocalspecError(
                f"cannot read the prompt file {args.file}: {exc}",
                "give a readable UTF-8 text file with -f",
            ) from None
    if args.prompt is not None:
        return args.prompt, args.chat or bool(args.system)
    return default_prompt().text, True  # the built-in prompt is an instruction: chat it


def read_grammar(args: argparse.Namespace) -> str | None:
    """``--json-schema`` (a file or the schema's text) or ``--grammar`` (a GBNF file), as
    GBNF; checked before any model loads."""
    from localspec.engine.grammar import schema_grammar

    if args.grammar is not None:
        return read_text(args.grammar, "--grammar")
    if args.json_schema is None:
        return None
    text = args.json_schema
    if not text.lstrip().startswith("{"):
        text = read_text(Path(text), "--json-schema")
    try:
        schema = json.loads(text)
    except ValueError as exc:
        raise LocalspecError(
            f"--json-schema: not valid JSON: {exc}",
            "give a JSON schema, or a .json file holding one",
        ) from None
    if not isinstance(schema, dict):
        raise LocalspecError("--json-schema: a schema is a JSON object", 'e.g. {"type": "object"}')
    return schema_grammar(schema)


def read_text(path: Path, flag: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise LocalspecError(
            f"{flag}: cannot read {path}: {exc}", "give a readable UTF-8 file"
        ) from None


def cmd_run(args: argparse.Namespace) -> int:
    from localspec.api import validate_sampling
    from localspec.lossless import compare

    validate_sampling(args.temp, args.top_k, args.top_p, args.min_p, args.seed)
    prompt, chat = read_prompt(args)
    grammar = read_grammar(args)
    gen = dict(
        max_tokens=args.max_tokens,
        temperature=args.temp,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        seed=args.seed,
        stop=args.stop,
        chat=chat,
        system=args.system,
        grammar=grammar,
    )
    with load_engine(args) as engine:
        plain = None
        if args.compare:
            plain = engine.generate(prompt, mode="none", record_margins=True, **gen)
        result = None
        text: list[str] = []
        tokens: list[int] = []
        for event in engine.stream(prompt, **gen):
            if not args.json:
                sys.stdout.write(event.text)
                sys.stdout.flush()
            text.append(event.text)
            tokens.extend(event.tokens)
            result = event
        assert result is not None
        # plain decoding again after the speculative run: on a busy machine the speed drifts
        # within seconds, and one plain run on one side would bias the speedup
        plain_after = engine.generate(prompt, mode="none", **gen) if args.compare else None
    stats = result.stats
    report = {
        "text": "".join(text),
        "finish_reason": result.finish_reason,
        "mode": engine.mode,
        "n_tokens": stats.n_tokens,
        "tokens_per_s": round(stats.tokens_per_s, 3),
        "stats": stats.to_dict(),
    }
    if plain is not None and plain_after is not None:
        plain_runs = [plain.stats.tokens_per_s, plain_after.stats.tokens_per_s]
        plain_speed = sum(plain_runs) / 2
        speedup = stats.tokens_per_s / plain_speed if plain_speed else 0.0
        report["plain_tokens_per_s"] = round(plain_speed, 3)
        report["plain_runs_tokens_per_s"] = [round(x, 3) for x in plain_runs]
        report["speedup"] = round(speedup, 3)
        if args.temp == 0:
            report["lossless"] = compare(
                plain.tokens, plain.margins, tokens, plain.runners_up
            ).to_dict()
    if args.json:
        print(json.dumps(report, indent=2, ensure_ascii=False))
    else:
        print_summary(report)
    return 0


def print_summary(report: dict) -> None:  # type: ignore[type-arg]
    s = report["stats"]
    lines = [
        "",
        f"[{report['mode']}] {report['n_tokens']} tokens, {report['tokens_per_s']:.1f} tok/s, "
        f"finish: {report['finish_reason']}",
        f"  drafted {s['drafted']}, accepted {s['accepted']} "
        f"({100 * s['acceptance_rate']:.1f}%), mean acceptance length "
        f"{s['mean_acceptance_length']:.2f}, draft {s['draft_ms']:.0f} ms, "
        f"verify {s['verify_ms']:.0f} ms",
    ]
    drafters = parse_mode(report["mode"]) if report["mode"] != "none" else []
    if len(drafters) > 1:  # a chain: who drafted what (a drafter that never drafted too)
        empty = {"drafted": 0, "accepted": 0, "acceptance_rate": 0.0}
        for name in drafters:
            d = s["by_drafter"].get(name, empty)
            lines.append(
                f"  {name}: drafted {d['drafted']}, accepted {d['accepted']} "
                f"({100 * d['acceptance_rate']:.1f}%)"
            )
    if drafters:
        lines.append(
            f"  adaptive: {s['pauses']} pause(s), {s['shadow_checks']} shadow check(s)"
            + (", paused at the end" if s["paused"] else "")
        )
    if "speedup" in report:
        lines.append(
            f"  plain {report['plain_tokens_per_s']:.1f} tok/s -> speedup {report['speedup']:.2f}x"
        )
    if "lossless" in report:
        lossless = report["lossless"]
        lines.append(
            "  lossless: identical to plain decoding"
            if lossless["identical"]
            else f"  lossless: diverges at token {lossless['first_divergence']} "
            f"(top-2 gap {lossless['top2_gap']:.4f}, "
            f"{'near tie: ok' if lossless['near_tie'] else 'NOT a near tie'})"
        )
    print("\n".join(lines), file=sys.stderr)
