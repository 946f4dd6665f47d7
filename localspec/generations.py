"""How a generation is put together: the drafter of its mode (one per drafting part, chained,
with the grammar's forced tokens first), the controller that sizes its drafts (kept per
mode and slot, so that measured costs carry over), and the loop that runs it on a slot's
sequences. ``Engine`` checks a request and reads its prompt (``GenerationJob``); this opens
it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from localspec.drafters.chain import ChainController, ChainedDrafter
from localspec.drafters.draft_model import DraftModelDrafter
from localspec.drafters.grammar_forced import ByteTokens, GrammarForcedDrafter
from localspec.drafters.mtp import MtpDrafter
from localspec.drafters.ngram import NgramDrafter, NgramParams
from localspec.drafters.self_draft import SelfDraftDrafter
from localspec.drafters.suffix import SuffixDrafter
from localspec.engine.adaptive import AdaptiveController, FixedLengthController
from localspec.engine.costs import ModelledTimes, VerifyCost
from localspec.engine.drafting import Drafter
from localspec.engine.fim import fim_order
from localspec.engine.grammar import Grammar, GrammarState
from localspec.engine.loop import DraftControl, SpecConfig, SpeculativeLoop
from localspec.engine.model_context import ModelContext
from localspec.engine.mtp import MtpContext
from localspec.engine.scheduler import SlotWork
from localspec.engine.settings import GenerationSettings
from localspec.engine.verify import SamplingParams
from localspec.memory_bank import DEFAULT_PARTITION, MemoryBank
from localspec.modes import LOOKUP_MODES, parse_mode

CHAIN_NEURAL_N_MAX = 16  # a neural drafter's cap inside a chain (the lookup's is size-m)


@dataclass(frozen=True)
class GenerationJob:
    """A checked request, its prompt read: what a generation is opened from."""

    settings: GenerationSettings
    sampling: SamplingParams
    mode: str
    spec: SpecConfig
    tokens: list[int]
    grammar: Grammar | None
    record_margins: bool
    healed: str = ""  # the prompt's end given back to the model to write (token healing)


class GenerationFactory:
    """Opens generations on the loaded models. ``verify_cost(n_max)``: the target's
    calibrated cost curve (measured on first use); ``modelled_times(spec)``: round costs
    from the frozen calibration, for reproducible schedules."""

    def __init__(
        self,
        target: ModelContext,
        draft: ModelContext | None,
        mtp: MtpContext | None,
        draft_kind: str | None,
        ngram: NgramParams,
        memories: MemoryBank,
        verify_cost: Callable[[int], VerifyCost],
        modelled_times: Callable[[SpecConfig], ModelledTimes],
    ) -> None:
        self.target, self.draft, self.mtp, self.draft_kind = target, draft, mtp, draft_kind
        self.ngram, self.memories = ngram, memories
        self.verify_cost, self.modelled_times = verify_cost, modelled_times
        self._controllers: dict[tuple[str, SpecConfig, int], AdaptiveController] = {}
        self._byte_tokens: ByteTokens | None = None

    def _controller(
        self, mode: str, spec: SpecConfig, times: ModelledTimes | None = None, slot: int = 0
    ) -> AdaptiveController | FixedLengthController | None:
        """One adaptive controller per (mode, settings), kept across generations: the costs
        it measured carry over to the next prompt (acceptance is learnt per answer). With
        modelled ``times``, a fresh one on the frozen calibration: nothing carried over."""
        if mode == "none" or not spec.adaptive:
            return None
        if mode == GrammarForcedDrafter.name:
            # what a grammar forces is the target's own choice but for a tokenization or a
            # whitespace guess, and costs nothing to draft: always drafted, never paused
            return FixedLengthController(spec.n_max)
        if times is not None:
            return AdaptiveController(spec.n_max, times.cost, spec.n_min)
        key = (mode, spec, slot)
        if key not in self._controllers:
            cost = self.verify_cost(spec.n_max)
            control = AdaptiveController(spec.n_max, cost, spec.n_min)
            self._start_from_calibration(control, mode, spec)
            self._controllers[key] = control
        return self._controllers[key]

    def _start_from_calibration(
        self, control: AdaptiveController, mode: str, spec: SpecConfig
    ) -> None:
        """A new controller of a drafter that pays for its tokens starts from the
        calibration's price of a draft token and of a catch-up, until it times its own: a
        scheduler deciding whether a new slot's first prompt read pays beside the other
        generations asks for them before any draft of that slot was made."""
        times = self.modelled_times(spec)
        step = times.draft(1, mode)
        if step > 0:
            control.note_draft_time(1, step)
        if mode == DraftModelDrafter.name:
            control.note_catch_up(times.catch_up(mode))

    def drafter(
        self,
        mode: str,
        sampling: SamplingParams,
        spec: SpecConfig,
        grammar: GrammarState | None = None,
        memory_partition: str = DEFAULT_PARTITION,
        target: ModelContext | None = None,
        draft: ModelContext | None = None,
    ) -> Drafter | None:
        """The mode's drafter; under a grammar, a chain whose first link drafts what the
        grammar forces (plain decoding, mode "none", stays plain). ``target``/``draft``:
        the sequences of a slot (default: the contexts' first)."""
        if mode == "none":
            return None
        parts = self._parts(mode, grammar)
        drafters = [
            self._single_drafter(
                part, sampling, spec, grammar, memory_partition, target or self.target, draft
            )
            for part in parts
        ]
        if len(drafters) == 1:
            return drafters[0]
        return ChainedDrafter(drafters, [self._part_spec(p, spec).n_max for p in parts])

    @staticmethod
    def _parts(mode: str, grammar: GrammarState | None) -> list[str]:
        parts = parse_mode(mode) if mode != "none" else []
        return [GrammarForcedDrafter.name, *parts] if grammar is not None and parts else parts

    @staticmethod
    def _part_spec(part: str, spec: SpecConfig) -> SpecConfig:
        """A chain member's settings: a neural drafter is capped at CHAIN_NEURAL_N_MAX."""
        if part in (*LOOKUP_MODES, GrammarForcedDrafter.name) or spec.n_max <= CHAIN_NEURAL_N_MAX:
            return spec
        return replace(spec, n_max=CHAIN_NEURAL_N_MAX, n_min=min(spec.n_min, CHAIN_NEURAL_N_MAX))

    def _single_drafter(
        self,
        mode: str,
        sampling: SamplingParams,
        spec: SpecConfig,
        grammar: GrammarState | None = None,
        memory_partition: str = DEFAULT_PARTITION,
        target: ModelContext | None = None,
        draft: ModelContext | None = None,
    ) -> Drafter:
        target = target or self.target
        draft = draft or self.draft
        if mode == SuffixDrafter.name:
            return SuffixDrafter(self.memories.partition(memory_partition))
        if mode == "ngram-simple":
            fim = fim_order(target)
            if grammar is not None:
                # structured answers copy values from the prompt, framed by the grammar's
                # punctuation: a one-token key is what a copy starts from there
                return NgramDrafter(replace(self.ngram, min_n=1), fim, target)
            return NgramDrafter(self.ngram, fim, target)
        if mode == GrammarForcedDrafter.name:
            assert grammar is not None
            if self._byte_tokens is None:
                self._byte_tokens = ByteTokens(target)
            return GrammarForcedDrafter(target, grammar, self._byte_tokens)
        assert mode == self.draft_kind
        if mode == "draft-mtp":
            assert self.mtp is not None
            return MtpDrafter(self.mtp, sampling, spec.p_min)
        assert draft is not None
        if mode == "draft-self":
            return SelfDraftDrafter(draft, sampling, spec.p_min)
        return DraftModelDrafter(draft, sampling, spec.p_min)

    def open(
        self, job: GenerationJob, target: ModelContext, draft: ModelContext | None
    ) -> SlotWork:
        """The generation's loop on ``target`` (a sequence of the target's context) with its
        drafter (on ``draft``, that sequence of the draft's context), and its clean-up."""
        s, spec = job.settings, job.spec
        state = job.grammar.start() if job.grammar is not None else None
        drafter = None
        loop: SpeculativeLoop | None = None

        def close() -> None:
            # everything written, whatever the mode (the prompt alone if the caller left
            # before the first token): the suffix drafter's evidence
            if s.remember:
                written = loop.output.tokens if loop is not None else []
                self.memories.remember([*job.tokens, *written], s.memory_partition)
            if drafter is not None:
                drafter.close()
            if state is not None:
                state.close()

        try:
            drafter = self.drafter(
                job.mode, job.sampling, spec, state, s.memory_partition, target, draft
            )
            # identical greedy or seeded requests: a schedule that depends on the tokens only
            reproducible = s.reproducible and drafter is not None and spec.adaptive
            times = self.modelled_times(spec) if reproducible else None
            if times is not None:
                _model_catch_ups(drafter, times)
            control = self._control(job.mode, spec, state, drafter, times, target.seq_id)
            if self.mtp is not None:
                self._follow_with_mtp("draft-mtp" in parse_mode(job.mode))
            loop = SpeculativeLoop(
                target,
                job.tokens,
                drafter,
                job.sampling,
                spec,
                s.max_tokens,
                s.stop,
                job.record_margins,
                control,
                s.logprobs,
                s.reproducible,
                state,
                times,
                job.healed,
            )
        except BaseException:
            close()
            raise
        return SlotWork(loop, close)

    def _control(
        self,
        mode: str,
        spec: SpecConfig,
        state: GrammarState | None,
        drafter: Drafter | None,
        times: ModelledTimes | None,
        slot: int = 0,
    ) -> DraftControl | None:
        """The draft-length control of a generation: one controller per drafter of a chain
        (kept per slot: each slot's generations run one after another)."""
        if isinstance(drafter, ChainedDrafter) and spec.adaptive:
            parts = [
                self._controller(p, self._part_spec(p, spec), times, slot)
                for p in self._parts(mode, state)
            ]
            return ChainController(drafter, [c for c in parts if c is not None])
        return self._controller(mode, spec, times, slot)

    def _follow_with_mtp(self, on: bool) -> None:
        """The MTP context mirrors the target only in draft-mtp generations (a plain one pays
        nothing); when switched on, the target re-decodes whatever was not mirrored."""
        assert self.mtp is not None
        self.mtp.active = on
        if on and self.mtp.synced < self.target.n_past:
            self.target.trim(self.mtp.synced)


def _model_catch_ups(drafter: Drafter | None, times: ModelledTimes) -> None:
    """A modelled schedule's draft models report the calibration's catch-up rate, not the
    clock's: whether the answer checks them again after a pause is part of the schedule."""
    links = drafter.drafters if isinstance(drafter, ChainedDrafter) else [drafter]
    for link in links:
        if isinstance(link, DraftModelDrafter):
            link.modelled_catch_up = link.catch_up_per_token = times.catch_up(link.name)
