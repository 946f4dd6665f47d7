"""llama.cpp's own speculative decoding (``llama-speculative-simple``), run on the same
model, prompt, flags, context and threads as a bench cell, for the localspec/native ratio."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from localspec.engine.llama_lib import weight_repacking
from localspec.engine.model_context import FlashAttn
from localspec.errors import LocalspecError
from localspec.modes import parse_mode

TOOL = "llama-speculative-simple"
_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s")
_COUNT = {name: re.compile(rf"\b{name}\s*=\s*(\d+)") for name in ("n_drafted", "n_accept")}
# llama.cpp's --spec-type names; draft-self has no native counterpart
_SPEC_TYPES = {
    "ngram-simple": "ngram-simple",
    "draft-model": "draft-simple",
    "draft-mtp": "draft-mtp",
}


@dataclass(frozen=True)
class NativeSettings:
    tool_dir: Path
    target: Path
    draft: Path | None
    n_tokens: int
    threads: int
    n_ctx: int
    n_max: int
    # as localspec's target context has it (``ModelContext.flash_attn``): what is compared is
    # the speculation, not the attention kernel
    flash_attn: FlashAttn


def supported(mode: str) -> bool:
    return all(part in _SPEC_TYPES for part in parse_mode(mode))


def spec_type(mode: str) -> str:
    """``ngram-simple+draft-model`` -> ``ngram-simple,draft-simple`` (llama.cpp's chain)."""
    return ",".join(_SPEC_TYPES[part] for part in parse_mode(mode))


def weight_flags() -> list[str]:
    """llama.cpp's tools load the weights as localspec does: without repacked or AMX
    buffers where localspec goes without them (``llama_lib.weight_repacking``), for the
    same kernels on both sides, and because their AMX products crash on the same CPUs."""
    return [] if weight_repacking() else ["--no-repack"]


def command(
    s: NativeSettings, mode: str, prompt_file: Path, temperature: float, seed: int = 0
) -> list[str]:
    """The llama-speculative-simple command line for one cell. ``seed``: the repeat's, as
    localspec's own runs take it, so that at temperature > 0 each repeat samples another
    answer on both sides (with one seed the tool's repeats are one answer timed again)."""
    cmd = [
        str(s.tool_dir / TOOL),
        "-m",
        str(s.target),
        "-f",
        str(prompt_file),
        "-n",
        str(s.n_tokens),
        "--temp",
        f"{temperature:g}",
        # the distribution localspec's bench samples from: temperature alone (llama.cpp's
        # defaults would truncate it to top-k 40 / top-p 0.95 / min-p 0.05, a sharper one
        # that accepts drafted tokens more often)
        "--top-k",
        "0",
        "--top-p",
        "1",
        "--min-p",
        "0",
        "-t",
        str(s.threads),
        "-c",
        str(s.n_ctx),
        # the tool evaluates the prompt in one batch and refuses a prompt longer than it
        "-b",
        str(s.n_ctx),
        "--seed",
        str(seed),
        "-fa",
        s.flash_attn,
        "--spec-type",
        spec_type(mode),
        "--spec-draft-n-max",
        str(s.n_max),
        *weight_flags(),
    ]
    if "draft-model" in parse_mode(mode):
        if s.draft is None:
            raise LocalspecError("native draft-model needs a draft model (-md)")
        cmd += ["-md", str(s.draft)]
    return cmd


@dataclass(frozen=True)
class NativeRun:
    tokens_per_s: float
    drafted: int  # tokens the tool drafted (0: its lookup never matched)
    accepted: int
    text: str | None = None  # the answer it wrote (None: not found in what it printed)


def parse_run(output: str, n_tokens: int | None = None) -> NativeRun:
    """``n_tokens``: the tokens asked for. The tool stops only after the round that reaches
    them, so a draft accepted whole in its last round decodes up to ``--spec-draft-n-max``
    tokens more (241 for 192 asked on a code edit), nearly free in one batch, and its own
    speed counts them; localspec stops drafting at the limit. Counted here: the tokens asked
    for, over the whole decoding time (which the extra tokens only lengthen)."""
    match = _DECODED.search(output)
    if match is None:
        raise LocalspecError(
            f"{TOOL} printed no 'decoded ... t/s' line",
            "check that the tool runs: " + output.strip()[-300:],
        )
    counts = [_COUNT[name].search(output) for name in ("n_drafted", "n_accept")]
    drafted, accepted = (int(c.group(1)) if c else 0 for c in counts)
    decoded, seconds = int(match.group(1)), float(match.group(2))
    speed = float(match.group(3))
    if n_tokens is not None and decoded > n_tokens and seconds > 0:
        speed = n_tokens / seconds
    return NativeRun(speed, drafted, accepted)


def check_tool(tool_dir: Path) -> None:
    """``--native DIR`` must hold an executable llama-speculative-simple (checked before a
    bench starts, not after it ran)."""
    tool = tool_dir / TOOL
    if not tool.is_file() or not os.access(tool, os.X_OK):
        raise LocalspecError(
            f"--native {tool_dir}: no executable {TOOL} there",
            f"build it with `scripts/build-llama-cpp-tools {tool_dir}`, or drop --native",
        )


def prompt_file_text(prompt_text: str) -> str:
    """What the -f prompt file holds so that the tool reads exactly ``prompt_text``: llama.cpp
    drops one trailing newline from a prompt file (common/arg.cpp), and a chat prompt ends
    with one ("<|im_start|>assistant\\n") which must arrive whole, or the tool continues
    another prompt and writes another text than localspec's runs."""
    return prompt_text + "\n"


def run(
    s: NativeSettings, mode: str, prompt_text: str, temperature: float, seed: int = 0
) -> NativeRun:
    """The native tool's speed and draft counts on this prompt (already chat-formatted)."""
    check_tool(s.tool_dir)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(prompt_file_text(prompt_text))
    try:
        done = subprocess.run(
            command(s, mode, Path(f.name), temperature, seed),
            capture_output=True,
            encoding="utf-8",
            errors="replace",
            timeout=1800,
        )
    finally:
        Path(f.name).unlink(missing_ok=True)
    run = parse_run(done.stdout + done.stderr, s.n_tokens)
    return replace(run, text=answer_text(done.stdout, prompt_text))


def answer_text(stdout: str, prompt_text: str) -> str | None:
    """The answer in the tool's standard output, which holds the prompt's pieces, then the
    answer's, between blank lines; trailing newlines dropped (``parts_from`` compares
    answers without them). None where the prompt is not found in it."""
    at = stdout.find(prompt_text)
    if at < 0:
        return None
    return stdout[at + len(prompt_text) :].rstrip("\n")


def parts_from(answer: str, reference: str) -> bool:
    """Whether two answers to one prompt differ before the shorter one ends (the tool writes
    a few tokens past the count asked for; an answer may stop at its end token sooner)."""
    # an answer cut inside a character ends with a replacement character
    answer, reference = answer.rstrip("\n\ufffd"), reference.rstrip("\n\ufffd")
    n = min(len(answer), len(reference))
    return answer[:n] != reference[:n]
