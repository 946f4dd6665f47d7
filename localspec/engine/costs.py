"""What a target pass costs as a function of its batch size, on this machine.

On a GPU a batch of 16 tokens costs about what one token costs (memory-bound); on a small
CPU it costs several times more (compute-bound), and the curve is concave. The adaptive
controller needs this curve to decide how long a draft may be, so it is measured once per
loaded model (a few batches on an empty cache) and then rescaled online by the ratio of
observed to predicted times, which follows context growth and machine load.
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np

from localspec.engine.model_context import ModelContext

# Every small size, and both sides of each multiple of 4: on a CPU the cost is a staircase
# (a step up after each multiple of 4: docs/benchmarks.md), which interpolating between
# powers of two misses exactly where short drafts are decided.
CALIBRATION_SIZES = (1, 2, 3, 4, 5, 6, 8, 9, 12, 13, 16, 17, 24, 32, 48, 64)
# How often each size is timed (sizes up to the first figure: the second figure's times), in
# rounds over the sizes. A one-row step is memory-bound, and on a shared machine its time
# moves by a third from one moment to the next while wider batches, compute-bound, move less:
# the fastest of two timings caught a lucky one-row step and priced every batch dearer
# against it, by an amount that changed from one calibration to the next. The median of
# timings spread over rounds, each visiting every size, prices the batches against the steps
# the answers will run, in about the time the calibration took before.
TIMINGS = ((6, 3), (17, 2))
RATIO_DECAY = 0.9


class VerifyCost:
    def __init__(self, sizes: np.ndarray, seconds: np.ndarray) -> None:
        self.sizes = sizes.astype(float)
        self.seconds = np.maximum.accumulate(seconds.astype(float))  # never cheaper when longer
        self._ratio = 1.0
        self._row_slope = self._upper_half_slope()

    @classmethod
    def measure(cls, backend: ModelContext, max_size: int) -> VerifyCost:
        """Time each size (after one warm-up decode) at the backend's cache end, in rounds
        over the sizes (``TIMINGS``: short batches decide most rounds and are timed most),
        and keep each size's median; the cache is trimmed back afterwards. A caller gone
        meanwhile (``backend.cancelled``) stops it between two sizes: the first answer of a
        session waits for it, and a chat's quit or a client's leaving must not."""
        sizes = [n for n in CALIBRATION_SIZES if n <= max_size] or [1]
        if sizes[-1] < max_size:
            sizes.append(max_size)
        base = backend.n_past
        filler = [backend.bos_token if backend.bos_token >= 0 else 0] * max(sizes)
        backend.decode(filler[:8], all_logits=True)  # warm-up: first decodes allocate
        backend.trim(base)
        times: dict[int, list[float]] = {n: [] for n in sizes}
        for n in calibration_order(sizes):
            t0 = time.perf_counter()
            backend.decode(filler[:n], all_logits=True)
            times[n].append(time.perf_counter() - t0)
            backend.trim(base)
            backend.stop_if_cancelled("the verify costs were measured")
        return cls(np.array(sizes), np.array([np.median(times[n]) for n in sizes]))

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        """Predicted seconds for each batch size: linear between measured sizes, and beyond
        the largest at the upper half's average cost per row (the last two sizes can sit
        on one stair of the staircase: their slope, 0, priced any wider step as free)."""
        batch = np.asarray(batch, dtype=float)
        inside = np.interp(batch, self.sizes, self.seconds)
        if self.sizes.size > 1:
            inside = np.where(
                batch > self.sizes[-1],
                self.seconds[-1] + self._row_slope * (batch - self.sizes[-1]),
                inside,
            )
        return inside * self._ratio

    def _upper_half_slope(self) -> float:
        if self.sizes.size < 2:
            return 0.0
        half = int(np.searchsorted(self.sizes, self.sizes[-1] / 2))
        half = min(half, self.sizes.size - 2)
        return float((self.seconds[-1] - self.seconds[half]) / (self.sizes[-1] - self.sizes[half]))

    def observe(self, batch: int, seconds: float) -> None:
        predicted = float(self(np.array([batch]))[0]) / self._ratio
        if predicted > 0:
            self._ratio = RATIO_DECAY * self._ratio + (1 - RATIO_DECAY) * seconds / predicted

    def frozen(self) -> VerifyCost:
        """A copy at the calibration's scale, for a controller that must not follow the
        online rescaling (see ``ModelledTimes``)."""
        return VerifyCost(self.sizes, self.seconds)

    def batched_token_share(self) -> float:
        """What a token of the longest calibrated batch costs, as a share of a one-token
        step: the rate at which a model on these kernels reads a prompt or catches up."""
        if self.seconds[0] <= 0:
            return 1.0
        return float(self.seconds[-1] / self.sizes[-1] / self.seconds[0])

    def ceiling(self) -> float:
        """The best speedup any drafting could give here: max over n of n * t(1) / t(n)."""
        return float(np.max(self._throughput_gains()))

    def break_even_draft_cost(self) -> float:
        """The most a drafted token may cost, as a share of a one-token step, for drafting
        to pay at all, every draft being accepted: max over batches of n rows of
        (n - t(n)/t(1)) / (n - 1). Near 0 where verifying a batch costs what its tokens cost
        one by one (a compute-bound target): there only drafts that cost nothing pay."""
        wide = self.sizes > 1
        if not wide.any() or self.seconds[0] <= 0:
            return 0.0
        n = self.sizes[wide]
        saved = n - self.seconds[wide] / self.seconds[0]
        return float(max(0.0, np.max(saved / (n - 1))))

    def ceiling_batch(self) -> tuple[int, float]:
        """The batch where the ceiling is reached: its size, and its measured seconds."""
        i = int(np.argmax(self._throughput_gains()))
        return int(self.sizes[i]), float(self.seconds[i])

    def _throughput_gains(self) -> np.ndarray:
        return self.sizes * self.seconds[0] / self.seconds


def calibration_order(sizes: list[int]) -> list[int]:
    """The batch sizes in the order they are timed: rounds over the sizes, each round
    visiting every size still to be timed (``TIMINGS``), so that a machine whose speed
    drifts meanwhile moves every size's timings alike."""
    timings = [next((times for top, times in TIMINGS if n <= top), 1) for n in sizes]
    return [n for r in range(max(timings)) for n, t in zip(sizes, timings, strict=True) if r < t]


def one_token_seconds(backend: ModelContext, samples: int = 7) -> float:
    """The median of ``samples`` one-token decodes at the cache end (the cache is trimmed
    back): what a draft step costs as answers run it, priced beside the calibration's
    medians (the fastest of a few was a lucky moment, a fifth under the steps drafts take)."""
    if backend.n_past + 1 > backend.n_ctx:
        backend.trim(0)
    base = backend.n_past
    token = backend.bos_token if backend.bos_token >= 0 else 0
    backend.decode([token])  # the first decode allocates: not timed
    backend.trim(base)
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        backend.decode([token])
        times.append(time.perf_counter() - t0)
        backend.trim(base)
    return float(np.median(times))


class ModelledTimes:
    """Round times taken from the calibration instead of the clock.

    Greedy output depends on how rounds are batched (llama.cpp's batched and one-token
    passes round floats differently), and the adaptive controller batches by what it
    measures. Fed these times instead, it makes the same choices for the same tokens
    whatever the machine is doing, so identical greedy requests get identical answers.
    ``step_seconds``: what one drafted token costs each drafter (0 for lookups)."""

    def catch_up(self, source: str) -> float | None:
        """What ``source`` pays per token to catch up with a stretch it did not follow: its
        drafting step at the target's batched rate (a draft model runs on the same kernels);
        None for a drafter that pays nothing to draft (a lookup follows for free)."""
        step = self.step_seconds.get(source, 0.0)
        return step * self.cost.batched_token_share() if step else None

    def __init__(self, cost: VerifyCost, step_seconds: dict[str, float]) -> None:
        self.cost = cost
        self.step_seconds = step_seconds

    def verify(self, batch: int) -> float:
        return float(self.cost(np.array([batch]))[0])

    def draft(self, n_drafted: int, source: str) -> float:
        return n_drafted * self.step_seconds.get(source, 0.0)


class DraftPassCost:
    """What the draft model's pass of n rows costs, for a step shared by several
    generations that draft together (one decode per draft position for all of them). The
    draft model runs on the target's machine with the same kernels, so a pass of n rows is
    taken to cost its one-row step times the target's own curve at n over the curve at 1;
    the one-row step is the median of the draft decodes timed, each divided so."""

    SAMPLES = 9

    def __init__(self) -> None:
        self._unit: deque[float] = deque(maxlen=self.SAMPLES)

    def observe(self, rows: int, seconds: float, verify: VerifyCost) -> None:
        self._unit.append(seconds / _relative(verify, rows))

    def seconds(self, rows: int, verify: VerifyCost, fallback: float) -> float:
        """A pass of ``rows`` rows; ``fallback``: the one-row step before any was timed."""
        unit = float(np.median(self._unit)) if self._unit else fallback
        return unit * _relative(verify, rows)


def _relative(verify: VerifyCost, rows: int) -> float:
    one, wide = verify(np.array([1, max(1, rows)]))
    return float(wide / one) if one > 0 else float(rows)
