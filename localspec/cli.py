"""The ``localspec`` command."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from localspec.errors import LocalspecError


def add_model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "target",
        nargs="?",
        default=None,
        help="target model: a .gguf path or a catalog name (default: the catalog's)",
    )
    p.add_argument(
        "-md",
        "--model-draft",
        dest="draft",
        default=None,
        help="draft model (.gguf path or catalog name) for --mode draft-model",
    )
    p.add_argument(
        "--mode",
        default=None,
        help="none | draft-model | ngram-simple (default: draft-model with -md, else ngram-simple)",
    )
    p.add_argument("-c", "--ctx-size", type=int, default=4096, help="context size in tokens")
    p.add_argument(
        "-t", "--threads", type=int, default=None, help="CPU threads (default: physical cores)"
    )
    p.add_argument(
        "-ngl",
        "--gpu-layers",
        "--n-gpu-layers",
        dest="gpu_layers",
        type=int,
        default=None,
        help="target layers to offload to the GPU",
    )
    p.add_argument(
        "-ngld",
        "--gpu-layers-draft",
        "--n-gpu-layers-draft",
        dest="gpu_layers_draft",
        type=int,
        default=None,
        help="draft layers to offload to the GPU",
    )


def add_spec_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("speculation (llama.cpp flag names)")
    g.add_argument(
        "--spec-draft-n-max",
        type=int,
        default=None,
        help="most tokens drafted per round (default 16; ngram-simple: its size-m)",
    )
    g.add_argument(
        "--spec-draft-n-min",
        type=int,
        default=0,
        help="drafts shorter than this are not verified (default 0)",
    )
    g.add_argument(
        "--spec-draft-p-min",
        type=float,
        default=0.0,
        help="stop drafting when the draft's top probability is below this",
    )
    g.add_argument(
        "--spec-ngram-simple-size-n",
        type=int,
        default=12,
        help="length of the lookup n-gram (default 12)",
    )
    g.add_argument(
        "--spec-ngram-simple-size-m",
        type=int,
        default=48,
        help="length of the drafted m-gram (default 48)",
    )
    g.add_argument(
        "--spec-ngram-simple-min-hits",
        type=int,
        default=1,
        help="earlier occurrences a key needs (default 1)",
    )
    g.add_argument(
        "--spec-ngram-simple-min-n",
        type=int,
        default=4,
        help="shortest key tried when the size-n key has no match "
        "(default 4; set it to size-n for llama.cpp's exact behaviour)",
    )
    g.add_argument(
        "--no-adaptive",
        action="store_true",
        help="always draft n-max tokens; never pause speculation",
    )


def add_sampling_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument(
        "-n",
        "--n-predict",
        "--max-tokens",
        dest="max_tokens",
        type=int,
        default=256,
        help="most tokens to generate (default 256)",
    )
    g.add_argument("--temp", type=float, default=0.0, help="temperature (0: greedy, default)")
    g.add_argument("--top-k", type=int, default=0, help="top-k (0: off)")
    g.add_argument("--top-p", type=float, default=1.0, help="top-p (1: off)")
    g.add_argument("--min-p", type=float, default=0.0, help="min-p (0: off)")
    g.add_argument("-s", "--seed", type=int, default=None, help="random seed")
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="localspec", description="Lossless speculative decoding for local LLMs."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="generate from a prompt, with speculation")
    add_model_flags(run)
    src = run.add_mutually_exclusive_group()
    src.add_argument("-p", "--prompt", default=None, help="the prompt text")
    src.add_argument("-f", "--file", type=Path, default=None, help="read the prompt from a file")
    run.add_argument(
        "--chat",
        action="store_true",
        help="wrap the prompt as a user message in the model's chat template",
    )
    run.add_argument("--system", default=None, help="system message (implies --chat)")
    add_sampling_flags(run)
    add_spec_flags(run)
    run.add_argument("--json", action="store_true", help="print one JSON object at the end")
    run.add_argument(
        "--compare",
        action="store_true",
        help="first decode plainly in the same process: speedup and losslessness",
    )
    run.set_defaults(handler=cmd_run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except LocalspecError as exc:
        print(f"localspec: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nlocalspec: interrupted", file=sys.stderr)
        return 130


def load_engine(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from localspec.api import Engine, resolve_mode
    from localspec.catalog import load_catalog
    from localspec.drafters.ngram import NgramParams
    from localspec.engine.loop import SpecConfig

    mode = resolve_mode(args.mode, args.draft is not None)
    n_max = args.spec_draft_n_max
    if n_max is None:
        n_max = args.spec_ngram_simple_size_m if mode == "ngram-simple" else 16
    spec = SpecConfig(
        n_max=n_max,
        n_min=args.spec_draft_n_min,
        p_min=args.spec_draft_p_min,
        adaptive=not args.no_adaptive,
    )
    ngram = NgramParams(
        args.spec_ngram_simple_size_n,
        args.spec_ngram_simple_size_m,
        args.spec_ngram_simple_min_hits,
        min(args.spec_ngram_simple_min_n, args.spec_ngram_simple_size_n),
    )
    target = args.target or load_catalog().default_model
    return Engine.load(
        target,
        args.draft,
        mode,
        n_ctx=args.ctx_size,
        n_threads=args.threads,
        n_gpu_layers=args.gpu_layers,
        n_gpu_layers_draft=args.gpu_layers_draft,
        spec=spec,
        ngram=ngram,
    )


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


def cmd_run(args: argparse.Namespace) -> int:
    from localspec.api import validate_sampling
    from localspec.lossless import compare

    validate_sampling(args.temp, args.top_k, args.top_p, args.min_p, args.seed)
    if args.max_tokens <= 0:
        raise LocalspecError(f"-n must be > 0 (got {args.max_tokens})")
    prompt, chat = read_prompt(args)
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
    stats = result.stats
    report = {
        "text": "".join(text),
        "finish_reason": result.finish_reason,
        "mode": engine.mode,
        "n_tokens": stats.n_tokens,
        "tokens_per_s": round(stats.tokens_per_s, 3),
        "stats": stats.to_dict(),
    }
    if plain is not None:
        speedup = stats.tokens_per_s / plain.stats.tokens_per_s if plain.stats.tokens_per_s else 0
        report["plain_tokens_per_s"] = round(plain.stats.tokens_per_s, 3)
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


if __name__ == "__main__":
    sys.exit(main())
