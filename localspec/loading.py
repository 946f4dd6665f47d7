"""Loading: model names and paths resolved, every argument checked, the target (and its
draft, derived draft or MTP context) loaded, and the speculation memory opened. What
``Engine.load`` does before an Engine exists; generating lives in ``api.py``."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from localspec import api_checks as checks
from localspec.argtypes import MAX_SLOTS
from localspec.drafters.ngram import NgramParams
from localspec.drafters.suffix import SuffixDrafter
from localspec.engine.loop import SpecConfig, default_n_max
from localspec.engine.model_context import (
    FLASH_ATTN_CHOICES,
    ContextOptions,
    FlashAttn,
    ModelContext,
)
from localspec.engine.mtp import MtpContext, check_nextn
from localspec.errors import LocalspecError
from localspec.fileops import check_output_path
from localspec.memory_bank import (
    DEFAULT_MEMORY_MB,
    MemoryBank,
    default_memory_file,
    refuse_foreign_file,
)
from localspec.modes import canonical, neural_part, parse_mode
from localspec.pairing import vocab_problems
from localspec.probe_results import saved_choice
from localspec.progress import status
from localspec.sources import resolve_model

# rollback depth asked of recurrent/hybrid targets: each step kept costs one copy of the
# recurrent state, so drafts for such targets are capped at this length
MAX_RECURRENT_ROLLBACK = 16


@dataclass(frozen=True)
class LoadedModels:
    """What an Engine is made of."""

    target: ModelContext
    draft: ModelContext | None
    mode: str
    spec: SpecConfig
    ngram: NgramParams
    draft_kind: str | None
    mtp: MtpContext | None
    memories: MemoryBank
    parallel: int = 1


def load_models(
    target: str | os.PathLike[str],
    draft: str | os.PathLike[str] | None = None,
    mode: str | None = None,
    *,
    n_ctx: int = 4096,
    n_threads: int | None = None,
    n_gpu_layers: int | None = None,
    n_gpu_layers_draft: int | None = None,
    flash_attn: FlashAttn = "auto",
    spec: SpecConfig | None = None,
    ngram: NgramParams | None = None,
    progress: Callable[[str, float], None] | None = None,
    self_layers: str | None = None,
    self_quant: str = "auto",
    spec_memory_mb: float = DEFAULT_MEMORY_MB,
    spec_memory_path: str | os.PathLike[str] | bool | None = None,
    parallel: int = 1,
) -> LoadedModels:
    """``Engine.load``'s work (its docstring says what each argument means)."""
    checks.integer("parallel", parallel, low=1)
    if parallel > MAX_PARALLEL:
        raise LocalspecError(
            f"parallel={parallel}: at most {MAX_PARALLEL} generations share a batch",
            "use fewer slots (-np / --parallel)",
        )
    checks.load_arguments(
        target, draft, n_ctx, n_threads, n_gpu_layers, n_gpu_layers_draft, progress
    )
    checks.mode_name(mode)
    mode = resolve_mode(mode, draft is not None)
    checks.memory_cap(spec_memory_mb)
    spec_memory_path = checks.memory_path(spec_memory_path, spec_memory_mb)
    ngram = checks.ngram(ngram) if ngram is not None else NgramParams()
    validate_ngram(ngram)
    if spec is not None:
        spec = checks.spec(spec)
    else:  # as the command line's flags default (``auto`` without a probe: ngram-simple)
        drafting = mode if mode != "auto" else "ngram-simple"
        spec = SpecConfig(n_max=default_n_max(drafting, ngram.size_m))
    if flash_attn not in FLASH_ATTN_CHOICES:
        raise LocalspecError(
            f"flash_attn={flash_attn!r} is not a flash-attention setting",
            f"use one of {', '.join(FLASH_ATTN_CHOICES)}",
        )
    target_path = resolve_model(target)
    check_context_fits(target_path, n_ctx, parallel)
    if n_threads is None:
        n_threads = threads_now()
    elif n_threads > (os.cpu_count() or 1):
        status(
            f"{n_threads} threads on {os.cpu_count()} logical cores: llama.cpp's threads "
            "wait for one another, decoding will be far slower than with fewer",
            True,
        )
    if mode == "auto":
        mode, draft, spec = auto_choice(target_path, spec)
        if "draft-mtp" in parse_mode(mode) and parallel > 1:
            status(f"--mode auto chose {mode}, which answers one request at a time: 1 slot")
            parallel = 1
    if spec_memory_mb == 0 and SuffixDrafter.name in parse_mode(mode):
        raise LocalspecError(
            f"--mode {mode} drafts from the speculation memory, which is turned off "
            "(--no-spec-memory, spec_memory_mb=0)",
            "turn the memory on, or choose a mode without suffix",
        )
    if spec_memory_path is True:
        spec_memory_path = default_memory_file(target_path)
        spec_memory_path.parent.mkdir(parents=True, exist_ok=True)
    if spec_memory_path is not None:
        check_memory_file(Path(spec_memory_path))
    draft_kind = neural_part(mode) if mode != "none" else None
    if self_layers is not None and draft_kind != "draft-self":
        raise LocalspecError(
            "--spec-self-layers applies to --mode draft-self only",
            "drop it, or add draft-self to --mode",
        )
    if draft_kind == "draft-self":
        from localspec.derivation.self_draft import ensure_self_draft

        draft = ensure_self_draft(target_path, self_layers, self_quant).path
    draft_path = resolve_model(draft) if draft is not None else None
    if draft_kind == "draft-mtp":
        check_nextn(target_path)
        if parallel > 1:
            raise LocalspecError(
                "draft-mtp runs one generation at a time (its head follows one sequence)",
                "use --parallel 1 with draft-mtp, or another mode for parallel slots",
            )
    options = ContextOptions(
        n_ctx,
        n_threads,
        n_gpu_layers,
        n_rs_seq=min(spec.n_max, MAX_RECURRENT_ROLLBACK),
        load_mtp=draft_kind == "draft-mtp",
        flash_attn=flash_attn,
        n_seq=parallel,
    )
    target_backend, draft_backend, mtp = open_models(
        target_path, draft_path, draft_kind, options, n_gpu_layers_draft, spec, progress
    )
    try:
        memories = load_memories(target_backend, spec_memory_mb, spec_memory_path)
    except BaseException:
        close_models(target_backend, draft_backend, mtp)
        raise
    return LoadedModels(
        target_backend, draft_backend, mode, spec, ngram, draft_kind, mtp, memories, parallel
    )


def open_models(
    target_path: Path,
    draft_path: Path | None,
    draft_kind: str | None,
    options: ContextOptions,
    n_gpu_layers_draft: int | None,
    spec: SpecConfig,
    progress: Callable[[str, float], None] | None,
) -> tuple[ModelContext, ModelContext | None, MtpContext | None]:
    """The target's context, and the draft's (a second model, a derived layer subset) or the
    MTP context on the target; all freed again if any of them fails."""
    target = ModelContext(target_path, options, partial(progress, "target") if progress else None)
    draft: ModelContext | None = None
    mtp = None
    try:
        spec.validate(target.n_batch)  # a small context has a smaller batch
        if draft_kind == "draft-mtp":
            mtp = MtpContext(target)
        elif draft_path is not None:
            draft = ModelContext(
                draft_path,
                # the target's context, also when -c 0 let llama.cpp choose it
                ContextOptions(
                    target.n_ctx,
                    options.n_threads,
                    n_gpu_layers_draft,
                    flash_attn=options.flash_attn,
                    n_seq=options.n_seq,  # one draft sequence per slot
                ),
                partial(progress, "draft") if progress else None,
            )
            if draft_kind == "draft-model":
                check_pair(target, draft)
    except BaseException:
        close_models(target, draft, mtp)
        raise
    return target, draft, mtp


def close_models(target: ModelContext, draft: ModelContext | None, mtp: MtpContext | None) -> None:
    if mtp is not None:
        mtp.close()
    if draft is not None:
        draft.close()
    target.close()


def resolve_mode(mode: str | None, has_draft: bool, suffix_first: bool = False) -> str:
    """No mode: draft-model when a draft is given, else ngram-simple (``suffix_first``: after
    the suffix lookup, which costs nothing when it finds nothing). Check the combination."""
    default = "draft-model" if has_draft else "ngram-simple"
    mode = mode or (f"suffix+{default}" if suffix_first else default)
    if mode == "auto":
        if has_draft:
            raise LocalspecError(
                "--mode auto chooses the draft itself (from `localspec probe --save`)",
                "drop the draft model (-md/--model-draft, draft=), or pick a mode",
            )
        return mode
    mode = canonical(mode)
    uses_draft_model = neural_part(mode) == "draft-model"
    if uses_draft_model and not has_draft:
        raise LocalspecError(
            f"--mode {mode} needs a draft model",
            "give one (-md/--model-draft, draft=), or use the mode ngram-simple or draft-self",
        )
    if not uses_draft_model and has_draft:
        raise LocalspecError(
            f"a draft model was given but --mode is {mode}, which does not use one",
            "drop the draft model (-md/--model-draft, draft=), or use the mode draft-model",
        )
    return mode


def auto_choice(target: Path, spec: SpecConfig) -> tuple[str, str | None, SpecConfig]:
    """``--mode auto``: the winner of the saved probe of this target (mode, draft, length)."""
    from localspec.progress import status

    choice = saved_choice(target)
    if choice is None:
        status(
            f"--mode auto: no saved probe for {target.name}, using ngram-simple "
            f"(run `localspec probe {target} --save` to measure)"
        )
        return "ngram-simple", None, spec
    if choice.mode == "none":
        status("--mode auto: plain decoding (the saved probe found no draft that pays here)")
    else:
        status(f"--mode auto: {choice.label} (from the saved probe)")
    n_max = choice.n_max if choice.mode != "none" else spec.n_max
    return choice.mode, choice.draft, replace(spec, n_max=n_max, n_min=min(spec.n_min, n_max))


LARGE_CONTEXT = 131_072  # above this, the cache's size is checked against the machine first
# the estimate counts every layer as attention: a hybrid model's cache is up to ~4x smaller
CACHE_ESTIMATE_SLACK = 4.0
MAX_PARALLEL = MAX_SLOTS


def check_context_fits(target: Path, n_ctx: int, parallel: int = 1) -> None:
    """A context whose cache cannot fit in this machine's memory is refused at once (llama.cpp
    would spend a minute trying to allocate it); ``parallel`` slots have a context each."""
    if n_ctx * parallel <= LARGE_CONTEXT:
        return
    import psutil

    from localspec.derivation.gguf_info import gguf_info

    need = gguf_info(target).kv_cache_bytes(n_ctx * parallel)
    have = psutil.virtual_memory().total + psutil.swap_memory().total
    if need > CACHE_ESTIMATE_SLACK * have:
        what = f"{parallel} slots of {n_ctx} tokens" if parallel > 1 else f"{n_ctx} tokens"
        raise LocalspecError(
            f"a context of {what} needs about {need / 2**30:.0f} GiB for its cache; "
            f"this machine has {have / 2**30:.0f} GiB",
            "lower the context size (-c / n_ctx; 0: the model's trained length)"
            + (" or the number of slots (--parallel)" if parallel > 1 else ""),
        )


def load_memories(
    target: ModelContext, max_mb: float, path: str | os.PathLike[str] | None
) -> MemoryBank:
    """The suffix drafter's memories for this target: token ids belong to its vocabulary,
    so a memory file names the model it was written for."""
    model = f"{target.path.name}|{target.n_vocab}"
    return MemoryBank(max_mb, Path(path) if path is not None else None, model, target.n_vocab)


def check_memory_file(path: Path, flag: str = "--spec-memory (spec_memory_path)") -> None:
    """Refuse a memory path that cannot be written, or a file that is not a memory file,
    before the models load."""
    check_output_path(path, flag)
    if path.exists():
        refuse_foreign_file(path)


def threads_now() -> int:
    """All physical cores, less those other processes keep busy (said when it is fewer)."""
    from localspec.hardware import choose_threads, default_threads
    from localspec.progress import status

    threads, load = choose_threads()
    if threads < default_threads():
        status(
            f"threads: {threads} of {default_threads()} cores (other processes keep "
            f"{100 * load.others_share:.0f}% of the machine busy; -t or n_threads sets it)"
        )
    return threads


def validate_ngram(params: NgramParams) -> None:
    for flag, value in (
        ("size-n", params.size_n),
        ("size-m", params.size_m),
        ("min-hits", params.min_hits),
        ("min-n", params.min_n),
    ):
        if value < 1:
            raise LocalspecError(f"--spec-ngram-simple-{flag} must be >= 1 (got {value})")
    if params.min_n > params.size_n:
        raise LocalspecError(
            f"--spec-ngram-simple-min-n ({params.min_n}) must not exceed size-n ({params.size_n})"
        )


def check_pair(target: ModelContext, draft: ModelContext) -> None:
    """llama.cpp's vocabulary rules for a draft model; refuse with the failing rule."""
    problems = vocab_problems(target.vocab_view(), draft.vocab_view())
    if problems:
        raise LocalspecError(
            f"incompatible draft {draft.path.name} for target {target.path.name}: "
            + "; ".join(problems),
            "use a draft of the same family and tokenizer (see `localspec pairs`)",
        )
