"""`localspec doctor`: the machine, its load, GPU offload, and the speculation ceiling."""

from __future__ import annotations

import argparse
import platform

from localspec.commands.flags import add_model_flags, add_spec_flags, engine_options
from localspec.engine.llama_lib import AMX_VARIABLE, amx_built_in, weight_repacking
from localspec.hardware import machine_load
from localspec.progress import report_console


def run(args: argparse.Namespace) -> int:
    import llama_cpp
    import psutil

    from localspec.api import Engine
    from localspec.hardware import threads_for

    mem = psutil.virtual_memory()
    console = report_console()
    load = machine_load()
    args.threads = args.threads or threads_for(load)
    console.print(
        f"machine: {platform.machine()}, {psutil.cpu_count(logical=False)} physical / "
        f"{psutil.cpu_count()} logical cores, threads used: {args.threads}"
    )
    console.print(f"memory: {mem.total / 2**30:.1f} GiB, {mem.available / 2**30:.1f} GiB free")
    console.print(load.describe())
    console.print(
        f"llama-cpp-python {llama_cpp.__version__}; GPU offload "
        f"{'available' if llama_cpp.llama_supports_gpu_offload() else 'not built in (CPU)'}"
    )
    if amx_built_in():
        console.print(
            "AMX kernels built in: "
            + (
                f"on ({AMX_VARIABLE}=1)"
                if weight_repacking()
                else "not used (llama.cpp's AMX products crash where GCC 12 or 13 built "
                f"them; weights load without repacking; {AMX_VARIABLE}=1 turns them on for a "
                "build by clang or GCC 14)"
            )
        )
    args.mode, args.draft = "ngram-simple", None
    with Engine.load(**engine_options(args)) as engine:
        cost = engine.verify_cost()
        fa = engine.target.flash_attn
        console.print(
            f"model: {engine.target_path}; flash attention "
            f"{'auto (llama.cpp decides)' if fa == 'auto' else fa}"
        )
        size, seconds = cost.ceiling_batch()
        console.print(
            f"one-token step {1000 * cost.seconds[0]:.1f} ms; "
            f"batch of {size} {1000 * seconds:.1f} ms"
        )
        console.print(
            f"ceiling for speculation here: {cost.ceiling():.2f}x ({size} tokens in that batch's "
            "time against one-token steps: no drafting can beat it)"
        )
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("doctor", help="machine, threads, GPU offload, speculation ceiling")
    add_model_flags(p, draft=False, mode=False)  # it measures the target alone
    add_spec_flags(p)
    p.set_defaults(handler=run)
