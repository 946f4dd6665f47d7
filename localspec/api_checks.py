"""What the Python API checks of its arguments before any work: each wrong type or value is
one ``LocalspecError`` naming the argument, never a TypeError from deep inside (a script's
author sees the mistake, not numpy's or ctypes' words for it).

The command line and the server check their own input (argparse types, pydantic); they
reach the same checks through ``Engine``, so these are also the last line for them."""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Sequence
from dataclasses import fields, replace

from localspec.argtypes import MIN_CONTEXT
from localspec.drafters.ngram import NgramParams
from localspec.engine.fim import ExtraFile, FimPrompt
from localspec.engine.loop import SpecConfig
from localspec.engine.prompting import TokenPrompt
from localspec.engine.settings import GenerationSettings
from localspec.errors import LocalspecError

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_THREADS = 1024


def integer(name: str, value: object, low: int | None = None, none_ok: bool = False) -> None:
    if value is None and none_ok:
        return
    if type(value) is not int:  # bool is an int to Python, never to a user
        raise LocalspecError(f"{name} must be a whole number (got {value!r})")
    if low is not None and value < low:
        raise LocalspecError(f"{name} must be >= {low} (got {value})")


def real(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise LocalspecError(f"{name} must be a number (got {value!r})")


def flag(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise LocalspecError(f"{name} must be True or False (got {value!r})")


def optional_callable(name: str, value: object) -> None:
    if value is not None and not callable(value):
        raise LocalspecError(f"{name} must be a function or None (got {value!r})")


def text(name: str, value: object, none_ok: bool = True) -> None:
    if not (isinstance(value, str) or (value is None and none_ok)):
        raise LocalspecError(f"{name} must be a string (got {value!r})")


def stop_strings(value: object) -> tuple[str, ...]:
    """A string is one stop string (as in OpenAI's API), not one per character."""
    if isinstance(value, str):
        value = (value,)
    if not isinstance(value, Sequence) or not all(isinstance(s, str) and s for s in value):
        raise LocalspecError(
            f"stop must be a non-empty string or a list of them (got {value!r})",
            'e.g. stop=["\\n\\n"]',
        )
    return tuple(value)


def setting_names(names: Iterable[str]) -> None:
    """Keyword settings of a generation: each a field of ``GenerationSettings``."""
    known = [f.name for f in fields(GenerationSettings)]
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            raise LocalspecError(
                f"unknown generation setting {name!r}",
                f"did you mean {close[0]}?" if close else f"the settings: {', '.join(known)}",
            )


def settings(value: object) -> GenerationSettings:
    """The settings of one generation, checked; ``stop`` as a tuple."""
    if not isinstance(value, GenerationSettings):
        raise LocalspecError(
            f"settings must be a GenerationSettings (got {type(value).__name__})",
            "or pass the settings as keywords: generate(prompt, max_tokens=32, ...)",
        )
    s = value
    integer("max_tokens", s.max_tokens, low=1, none_ok=True)
    for name in ("temperature", "top_p", "min_p"):
        real(name, getattr(s, name))
    integer("top_k", s.top_k)
    integer("seed", s.seed, none_ok=True)
    for name in ("repeat_penalty", "frequency_penalty", "presence_penalty"):
        real(name, getattr(s, name))
    integer("repeat_last_n", s.repeat_last_n)
    logit_bias(s.logit_bias)
    flag("ignore_eos", s.ignore_eos)
    integer("logprobs", s.logprobs, low=0, none_ok=True)
    text("mode", s.mode)
    text("grammar", s.grammar)
    if s.grammar is not None and not s.grammar.strip():
        raise LocalspecError("grammar is empty", "give GBNF text, or grammar=None for none")
    text("memory_partition", s.memory_partition, none_ok=False)
    flag("reproducible", s.reproducible)
    flag("remember", s.remember)
    if s.spec is not None:
        spec(s.spec)
    tools(s.tools)
    return replace(s, stop=stop_strings(s.stop))


def logit_bias(value: object) -> None:
    """(token id, bias) pairs."""
    hint = "give (token id, bias) pairs, e.g. [(42, -5.0)]; -inf bans the token"
    if isinstance(value, str | bytes | dict) or not isinstance(value, Sequence):
        raise LocalspecError(f"logit_bias must be a list of pairs (got {value!r:.60})", hint)
    for pair in value:
        if not (isinstance(pair, Sequence) and len(pair) == 2):
            raise LocalspecError(f"logit_bias: {pair!r:.40} is not a (token id, bias) pair", hint)
        integer("logit_bias token", pair[0])
        real("logit_bias bias", pair[1])


def spec(value: object) -> SpecConfig:
    if not isinstance(value, SpecConfig):
        raise LocalspecError(
            f"spec must be a SpecConfig (got {type(value).__name__})",
            "from localspec import SpecConfig; spec=SpecConfig(n_max=8)",
        )
    integer("SpecConfig.n_max", value.n_max)
    integer("SpecConfig.n_min", value.n_min)
    real("SpecConfig.p_min", value.p_min)
    flag("SpecConfig.adaptive", value.adaptive)
    value.validate()
    return value


def ngram(value: object) -> NgramParams:
    if not isinstance(value, NgramParams):
        raise LocalspecError(f"ngram must be an NgramParams (got {type(value).__name__})")
    for name in ("size_n", "size_m", "min_hits", "min_n"):
        integer(f"NgramParams.{name}", getattr(value, name), low=1)
    return value


def tools(value: object) -> None:
    """OpenAI-style function tools: [{"type": "function", "function": {"name": ...}}]."""
    if value is None:
        return
    example = '[{"type": "function", "function": {"name": "f", "parameters": {...}}}]'
    if isinstance(value, str | bytes | dict) or not isinstance(value, Sequence):
        raise LocalspecError("tools must be a list of function tools", example)
    for i, tool in enumerate(value):
        function = tool.get("function") if isinstance(tool, dict) else None
        if (
            not isinstance(tool, dict)
            or tool.get("type") != "function"
            or not isinstance(function, dict)
            or not isinstance(function.get("name"), str)
            or not function["name"]
            or not isinstance(function.get("parameters", {}), dict)
        ):
            raise LocalspecError(
                f"tool #{i + 1} is not a function tool with a name (and object parameters)",
                example,
            )


def prompt(value: object) -> None:
    """Text, chat messages (a list of {"role", "content"} dicts), a ``FimPrompt`` or a
    ``TokenPrompt``."""
    if isinstance(value, str | TokenPrompt):
        return
    if isinstance(value, FimPrompt):
        return fim_prompt(value)
    hint = 'give text, or messages: [{"role": "user", "content": "..."}]'
    if isinstance(value, bytes | dict) or not isinstance(value, Sequence):
        raise LocalspecError(f"the prompt must be text or chat messages (got {value!r:.60})", hint)
    if not value:
        raise LocalspecError("the chat has no messages", hint)
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise LocalspecError(f"chat message #{i + 1} is not a dict ({message!r:.40})", hint)
        if message.get("role") not in CHAT_ROLES:
            raise LocalspecError(
                f"chat message #{i + 1} has the role {message.get('role')!r}",
                f"use one of {', '.join(CHAT_ROLES)}",
            )


def fim_prompt(fim: FimPrompt) -> None:
    for name in ("prefix", "suffix", "typed"):
        text(f"FimPrompt.{name}", getattr(fim, name), none_ok=False)
    for i, file in enumerate(fim.extra):
        if not isinstance(file, ExtraFile):
            raise LocalspecError(f"FimPrompt.extra[{i}] must be an ExtraFile (got {file!r:.40})")
        text(f"FimPrompt.extra[{i}].text", file.text, none_ok=False)
        text(f"FimPrompt.extra[{i}].filename", file.filename, none_ok=False)


def load_arguments(
    target: object,
    draft: object,
    n_ctx: object,
    n_threads: object,
    n_gpu_layers: object,
    n_gpu_layers_draft: object,
    progress: object,
) -> None:
    """``Engine.load``'s arguments that reach llama.cpp: checked before anything loads."""
    for name, model in (("target", target), ("draft", draft)):
        if not (isinstance(model, str | os.PathLike) or (name == "draft" and model is None)):
            raise LocalspecError(f"{name} must be a .gguf path or a catalog name (got {model!r})")
    integer("n_ctx", n_ctx, low=0)
    if 0 < n_ctx < MIN_CONTEXT:  # type: ignore[operator]
        raise LocalspecError(
            f"n_ctx={n_ctx} is too small a context: give at least {MIN_CONTEXT}, or 0 for "
            "the model's trained context length"
        )
    integer("n_threads", n_threads, low=1, none_ok=True)
    if n_threads is not None and n_threads > MAX_THREADS:  # type: ignore[operator]
        raise LocalspecError(f"n_threads must be at most {MAX_THREADS} (got {n_threads})")
    integer("n_gpu_layers", n_gpu_layers, low=-1, none_ok=True)
    integer("n_gpu_layers_draft", n_gpu_layers_draft, low=-1, none_ok=True)
    if progress is not None and not callable(progress):
        raise LocalspecError(f"progress must be a function(what, fraction) (got {progress!r})")


def mode_name(value: object) -> None:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise LocalspecError(f"mode must be a mode's name or None (got {value!r})")


def memory_cap(max_mb: object) -> None:
    """``spec_memory_mb``: a finite number of MB >= 0."""
    number = isinstance(max_mb, int | float) and not isinstance(max_mb, bool)
    if not number or not 0 <= max_mb < float("inf"):  # type: ignore[operator]
        raise LocalspecError(
            f"spec_memory_mb must be a finite number of MB >= 0 (got {max_mb!r})",
            "0 turns the memory off (--no-spec-memory on the command line)",
        )


def memory_path(value: object, max_mb: float) -> str | os.PathLike[str] | bool | None:
    """``spec_memory_path``: a file, True (the cache's file), or False/None (no file)."""
    if value is False:
        return None
    if not (value is None or value is True or isinstance(value, str | os.PathLike)):
        raise LocalspecError(
            f"spec_memory_path must be a file path, True or None (got {value!r})",
            "True: the localspec cache's file for this model",
        )
    if value is not None and max_mb == 0:
        raise LocalspecError(
            "spec_memory_path was given but spec_memory_mb=0 turns the memory off",
            "drop one of them",
        )
    return value
