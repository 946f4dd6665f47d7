"""The speculative loop: draft -> one batched target pass -> accept -> roll back -> repeat.

Invariant between rounds: the target's KV cache holds the context except its last token
(``last``), which was chosen by the target but not yet evaluated. A round evaluates
``[last] + draft`` in one batch with logits for every position, accepts a prefix of the
draft plus one target token, and trims the cache back to the accepted part. With no draft
the round is exactly plain decoding, which is also how ``--mode none`` runs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from localspec.engine.adaptive import FixedLengthController, ShadowCheck
from localspec.engine.costs import ModelledTimes
from localspec.engine.drafting import Draft, Drafter, Steps, decode_directly, is_stepped
from localspec.engine.grammar import ConstrainedRows, GrammarState
from localspec.engine.healing import HealedStart
from localspec.engine.logit_bias import BiasedRows
from localspec.engine.model_context import ContextOptions, ModelContext
from localspec.engine.output import OutputAssembler
from localspec.engine.penalties import PenalizedRows
from localspec.engine.shadow import ShadowRounds
from localspec.engine.stats import Stats, StatsRecorder
from localspec.engine.verify import (
    SamplingParams,
    TokenDraws,
    accept_greedy,
    accept_sampling,
    acceptance_odds,
    draw_margin,
    probabilities,
    sample_row,
    token_logprobs,
)
from localspec.errors import LocalspecError
from localspec.lossless import ANY_TOKEN, NEAR_TIE_GAP
from localspec.modes import LOOKUP_MODES

# a token's log-probability, and the most likely tokens with theirs
TokenLogprob = tuple[float, tuple[tuple[int, float], ...]]


NEURAL_N_MAX = 16  # llama.cpp's --spec-draft-n-max default


def default_n_max(mode: str, lookup_size_m: int) -> int:
    """The most tokens a round drafts unless told: a mode that starts with a lookup drafts up
    to the lookup's ``size_m`` (a copy costs nothing to draft, and the controller verifies
    only what pays), a neural one llama.cpp's 16."""
    return lookup_size_m if mode.startswith(LOOKUP_MODES) else NEURAL_N_MAX


@dataclass(frozen=True)
class SpecConfig:
    """Speculation settings shared by every drafter (llama.cpp's --spec-draft-* flags)."""

    n_max: int = NEURAL_N_MAX
    n_min: int = 0
    p_min: float = 0.0
    adaptive: bool = True

    def validate(self, max_batch: int = ContextOptions.n_batch) -> None:
        """``max_batch``: the target's batch size; a draft is verified in one batch together
        with the last accepted token, so it holds at most ``max_batch - 1`` tokens."""
        if self.n_max < 1:
            raise LocalspecError(f"n_max (--spec-draft-n-max) must be >= 1 (got {self.n_max})")
        if self.n_max >= max_batch:
            raise LocalspecError(
                f"n_max (--spec-draft-n-max) {self.n_max} is more than one verification batch "
                f"holds: at most {max_batch - 1} drafted tokens (a batch of {max_batch} tokens, "
                "one of them the last accepted token)",
                f"use {max_batch - 1} or less (16-48 is usual)",
            )
        if not 0 <= self.n_min <= self.n_max:
            raise LocalspecError(
                f"n_min (--spec-draft-n-min, {self.n_min}) must be between 0 and n_max "
                f"({self.n_max})",
                "lower n-min or raise n-max",
            )
        if not 0.0 <= self.p_min <= 1.0:
            raise LocalspecError(
                f"p_min (--spec-draft-p-min) must be within [0, 1] (got {self.p_min})"
            )


class DraftControl(Protocol):
    """Chooses each round's draft length from what it observes (``AdaptiveController``, or
    ``ChainController`` with one controller per drafter of a chain)."""

    draft_length: int
    paused: bool
    pauses: int
    shadow_checks: int

    sits_out: bool  # this answer goes without the drafter (it cost the answers before)
    probing: bool  # the opening verifies one-token drafts instead of checking guesses

    def start(self) -> None: ...
    def note_catch_up(self, seconds_per_token: float | None) -> None: ...
    def note_prompt_read(self, seconds: float) -> None: ...
    def catch_up_pays(
        self, behind: int, left: int | None, saved_per_token: float | None = None
    ) -> bool: ...
    def proposal_length(self) -> int: ...
    def fit(self, draft: Draft) -> int: ...
    def shadow_length(self) -> int: ...
    def observe_shadow(self, check: ShadowCheck) -> None: ...
    def observe(
        self,
        n_drafted: int,
        n_accepted: int,
        draft_s: float,
        verify_s: float,
        odds: Sequence[float] | None = None,
        beyond: float | None = None,
    ) -> None: ...
    def verification_odds(self, draft: Draft) -> np.ndarray | None: ...
    def paid_draft(self) -> tuple[np.ndarray, float] | None: ...
    def note_draft_time(self, n_drafted: int, seconds: float) -> None: ...


@dataclass(frozen=True)
class RoundPlan:
    """A round before verification: the draft (possibly empty), a paused drafter's shadow
    guess, the cache length before it, what drafting took, and how many tokens it drafted
    (more than ``draft`` holds once a shared step's budget cut it)."""

    draft: Draft
    shadow: tuple[Draft, int] | None
    n_past: int
    draft_s: float
    last: int  # the token chosen last round, evaluated first in this one
    made: int = 0

    @property
    def batch(self) -> list[int]:
        return [self.last, *self.draft.tokens]


@dataclass(frozen=True)
class RoundEvent:
    """What one round produced. ``from_draft[i]`` says whether ``tokens[i]`` was a drafted
    token the target accepted. ``margins`` (only when asked for) is the target's top-2 logit
    gap at each emitted token and ``runners_up`` the other tokens whose logits lie within
    ``NEAR_TIE_GAP`` of the best, nearest first, for tie-aware comparisons; when sampling,
    the draw's margin (``verify.draw_margin``) and ``(ANY_TOKEN,)``."""

    text: str
    tokens: tuple[int, ...]
    from_draft: tuple[bool, ...]
    stats: Stats
    finish_reason: str | None = None
    stop_word: str | None = None  # with finish_reason "stop": the stop string that ended it
    margins: tuple[float, ...] = ()
    runners_up: tuple[tuple[int, ...], ...] = ()
    # only when asked for: each token's log-probability and the most likely alternatives
    logprobs: tuple[TokenLogprob, ...] = ()
    drafted_by: str = ""  # the drafter whose tokens ``from_draft`` marks (a chain's member)


def near_ties(row: np.ndarray) -> tuple[float, tuple[int, ...]]:
    """The gap between the two best logits, and the tokens other than the best whose logits
    lie within ``NEAR_TIE_GAP`` of it, nearest first: with three logits that close, a
    rounding can put any of them first. Linear passes only: a partition of the vocabulary
    costs ~1 ms, which would slow the plain baseline."""
    best = int(row.argmax())
    top = row[best]
    close = [int(t) for t in np.flatnonzero(row >= top - NEAR_TIE_GAP) if t != best]
    if close:
        close.sort(key=lambda t: -row[t])
        return float(top - row[close[0]]), tuple(close)
    rest = row.copy()
    rest[best] = -np.inf
    return float(top - rest.max()), ()


class SpeculativeLoop:
    """One generation. Iterate ``steps()``; closing the iterator early (cancellation) leaves
    the target's cache consistent for the next generation."""

    def __init__(
        self,
        target: ModelContext,
        prompt: Sequence[int],
        drafter: Drafter | None,
        sampling: SamplingParams,
        spec: SpecConfig,
        max_tokens: int | None,
        stop: Sequence[str] = (),
        record_margins: bool = False,
        control: DraftControl | None = None,
        logprobs: int | None = None,
        reproducible: bool = False,
        grammar: GrammarState | None = None,
        times: ModelledTimes | None = None,
        healed: str = "",
    ) -> None:
        """``logprobs``: report each emitted token's log-probability and that many of the
        most likely alternatives (None: none). ``reproducible``: evaluate the prompt as a
        fresh context would, whatever the cache held (see ``ModelContext.evaluate``).
        ``grammar``: the state of a grammar the output must follow (see grammar.py); the
        loop advances it by every emitted token. ``times``: what the controller is told rounds
        cost, instead of what they took (a schedule that does not depend on timing).
        ``healed``: the prompt's end taken off for the model to write again (token healing,
        ``healing.py``): its first tokens must write it, and it is not emitted again."""
        if len(prompt) >= target.n_ctx:
            raise LocalspecError(
                f"the prompt has {len(prompt)} tokens but the context holds {target.n_ctx}",
                "shorten the prompt or raise the context size (-c / --ctx-size)",
            )
        if not prompt:
            raise LocalspecError("the prompt is empty", "give some text to continue")
        self.target = target
        self.prompt = list(prompt)
        self.drafter = drafter
        self.sampling = sampling
        self.spec = spec
        self.max_tokens = max_tokens
        self.record_margins = record_margins
        self.logprobs = logprobs
        self.reproducible = reproducible
        self.grammar: GrammarState | HealedStart | None = grammar
        if healed and grammar is None:  # a grammar's own rule decides where one applies
            self.grammar = HealedStart(target.piece_index(), healed.encode())
        self.times = times
        self.draws = TokenDraws(sampling.seed)
        given = healed if self.grammar is not grammar else ""
        self.output = OutputAssembler(target.piece, target.is_eog, stop, max_tokens, given)
        self.control: DraftControl = control or FixedLengthController(spec.n_max)
        self.control.start()
        if drafter is not None:
            self._note_modelled_costs(drafter, times)
        self.shadows = ShadowRounds(drafter, self.control) if drafter is not None else None
        self.recorder = StatsRecorder(n_prompt=len(prompt))
        self.last = -1  # the token chosen but not yet evaluated (set by ``first``)
        self.context: list[int] = []  # prompt and output so far (set by ``first``)
        # set by a scheduler whose load leaves no room for this drafter's paid drafts: it
        # then reads no prompt and makes no checks until the load lets it draft again (as
        # for an answer its controller sits out: ``sits_out``)
        self.drafter_rests = False
        self._drafter_begun = False

    def _note_modelled_costs(self, drafter: Drafter, times: ModelledTimes | None) -> None:
        """A modelled schedule knows what its draft model's tokens and catch-up cost before
        it drafts or reads anything: a scheduler deciding whether that first read pays beside
        other generations asks for them (``catch_up_pays``, ``paid_draft``)."""
        self.control.note_catch_up(drafter.catch_up_per_token)
        draft_step = times.draft(1, drafter.name) if times is not None else 0.0
        if draft_step > 0:
            self.control.note_draft_time(1, draft_step)

    def _snapshot(self) -> Stats:
        c = self.control
        draft_length = c.draft_length if self.drafter is not None else 0
        return self.recorder.snapshot(draft_length, c.paused, c.pauses, c.shadow_checks)

    def _event(
        self,
        tokens: list[int],
        from_draft: list[bool],
        tops: list[tuple[float, tuple[int, ...]]],
        logprobs: list[TokenLogprob] | None = None,
        drafted_by: str = "",
    ) -> RoundEvent:
        self.recorder.n_tokens = len(self.output.tokens)
        return RoundEvent(
            text=self.output.take_text(),
            tokens=tuple(tokens),
            from_draft=tuple(from_draft),
            stats=self._snapshot(),
            finish_reason=self.output.finish_reason,
            stop_word=self.output.stop_word,
            margins=tuple(gap for gap, _ in tops),
            runners_up=tuple(close for _, close in tops),
            logprobs=tuple(logprobs or ())[: len(tokens)],
            drafted_by=drafted_by if any(from_draft) else "",
        )

    def _logprobs(self, rows: np.ndarray, tokens: Sequence[int]) -> list[TokenLogprob]:
        """Row i of a verified batch is the target's distribution for token i."""
        if self.logprobs is None:
            return []
        return [token_logprobs(rows[i], t, self.logprobs) for i, t in enumerate(tokens)]

    def _choose(self, row: np.ndarray) -> int:
        if self.sampling.greedy:
            return int(row.argmax())
        return sample_row(row, self.sampling, self.draws.uniform(len(self.output.tokens)))[0]

    def _tie(self, row: np.ndarray, position: int) -> tuple[float, tuple[int, ...]]:
        """How near the token emitted at ``position`` came to others (tie-aware checks)."""
        if self.sampling.greedy:
            return near_ties(row)
        margin, _ = draw_margin(probabilities(row, self.sampling), self.draws.uniform(position))
        return margin, (ANY_TOKEN,)  # a rounding can tip a draw onto a token far away

    def _constrained(self, rows: np.ndarray, draft: Sequence[int]) -> Sequence[np.ndarray]:
        """The rows as the acceptance rules must see them: biased, penalized for repetition
        and masked by the grammar, if asked (row i after the context and ``draft[:i]``)."""
        if self.sampling.logit_bias.active:
            rows = BiasedRows(rows, self.sampling.logit_bias)  # type: ignore[assignment]
        penalties = self.sampling.penalties
        if penalties.active:
            seen = self.context or self.prompt  # before ``first``: the prompt alone
            rows = PenalizedRows(rows, seen, draft, penalties)  # type: ignore[assignment]
        if self.grammar is None:
            return rows
        temperature = None if self.sampling.greedy else self.sampling.temperature
        near = NEAR_TIE_GAP if self.record_margins else 0.0
        eog = self.target.eog_tokens() if self.sampling.logit_bias.active else ()
        return ConstrainedRows(rows, draft, self.grammar, temperature, near, eog)

    def _follow_grammar(self, tokens: Sequence[int]) -> None:
        if self.grammar is None:
            return
        for token in tokens:
            if self.target.is_eog(token):
                break
            if not self.grammar.allows(token):  # llama.cpp would abort the process
                raise LocalspecError(
                    "the answer wrote a token its grammar refuses: a logit bias that bans "
                    "every token the grammar allows there?",
                    "bias the grammar's tokens less, or drop the grammar",
                )
            self.grammar.accept(token)

    def rounds(self) -> Iterator[RoundEvent]:
        row = self.target.evaluate(self.prompt, self.reproducible)
        self.recorder.n_cached = self.target.reused
        yield self.first(row)
        while not self.output.done:
            if self.context_full():
                yield self.end_at_length()
                return
            plan = self.plan()
            t_verify = time.perf_counter()
            yield self.finish(plan, self.target.decode(plan.batch, all_logits=True), t_verify)

    def first(self, raw: np.ndarray) -> RoundEvent:
        """The first token, from the logits row after the prompt (which the target's cache
        now holds): the drafter starts from the prompt."""
        if self.drafter is not None and not self._drafter_idle():
            self._begin_drafter()
        self.recorder.t_prefilled = time.perf_counter()
        row = self._constrained(raw[None, :], ())[0]
        last = self._choose(row)
        self._follow_grammar([last])
        margins = [self._tie(row, 0)] if self.record_margins else []
        logprobs = self._logprobs(raw[None, :], [last])
        emitted = self.output.push(last)
        self.recorder.t_first = time.perf_counter()
        self.last, self.context = last, [*self.prompt, last]
        return self._event([last] if emitted else [], [False] if emitted else [], margins, logprobs)

    def _begin_drafter(self) -> None:
        """The drafter reads the prompt (after ``first``, when it wakes from a rest: what it
        did not follow of the answer it catches up when it drafts)."""
        assert self.drafter is not None
        t0 = time.perf_counter()
        self.drafter.begin(self.prompt)
        self._drafter_begun = True
        self.control.note_catch_up(self.drafter.catch_up_per_token)  # modelled or measured
        if self.times is None:  # a fresh controller per modelled schedule: no ledger to keep
            self.control.note_prompt_read(time.perf_counter() - t0)

    @property
    def drafter_begun(self) -> bool:
        """The drafter has read this answer's prompt."""
        return self._drafter_begun

    def drafter_behind(self) -> int:
        """Tokens of the context the drafter would have to catch up with before drafting:
        what its own cache lacks (before it read the prompt, of the prompt and what followed:
        a draft model keeps what an earlier answer left, the turns before in a chat); all
        of them for a drafter that cannot tell."""
        whole = max(len(self.context), len(self.prompt))
        if not is_stepped(self.drafter):
            return 0 if self._drafter_begun else whole
        if not self._drafter_begun:  # ``begin`` decodes the prompt's last token at least
            return whole - min(self.drafter.held(self.prompt), len(self.prompt) - 1)
        return len(self.context) - self.drafter.held(self.context)

    def tokens_left(self) -> int | None:
        """Tokens this answer may still write (None: up to the context's end)."""
        if self.max_tokens is None:
            return None
        return max(0, self.max_tokens - len(self.output.tokens))

    def _drafter_idle(self) -> bool:
        """The drafter neither reads nor guesses now: the load leaves its drafts no room,
        or its controller sits this answer out."""
        return self.drafter_rests or self.control.sits_out

    def context_full(self) -> bool:
        return self.target.n_past + 1 > self.target.n_ctx

    def end_at_length(self) -> RoundEvent:
        self.output.finish("length")
        return self._event([], [], [])

    def plan(self, cap: int | None = None) -> RoundPlan:
        """This round's draft (or a shadow check's guess): what the target verifies next,
        ``[last] + draft``, in one batch (``finish`` then accepts from its logits). ``cap``:
        the most a shared step lets it draft (sized before drafting: ``draft_length``)."""
        return decode_directly(self.plan_steps(cap))

    def plan_steps(self, cap: int | None = None) -> Steps[RoundPlan]:
        """``plan``, yielding the draft model's decodes (``SteppedDrafter``) instead of
        running them; ``draft_s`` is then the wall time of the whole, which a caller that
        shares the decodes with other generations replaces by this one's share."""
        t0 = time.perf_counter()
        draft, shadow = yield from self._draft(self.context, cap)
        draft_s = time.perf_counter() - t0
        return RoundPlan(draft, shadow, self.target.n_past, draft_s, self.last, len(draft))

    def cut(self, plan: RoundPlan, length: int) -> RoundPlan:
        """The plan with its draft cut to ``length`` tokens (a shared step's draft budget)."""
        if length >= len(plan.draft):
            return plan
        if not length and self.control.probing and self.shadows is not None:
            # an opening probe the step has no room for: its token, made, is checked instead
            return replace(plan, draft=Draft(), shadow=(plan.draft.truncated(1), 0), made=0)
        return replace(plan, draft=plan.draft.truncated(length) if length else Draft())

    def draft_length(self) -> int:
        """How many tokens the drafter is asked for (the controller's ``fit`` then says how
        many of them are verified)."""
        if self.drafter is None:
            return 0
        k = self.control.proposal_length()
        room = min(self.target.n_ctx - self.target.n_past, self.target.n_batch) - 1
        if self.max_tokens is not None:
            room = min(room, self.max_tokens - len(self.output.tokens) - 1)
        if self.target.max_rollback is not None:  # recurrent state: rollback depth is bounded
            room = min(room, self.target.max_rollback)
        return max(0, min(k, room))

    def _told_times(
        self,
        draft: Draft,
        shadow: tuple[Draft, int] | None,
        draft_s: float,
        verify_s: float,
    ) -> tuple[float, float]:
        """The round's times as the controller is told them: measured, or modelled. A
        lookup is told it cost nothing: it costs microseconds, and the clock says more only
        when another thread (the chat's interface, the server's event loop) held the GIL,
        which would make the controller stop asking lookups for whole drafts."""
        made = draft if draft.tokens else (shadow[0] if shadow and shadow[1] == 0 else Draft())
        source = made.source or (self.drafter.name if self.drafter else "")
        if self.times is None:
            return (0.0 if source in LOOKUP_MODES else draft_s), verify_s
        return self.times.draft(len(made), source), self.times.verify(len(draft) + 1)

    def _draft(
        self, context: list[int], cap: int | None = None
    ) -> Steps[tuple[Draft, tuple[Draft, int] | None]]:
        """This round's draft (cut to the allowed length and to what the grammar allows),
        or, when there is none, what the paused drafter's shadow check guesses."""
        if self.drafter is not None and self._drafter_idle():
            if self.shadows is not None:
                self.shadows.stop()
            return Draft(), None
        if self.drafter is not None and not self._drafter_begun:
            self._begin_drafter()
        k = self.draft_length() if cap is None else min(cap, self.draft_length())
        draft = Draft()
        if k > 0 and is_stepped(self.drafter):
            draft = yield from self.drafter.propose_steps(context, k)
        elif k > 0 and self.drafter is not None:
            draft = self.drafter.propose(context, k)
        if draft.tokens:
            draft = draft.truncated(min(k, self.control.fit(draft)))
        if self.grammar is not None and draft.tokens:
            # a token the grammar would cut is never verified: it scores nothing either
            draft = replace(draft.truncated(self.grammar.valid_prefix(draft.tokens)), after=None)
        if len(draft) < self.spec.n_min:
            draft = Draft()
        if self.shadows is None:
            return draft, None
        if draft.tokens:
            self.shadows.stop()
            return draft, None
        # scored after the plain step, not verified; a probe the step had no room for is
        # checked instead
        denied = cap == 0 and self.control.probing
        return draft, self.shadows.check(context, 1 if denied else None)

    def _accept(
        self, draft: Draft, rows: Sequence[np.ndarray]
    ) -> tuple[int, int, np.ndarray | None, list[float] | None]:
        """How many drafted tokens the target accepts, its own next token, (a plain sampled
        round) the distribution it was drawn from, for a shadow guess, and (a sampled draft)
        the chance each position it reached had of being accepted, for the controller."""
        if self.sampling.greedy:
            return (*accept_greedy(draft.tokens, rows), None, None)
        position = len(self.output.tokens)
        if not draft.tokens:
            chosen, p = sample_row(rows[0], self.sampling, self.draws.uniform(position))
            return 0, chosen, p, None
        odds: list[float] = []
        n_acc, chosen = accept_sampling(
            draft.tokens, draft.probs, rows, self.sampling, self.draws, position, odds
        )
        return n_acc, chosen, None, odds

    def _beyond(
        self, draft: Draft, n_acc: int, chosen: int, rows: Sequence[np.ndarray]
    ) -> float | None:
        """A draft kept whole whose drafter had guessed further: the chance its next guess
        would have been accepted, read from the row that chose the bonus token (greedy:
        whether it is that token). It tells the controller about the position after the
        draft's last, which a draft cut short would otherwise never reach: at one token a
        round, a copy kept whole round after round would not grow."""
        if draft.after is None or not draft.tokens or n_acc < len(draft):
            return None
        if self.sampling.greedy:
            return float(chosen == draft.after)
        p = probabilities(rows[n_acc], self.sampling)
        return acceptance_odds(p, draft.after_probs, draft.after)

    def finish(
        self,
        plan: RoundPlan,
        raw: np.ndarray,
        t_verify: float,
        told_verify_s: float | None = None,
    ) -> RoundEvent:
        """Accept from the verified rows ``raw`` (one per token of ``plan.batch``), roll the
        cache back past a rejection, and tell the controller. ``t_verify``: when the
        verification began; ``told_verify_s``: what the controller is told it cost instead
        of the time measured (a pass shared with other generations costs more than theirs)."""
        draft, shadow, n_past = plan.draft, plan.shadow, plan.n_past
        rows = self._constrained(raw, draft.tokens)
        n_acc, chosen, p_plain, odds = self._accept(draft, rows)
        at = len(self.output.tokens)  # the output position of the round's first token
        margins = (
            [self._tie(rows[i], at + i) for i in range(n_acc + 1)] if self.record_margins else []
        )
        logprobs = self._logprobs(raw, [*draft.tokens[:n_acc], chosen])
        self._follow_grammar([*draft.tokens[:n_acc], chosen])
        if n_acc < len(draft):
            self.target.trim(n_past + 1 + n_acc)
        t2 = time.perf_counter()
        if self.drafter is not None:
            self.drafter.accepted(n_acc)
        verify_s = t2 - t_verify if told_verify_s is None else told_verify_s
        draft_s, verify_s = self._told_times(draft, shadow, plan.draft_s, verify_s)
        if self.times is None and plan.made > len(draft):
            # cut by a shared step's budget: the time went into plan.made tokens, and a
            # drafter cut to nothing still learns what its tokens cost (see ``paid_draft``)
            if not draft.tokens:
                self.control.note_draft_time(plan.made, draft_s)
            draft_s *= len(draft) / plan.made
        beyond = self._beyond(draft, n_acc, chosen, rows)
        self.control.observe(len(draft), n_acc, draft_s, verify_s, odds, beyond)
        if shadow is not None and self.shadows is not None:
            self.shadows.score(shadow, p_plain, chosen, draft_s)
        self.recorder.draft_s += plan.draft_s
        self.recorder.verify_s += t2 - t_verify

        new = [*draft.tokens[:n_acc], chosen]
        tokens: list[int] = []
        for token in new:
            if not self.output.push(token):
                break
            tokens.append(token)
        from_draft = [i < n_acc for i in range(len(tokens))]
        source = draft.source or (self.drafter.name if self.drafter else "")
        self.recorder.record_round(len(draft), sum(from_draft), source)
        self.context.extend(new)
        self.last = chosen
        return self._event(tokens, from_draft, margins[: len(tokens)], logprobs, source)
