"""Adaptive speculation: pick the draft length that maximises measured throughput, and pause
speculation when even the best length would be slower than plain decoding.

The model is the one every speculative-decoding analysis uses. With per-position acceptance
a_1..a_k (a_i = P(draft token i accepted | tokens before it accepted)), a round that drafts k
tokens emits E(k) = 1 + sum_i prod_{j<=i} a_j tokens and costs draft(k) + verify(k + 1).
All three are measured as the generation runs:

* a_i: exponentially decayed counts per position (recent text matters most);
* verify(n): the target's measured cost curve (``costs.VerifyCost``), rescaled online;
* draft(k): decayed seconds per drafted token plus a fixed cost per round.

The length chosen maximises E(k) / cost(k). If k = 0 (plain decoding) wins, speculation is
paused; a single short probe round is made after a pause long enough that failing probes
cost at most PROBE_BUDGET of the time (from the measured costs), and the pause doubles while
the probes keep losing, so a bad regime costs little and a good one is found again. When even
a fully accepted draft could not beat plain decoding (the drafter costs too much on this
machine), the controller stops probing altogether; the Engine keeps one controller per mode
across generations, so that lesson is not paid for again on the next prompt.
"""

from __future__ import annotations

import numpy as np

from localspec.engine.costs import VerifyCost

DECAY = 0.9  # weight of the past in the acceptance and cost estimates
PRIOR_ACCEPT, PRIOR_TRIES = 1.6, 2.0  # an optimistic start (0.8) so speculation is tried
MIN_PAUSE, MAX_PAUSE = 4, 128
PROBE_BUDGET = 0.025  # share of the time failing probes may cost while speculation loses
MARGIN = 0.05  # predicted gain a draft length needs over plain decoding to be chosen
MIN_EVIDENCE = 2  # verifications in an answer before a drafter that cannot probe stops
CARRY_OVER = 0.0  # acceptance is per answer: earlier answers (another kind of text) mislead
PROBE_LENGTH = 2  # a probe after a pause: a failed one costs little more than a plain step
NEURAL_START = 4  # a neural drafter's first draft length (see ``n_start``)
LOOKUP_START = 16  # a lookup drafter's: a long failed lookup draft costs a long verify batch
# If even a draft accepted in full would gain less than this over plain decoding, drafting
# cannot pay with this drafter on this machine: stop probing (a probe of a draft model must
# first catch its cache up with every token made during the pause, which is not free).
HOPELESS_BELOW = 1.05


class AdaptiveController:
    def __init__(
        self,
        n_max: int,
        cost: VerifyCost | None,
        n_min: int = 0,
        enabled: bool = True,
        n_start: int | None = None,
    ) -> None:
        """``n_start``: the first draft length (default ``n_max``). A neural drafter starts
        short: each of its tokens costs a forward pass, so a long first draft that fails
        costs as much as many plain tokens; a lookup draft is free to make and starts long."""
        self.n_max, self.n_min = n_max, n_min
        self.enabled = enabled and cost is not None
        self.cost = cost
        self._accepted = np.zeros(n_max + 1)
        self._tried = np.zeros(n_max + 1)
        self._draft_per_token = 0.0
        self._catch_up: float | None = None
        self._draft_seen = False
        self._n_start = n_max if n_start is None else max(1, min(n_start, n_max))
        self.n_draft = self._n_start
        self.hopeless = False  # even perfect acceptance could not beat plain decoding
        self.paused = False
        self.start()

    def start(self) -> None:
        """A new generation: per-generation counters restart, what was learnt is kept.

        A generation that ended paused (speculation was losing) opens the next one with a
        single short probe and keeps its pause length: a prompt of another kind that suits the
        drafter resumes after one round, one that does not costs one probe instead of the
        whole climb of ever longer pauses (each probe of a neural drafter first catches its
        cache up with the paused stretch, which is not free)."""
        ended_paused = self.paused
        self.pauses = 0
        self._rounds_seen = 0
        self._answer_verifications = 0
        # acceptance depends on the prompt: each answer learns its own (costs are kept)
        self._accepted *= CARRY_OVER
        self._tried *= CARRY_OVER
        self.n_draft = min(self.n_draft, self._n_start)  # a new prompt starts short
        if self.hopeless or not ended_paused:
            self.paused = self.hopeless
            self._pause_len = MIN_PAUSE
            self._pause_left = 0
        else:
            self.paused = True
            self.pauses = 1
            self._pause_left = 1

    def note_catch_up(self, seconds_per_token: float | None) -> None:
        """What the drafter pays per token to catch up after a pause (a draft model must
        decode the stretch it skipped before it can draft again; None: nothing)."""
        if seconds_per_token is not None:  # None: not measurable this time (cached prompt)
            self._catch_up = seconds_per_token
        if self.paused and not self.hopeless and not self._probes_pay():
            # it cannot probe later in this answer: explore at its start instead
            self.paused = False
            self.n_draft = min(self._n_start, NEURAL_START)

    def _probes_pay(self) -> bool:
        """Whether probing during a pause can stay within PROBE_BUDGET. A draft model that
        must catch up pays for every paused token at its prompt-processing rate: about a
        tenth of a target step on a small CPU (then it waits for the next answer, which its
        prompt processing catches up for free), next to nothing on a GPU."""
        if not self._catch_up or self.cost is None:
            return True
        return self._catch_up < PROBE_BUDGET * float(self.cost(np.array([1]))[0])

    def _exploring(self) -> bool:
        """A drafter that cannot probe mid-answer (``_probes_pay`` is False) would stop for
        the whole answer on one unlucky round: it first gets MIN_EVIDENCE verifications in
        this answer (at a short length) before it pauses."""
        return (
            not self.paused and not self._probes_pay() and self._answer_verifications < MIN_EVIDENCE
        )

    def next_draft_length(self) -> int:
        """How many tokens to draft this round (0: decode plainly)."""
        if not self.enabled:
            return self.n_max
        if self.paused:
            self._pause_left -= 1
            # the opening probe of an answer is free of catch-up (prompt processing did it)
            mid_answer = self._rounds_seen > 0
            if self._pause_left > 0 or self.hopeless or (mid_answer and not self._probes_pay()):
                return 0
            return min(self.n_draft, PROBE_LENGTH)  # a short probe: cheap when it fails again
        return self.n_draft

    def observe(self, n_drafted: int, n_accepted: int, draft_s: float, verify_s: float) -> None:
        """Record one round and choose the draft length for the next."""
        self._rounds_seen += 1
        self._answer_verifications += n_drafted > 0
        if self.cost is not None:
            self.cost.observe(n_drafted + 1, verify_s)
        if n_drafted:
            self._record_acceptance(n_drafted, n_accepted)
            if not self.paused:  # a probe's draft time includes catching up the pause
                self._record_draft_cost(n_drafted, draft_s)
        if not self.enabled:
            return
        best = self._best_length()
        won_probe = self.paused and 0 < n_drafted == n_accepted
        if best == 0 and n_drafted and won_probe:
            # a probe accepted in full is evidence the text changed (a file copied again)
            best = min(self._n_start, NEURAL_START)
        elif best == 0 and n_drafted and self._exploring():
            best = min(self._n_start, PROBE_LENGTH)  # too little evidence to stop for good
        if best == 0:
            self.hopeless = self._perfect_speedup() < HOPELESS_BELOW
            if not self.paused or self._pause_left <= 0:
                self._pause(after_probe=self.paused)
        else:
            self.paused = False
            self._pause_len = MIN_PAUSE
            self.n_draft = best

    def _pause(self, after_probe: bool) -> None:
        """Pause, or pause again after a lost probe (the pause doubles)."""
        if not self.paused:
            self.pauses += 1
        if after_probe:
            self._pause_len = min(max(self._pause_len * 2, self._first_pause()), MAX_PAUSE)
        else:
            self._pause_len = self._first_pause()
        self.paused = True
        self._pause_left = self._pause_len

    def _first_pause(self) -> int:
        """Plain rounds before the first probe, so that probes that keep failing cost at most
        PROBE_BUDGET of the time. A probe costs a batch of PROBE_LENGTH + 1 (and its draft)
        instead of one step: next to nothing on a GPU, more than two steps on a small CPU,
        where a batch of 2 leaves llama.cpp's one-token (matrix-vector) kernels."""
        if self.cost is None:
            return MIN_PAUSE
        k = min(self.n_draft, PROBE_LENGTH)
        step = float(self.cost(np.array([1]))[0])
        probe = float(self.cost(np.array([k + 1]))[0]) + self._draft_per_token * k
        overhead = max(0.0, probe / step - 1.0)
        return int(np.clip(np.ceil(overhead / PROBE_BUDGET), MIN_PAUSE, MAX_PAUSE))

    def _record_acceptance(self, n_drafted: int, n_accepted: int) -> None:
        self._accepted *= DECAY
        self._tried *= DECAY
        # a_i is conditional: position i is only "tried" when every earlier one was accepted.
        self._tried[: min(n_accepted + 1, n_drafted)] += 1
        self._accepted[:n_accepted] += 1

    def _record_draft_cost(self, n_drafted: int, draft_s: float) -> None:
        per_token = draft_s / n_drafted
        if not self._draft_seen:
            self._draft_per_token, self._draft_seen = per_token, True
        self._draft_per_token = DECAY * self._draft_per_token + (1 - DECAY) * per_token

    def acceptance(self) -> np.ndarray:
        """Estimated a_i for positions 1..n_max (conditional on the previous ones accepted).

        A position seldom reached borrows the estimate of the one before it (acceptance is
        similar from one position to the next), so a draft length that keeps being fully
        accepted is extended without waiting for evidence that could never come."""
        estimates = np.empty(self.n_max + 1)
        prior = PRIOR_ACCEPT / PRIOR_TRIES
        for i in range(self.n_max + 1):
            estimates[i] = (self._accepted[i] + PRIOR_TRIES * prior) / (
                self._tried[i] + PRIOR_TRIES
            )
            prior = estimates[i]
        return estimates

    def _speeds(self, acceptance: np.ndarray) -> np.ndarray:
        """Expected tokens per second for each draft length k = 0..n_max."""
        assert self.cost is not None
        k = np.arange(self.n_max + 1)
        expected = 1.0 + np.concatenate([[0.0], np.cumsum(np.cumprod(acceptance[: self.n_max]))])
        return expected / (self.cost(k + 1) + self._draft_per_token * k)

    def _perfect_speedup(self) -> float:
        """The best speedup over plain decoding if every drafted token were accepted."""
        speed = self._speeds(np.ones(self.n_max + 1))
        return float(speed[max(self.n_min, 1) :].max() / speed[0])

    def _best_length(self) -> int:
        speed = self._speeds(self.acceptance())
        lengths = np.arange(max(self.n_min, 1), self.n_max + 1)
        best = int(lengths[np.argmax(speed[lengths])]) if lengths.size else 0
        # a margin: at break-even the estimates' noise makes drafting lose on average
        return best if speed[best] > speed[0] * (1 + MARGIN) else 0
