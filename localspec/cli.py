"""The ``localspec`` command."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from localspec import argtypes as at
from localspec.errors import LocalspecError
from localspec.interrupts import install_interrupt_handler


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
        help="none | ngram-simple | draft-model | draft-self | draft-mtp, or a chain such as "
        "ngram-simple,draft-self (default: draft-model with -md, else ngram-simple)",
    )
    p.add_argument(
        "-c",
        "--ctx-size",
        type=at.context,
        default=4096,
        help="context size in tokens (0: the model's trained length)",
    )
    p.add_argument(
        "-t",
        "--threads",
        type=at.threads,
        default=None,
        help="CPU threads (default: physical cores)",
    )
    p.add_argument(
        "-ngl",
        "--gpu-layers",
        "--n-gpu-layers",
        dest="gpu_layers",
        type=at.gpu_layers,
        default=None,
        help="target layers to offload to the GPU",
    )
    p.add_argument(
        "-ngld",
        "--gpu-layers-draft",
        "--n-gpu-layers-draft",
        dest="gpu_layers_draft",
        type=at.gpu_layers,
        default=None,
        help="draft layers to offload to the GPU",
    )


def add_spec_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("speculation (llama.cpp flag names)")
    g.add_argument(
        "--spec-draft-n-max",
        type=at.count,
        default=None,
        help="most tokens drafted per round (default 16; ngram-simple: its size-m)",
    )
    g.add_argument(
        "--spec-draft-n-min",
        type=at.non_negative,
        default=0,
        help="drafts shorter than this are not verified (default 0)",
    )
    g.add_argument(
        "--spec-draft-p-min",
        type=at.probability,
        default=0.0,
        help="stop drafting when the draft's top probability is below this",
    )
    g.add_argument(
        "--spec-ngram-simple-size-n",
        type=at.count,
        default=12,
        help="length of the lookup n-gram (default 12)",
    )
    g.add_argument(
        "--spec-ngram-simple-size-m",
        type=at.count,
        default=48,
        help="length of the drafted m-gram (default 48)",
    )
    g.add_argument(
        "--spec-ngram-simple-min-hits",
        type=at.count,
        default=1,
        help="earlier occurrences a key needs (default 1)",
    )
    g.add_argument(
        "--spec-ngram-simple-min-n",
        type=at.count,
        default=4,
        help="shortest key tried when the size-n key has no match "
        "(default 4; set it to size-n for llama.cpp's exact behaviour)",
    )
    g.add_argument(
        "--spec-self-layers",
        default=None,
        help="draft-self: the target layers the draft keeps, e.g. 0-11, 0-5,18-23 or "
        "skip-every=2 (default: all but the second quarter, e.g. 0-5,12-23 of 24)",
    )
    g.add_argument(
        "--spec-self-quant",
        default="auto",
        help="draft-self: weight type of the draft, every tensor (auto: Q4_0 unless the target is "
        "that small already; none: the target's types; Q8_0; Q4_K_M; Q4_0)",
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
        type=at.count,
        default=256,
        help="most tokens to generate (default 256)",
    )
    g.add_argument(
        "--temp", type=at.temperature, default=0.0, help="temperature (0: greedy, default)"
    )
    g.add_argument("--top-k", type=at.non_negative, default=0, help="top-k (0: off)")
    g.add_argument("--top-p", type=at.top_p, default=1.0, help="top-p (1: off)")
    g.add_argument("--min-p", type=at.probability, default=0.0, help="min-p (0: off)")
    g.add_argument("-s", "--seed", type=at.seed, default=None, help="random seed (-1: random)")
    g.add_argument(
        "--stop", action="append", type=at.text, default=[], help="stop string (repeatable)"
    )


class Parser(argparse.ArgumentParser):
    """argparse, with a bad flag said in one line and a hint instead of the usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n  hint: see `{self.prog} --help`\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="localspec", description="Lossless speculative decoding for local LLMs.")
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
    shape = run.add_mutually_exclusive_group()
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
    add_sampling_flags(run)
    add_spec_flags(run)
    run.add_argument("--json", action="store_true", help="print one JSON object at the end")
    run.add_argument(
        "--compare",
        action="store_true",
        help="first decode plainly in the same process: speedup and losslessness",
    )
    run.set_defaults(handler=lambda a: _command("run").cmd_run(a))
    pairs = sub.add_parser("pairs", help="which draft models work with a target, and why")
    pairs.add_argument("target", help="target model: a .gguf path or a catalog name")
    pairs.add_argument("candidates", nargs="*", help="draft candidates (paths or catalog names)")
    pairs.add_argument(
        "--scan",
        action="append",
        default=[],
        metavar="DIR",
        help="also consider every .gguf under DIR (repeatable)",
    )
    pairs.add_argument(
        "--no-hf-cache",
        action="store_true",
        help="do not consider the GGUFs in the Hugging Face cache",
    )
    pairs.add_argument(
        "-c", "--ctx-size", type=at.context, default=4096, help="context size for the memory check"
    )
    pairs.add_argument("--json", action="store_true", help="print JSON")
    pairs.set_defaults(handler=lambda a: _command("pairs").cmd_pairs(a))

    models = sub.add_parser("models", help="the catalog and what is on disk")
    models.add_argument("--json", action="store_true", help="print JSON")
    models.set_defaults(handler=lambda a: _command("models").cmd_models(a))

    pull = sub.add_parser("pull", help="download a model (catalog name or REPO[:FILE])")
    pull.add_argument("ref", help="a catalog name, or a Hugging Face repo id with :FILE")
    pull.set_defaults(handler=lambda a: _command("models").cmd_pull(a))
    probe = sub.add_parser("probe", help="rank drafts and modes by measured speedup")
    probe.add_argument("target", help="target model: a .gguf path or a catalog name")
    probe.add_argument(
        "--candidates",
        type=lambda t: [x for x in t.split(",") if x],
        default=[],
        help="comma-separated draft candidates (paths or names)",
    )
    probe.add_argument(
        "--scan",
        action="append",
        default=[],
        metavar="DIR",
        help="also consider every .gguf under DIR",
    )
    probe.add_argument(
        "--no-hf-cache",
        action="store_true",
        help="do not consider the GGUFs in the Hugging Face cache",
    )
    probe.add_argument(
        "--prompts",
        default="code-edit,qa",
        help="prompt kinds (code-edit,code,qa,summary,creative,french) or a file",
    )
    probe.add_argument("--lengths", default="4,8,16", help="draft lengths to try")
    probe.add_argument(
        "--modes",
        default="ngram-simple,draft-self,draft-mtp,draft-model",
        help="what to measure (default: every mode the target supports and every draft)",
    )
    probe.add_argument(
        "--repeat",
        type=at.integer(2, 50),
        default=4,
        help="speculative runs per configuration and prompt at most, each between two plain "
        "runs (default 4; at least 2 are always made, more while their spread is wide)",
    )
    probe.add_argument(
        "--budget",
        type=at.real(1.0, 86400.0),
        default=150.0,
        metavar="SECONDS",
        help="time for repeats beyond the first two (default 150)",
    )
    probe.add_argument("-n", "--n-predict", type=at.count, default=128, help="tokens per run")
    probe.add_argument("--temp", type=at.temperature, default=0.0, help="temperature")
    probe.add_argument("-s", "--seed", type=at.seed, default=0, help="seed for sampling")
    probe.add_argument("-c", "--ctx-size", type=at.context, default=4096)
    probe.add_argument("-t", "--threads", type=at.threads, default=None)
    probe.add_argument("-ngl", "--gpu-layers", dest="gpu_layers", type=at.gpu_layers, default=None)
    probe.add_argument(
        "-ngld", "--gpu-layers-draft", dest="gpu_layers_draft", type=at.gpu_layers, default=None
    )
    probe.add_argument("--json", action="store_true", help="print JSON")
    probe.add_argument(
        "--save", action="store_true", help="remember the winner for --mode auto (run, chat, serve)"
    )
    probe.add_argument(
        "--export",
        choices=("llama-server", "vllm"),
        default=None,
        help="print the winner as a llama-server command or a vLLM config",
    )
    probe.set_defaults(handler=lambda a: _command("probe").cmd_probe(a))
    chat = sub.add_parser("chat", help="terminal chat showing speculation live")
    add_model_flags(chat)
    add_spec_flags(chat)
    chat.add_argument("--system", default=None, help="system message")
    chat.add_argument("--temp", type=at.temperature, default=0.0, help="temperature (0: greedy)")
    chat.add_argument(
        "-n",
        "--n-predict",
        dest="max_tokens",
        type=at.count,
        default=1024,
        help="most tokens per answer (default 1024)",
    )
    chat.set_defaults(handler=lambda a: _command("chat").cmd_chat(a))

    bench = sub.add_parser("bench", help="every mode vs plain decoding (and native llama.cpp)")
    add_model_flags(bench)
    add_spec_flags(bench)
    bench.add_argument(
        "--modes",
        default="none,ngram-simple",
        help="comma-separated modes: none, ngram-simple, draft-model, draft-self, draft-mtp, "
        "or chains written with + (ngram-simple+draft-self)",
    )
    bench.add_argument(
        "--prompts",
        default="code-edit,code,qa,summary,creative,french",
        help="prompt kinds or a prompt file",
    )
    bench.add_argument("--temps", default="0", help="comma-separated temperatures")
    bench.add_argument("-n", "--n-predict", type=at.count, default=128, help="tokens per run")
    bench.add_argument("--repeat", type=at.count, default=3, help="interleaved repeats")
    bench.add_argument("--json", default=None, metavar="OUT", help="write JSON results")
    bench.add_argument("--markdown", default=None, metavar="OUT.md", help="write a table")
    bench.add_argument(
        "--plot",
        default=None,
        metavar="OUT.png",
        help="write a PNG plot (needs matplotlib: pip install localspec[plot])",
    )
    bench.add_argument(
        "--native",
        default=None,
        metavar="DIR",
        help="also run llama.cpp's llama-speculative-simple from DIR "
        "(scripts/build-llama-cpp-tools builds it)",
    )
    bench.set_defaults(handler=lambda a: _command("bench").cmd_bench(a))

    doctor = sub.add_parser("doctor", help="machine, threads, GPU offload, speculation ceiling")
    add_model_flags(doctor)
    add_spec_flags(doctor)
    doctor.set_defaults(handler=lambda a: _command("bench").cmd_doctor(a))

    serve = sub.add_parser("serve", help="OpenAI-compatible HTTP server")
    add_model_flags(serve)
    add_spec_flags(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    serve.add_argument(
        "--port", type=at.port, default=8080, help="port (default 8080; 0: any free)"
    )
    serve.add_argument(
        "--api-key", default=None, help="require Authorization: Bearer KEY (also for /metrics)"
    )
    serve.add_argument(
        "--allowed-origins",
        type=at.origins,
        default=(),
        metavar="ORIGINS",
        help="web origins that may call the API besides loopback ones, comma-separated "
        "(e.g. https://app.example.com; *: any)",
    )
    serve.add_argument(
        "--max-queue",
        type=at.non_negative,
        default=8,
        help="requests that may wait for the engine before 429 (default 8)",
    )
    serve.set_defaults(handler=lambda a: _command("serve").cmd_serve(a))
    return parser


def _command(name: str):  # type: ignore[no-untyped-def]
    """Import a subcommand's module on demand: `localspec --help` stays fast."""
    import importlib

    return importlib.import_module(f"localspec.commands.{name}")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    install_interrupt_handler()
    try:
        return int(args.handler(args) or 0)
    except LocalspecError as exc:
        print(f"localspec: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nlocalspec: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `localspec ... | head`: the reader left, nothing to say
        return 141
    except Exception as exc:
        # A bug, not bad input: one line, the traceback only when asked for.
        if os.environ.get("LOCALSPEC_DEBUG"):
            raise
        where = exc.__traceback__
        while where is not None and where.tb_next is not None:
            where = where.tb_next
        frame = (
            f" at {Path(where.tb_frame.f_code.co_filename).name}:{where.tb_lineno}" if where else ""
        )
        print(
            f"localspec: internal error: {type(exc).__name__}: {exc}{frame}\n"
            "  hint: this is a bug in localspec; rerun with LOCALSPEC_DEBUG=1 for the "
            "traceback and report it",
            file=sys.stderr,
        )
        return 70


if __name__ == "__main__":
    sys.exit(main())
