"""`localspec run`: generate from a prompt, print as it streams, report statistics."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from localspec.commands.flags import (
    add_memory_flags,
    add_model_flags,
    add_sampling_flags,
    add_spec_flags,
    load_engine,
)
from localspec.engine.settings import GenerationSettings
from localspec.errors import LocalspecError
from localspec.modes import LOOKUP_MODES, parse_mode


def read_prompt(args: argparse.Namespace) -> tuple[str, bool]:
    """The prompt text and whether to apply the chat template."""
    from localspec.prompts import default_prompt

    chat = args.chat or bool(args.system)
    if args.file is not None:
        try:
            text = sys.stdin.read() if str(args.file) == "-" else args.file.read_text("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise LocalspecError(
                f"cannot read the prompt file {args.file}: {exc}",
                "give a readable UTF-8 text file with -f (-f -: standard input)",
            ) from None
        return _not_empty(text, f"-f {args.file}"), chat
    if args.prompt is not None:
        return _not_empty(args.prompt, "-p"), chat
    return default_prompt().text, True  # the built-in prompt is an instruction: chat it


def _not_empty(prompt: str, where: str) -> str:
    if not prompt:
        raise LocalspecError(f"{where}: the prompt is empty", "give some text to continue")
    return prompt


def read_grammar(args: argparse.Namespace) -> str | None:
    """``--json-schema`` (a file or the schema's text) or ``--grammar`` (a GBNF file), as
    GBNF; checked before any model loads."""
    from localspec.engine.grammar import schema_grammar

    if args.grammar is not None:
        gbnf = read_text(args.grammar, "--grammar")
        if not gbnf.strip():
            raise LocalspecError(
                f"--grammar {args.grammar}: the file is empty",
                "give a GBNF grammar with a root rule (see llama.cpp's grammars/README.md)",
            )
        return gbnf
    if args.json_schema is None:
        return None
    text = args.json_schema
    if not text.lstrip().startswith("{") and Path(text).is_file():
        text = read_text(Path(text), "--json-schema")
    try:
        schema = json.loads(text)
    except ValueError as exc:
        said = f"not valid JSON ({exc})" if text.lstrip()[:1] in '{["' else "no such file"
        raise LocalspecError(
            f"--json-schema {args.json_schema!r}: {said}",
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


def run(args: argparse.Namespace) -> int:
    from localspec.api import validate_sampling
    from localspec.lossless import NEAR_TIE_DRAW, NEAR_TIE_GAP, compare

    validate_sampling(args.temperature, args.top_k, args.top_p, args.min_p, args.seed)
    prompt, chat = read_prompt(args)
    settings = GenerationSettings.pick(args, grammar=read_grammar(args), mode=None, spec=None)
    gen = dict(settings=settings, chat=chat, system=args.system)
    with load_engine(args) as engine:
        plain = None
        # the plain baselines stay out of the memory: the speculative run would copy them
        baseline = dict(gen, settings=settings.but(mode="none", remember=False))
        if args.compare:
            plain = engine.generate(prompt, record_margins=True, **baseline)
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
        plain_after = engine.generate(prompt, **baseline) if args.compare else None
    stats = result.stats
    full = (
        result.finish_reason == "length" and stats.n_prompt + stats.n_tokens >= engine.target.n_ctx
    )
    report = {
        "text": "".join(text),
        "finish_reason": result.finish_reason,
        "context_full": full,  # "length" because the context filled, not -n
        "mode": engine.mode,
        "n_tokens": stats.n_tokens,
        "tokens_per_s": round(stats.tokens_per_s, 3),
        "stats": stats.to_dict(),
    }
    if plain is not None and plain_after is not None:
        plain_runs = [plain.stats.tokens_per_s, plain_after.stats.tokens_per_s]
        plain_speed = sum(plain_runs) / 2
        # no token, no speed: a speedup of nothing is no figure (null, not 0)
        measured = plain_speed > 0 and stats.n_tokens > 0
        report["plain_tokens_per_s"] = round(plain_speed, 3)
        report["plain_runs_tokens_per_s"] = [round(x, 3) for x in plain_runs]
        report["speedup"] = round(stats.tokens_per_s / plain_speed, 3) if measured else None
        unchecked = why_not_comparable(args, engine.mode)
        if unchecked is None:
            greedy = args.temperature == 0
            bound = NEAR_TIE_GAP if greedy else NEAR_TIE_DRAW
            lossless = compare(plain.tokens, plain.margins, tokens, plain.runners_up, bound)
            report["lossless"] = {
                "checked": True,
                **lossless.to_dict(),
                "margin_is": "top-2 logit gap" if greedy else "draw margin",
            }
        else:
            report["lossless"] = {"checked": False, "why": unchecked}
    if args.json:
        print(json.dumps(report, indent=2, ensure_ascii=False))
    else:
        print_summary(report)
    return 0


def why_not_comparable(args: argparse.Namespace, mode: str) -> str | None:
    """Why the speculative run need not give plain decoding's tokens (None: it must).
    Greedy, or sampling with a seed where only lookups draft, must (their drafts are judged
    by the target's own draw); a draft model's are judged by rejection sampling, another
    draw of the same distribution."""
    if args.temperature == 0:
        return None
    if args.seed is None or args.seed < 0:
        return "sampling without --seed: each run draws its own text (give --seed N)"
    if mode != "none" and any(m not in LOOKUP_MODES for m in parse_mode(mode)):
        return (
            "a model's draft is accepted by rejection sampling: another draw of the same "
            "distribution, not plain decoding's text"
        )
    return None


def print_summary(report: dict) -> None:  # type: ignore[type-arg]
    s = report["stats"]
    lines = [
        "",
        f"[{report['mode']}] {report['n_tokens']} tokens, {report['tokens_per_s']:.1f} tok/s, "
        f"finish: {report['finish_reason']}"
        + (" (the context is full: raise -c)" if report["context_full"] else ""),
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
        # an answer starts held back, until shadow checks say drafting pays (sure copies
        # are drafted meanwhile); pauses count the stops after that
        held = "held back to the end" if s["pauses"] == 0 else "paused at the end"
        lines.append(
            f"  adaptive: {s['pauses']} pause(s), {s['shadow_checks']} shadow check(s)"
            + (f", {held}" if s["paused"] else "")
        )
    if report.get("speedup") is not None:
        lines.append(
            f"  plain {report['plain_tokens_per_s']:.1f} tok/s -> speedup {report['speedup']:.2f}x"
        )
    elif "speedup" in report:
        lines.append("  speedup: none measured (no token was generated)")
    lossless = report.get("lossless")
    if lossless is not None and not lossless["checked"]:
        lines.append(f"  lossless: not checked ({lossless['why']})")
    elif lossless is not None:
        lines.append(
            "  lossless: identical to plain decoding"
            if lossless["identical"]
            else f"  lossless: diverges at token {lossless['first_divergence']} "
            f"({lossless['margin_is']} {lossless['margin']:.4f}, "
            f"{'near tie: ok' if lossless['near_tie'] else 'NOT a near tie'})"
        )
    print("\n".join(lines), file=sys.stderr)


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("run", help="generate from a prompt, with speculation")
    add_model_flags(p)
    src = p.add_mutually_exclusive_group()
    src.add_argument("-p", "--prompt", default=None, help="the prompt text")
    src.add_argument(
        "-f", "--file", type=Path, default=None, help="read the prompt from a file (-: stdin)"
    )
    p.add_argument(
        "--chat",
        action="store_true",
        help="wrap the prompt as a user message in the model's chat template",
    )
    p.add_argument("--system", default=None, help="system message (implies --chat)")
    shape = p.add_mutually_exclusive_group()
    shape.add_argument(
        "--json-schema",
        default=None,
        metavar="SCHEMA",
        help="the answer must follow this JSON schema (a .json file, or the schema itself)",
    )
    shape.add_argument(
        "--grammar",
        type=Path,
        default=None,
        metavar="FILE",
        help="a GBNF grammar the answer follows",
    )
    add_sampling_flags(p)
    add_spec_flags(p)
    add_memory_flags(p, on_by_default=False)
    p.add_argument("--json", action="store_true", help="print one JSON object at the end")
    p.add_argument(
        "--compare",
        action="store_true",
        help="first decode plainly in the same process: speedup and losslessness",
    )
    p.set_defaults(handler=run)
