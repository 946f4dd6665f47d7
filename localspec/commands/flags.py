"""The flag groups several commands share, and what they mean: ``Engine.load`` options and
speculation settings from parsed flags."""

from __future__ import annotations

import argparse
from typing import Any

from localspec import argtypes as at
from localspec.api import Engine
from localspec.catalog import Catalog
from localspec.drafters.ngram import NgramParams
from localspec.engine.loop import SpecConfig, default_n_max
from localspec.engine.model_context import FLASH_ATTN_CHOICES
from localspec.errors import LocalspecError
from localspec.memory_bank import DEFAULT_MEMORY_MB


def add_model_flags(p: argparse.ArgumentParser, draft: bool = True, mode: bool = True) -> None:
    """The target, and the draft model and mode where the command uses them (a flag a
    command would ignore is not offered: argparse refuses it)."""
    p.add_argument(
        "target",
        nargs="?",
        default=None,
        help="target model: a .gguf path or a catalog name (default: the catalog's)",
    )
    if draft:
        p.add_argument(
            "-md",
            "--model-draft",
            dest="draft",
            default=None,
            help="draft model (.gguf path or catalog name) for --mode draft-model",
        )
    if mode:
        p.add_argument(
            "--mode",
            default=None,
            help="none | ngram-simple | suffix | draft-model | draft-self | draft-mtp, or a "
            "chain such as suffix+ngram-simple or ngram-simple+draft-self (default: "
            "draft-model with -md, else ngram-simple; after the suffix lookup where the "
            "speculation memory is on)",
        )
    add_machine_flags(p)


def add_machine_flags(p: argparse.ArgumentParser) -> None:
    """Context, threads, GPU offload: how a model is loaded on this machine."""
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
    p.add_argument(
        "-fa",
        "--flash-attn",
        dest="flash_attn",
        choices=FLASH_ATTN_CHOICES,
        default="auto",
        help="flash attention (auto: off on the CPU, where it slows verify batches; "
        "llama.cpp's choice on a GPU)",
    )


# (flag, type, default, help): llama.cpp's speculation flags, and localspec's own beside them
SPEC_FLAGS: tuple[tuple[str, Any, Any, str], ...] = (
    (
        "--spec-draft-n-max",
        at.count,
        None,
        "most tokens drafted per round (default 16; ngram-simple: its size-m)",
    ),
    (
        "--spec-draft-n-min",
        at.non_negative,
        0,
        "drafts shorter than this are not verified (default 0)",
    ),
    (
        "--spec-draft-p-min",
        at.probability,
        0.0,
        "stop drafting when the draft's top probability is below this (default 0)",
    ),
    ("--spec-ngram-simple-size-n", at.count, 12, "length of the lookup n-gram (default 12)"),
    ("--spec-ngram-simple-size-m", at.count, 48, "length of the drafted m-gram (default 48)"),
    ("--spec-ngram-simple-min-hits", at.count, 1, "earlier occurrences a key needs (default 1)"),
    (
        "--spec-ngram-simple-min-n",
        at.count,
        NgramParams.min_n,
        "shortest key tried when the size-n key has no match "
        "(default 4; set it to size-n for llama.cpp's exact behaviour)",
    ),
    (
        "--spec-self-layers",
        str,
        None,
        "draft-self: the target layers the draft keeps, e.g. 0-11, 0-5,18-23 or "
        "skip-every=2 (default: all but the second quarter, e.g. 0-5,12-23 of 24)",
    ),
    (
        "--spec-self-quant",
        str,
        "auto",
        "draft-self: weight type of the draft, every tensor (auto: Q4_0 unless the target is "
        "that small already; none: the target's types; F16; Q8_0; Q4_K_M; Q4_0)",
    ),
)


def add_spec_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("speculation (llama.cpp flag names)")
    for flag, kind, default, help_text in SPEC_FLAGS:
        g.add_argument(flag, type=kind, default=default, help=help_text)
    g.add_argument(
        "--no-adaptive",
        action="store_true",
        help="always draft n-max tokens; never pause speculation",
    )


def add_memory_flags(p: argparse.ArgumentParser, on_by_default: bool) -> None:
    """The suffix drafter's memory of earlier generations. ``on_by_default``: the default
    mode starts with the suffix lookup (serve and chat, where requests follow each other;
    a single ``run`` has nothing to remember unless a memory file is kept)."""
    g = p.add_argument_group("speculation memory (the suffix drafter)")
    choice = g.add_mutually_exclusive_group()
    choice.add_argument(
        "--spec-memory",
        nargs="?",
        const=True,
        default=None,
        metavar="PATH",
        help="keep the memory of earlier prompts and answers in this file across runs "
        "(no PATH: one file per model in the localspec cache)",
    )
    choice.add_argument(
        "--no-spec-memory",
        action="store_true",
        help="remember nothing: no suffix drafting"
        + (" (default mode: ngram-simple, or draft-model with -md)" if on_by_default else ""),
    )
    g.add_argument(
        "--spec-memory-mb",
        type=at.megabytes,
        default=None,
        help=f"memory cap in MB, oldest generations evicted first (default {DEFAULT_MEMORY_MB:g}"
        "; per API key in serve)",
    )
    p.set_defaults(memory_by_default=on_by_default)


def add_length_and_temperature(
    g: argparse._ActionsContainer, max_tokens: int, what: str = "to generate"
) -> None:
    g.add_argument(
        "-n",
        "--n-predict",
        "--max-tokens",
        dest="max_tokens",
        type=at.count,
        default=max_tokens,
        help=f"most tokens {what} (default {max_tokens})",
    )
    g.add_argument(
        "--temp",
        dest="temperature",
        type=at.temperature,
        default=0.0,
        help="temperature (0: greedy, default)",
    )


# llama.cpp's repetition penalties: (flag, type, default, help)
PENALTY_FLAGS = (
    (
        "--repeat-penalty",
        at.repeat_penalty,
        1.0,
        "penalize tokens seen in the last --repeat-last-n (1: off, default)",
    ),
    (
        "--repeat-last-n",
        at.penalty_window,
        64,
        "tokens the penalties look back on (default 64; 0: off, -1: the whole context)",
    ),
    ("--presence-penalty", at.penalty, 0.0, "lower each seen token's logit by this (0: off)"),
    (
        "--frequency-penalty",
        at.penalty,
        0.0,
        "lower each seen token's logit by this times its count (0: off)",
    ),
)


def add_sampling_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    add_length_and_temperature(g, 256)
    g.add_argument("--top-k", type=at.non_negative, default=0, help="top-k (0: off)")
    g.add_argument("--top-p", type=at.top_p, default=1.0, help="top-p (1: off)")
    g.add_argument("--min-p", type=at.probability, default=0.0, help="min-p (0: off)")
    g.add_argument("-s", "--seed", type=at.seed, default=None, help="random seed (-1: random)")
    for flag, kind, default, what in PENALTY_FLAGS:
        g.add_argument(flag, type=kind, default=default, help=what)
    g.add_argument(
        "--stop", action="append", type=at.text, default=[], help="stop string (repeatable)"
    )
    g.add_argument(
        "--ignore-eos", action="store_true", help="write on past the model's end tokens to -n"
    )


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of ``Engine.load`` from the shared model and spec flags."""
    from localspec.catalog import load_catalog
    from localspec.loading import resolve_mode

    forget = getattr(args, "no_spec_memory", False)
    memory_file = getattr(args, "spec_memory", None)
    if isinstance(memory_file, str):
        command = getattr(args, "command", None) or "run"
        check_memory_path(memory_file, args.target, load_catalog(), command)
    memory_mb = getattr(args, "spec_memory_mb", None)
    if forget and memory_mb is not None:
        raise LocalspecError(
            "--spec-memory-mb sets the cap of a memory that --no-spec-memory turns off",
            "drop one of the two",
        )
    suffix_first = not forget and (getattr(args, "memory_by_default", False) or bool(memory_file))
    mode = resolve_mode(args.mode, args.draft is not None, suffix_first)
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
        flash_attn=args.flash_attn,
        spec=spec,
        ngram=ngram,
        self_layers=args.spec_self_layers,
        self_quant=args.spec_self_quant,
        spec_memory_mb=0.0 if forget else (memory_mb or DEFAULT_MEMORY_MB),
        spec_memory_path=memory_file,
        parallel=parallel_for(args, mode),
        # where the command has it (serve): the prompt cache of the parallel slots
        **(
            {"prompt_cache_mb": args.cache_ram}
            if getattr(args, "cache_ram", None) is not None
            else {}
        ),
    )


def parallel_for(args: argparse.Namespace, mode: str) -> int:
    """``--parallel`` where the command has it (serve), else one generation at a time; by
    default the command's own, and 1 with draft-mtp (its head follows one sequence)."""
    parallel = getattr(args, "parallel", None)
    if parallel is not None:
        return int(parallel)
    if "draft-mtp" in mode.split("+"):
        return 1
    return int(getattr(args, "default_parallel", 1))


def check_memory_path(
    path: str, target: str | None, catalog: Catalog, command: str = "run"
) -> None:
    """--spec-memory takes an optional PATH, so a model written after it is taken for the
    path: refuse a path that names a model (the model would be overwritten or misread)."""
    if not path.strip():
        raise LocalspecError(
            "--spec-memory: the path is empty", "give a file name, or no value: the cache's file"
        )
    if path.endswith(".gguf") or path in catalog.models:
        raise LocalspecError(
            f"--spec-memory {path}: that is a model, not a memory file",
            f"put the model before the flag (localspec {command} {path} --spec-memory), or "
            "name the memory file differently"
            if target is None
            else "name the memory file differently (a file named like a catalog model would "
            "hide that model in this directory)",
        )


def spec_for(args: argparse.Namespace, mode: str) -> SpecConfig:
    """The speculation settings of the flags for ``mode``. Without --spec-draft-n-max, a mode
    that starts with a lookup drafts up to the n-gram size-m (48), a neural one 16."""
    n_max = args.spec_draft_n_max
    if n_max is None:
        n_max = default_n_max(mode, args.spec_ngram_simple_size_m)
    return SpecConfig(
        n_max=n_max,
        n_min=args.spec_draft_n_min,
        p_min=args.spec_draft_p_min,
        adaptive=not args.no_adaptive,
    )


def load_engine(args: argparse.Namespace) -> Engine:
    return Engine.load(**engine_options(args))
