"""The suffix drafter on the real model: a request asked again is drafted from the memory of
the first answer, and the answer is still the target's own."""

from localspec.api import Engine
from localspec.lossless import compare

PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring."


def test_a_request_asked_again_is_drafted_from_the_first_answer(qwen: Engine) -> None:
    plain = qwen.generate(
        PROMPT, chat=True, max_tokens=64, temperature=0, mode="none", record_margins=True
    )
    again = qwen.generate(PROMPT, chat=True, max_tokens=64, temperature=0, mode="suffix")
    drafted, accepted = next((d, a) for name, d, a, _ in again.stats.by_drafter if name == "suffix")
    assert drafted >= 32 and accepted >= 0.9 * drafted  # long drafts, from the first match
    report = compare(plain.tokens, plain.margins, again.tokens, plain.runners_up)
    assert report.ok, report


def test_a_chain_falls_back_on_the_lookup_when_memory_has_nothing(qwen: Engine) -> None:
    fresh = "Rename `total` to `grand_total` and print the file:\n\n" + "\n".join(
        f"total = total + item_{i}.price * item_{i}.count" for i in range(12)
    )
    result = qwen.generate(
        fresh, chat=True, max_tokens=96, temperature=0, mode="suffix+ngram-simple"
    )
    names = {name for name, drafted, *_ in result.stats.by_drafter if drafted}
    assert "ngram-simple" in names
