"""Adaptive speculation: pick the draft length that maximises measured throughput, and pause
speculation when even the best length would be slower than plain decoding.

The model is the one every speculative-decoding analysis uses. With per-position acceptance
a_1..a_k (a_i = P(draft token i accepted | tokens before it accepted)), a round that drafts k
tokens emits E(k) = 1 + sum_i prod_{j<=i} a_j tokens and costs draft(k) + verify(k + 1).
All three are measured as the generation runs:

* a_i: exponentially decayed counts per position (recent text matters most; at temperature
  > 0 each position verified counts its chance of acceptance, sum(min(p, q)), not its draw);
* verify(n): the target's measured cost curve (``costs.VerifyCost``), rescaled online;
* draft(k): decayed seconds per drafted token.

The length chosen maximises E(k) / cost(k). If k = 0 (plain decoding) wins, speculation is
paused. While paused, evidence comes from *shadow checks*, not from verified probes: the
drafter guesses the next token, the target decodes plainly as it would anyway, and the guess
is scored against the target's own choice (greedy: equal or not; sampling: the probability
the guess would have been accepted, sum(min(p, q))). A probe costs a verify batch, which on
a small CPU is more than two plain steps; a shadow check costs one drafted token (nothing for
an n-gram lookup). A drafter whose guesses cost next to nothing (a lookup) guesses a whole
draft, and the loop follows it over the next plain steps while the target agrees, one
position per step: a *shadow round*. For a one-hot draft this is verification simulated
exactly (plain decoding takes guessed token i with probability p_i(x_i), the chance that
verification accepts it; greedy: when it is the argmax), so every position's acceptance is
learnt, not only the first one's, before a verify batch is risked (in prose at T > 0 a
lookup's next token is often right and the ones after it seldom are).
Every answer opens with shadow checks, because acceptance depends on the prompt: a lookup
checks every step; a neural drafter checks while its own cost stays within SHADOW_BUDGET of
the time, or, when it would first have to catch its cache up with a paused stretch (a draft
model on a CPU), only in the answer's opening, until its second miss (it is in step with
the answer there: it has drafted or guessed at every step). Where the target's two-row batch
costs less over a step than a drafted token is expected to be worth, the opening verifies
one-token drafts (probes) instead: the same cost to the drafter, the same evidence, and the
token kept when right (``_probing``).
An opening of right guesses always ends in a verified draft when no check can follow it:
the cost model that would keep the answer plain was measured once, maybe on a busy machine,
and one verified round measures what it only predicts. Nor is a drafter hopeless on one
stalled timing (its cost is the median of its last timings) or on an unconfirmed cost curve.
Speculation resumes when the model predicts a gain for a draft starting where the check
stands (mid-round: that deep into the guessed continuation, judged by the acceptance
measured at that depth), or after SHADOW_STREAK right guesses in a row (text being copied,
where the a_i are near 1 but the evidence is still thin) if a short draft kept whole would
pay at all.
A lookup's draft also says how long a key it matched. Twelve tokens or more (a strong
match) is copied text, verified at once on its own estimates; a shorter key is judged, before
its draft is verified, by how often drafts on keys of that length kept their first token in
this answer (``KeyLengthOdds``): four tokens of prose recur by chance, and a draft on a key
length that keeps failing is only checked (for free, as a shadow guess), not verified.
Nor is a weak draft that pays always verified at once: where every row of a batch costs
most of a step, one whose first token is doubtful would risk the whole batch on it. Its
first token is then checked in the plain step, and the rest drafted next step once the
target has taken it (``_check_first``: whichever is expected to save more steps).
When even a fully accepted draft could not beat plain decoding (the drafter costs too much
on this machine), the controller stops drafting and checking for the rest of the answer.
The Engine keeps one controller per mode across generations: measured costs carry over.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from localspec.engine.costs import VerifyCost
from localspec.engine.drafting import Draft

DECAY = 0.9  # weight of the past in the acceptance and cost estimates
PRIOR_ACCEPT, PRIOR_TRIES = 1.6, 2.0  # an optimistic start (0.8) so speculation is tried
# The prior's weight decays with the evidence (as old evidence does), down to this floor: a
# fixed weight would cap the estimate of a drafter that is always right near 0.97, and on a
# small CPU an expensive drafter pays only above that.
MIN_PRIOR_TRIES = 0.2
SHADOW_BUDGET = 0.025  # share of the time shadow checks may cost while speculation is paused
MAX_SHADOW_SPACING = 128  # plain steps between two shadow checks, at most
SHADOW_STREAK = 3  # right guesses in a row that resume speculation whatever the estimates
STREAK_HIT = 0.9  # a guess counts in the streak when accepted with at least this probability
OPENING_MISSES = 2  # an answer's opening checks (every step) end after this many misses
OPENING_CHECKS = 5  # or after this many checks (a neural guess costs a draft step)
MARGIN = 0.05  # predicted gain a draft length needs over plain decoding to be chosen
# ... and to resume after a pause (hysteresis): estimates from a few guesses are noisy, and
# resuming whenever they overshoot makes speculation flap, losing a round each time
RESUME_MARGIN = 0.15
RESUME_LENGTH = 4  # speculation resumes this short: a guess is evidence about one token
# A lookup's verified draft that lost time (fewer tokens kept than its batch costs in plain
# steps) and paused speculation doubles what the next resume needs: twice the streak, twice
# the margin (a compute-bound target, where a four-token verify costs three steps, would
# otherwise resume on every short streak of code and lose each time; free guesses make such
# streaks cheap to find). A draft that pays clears it.
MAX_BACKOFF = 4
# If even a draft accepted in full would gain less than this over plain decoding, drafting
# cannot pay with this drafter on this machine: stop drafting and checking for this answer.
HOPELESS_BELOW = 1.05
# A drafter that reads every prompt (a draft model) can cost an answer more than its drafts
# save: the prompt read and the opening's guesses. After LOSING_ANSWERS answers in a row that
# it cost, it sits answers out (reads no prompt, guesses nothing): one, then twice as many
# after each further losing answer, up to MAX_SIT_OUT; an answer it paid for clears that.
LOSING_ANSWERS = 2
MAX_SIT_OUT = 8
DRAFT_COST_SAMPLES = 5  # recent draft timings whose median is the draft's cost
SETTLED_SAMPLES = 3  # timings before a drafter may be judged hopeless by its cost
# A lookup draft whose key matched at least this many tokens (llama.cpp's ngram-simple key) is
# evidence by itself: copied text, or text the answer repeats. It is verified at once, paused
# or not, at the length its own acceptance estimates choose, which start from STRONG_PRIOR
# per position (such drafts are mostly kept whole) and are learnt per answer.
STRONG_MATCH = 12
STRONG_PRIOR = 0.95
# A drafter that cannot check once paused (a draft model on a CPU) ends the answer's drafting
# when it pauses. On a compute-bound CPU such a drafter pays only above 90-95% acceptance, and
# one draft that breaks off after a few right tokens says little about that: while the
# answer's tokens tried (checked or verified) are fewer than FINAL_PAUSE_EVIDENCE and at most
# FINAL_PAUSE_MISSES of them were missed, it drafts on, short, instead of stopping.
FINAL_PAUSE_EVIDENCE = 32
FINAL_PAUSE_MISSES = 1.0
# A weak match's first token is judged by what drafts on keys of the same length did in this
# answer (KeyLengthOdds): weight of the per-position estimate in that judgement, in drafts.
KEY_PRIOR_TRIES = 1.0
# Tokens a draft must share with what followed a checked first token to continue it.
CONTINUATION_TOKENS = 4


@dataclass(frozen=True)
class ShadowCheck:
    """How one shadow check fared. ``acceptance``: the probability that the guessed token
    would have been accepted (None: the drafter had no guess). ``position`` in the shadow
    round (0 opens it: ``draft_s`` is the time the ``n_guessed`` tokens took); ``last``: the
    round ends here (the target chose another token, or the guess is used up); ``match``:
    the lookup key length the guess was drafted on (``Draft.match``)."""

    acceptance: float | None
    draft_s: float = 0.0
    position: int = 0
    last: bool = True
    n_guessed: int = 1
    match: int = 0


class AcceptanceEstimate:
    """Per-position acceptance a_i, from exponentially decayed counts and a prior whose
    weight decays with the evidence. ``tried[i]``: drafts that reached position i (every
    earlier token accepted); ``accepted[i]``: how much of those it was accepted."""

    def __init__(self, n_max: int, prior: float) -> None:
        self.prior = prior
        self.accepted = np.zeros(n_max + 1)
        self.tried = np.zeros(n_max + 1)
        self.prior_tries = PRIOR_TRIES

    def reset(self) -> None:
        self.accepted[:] = 0.0
        self.tried[:] = 0.0
        self.prior_tries = PRIOR_TRIES

    def decay(self) -> None:
        """Before a new observation: older evidence, and the prior, weigh less."""
        self.accepted *= DECAY
        self.tried *= DECAY
        self.prior_tries = max(self.prior_tries * DECAY, MIN_PRIOR_TRIES)

    def record_round(
        self,
        n_drafted: int,
        n_accepted: int,
        depth: int = 0,
        odds: Sequence[float] | None = None,
        beyond: float | None = None,
    ) -> None:
        """A verified draft: position i is only "tried" when every earlier one was kept.
        ``depth``: the draft continued a guess that deep (a resume mid-shadow-round), so its
        first token is position ``depth`` of the guessed continuation. ``odds``: the chance
        each position reached had of being accepted (sampling), counted instead of whether
        it was: the same expectation without the draws' noise. ``beyond``: the draft was
        kept whole and the position after it scored (``SpeculativeLoop._beyond``)."""
        self.decay()
        reached = min(n_accepted + 1, n_drafted)
        self.tried[depth : depth + reached] += 1
        self.accepted[depth : depth + reached] += kept_per_position(n_drafted, n_accepted, odds)
        if beyond is not None and n_accepted == n_drafted and depth + n_drafted < self.tried.size:
            self.record_position(depth + n_drafted, beyond)

    def record_position(self, position: int, acceptance: float) -> None:
        self.tried[position] += 1
        self.accepted[position] += acceptance

    def estimates(self) -> np.ndarray:
        """a_i for positions 1..n_max (conditional on the previous ones accepted). A position
        seldom reached borrows the estimate of the one before it (acceptance is similar from
        one position to the next), so a draft length that keeps being fully accepted is
        extended without waiting for evidence that could never come."""
        estimates = np.empty(self.tried.size)
        prior, weight = self.prior, self.prior_tries
        for i in range(self.tried.size):
            estimates[i] = (self.accepted[i] + weight * prior) / (self.tried[i] + weight)
            prior = estimates[i]
        return estimates


def at_depth(acceptance: np.ndarray, depth: int) -> np.ndarray:
    """Per-position estimates for a draft that starts ``depth`` tokens into a guessed
    continuation (the deepest position's estimate stands for those beyond it)."""
    if not depth:
        return acceptance
    return np.concatenate([acceptance[depth:], np.full(depth, acceptance[-1])])


def continues(draft: Draft, rest: Sequence[int]) -> bool:
    """Whether ``draft`` goes on with ``rest``, what a draft whose first token was checked
    had after it (the same copy, one token on)."""
    n = min(len(draft), len(rest), CONTINUATION_TOKENS)
    return n > 0 and list(draft.tokens[:n]) == list(rest[:n])


def kept_per_position(
    n_drafted: int, n_accepted: int, odds: Sequence[float] | None = None
) -> np.ndarray:
    """What each position a verified draft reached counts as kept: its chance of acceptance
    (``odds``, sampling), or whether it was (greedy, or odds not given for every position)."""
    reached = min(n_accepted + 1, n_drafted)
    if odds is not None and len(odds) == reached:
        return np.asarray(odds, dtype=float)
    return (np.arange(reached) < n_accepted).astype(float)


class KeyLengthOdds:
    """How often the first token of a weak lookup draft was right, per length of the key it
    matched: decayed counts, each shrunk towards the per-position estimate. In text that
    does not repeat, four or five tokens recur by chance (a common phrase, a line of
    boilerplate) and what followed them once is seldom what follows now, while a longer key
    picks a copy back up after an edit: one estimate for every key length averages the two
    and keeps drafting on the chance matches."""

    def __init__(self, max_key: int) -> None:
        self.hits = np.zeros(max_key + 1)
        self.tries = np.zeros(max_key + 1)

    def reset(self) -> None:
        self.hits[:] = 0.0
        self.tries[:] = 0.0

    def record(self, key: int, acceptance: float) -> None:
        if not 0 < key < self.tries.size:
            return
        self.hits *= DECAY
        self.tries *= DECAY
        self.hits[key] += acceptance
        self.tries[key] += 1

    def first_token(self, key: int, overall: float) -> float:
        """The chance that a draft on a ``key``-token match keeps its first token, given
        ``overall``, the per-position estimate for every weak draft."""
        if not 0 < key < self.tries.size:
            return overall
        return (self.hits[key] + KEY_PRIOR_TRIES * overall) / (self.tries[key] + KEY_PRIOR_TRIES)


class DraftCost:
    """What a drafted token costs: the median of the last DRAFT_COST_SAMPLES measurements.
    A desktop's other work stalls a measurement now and then (a second, where a draft token
    costs milliseconds); one such sample must not make drafting look hopeless, nor a mean
    carry it for dozens of rounds."""

    def __init__(self) -> None:
        self.samples: deque[float] = deque(maxlen=DRAFT_COST_SAMPLES)
        self.per_token = 0.0  # read several times a round: computed once per timing

    def record(self, per_token: float) -> None:
        self.samples.append(per_token)
        self.per_token = float(np.median(self.samples))

    @property
    def seen(self) -> bool:
        return bool(self.samples)

    @property
    def settled(self) -> bool:
        """Measured often enough that a median outvotes one stalled measurement."""
        return len(self.samples) >= SETTLED_SAMPLES


class AnswerLedger:
    """What a drafter that reads every prompt gained each answer: the plain-decoding time its
    verified rounds saved, less what no round repaid (reading the prompt, the guesses of
    shadow checks); and the answers it sits out after losing ones (LOSING_ANSWERS)."""

    def __init__(self) -> None:
        self.net = 0.0  # seconds this answer's drafting saved (negative: cost)
        self.rounds = 0.0  # of which its verified rounds (without the prompt read, the checks)
        self.worked = False  # the drafter read this answer's prompt
        self.losing = 0  # answers in a row that drafting cost
        self._sit_out = 0  # answers still to sit out

    def open(self) -> bool:
        """A new answer: settle the last one; whether the drafter sits this one out."""
        if self.worked:
            self.losing = self.losing + 1 if self.net < 0 else 0
            if self.losing >= LOSING_ANSWERS:
                self._sit_out = min(MAX_SIT_OUT, 2 ** (self.losing - LOSING_ANSWERS))
        self.net, self.rounds, self.worked = 0.0, 0.0, False
        if self._sit_out:
            self._sit_out -= 1
            return True
        return False

    def spent(self, seconds: float) -> None:
        self.net -= seconds
        self.worked = True

    def saved(self, seconds: float) -> None:
        """What a verified round saved against plain decoding of its tokens."""
        self.net += seconds
        self.rounds += seconds


class AnswerTally:
    """This answer's tokens tried and kept, checked or verified, undecayed (at temperature
    > 0 a token counts its chance of acceptance, as the estimates do): what a pause that
    cannot be taken back is judged on, where the decayed estimates, right for choosing a
    length round by round, swing on one draft."""

    def __init__(self) -> None:
        self.kept = self.tried = 0.0

    def reset(self) -> None:
        self.kept = self.tried = 0.0

    def record(self, kept: float, tried: float) -> None:
        self.kept += kept
        self.tried += tried

    @property
    def missed(self) -> float:
        return self.tried - self.kept


class FixedLengthController:
    """Drafts ``n_max`` tokens every round, never pauses, never checks (``--no-adaptive``;
    the grammar-forced drafter, whose drafts are dictated and free)."""

    paused = False
    pauses = 0
    shadow_checks = 0
    sits_out = False
    probing = False
    timed = True
    may_probe = True

    def __init__(self, n_max: int) -> None:
        self.n_max = self.draft_length = n_max

    def start(self) -> None:
        """Nothing to learn per answer."""

    def note_catch_up(self, seconds_per_token: float | None) -> None:
        """Catching up costs nothing it would act on."""

    def note_prompt_read(self, seconds: float) -> None:
        """Reading the prompt costs nothing it would act on."""

    def catch_up_pays(
        self, behind: int, left: int | None, saved_per_token: float | None = None
    ) -> bool:
        return True

    def proposal_length(self) -> int:
        return self.n_max

    def fit(self, draft: Draft) -> int:
        return len(draft)

    def shadow_length(self) -> int:
        return 0

    def observe_shadow(self, check: ShadowCheck) -> None:
        """Never asked for one."""

    def observe(
        self,
        n_drafted: int,
        n_accepted: int,
        draft_s: float,
        verify_s: float,
        odds: Sequence[float] | None = None,
        beyond: float | None = None,
    ) -> None:
        """A fixed length decides nothing from what it sees."""

    def verification_odds(self, draft: Draft) -> np.ndarray | None:
        """None: a fixed length is not cut by a shared step's budget (it was asked for)."""
        return None

    def paid_draft(self) -> tuple[np.ndarray, float] | None:
        return None

    def note_draft_time(self, n_drafted: int, seconds: float) -> None:
        """A fixed length learns nothing from costs."""


class AdaptiveController:
    def __init__(self, n_max: int, cost: VerifyCost, n_min: int = 0) -> None:
        self.n_max, self.n_min = n_max, n_min
        self.cost = cost
        self._estimate = AcceptanceEstimate(n_max, PRIOR_ACCEPT / PRIOR_TRIES)
        self._strong = AcceptanceEstimate(n_max, STRONG_PRIOR)  # drafts on strong matches
        self._strong_round = False  # the round being verified was drafted on a strong match
        self._key_odds = KeyLengthOdds(STRONG_MATCH - 1)  # weak drafts' first tokens, per key
        self._round_key = 0  # the key length of the draft being verified
        self._declined = False  # fit declined a weak draft: its first token is checked instead
        # a draft declined so that its first token is checked first: the tokens after it,
        # while the check's step runs (``_checking``) and for the round after (``_checked``)
        self._checking: tuple[int, ...] = ()
        self._checked: tuple[int, ...] = ()
        self._strong_cap = n_max  # how long the next strong draft may be (see fit)
        self._resume_depth = 0  # how deep into a guess the next verified draft starts
        self._draft_cost = DraftCost()
        self._tally = AnswerTally()  # this answer's tokens, for a pause that ends drafting
        self._catch_up: float | None = None
        self._guess_length = 1  # tokens per shadow guess (see shadow_length)
        self._resume = min(RESUME_LENGTH, n_max)
        self.draft_length = self._resume
        self.hopeless = False  # even perfect acceptance could not beat plain decoding
        self._curve_confirmed = False  # a verified draft has measured a batch's real cost
        self._ledger = AnswerLedger()
        self.sits_out = False  # this answer goes without the drafter (``AnswerLedger``)
        self.paused = False
        self.may_probe = True  # a chain forbids probes until its every drafter is timed
        self.start()

    def start(self) -> None:
        """A new generation: acceptance restarts from the prior (it depends on the prompt),
        measured costs are kept, and speculation waits for the answer's first shadow checks."""
        self.pauses = 0
        self.shadow_checks = 0
        self._since_shadow = 0
        self._streak = 0
        self._misses = 0  # wrong guesses and lost rounds in this answer's opening
        self._probes = 0  # one-token drafts verified in this answer's opening (``_probing``)
        self._probe_round = False  # the round being verified is one of them
        # acceptance is per answer: earlier answers (another kind of text) mislead
        self._estimate.reset()
        self._strong.reset()
        self._key_odds.reset()
        self._tally.reset()
        self._declined = False
        self._checking = self._checked = ()
        self._strong_cap = self.n_max
        self._resume_depth = 0
        self._backoff = 0  # doublings of what a resume needs (MAX_BACKOFF)
        self.draft_length = self._resume
        self.paused = True
        # re-learnt each answer (a guess or two): one slow first measurement must not
        # stop a drafter for good
        self.hopeless = False
        # only a drafter that pays for its tokens (a draft model) reads prompts at a cost
        paying = self._draft_cost.seen and not self._drafts_cost_nothing()
        self.sits_out = self._ledger.open() and paying

    def note_catch_up(self, seconds_per_token: float | None) -> None:
        """What the drafter pays per token to catch up after a pause (a draft model must
        decode the stretch it skipped before it can draft again; None: nothing)."""
        if seconds_per_token is not None:  # None: not measurable this time (cached prompt)
            self._catch_up = seconds_per_token

    def note_prompt_read(self, seconds: float) -> None:
        """What the drafter took to read this answer's prompt: drafting must repay it."""
        self._ledger.spent(seconds)

    def catch_up_pays(
        self, behind: int, left: int | None, saved_per_token: float | None = None
    ) -> bool:
        """Whether drafting the ``left`` tokens still to come (None: no limit) could repay
        the drafter's catching up with ``behind`` tokens it did not follow (reading the
        prompt is catching up with all of it): at best, drafts kept whole save a share of
        each step, ``saved_per_token`` seconds a token (by default this generation's alone);
        the catch-up costs its measured rate."""
        if left is None or not self._catch_up or self.cost is None:
            return True
        if saved_per_token is None:
            gain = float(self._perfect_gains().max())
            saved_per_token = float(self.cost(np.array([1]))[0]) * (1 - 1 / gain)
        return left * saved_per_token > behind * self._catch_up

    def _pause_margin(self) -> float:
        """The gain a drafting controller asks of its next draft to go on. A drafter that
        cannot check once paused (its catch-up is dear) drafts for the rest of the answer or
        never again: while this answer's verified drafts have saved time (its estimates
        proved right), it stops only where drafting is predicted to lose."""
        if self._catch_up_is_cheap() or self._ledger.rounds <= 0:
            return MARGIN
        return 0.0

    def _catch_up_is_cheap(self) -> bool:
        """Whether the drafter can check mid-answer: catching up a paused stretch costs it
        under SHADOW_BUDGET of a step per token. A draft model pays its prompt-processing
        rate, about a tenth of a target step on a small CPU, next to nothing on a GPU."""
        if not self._catch_up:
            return True
        return self._catch_up < self._budget_s()

    def next_draft_length(self) -> int:
        """How many tokens to draft and verify this round (0: decode plainly), whatever the
        draft's own evidence."""
        if self._probing():
            return 1
        return 0 if self.paused or self.hopeless else self.draft_length

    @property
    def timed(self) -> bool:
        """Whether what this drafter's tokens cost has been measured."""
        return self._draft_cost.seen

    @property
    def probing(self) -> bool:
        """Whether the answer's opening verifies one-token drafts (``_probing``)."""
        return self._probing()

    def _in_opening(self) -> bool:
        """The answer's opening: evidence every step, until OPENING_MISSES misses or
        OPENING_CHECKS checks and probes."""
        return self._misses < OPENING_MISSES and self.shadow_checks + self._probes < OPENING_CHECKS

    def _probing(self) -> bool:
        """Whether the opening verifies a one-token draft instead of a shadow check. Both
        cost the drafter one token and say whether its guess was right; the verified one
        also keeps the token when it is, for the cost of a two-row batch over a step. Where
        that extra is under the token's expected worth (a_1 steps) the probe is the better
        buy: a draft model beside a target whose batches of two cost little more than one
        step. On a small CPU where two rows cost two steps, checks stay cheaper."""
        if not self.may_probe or not self.paused or self.hopeless or self.n_min > 1:
            return False
        if not self._in_opening():
            return False
        if not self._draft_cost.seen or self._drafts_cost_nothing():
            return False
        step, pair = self.cost(np.array([1, 2]))
        return float(pair - step) < float(self.acceptance()[0]) * float(step)

    def proposal_length(self) -> int:
        """How many tokens to ask the drafter for: a drafter whose drafts cost nothing (a
        lookup) is always asked for a whole draft, so that a strong match is seen (paused
        or not); ``fit`` then says how much of it is verified."""
        if not self.hopeless and self._draft_cost.seen and self._drafts_cost_nothing():
            return self.n_max
        return self.next_draft_length()

    def fit(self, draft: Draft) -> int:
        """How many of the proposed tokens to verify: the chosen draft length, or, for a
        draft on a strong match, the length the strong drafts' own estimates choose."""
        k = self.next_draft_length()
        self._probe_round = self.paused and k > 0
        self._strong_round = False
        self._round_key = draft.match
        checked, self._checked, self._checking = self._checked, (), ()
        if draft.match >= STRONG_MATCH and not self.hopeless:
            strong = self._best_length(acceptance=self._strong.estimates())
            k = max(k, min(strong, self._strong_cap))
            # whichever length won, the round is evidence about strong drafts only
            self._strong_round = k > 0
        elif k and not self._resume_depth and continues(draft, checked):
            # its first token was checked and taken: the rest is judged one token in (and
            # grows as any draft does)
            k = min(k, self._best_length(depth=1))
            self._resume_depth = 1 if k else 0
        elif k and draft.match and not self._resume_depth:
            # the estimates with the first token's chance on this key length (computed once:
            # both judgements below read them)
            acceptance = self.acceptance()
            first = min(acceptance[0], self._key_odds.first_token(draft.match, acceptance[0]))
            with_first = np.concatenate([[first], acceptance[1:]])
            if first < acceptance[0] and not self._best_length(acceptance=with_first):
                self._declined = True  # this round's shadow check guesses its first token
                return 0
            if self._check_first(with_first, min(k, len(draft))):
                self._declined = True
                self._checking = tuple(draft.tokens[1:])
                return 0
        return min(k, len(draft))

    def _check_first(self, acceptance: np.ndarray, k: int) -> bool:
        """Whether checking a weak draft's first token in this plain step (free for a
        lookup), and drafting the rest next step once the target has taken it, is expected
        to save more steps than verifying the ``k`` tokens now (``acceptance``: the draft's
        per-position estimates): where every row of a batch costs most of a step, a draft
        rejected at its first token loses its whole batch."""
        if self.n_min > 1 or not self._drafts_cost_nothing():
            return False
        assert self.cost is not None
        first = float(acceptance[0])
        steps = self.cost(np.arange(1, k + 2))
        steps = steps / steps[0]
        now = 1.0 + float(np.cumprod(acceptance[:k]).sum()) - float(steps[k])
        rest = np.concatenate([[0.0], np.cumsum(np.cumprod(acceptance[1:k]))])
        later = first * float((1.0 + rest - steps[:k]).max())
        return later > now

    def shadow_length(self) -> int:
        """How many tokens this plain round's shadow check guesses (0: no check): one, or
        up to a whole draft when guessing costs next to nothing (a lookup). The length
        doubles while a guess costs under SHADOW_BUDGET of a step, and halves when not."""
        if self._declined:  # free evidence about the declined key length
            self._declined = False
            return 1
        return self._guess_length if self._wants_shadow() else 0

    def _wants_shadow(self) -> bool:
        """Whether this plain round should carry a shadow check (see the module docstring)."""
        if not self.paused or self.hopeless:
            return False
        if self._probing():
            return False  # the opening's evidence comes from verified one-token drafts
        if self._in_opening():
            return True  # the answer's opening: a check every step
        if not self._catch_up_is_cheap():
            return False  # it would first have to catch up with the paused stretch
        return self._since_shadow + 1 >= self._shadow_spacing()

    def _last_check(self) -> bool:
        """The answer's opening ends with this check, and no other will follow (catching up
        costs the drafter too much): right guesses all along are then verified once rather
        than left unused for the rest of the answer on a cost model's word. The verified
        round measures what the model only predicted, and the answer drafts or pauses on
        that evidence."""
        opened = self.shadow_checks + self._probes
        return opened >= OPENING_CHECKS and not self._catch_up_is_cheap()

    def _shadow_spacing(self) -> int:
        """Plain steps per shadow check, so that checks cost at most SHADOW_BUDGET."""
        if not self._draft_cost.seen:
            return 1
        spacing = np.ceil(self._draft_cost.per_token / self._budget_s())
        return int(np.clip(spacing, 1, MAX_SHADOW_SPACING))

    def observe(
        self,
        n_drafted: int,
        n_accepted: int,
        draft_s: float,
        verify_s: float,
        odds: Sequence[float] | None = None,
        beyond: float | None = None,
    ) -> None:
        """Record one verified (or plain) round and choose the draft length for the next
        (``odds``: see ``AcceptanceEstimate.record_round``; ``beyond``: a draft kept whole,
        the chance the drafter's next token would have been accepted too)."""
        self._since_shadow += 1
        self._checked, self._checking = self._checking, ()
        self.cost.observe(n_drafted + 1, verify_s)
        if not n_drafted:
            self._probe_round = False  # a probe cut to a check (``SpeculativeLoop.cut``)
            self._resume_depth = 0  # the draft judged at that depth was not verified
            return  # a plain round (or a lookup that found nothing): nothing to decide
        self._record_draft_cost(n_drafted, draft_s)
        self._curve_confirmed = True
        step = float(self.cost(np.array([1]))[0])
        self._ledger.saved((n_accepted + 1) * step - draft_s - verify_s)
        if self._probe_round:
            self._observe_probe(n_drafted, n_accepted, odds, beyond)
            return
        if self._strong_round:  # judged on its own evidence: the pause state stands
            self._strong.record_round(n_drafted, n_accepted, odds=odds, beyond=beyond)
            # as verified drafts grow (see below): deep positions borrow their estimates,
            # and a chat that re-quotes its history breaks off a dozen tokens into a match
            self._strong_cap = max(2 * (n_accepted + 1), self._resume)
            return
        depth, self._resume_depth = self._resume_depth, 0
        self._estimate.record_round(n_drafted, n_accepted, depth, odds, beyond)
        self._tally_round(n_drafted, n_accepted, odds)
        if depth == 0:
            self._key_odds.record(self._round_key, odds[0] if odds else float(n_accepted > 0))
        best = self._best_length(self._pause_margin())
        paid = self._paid(n_drafted, n_accepted)
        if paid:
            self._backoff = 0
        if best == 0:
            gains = self._perfect_gains()
            self.hopeless = self._is_hopeless(gains)
            self._misses += n_accepted < n_drafted  # a draft kept whole is no miss
            if not self.hopeless and self._pause_is_final() and self._too_little_to_stop():
                self.draft_length = self._resume_length(gains)  # short: a miss costs little
                return
            if not paid and self._drafts_cost_nothing():
                self._backoff = min(self._backoff + 1, MAX_BACKOFF)
            self._pause()
        else:
            # grow to at most about twice what was just accepted: deep positions borrow
            # their estimates from shallower ones, and in prose a lookup that matched a few
            # tokens seldom matches fifteen (a copied file still doubles up quickly). A
            # drafter that pays for each token grows by RESUME_LENGTH at most: its long
            # drafts save little verification time, and a rejected one costs its steps.
            if self._drafts_cost_nothing():
                grown = 2 * (n_accepted + 1)
            else:
                grown = n_accepted + 1 + self._resume
            self.draft_length = min(best, max(self.draft_length, grown))

    def _observe_probe(
        self,
        n_drafted: int,
        n_accepted: int,
        odds: Sequence[float] | None,
        beyond: float | None,
    ) -> None:
        """An opening's verified one-token draft: evidence as a check's, and speculation
        resumes on it as on a check (``observe_shadow``)."""
        self._probe_round = False
        self._probes += 1
        self._estimate.record_round(n_drafted, n_accepted, 0, odds, beyond)
        self._tally_round(n_drafted, n_accepted, odds)
        # right as a check is right: kept, or (sampling) with a chance of STREAK_HIT
        hit = (odds[0] if odds else float(n_accepted == n_drafted)) >= STREAK_HIT
        self._streak = self._streak + 1 if hit else 0
        self._misses += not hit
        self._resume_if_it_pays(depth=0, last=not self._in_opening())

    def observe_shadow(self, check: ShadowCheck) -> None:
        """Record a shadow check, and resume speculation if the evidence says it pays (mid-
        round, a resumed draft would start ``position + 1`` tokens into the guess)."""
        self._since_shadow = 0
        acceptance, position = check.acceptance, check.position
        if position == 0:
            self._ledger.spent(check.draft_s)
        if acceptance is None:
            return
        if check.match >= STRONG_MATCH:
            self._observe_strong_shadow(check)
            return
        if position == 0:
            self._key_odds.record(check.match, acceptance)
        if not self.paused and self._checked and position == 0:
            # a first token checked rather than verified: as a verified one, evidence
            # about every weak draft's first token
            self._estimate.decay()
            self._estimate.record_position(0, acceptance)
        if not self.paused:  # the check of a draft fit declined: evidence about its key only
            return
        if position == 0:
            self.shadow_checks += 1
            self._record_draft_cost(check.n_guessed, check.draft_s)
            self._estimate.decay()
            self._size_guesses(check.n_guessed, check.draft_s)
        self._estimate.record_position(position, acceptance)
        self._tally.record(acceptance, 1)
        self._streak = self._streak + 1 if acceptance >= STREAK_HIT else 0
        # mid-round, a draft would start deeper in the guessed continuation: it is judged
        # by the acceptance there (which copies reach far, which prose breaks off early)
        depth = 0 if check.last else position + 1
        if not self._resume_if_it_pays(depth, self._last_check()) and acceptance < STREAK_HIT:
            self._misses += 1

    def _resume_if_it_pays(self, depth: int, last: bool) -> bool:
        """Resume speculation after a check or probe if the estimates (at ``depth`` into a
        guessed continuation) predict a gain, or on a streak of right guesses where a short
        draft kept whole would pay (``last``: no check follows this one)."""
        gains = self._perfect_gains()  # what drafts kept whole would give: computed once
        self.hopeless = self._is_hopeless(gains)
        backoff = 2**self._backoff
        best = 0 if self.hopeless else self._best_length(RESUME_MARGIN * backoff, depth)
        streak = self._streak >= SHADOW_STREAK * backoff
        if best == 0 and streak and (gains[self._resume] > 1 + MARGIN or last):
            best = self._resume  # a short draft kept whole would pay
        if best == 0 and last and not self.hopeless and self._too_little_to_stop():
            best = self._resume  # no check follows: too few tokens to end drafting on
        if best == 0:
            return False
        # resume short, and let the verified rounds grow the draft
        self.paused, self.draft_length = False, min(best, self._resume_length(gains))
        # the estimates that chose to resume were those at this depth: the draft's outcome
        # is evidence about them (recorded at position 0, a first token rejected after a
        # right guess would never correct them)
        self._resume_depth = depth
        return True

    def _observe_strong_shadow(self, check: ShadowCheck) -> None:
        """A guess on a strong match that ``fit`` did not verify (its estimates said no):
        it is evidence about strong drafts, and only about them. Learnt here, a failed
        strong draft does not silence strong matches for the rest of the answer; it does
        not resume the weak matches' drafting (``fit`` verifies strong drafts by itself)."""
        assert check.acceptance is not None
        if check.position == 0:
            self.shadow_checks += 1
            self._record_draft_cost(check.n_guessed, check.draft_s)
            self._strong.decay()
        self._strong.record_position(check.position, check.acceptance)
        if check.acceptance >= STREAK_HIT:  # as a verified strong draft kept this far
            self._strong_cap = max(self._strong_cap, 2 * (check.position + 1))

    def _tally_round(self, n_drafted: int, n_accepted: int, odds: Sequence[float] | None) -> None:
        kept = kept_per_position(n_drafted, n_accepted, odds)
        self._tally.record(float(kept.sum()), kept.size)

    def _pause_is_final(self) -> bool:
        """Whether a pause now would end the answer's drafting: the drafter cannot check
        once paused, and the answer's opening, whose checks it still makes, is over."""
        return not self._catch_up_is_cheap() and not self._in_opening()

    def _too_little_to_stop(self) -> bool:
        """Whether this answer's tokens are too few to end its drafting on: fewer than
        FINAL_PAUSE_EVIDENCE tried, at most FINAL_PAUSE_MISSES of them missed."""
        tally = self._tally
        return tally.tried < FINAL_PAUSE_EVIDENCE and tally.missed <= FINAL_PAUSE_MISSES

    def _budget_s(self) -> float:
        """SHADOW_BUDGET of a one-token target step, in seconds (0 without a cost curve)."""
        return SHADOW_BUDGET * float(self.cost(np.array([1]))[0]) if self.cost is not None else 0.0

    def _drafts_cost_nothing(self) -> bool:
        """A drafted token costs under SHADOW_BUDGET of a step (a lookup)."""
        return self._draft_cost.per_token < self._budget_s()

    def _size_guesses(self, n_guessed: int, draft_s: float) -> None:
        if draft_s < self._budget_s():
            self._guess_length = min(2 * n_guessed, self.n_max)
        else:
            self._guess_length = max(n_guessed // 2, 1)

    def _paid(self, n_drafted: int, n_accepted: int) -> bool:
        """Whether a verified draft kept at least as many tokens as its batch (and drafting)
        cost in plain steps, by the cost curve."""
        assert self.cost is not None
        costs = self.cost(np.array([1, n_drafted + 1]))
        spent = costs[1] + self._draft_cost.per_token * n_drafted
        return n_accepted + 1 >= spent / costs[0]

    def _pause(self) -> None:
        self.pauses += 1
        self.paused = True
        self._since_shadow = 0
        self._streak = 0

    def _record_draft_cost(self, n_drafted: int, draft_s: float) -> None:
        self._draft_cost.record(draft_s / n_drafted)

    def verification_odds(self, draft: Draft) -> np.ndarray | None:
        """The acceptance estimates ``fit`` judged ``draft`` by (a strong match's own), for
        the draft budget of a step shared with other generations (``engine/budget.py``)."""
        if draft.match >= STRONG_MATCH:
            return self._strong.estimates()
        return at_depth(self.acceptance(), self._resume_depth)

    def paid_draft(self) -> tuple[np.ndarray, float] | None:
        """For a drafter that pays for each token it drafts (a draft model): the acceptance
        estimates and the seconds per drafted token by which a shared step sizes the draft
        before it is made (a draft the step would cut costs its drafting all the same).
        None for drafts that cost nothing (a lookup's, judged once made: their odds depend
        on the match found) and before a draft has been timed."""
        if not self._draft_cost.seen or self._drafts_cost_nothing():
            return None
        return self.acceptance(), self._draft_cost.per_token

    def note_draft_time(self, n_drafted: int, seconds: float) -> None:
        """What a draft cut away before verification took to make (only its cost is
        known: none of it was verified)."""
        if n_drafted > 0:
            self._record_draft_cost(n_drafted, seconds)
        if self._probe_round:  # a probe the shared step cut: it still ends the opening
            self._probe_round = False
            self._probes += 1

    def acceptance(self) -> np.ndarray:
        """Estimated a_i for positions 1..n_max (see ``AcceptanceEstimate``)."""
        return self._estimate.estimates()

    def _speeds(self, acceptance: np.ndarray) -> np.ndarray:
        """Expected tokens per second for each draft length k = 0..n_max."""
        assert self.cost is not None
        k = np.arange(self.n_max + 1)
        expected = 1.0 + np.concatenate([[0.0], np.cumsum(np.cumprod(acceptance[: self.n_max]))])
        return expected / (self.cost(k + 1) + self._draft_cost.per_token * k)

    def _perfect_gains(self) -> np.ndarray:
        """Speedup over plain decoding of each draft length k = 0..n_max if kept whole (on a
        small CPU a short neural draft loses even then: only the estimates can justify a
        long one)."""
        speed = self._speeds(np.ones(self.n_max + 1))
        return speed / speed[0]

    def _is_hopeless(self, gains: np.ndarray) -> bool:
        """Even drafts accepted in full could not beat plain decoding by HOPELESS_BELOW, by
        what drafting was measured to cost more than once (a stall is no verdict). Until a
        verified draft has confirmed the verify cost curve (measured once, maybe while the
        machine was busy), only the drafter's own cost can say so: even free verification
        would not pay for it."""
        if not self._draft_cost.settled:
            return False
        if not self._curve_confirmed:
            gains = self._free_verification_gains()
        return float(gains[max(self.n_min, 1) :].max()) < HOPELESS_BELOW

    def _free_verification_gains(self) -> np.ndarray:
        """Speedup of each draft length kept whole if a verify batch cost one step."""
        assert self.cost is not None
        step = float(self.cost(np.array([1]))[0])
        k = np.arange(self.n_max + 1)
        return (k + 1) * step / (step + self._draft_cost.per_token * k)

    def _resume_length(self, gains: np.ndarray) -> int:
        """RESUME_LENGTH, or the shortest draft that would pay if kept whole when that is
        longer (a neural drafter on a small CPU: four tokens lose even when all accepted)."""
        paying = np.flatnonzero(gains[1:] > 1 + MARGIN) + 1
        shortest = int(paying[0]) if paying.size else self.n_max
        return max(self._resume, shortest)

    def _best_length(
        self, margin: float = MARGIN, depth: int = 0, acceptance: np.ndarray | None = None
    ) -> int:
        """The draft length with the best predicted speed (0: plain decoding), for a draft
        that starts ``depth`` tokens into a guessed continuation (``acceptance``: other
        estimates than this controller's own)."""
        if acceptance is None:
            acceptance = self.acceptance()
        speed = self._speeds(at_depth(acceptance, depth))
        lengths = np.arange(max(self.n_min, 1), self.n_max + 1)
        best = int(lengths[np.argmax(speed[lengths])]) if lengths.size else 0
        # a margin: at break-even the estimates' noise makes drafting lose on average
        return best if speed[best] > speed[0] * (1 + margin) else 0
