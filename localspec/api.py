"""The Python API: ``Engine.load`` -> ``stream`` / ``generate`` -> ``close``.

    from localspec import Engine

    with Engine.load("qwen2.5-coder-0.5b", mode="ngram-simple") as engine:
        result = engine.generate("def fib(n):", max_tokens=64)
        print(result.text, result.stats.mean_acceptance_length)

Every consumer (``localspec run``, the TUI, the server, probe, bench) reads the same
``RoundEvent`` stream.
"""

from __future__ import annotations

import dataclasses
import math
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from localspec import api_checks as checks
from localspec.drafters.ngram import NgramParams
from localspec.drafters.suffix import SuffixDrafter
from localspec.engine.compute_thread import run_apart
from localspec.engine.costs import ModelledTimes, VerifyCost, one_token_seconds
from localspec.engine.fim import FimPrompt, fim_tokens, healed_fim_tokens
from localspec.engine.grammar import Grammar
from localspec.engine.loop import (
    RoundEvent,
    SpecConfig,
    TokenLogprob,
)
from localspec.engine.model_context import (
    FlashAttn,
    ModelContext,
)
from localspec.engine.mtp import MtpContext
from localspec.engine.penalties import NO_PENALTIES, Penalties
from localspec.engine.prompt_cache import DEFAULT_MAX_BYTES, PromptCache
from localspec.engine.prompting import Message, TokenPrompt, build_prompt
from localspec.engine.scheduler import DONE, BatchScheduler, SlotRequest, SlotWork
from localspec.engine.scoring import score_tokens
from localspec.engine.settings import GenerationSettings
from localspec.engine.spec_memory import SpecMemory
from localspec.engine.stats import Stats
from localspec.engine.turns import EngineTurns
from localspec.engine.verify import SamplingParams
from localspec.errors import LocalspecError
from localspec.generations import GenerationFactory, GenerationJob
from localspec.interrupts import interrupts_kept
from localspec.loading import close_models, load_models
from localspec.memory_bank import (
    DEFAULT_MEMORY_MB,
    MemoryBank,
)
from localspec.modes import LOOKUP_MODES, canonical, parse_mode

CHAIN_NEURAL_N_MAX = 16  # a neural drafter's cap inside a chain (the lookup's is size-m)
MTP_STEP_SHARE = 0.1  # an MTP head's step, as a share of a target step (modelled times)


@dataclass(frozen=True)
class GenerationResult:
    text: str
    tokens: list[int]
    from_draft: list[bool]
    finish_reason: str
    stats: Stats
    mode: str
    margins: list[float] = field(default_factory=list)
    runners_up: list[tuple[int, ...]] = field(default_factory=list)


DEFAULT_PROMPT_CACHE_MB = DEFAULT_MAX_BYTES / 2**20
# text, chat messages, or a middle to fill between a prefix and a suffix
Prompt = str | Sequence[Message] | FimPrompt | TokenPrompt


class Engine:
    """A loaded target (and draft) ready to generate. Free it with ``close()`` or ``with``."""

    def __init__(
        self,
        target: ModelContext,
        draft: ModelContext | None,
        mode: str,
        spec: SpecConfig,
        ngram: NgramParams,
        draft_kind: str | None = None,
        mtp: MtpContext | None = None,
        memories: MemoryBank | None = None,
        parallel: int = 1,
    ) -> None:
        self.target, self.draft, self.mode, self.mtp = target, draft, mode, mtp
        # generations answered together, in one batch per step (``engine/scheduler.py``)
        self.parallel = parallel
        self.prompt_cache_bytes = DEFAULT_MAX_BYTES  # read when the slots start
        self._slots: BatchScheduler | None = None
        # what drafts: "draft-model" (a second GGUF), "draft-self" (a layer subset of the
        # target) or "draft-mtp" (the target's NextN head, ``mtp``)
        self.draft_kind = draft_kind if draft is not None or mtp is not None else None
        self.spec, self.ngram = spec, ngram
        self._cost: VerifyCost | None = None
        self._draft_step: float | None = None
        # earlier prompts and answers, for the suffix drafter
        self.memories = memories if memories is not None else MemoryBank(DEFAULT_MEMORY_MB)
        self._generations = GenerationFactory(
            target,
            draft,
            mtp,
            self.draft_kind,
            ngram,
            self.memories,
            self.verify_cost,
            self.modelled_times,
        )
        self._turns = EngineTurns()  # one generation at a time, nothing after close

    @property
    def memory(self) -> SpecMemory:
        """The default partition of the suffix drafter's memory (see ``MemoryBank``)."""
        return self.memories.partition()

    def verify_cost(self, n_max: int | None = None, on: ModelContext | None = None) -> VerifyCost:
        """The target's batch-size cost curve, measured on first use (2-4 s on a 2-core CPU
        for a 0.5B model; the server does it before it answers: ``warm_up``). ``on``: the sequence
        to measure at the end of (a free slot's; default the first)."""
        size = (n_max or self.spec.n_max) + 1
        backend = on or self.target
        with self._turns.step():
            if self._cost is None or self._cost.sizes[-1] < size:
                if backend.n_past + size > backend.n_ctx:
                    backend.trim(0)
                self._cost = VerifyCost.measure(backend, size)
            return self._cost

    def warm_up(self) -> None:
        """Measure now what the first speculative generation would measure before its
        first token (the target's batch costs, a draft model's step): a server does it
        before it answers, so that its first client does not wait for it. It runs where
        the generations decode (the slots' thread), or on a thread of its own: the caller
        does not decode (``compute_thread.py``)."""
        if self.mode == "none":
            return
        if self.parallel > 1:
            self.scheduler().call([], lambda target, _draft: self._measure(target))
            return

        def measure(stop: threading.Event) -> None:
            with self._asking(stop.is_set):
                self._measure(self.target)

        run_apart(measure, "localspec-warm-up")

    def _measure(self, target: ModelContext) -> None:
        self.verify_cost(on=target)
        self.draft_step_seconds()

    def use_cost(self, cost: VerifyCost) -> None:
        """Adopt the cost curve another Engine measured on the same target and machine
        (probe loads one Engine per draft candidate: one calibration serves them all)."""
        self._cost = cost

    def draft_step_seconds(self) -> float | None:
        """One draft-model step (draft-model, draft-self), measured once; None for drafters
        without a model of their own (lookups, MTP heads)."""
        if self.draft is None:
            return None
        with self._turns.step():
            if self._draft_step is None:
                self._draft_step = one_token_seconds(self.draft)
            return self._draft_step

    @classmethod
    @interrupts_kept()  # a script's Ctrl-C during the load stops it (see interrupts.py)
    def load(
        cls,
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
        prompt_cache_mb: float = DEFAULT_PROMPT_CACHE_MB,
    ) -> Engine:
        """Resolve and load the models. ``target``/``draft``: a .gguf path or catalog name.
        ``progress(what, fraction)`` reports loading ("target" or "draft", 0..1).
        ``flash_attn``: "on", "off", or "auto" (off on the CPU, where it slows verify
        batches; llama.cpp's choice on a GPU).
        ``self_layers``/``self_quant``: the layers ``draft-self`` keeps and its weight type
        (``--spec-self-layers``, ``--spec-self-quant``). ``spec_memory_mb``: the cap of the
        suffix drafter's memory of earlier generations (0: none); ``spec_memory_path``: a
        file that keeps it across runs (``--spec-memory``; True: the cache's file for this
        target). ``parallel``: how many generations run at once, verified in one batch
        per step (``stream`` from several threads, or ``generate_many``); each has a
        context of ``n_ctx`` tokens. ``prompt_cache_mb``: with parallel slots, the host
        memory that keeps prompts' caches once their slot moved on (0: none)."""
        if not prompt_cache_mb >= 0:
            raise LocalspecError(
                f"prompt_cache_mb={prompt_cache_mb!r} is not a size in MiB",
                "give 0 (no prompt cache) or more",
            )
        models = load_models(
            target,
            draft,
            mode,
            n_ctx=n_ctx,
            n_threads=n_threads,
            n_gpu_layers=n_gpu_layers,
            n_gpu_layers_draft=n_gpu_layers_draft,
            flash_attn=flash_attn,
            spec=spec,
            ngram=ngram,
            progress=progress,
            self_layers=self_layers,
            self_quant=self_quant,
            spec_memory_mb=spec_memory_mb,
            spec_memory_path=spec_memory_path,
            parallel=parallel,
        )
        engine = cls(**vars(models))
        engine.prompt_cache_bytes = int(prompt_cache_mb * 2**20)
        return engine

    def close(self) -> None:
        """Free the models (once a running step is over); every later call is refused."""
        if self._slots is not None:
            self._slots.close()
        if not self._turns.close():
            return
        self.memories.close()
        close_models(self.target, self.draft, self.mtp)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def target_path(self) -> Path:
        return self.target.path

    def tokenize_prompt(
        self,
        prompt: Prompt,
        chat: bool = False,
        system: str | None = None,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> list[int]:
        # the vocabulary is only read: no need to wait for a running round (the server
        # tokenizes a new request on its event loop while another is being answered)
        return self._prompt_tokens(prompt, chat, system, tools)[0]

    def _prompt_tokens(
        self,
        prompt: Prompt,
        chat: bool,
        system: str | None,
        tools: Sequence[dict[str, Any]] | None,
        heal: bool = True,
    ) -> tuple[list[int], str]:
        """The prompt's tokens as they are read, and the text of its end given back to the
        model to write again (a fill-in-the-middle prompt's last typed token: token
        healing; "" for any other prompt, or with ``heal`` False: a request's grammar
        decides alone what its first tokens may be)."""
        self._turns.refuse_if_closed()
        if isinstance(prompt, FimPrompt) and heal:
            return healed_fim_tokens(self.target, prompt, self.target_path.name)
        if isinstance(prompt, FimPrompt):
            return fim_tokens(self.target, prompt, self.target_path.name), ""
        if isinstance(prompt, TokenPrompt):
            return prompt.checked(self.target.n_vocab), ""
        chat = chat or not isinstance(prompt, str) or system is not None  # a system: a chat
        return build_prompt(self.target, prompt, chat, system, tools), ""

    def modelled_times(self, spec: SpecConfig) -> ModelledTimes:
        """Round costs from the calibration (see ``ModelledTimes``): lookups draft for
        free, a draft model or a layer subset at its measured step, an MTP head at a tenth
        of a target step (one layer of a few dozen, plus its output)."""
        cost = self.verify_cost(spec.n_max).frozen()
        neural = self.draft_step_seconds()
        if self.draft_kind == "draft-mtp":
            neural = MTP_STEP_SHARE * float(cost(np.array([1]))[0])
        steps = {self.draft_kind: neural} if self.draft_kind and neural else {}
        return ModelledTimes(cost, steps)

    def available_modes(self) -> list[str]:
        """The modes ``stream(mode=...)`` accepts with what is loaded (any other chain of
        these parts too: see ``mode_available``)."""
        modes = ["none", "ngram-simple"]
        if self.memories.enabled:
            modes += ["suffix", "suffix+ngram-simple"]
        if self.draft_kind is not None:
            modes += [self.draft_kind, f"ngram-simple+{self.draft_kind}"]
            if self.memories.enabled:
                modes += [f"suffix+{self.draft_kind}"]
        return modes

    def mode_available(self, mode: str) -> bool:
        """Whether every drafter of ``mode`` can run with what is loaded (the suffix
        drafter: unless the memory is off)."""
        usable = [*LOOKUP_MODES, "none", self.draft_kind]
        if not self.memories.enabled:
            usable.remove(SuffixDrafter.name)
        return all(p in usable for p in parse_mode(mode))

    def stream(
        self,
        prompt: Prompt,
        settings: GenerationSettings | None = None,
        *,
        chat: bool = False,
        system: str | None = None,
        record_margins: bool = False,
        cancelled: Callable[[], bool] | None = None,
        **changes: Any,
    ) -> Iterator[RoundEvent]:
        """Generate, yielding one ``RoundEvent`` per round. ``settings`` (or keyword
        ``changes`` to them: ``max_tokens=32, temperature=0.7``...) are one
        ``GenerationSettings``. ``mode`` may switch to "none" (or to any mode the loaded
        models allow) for this call only. ``logprobs``: each token's log-probability under
        the target, with that many alternatives. ``reproducible``: the prompt is evaluated
        as in a fresh context, and the draft lengths are chosen from modelled round costs
        (``ModelledTimes``) by a fresh controller, so that identical requests batch
        identically and get identical output (see ``ModelContext.evaluate``); a sampled
        request with a seed of its own is always reproducible. ``grammar``: GBNF
        text the output must follow (``schema_grammar`` makes it from a JSON schema); the
        target's distribution is masked by it, and what it forces is drafted for free.
        ``tools``: OpenAI-style function tools shown to the model through its chat template
        (``toolcalls`` reads the calls back from the text). ``system``: a system message (a
        text prompt then goes through the chat template too). ``stop``: a string or a list
        of them. ``record_margins``: the top-2 logit gap (when sampling, the draw's margin)
        at each token, for tie-aware comparisons. ``cancelled``: asked from the generating
        thread between the chunks of a long prompt (which can take seconds to read) and
        between the sizes of the first verify-cost measurement; when it returns True,
        ``GenerationCancelled`` is raised (to end a stream between rounds, close it).
        ``chat=True``: a text prompt goes through the chat template (messages always do).
        A wrong type or value of any of these is a ``LocalspecError`` naming it, raised
        before any work (``api_checks``)."""
        checks.prompt(prompt)
        checks.text("system", system)
        checks.flag("chat", chat)
        checks.flag("record_margins", record_margins)
        checks.optional_callable("cancelled", cancelled)
        base = checks.settings(settings) if settings is not None else GenerationSettings()
        checks.setting_names(changes)
        s = checks.settings(base.but(**changes))
        if self.parallel > 1:
            yield from self._slot_stream(prompt, s, chat, system, record_margins, cancelled)
            return
        generation = self._stream(prompt, s, chat, system, record_margins)
        yield from self._turns.run(self._cancellable(generation, cancelled))

    def _slot_stream(
        self,
        prompt: Prompt,
        s: GenerationSettings,
        chat: bool,
        system: str | None,
        record_margins: bool,
        cancelled: Callable[[], bool] | None,
    ) -> Iterator[RoundEvent]:
        """A generation in one of the parallel slots: prepared here, run by the scheduler's
        thread together with the others, its events read from its queue."""
        self._turns.refuse_if_closed()
        job = self._prepare(prompt, s, chat, system, record_margins)

        def start(target: ModelContext, draft: ModelContext | None) -> SlotWork:
            if job.mode != "none":  # calibrated on the free slot, before any controller
                self.verify_cost(job.spec.n_max, on=target)
            return self._generations.open(job, target, draft)

        request = SlotRequest(job.tokens, start, cancelled, job.settings.reproducible)
        self.scheduler().submit(request)
        try:
            while (item := request.events.get()) is not DONE:
                if isinstance(item, BaseException):
                    raise item
                assert isinstance(item, RoundEvent)
                yield item
        finally:
            request.cancel()

    def scheduler(self) -> BatchScheduler:
        """The parallel slots' scheduler (``parallel`` > 1), started on first use."""
        with self._turns.step():
            if self._slots is None:
                cache = PromptCache(self.prompt_cache_bytes) if self.prompt_cache_bytes else None
                self._slots = BatchScheduler(
                    self.target, self.draft, self.parallel, lambda: self._cost, cache
                )
            return self._slots

    def generate_many(
        self,
        prompts: Sequence[Prompt],
        settings: GenerationSettings | None = None,
        **kwargs: Any,
    ) -> list[GenerationResult]:
        """``generate`` for each prompt, as many at once as the engine has slots
        (``parallel``), the results in the prompts' order. The first failure is raised
        once every generation has ended."""
        if isinstance(prompts, str):
            raise LocalspecError(
                "generate_many takes a list of prompts (got one string)",
                "wrap it in a list, or call generate",
            )
        results: list[GenerationResult | BaseException | None] = [None] * len(prompts)

        def one(i: int) -> None:
            try:
                results[i] = self.generate(prompts[i], settings, **kwargs)
            except BaseException as exc:  # raised below, in the caller's thread
                results[i] = exc

        if self.parallel > 1:
            with ThreadPoolExecutor(self.parallel, "localspec-client") as pool:
                list(pool.map(one, range(len(prompts))))
        else:  # one at a time, here: a second thread would decode beside this one's team
            for i, prompt in enumerate(prompts):
                try:
                    results[i] = self.generate(prompt, settings, **kwargs)
                except Exception as exc:  # Ctrl-C stops the batch at once
                    results[i] = exc
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return [r for r in results if isinstance(r, GenerationResult)]

    def _cancellable(
        self, generation: Iterator[RoundEvent], cancelled: Callable[[], bool] | None
    ) -> Iterator[RoundEvent]:
        """``generation``, with ``cancelled`` asked while any model reads a long input."""
        with self._asking(cancelled):
            yield from generation

    @contextmanager
    def _asking(self, cancelled: Callable[[], bool] | None) -> Iterator[None]:
        """Every model asks ``cancelled`` between the chunks of a long input meanwhile."""
        contexts = [c for c in (self.target, self.draft) if c is not None]
        for context in contexts:
            context.cancelled = cancelled
        try:
            yield
        finally:
            for context in contexts:
                context.cancelled = None

    def _stream(
        self,
        prompt: Prompt,
        s: GenerationSettings,
        chat: bool,
        system: str | None,
        record_margins: bool,
    ) -> Iterator[RoundEvent]:
        job = self._prepare(prompt, s, chat, system, record_margins)
        work = self._generations.open(job, self.target, self.draft)
        try:
            yield from work.loop.rounds()
        finally:
            work.close()

    def _prepare(
        self,
        prompt: Prompt,
        s: GenerationSettings,
        chat: bool,
        system: str | None,
        record_margins: bool,
    ) -> GenerationJob:
        """Check a request's settings and read its prompt (before it takes any turn)."""
        sampling = validate_sampling(s.temperature, s.top_k, s.top_p, s.min_p, s.seed, s.penalties)
        bias = s.bias(self.target.eog_tokens() if s.ignore_eos else ())
        bias.validate(self.target.n_vocab)
        sampling = dataclasses.replace(sampling, logit_bias=bias)
        if s.seeded:
            s = s.but(reproducible=True)  # what an earlier request left cached must not tip a draw
        if s.max_tokens is not None and s.max_tokens <= 0:
            raise LocalspecError(f"max_tokens must be > 0 (got {s.max_tokens})")
        if not isinstance(s.memory_partition, str):
            raise LocalspecError(
                f"memory_partition is a name (got {s.memory_partition!r})",
                "give a string, e.g. one per user",
            )
        mode = self.mode if s.mode is None else canonical(s.mode)
        if not self.mode_available(mode):
            raise LocalspecError(
                f"mode '{mode}' is not available with the loaded models",
                f"use one of: {', '.join(self.available_modes())}",
            )
        spec = s.spec or self.spec
        spec.validate()
        tokens, healed = self._prompt_tokens(prompt, chat, system, s.tools, s.grammar is None)
        grammar = Grammar(self.target, s.grammar) if s.grammar is not None else None
        return GenerationJob(s, sampling, mode, spec, tokens, grammar, record_margins, healed)

    def score(self, text: str | TokenPrompt, top: int = 0) -> list[tuple[int, TokenLogprob | None]]:
        """Each token of ``text`` (tokenized as a raw prompt, without the BOS token the
        tokenizer may add; a ``TokenPrompt``'s ids as they are) with its log-probability
        under the target given the text before it, and the ``top`` most likely tokens there
        (None for the first token of the model's input). What a completions request with
        ``echo`` and ``logprobs`` returns for its prompt, and what evaluation harnesses use
        to score a continuation."""
        checks.integer("top", top, low=0)
        if isinstance(text, TokenPrompt):
            tokens, skip = text.checked(self.target.n_vocab), 0
        else:
            checks.text("text", text, none_ok=False)
            if not text:
                raise LocalspecError("the text to score is empty", "give some text")
            tokens = self.tokenize_prompt(text)
            bare = len(self.target.tokenize(text, add_special=False, parse_special=True))
            skip = len(tokens) - bare
        if self.parallel > 1:  # in a free slot, on the scheduler's thread
            return self.scheduler().call(
                tokens, lambda target, _draft: next(self._score(tokens, top, skip, target))
            )
        [scored] = self._turns.run(self._score(tokens, top, skip, self.target))
        return scored

    def _score(
        self, tokens: list[int], top: int, skip: int, target: ModelContext
    ) -> Iterator[list[tuple[int, TokenLogprob | None]]]:
        scores = score_tokens(target, tokens, top)
        yield list(zip(tokens, scores, strict=True))[skip:]

    def generate(
        self,
        prompt: Prompt,
        settings: GenerationSettings | None = None,
        **kwargs: Any,
    ) -> GenerationResult:
        """Run ``stream`` to the end and gather the result."""
        text, tokens, from_draft, margins, runners_up = [], [], [], [], []
        event = None
        for event in self.stream(prompt, settings, **kwargs):
            text.append(event.text)
            tokens.extend(event.tokens)
            from_draft.extend(event.from_draft)
            margins.extend(event.margins)
            runners_up.extend(event.runners_up)
        assert event is not None
        mode = str(kwargs.get("mode") or (settings and settings.mode) or self.mode)
        return GenerationResult(
            "".join(text),
            tokens,
            from_draft,
            event.finish_reason or "stop",
            event.stats,
            mode,
            margins,
            runners_up,
        )


RANDOM_SEED = -1  # llama.cpp's convention: -1 asks for a random seed
MAX_SEED = (1 << 64) - 1


def validate_sampling(
    temperature: float,
    top_k: int,
    top_p: float,
    min_p: float,
    seed: int | None,
    penalties: Penalties = NO_PENALTIES,
) -> SamplingParams:
    """Check the sampling settings (nan and inf included: every comparison with nan is
    false) and turn seed -1 into a random seed."""
    penalties.validate()
    if not math.isfinite(temperature) or temperature < 0:
        raise LocalspecError(
            f"temperature must be a number >= 0 (got {temperature})", "0 means greedy"
        )
    if top_k < 0:
        raise LocalspecError(f"top_k must be >= 0 (got {top_k})", "0 turns it off")
    if not 0.0 < top_p <= 1.0:
        raise LocalspecError(f"top_p must be within (0, 1] (got {top_p})", "1 turns it off")
    if not 0.0 <= min_p <= 1.0:
        raise LocalspecError(f"min_p must be within [0, 1] (got {min_p})", "0 turns it off")
    if seed is not None and not RANDOM_SEED <= seed <= MAX_SEED:
        raise LocalspecError(
            f"seed must be between 0 and 2^64-1, or -1 for a random seed (got {seed})"
        )
    return SamplingParams(
        temperature, top_k, top_p, min_p, None if seed == RANDOM_SEED else seed, penalties
    )
