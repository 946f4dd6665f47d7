"""The suffix drafter on the real model: a request asked again is drafted from the memory of
the first answer, and the answer is still the target's own."""

from collections import Counter

import numpy as np
import pytest
from scipy.stats import chi2_contingency

from localspec.api import Engine
from localspec.lossless import NEAR_TIE_DRAW, compare

PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring."


def test_a_request_asked_again_is_drafted_from_the_first_answer(qwen: Engine) -> None:
    qwen.memory.clear()  # what other tests left must not be what drafts here
    plain = qwen.generate(
        PROMPT, chat=True, max_tokens=64, temperature=0, mode="none", record_margins=True
    )
    again = qwen.generate(PROMPT, chat=True, max_tokens=64, temperature=0, mode="suffix")
    drafted, accepted = next((d, a) for name, d, a, _ in again.stats.by_drafter if name == "suffix")
    assert drafted >= 32 and accepted >= 0.9 * drafted  # long drafts, from the first match
    report = compare(plain.tokens, plain.margins, again.tokens, plain.runners_up)
    assert report.ok, report


@pytest.mark.slow
def test_a_chain_falls_back_on_the_lookup_when_memory_has_nothing(qwen: Engine) -> None:
    qwen.memory.clear()
    fresh = "Rename `total` to `grand_total` and print the file:\n\n" + "\n".join(
        f"total = total + item_{i}.price * item_{i}.count" for i in range(12)
    )
    result = qwen.generate(
        fresh, chat=True, max_tokens=96, temperature=0, mode="suffix+ngram-simple"
    )
    names = {name for name, drafted, *_ in result.stats.by_drafter if drafted}
    assert "ngram-simple" in names


COLOURS = "List three colours at random, separated by commas. Answer with the list only."


def _second_colours(engine: Engine, mode: str, seeds: range) -> tuple[Counter[str], int]:
    """How often each second colour was drawn (the first comes from the prompt's own pass,
    which nothing drafts), and how many tokens the memory drafted."""
    counts: Counter[str] = Counter()
    drafted = 0
    for seed in seeds:
        result = engine.generate(
            COLOURS, chat=True, max_tokens=8, temperature=1.0, seed=seed, mode=mode
        )
        items = result.text.split(",")
        counts[items[1].strip(" .").lower() if len(items) > 1 else ""] += 1
        drafted += result.stats.drafted
    return counts, drafted


@pytest.mark.slow
def test_sampling_with_drafts_from_memory_keeps_the_distribution(qwen: Engine) -> None:
    """The memory drafts what followed the same first colour in a remembered answer (one-hot);
    rejection sampling must still draw each second colour as often as plain sampling does."""
    qwen.memory.clear()
    plain, _ = _second_colours(qwen, "none", range(80))
    qwen.memory.clear()
    spec, drafted = _second_colours(qwen, "suffix", range(1000, 1080))
    assert drafted >= 40  # the memory drafted throughout
    names = sorted(set(plain) | set(spec))
    assert len(names) >= 2, (plain, spec)  # the test means something only with a choice
    table = np.array([[plain[n] for n in names], [spec[n] for n in names]]) + 0.5
    assert chi2_contingency(table).pvalue > 1e-3, (plain, spec)
    qwen.memory.clear()


EDIT = (
    "Rename the variable `total` to `grand_total` in this code and return the whole code:\n\n"
    "def f(items):\n    total = 0\n    for item in items:\n"
    "        total += item.price * item.qty\n    return total\n"
)


@pytest.mark.slow
def test_a_seed_gives_plain_samplings_text_whatever_the_memory_drafted(qwen: Engine) -> None:
    """A lookup's draft is judged by the target's own draw at each output position, from the
    seed and the position alone: the same seed gives plain sampling's text, however much of
    it the memory drafted (it holds the earlier seeds' answers here), except where a batched
    pass's rounding moved an edge of the inverse CDF across the draw, as it can break a
    greedy near tie: then the plain run's draw lay within ``NEAR_TIE_DRAW`` of that edge."""
    qwen.memory.clear()
    same, from_memory = 0, 0
    for seed in range(1, 9):
        ask = dict(chat=True, max_tokens=48, temperature=0.7, seed=seed)
        plain = qwen.generate(EDIT, mode="none", remember=False, record_margins=True, **ask)  # type: ignore[arg-type]
        spec = qwen.generate(EDIT, mode="suffix+ngram-simple", **ask)  # type: ignore[arg-type]
        report = compare(plain.tokens, plain.margins, spec.tokens, bound=NEAR_TIE_DRAW)
        assert report.ok, (seed, report)  # identical, or apart at a draw on an edge
        same += report.identical
        from_memory += spec.stats.by_drafter_dict().get("suffix", {}).get("accepted", 0)
    qwen.memory.clear()
    assert from_memory >= 150  # most answers came largely from the memory
    assert same >= 6, same
