"""The stats of several answers to one prompt, run side by side (a request's ``n``)."""

from __future__ import annotations

from localspec.engine.stats import Stats, combined


def test_choices_count_their_prompt_once_and_their_tokens_and_drafts_together() -> None:
    one = Stats(
        n_prompt=40,
        n_tokens=10,
        drafted=6,
        accepted=4,
        rounds=6,
        verifications=2,
        drafted_at=(2, 2, 2),
        accepted_at=(2, 1, 1),
        gen_ms=500.0,
        ttft_ms=90.0,
        by_drafter=(("ngram-simple", 6, 4, 2),),
    )
    two = Stats(
        n_prompt=40,
        n_tokens=12,
        drafted=2,
        accepted=2,
        rounds=10,
        verifications=1,
        drafted_at=(1, 1),
        accepted_at=(1, 1),
        gen_ms=800.0,
        ttft_ms=95.0,
        paused=True,
        by_drafter=(("ngram-simple", 2, 2, 1), ("suffix", 0, 0, 0)),
    )
    both = combined([one, two])
    assert (both.n_prompt, both.n_tokens, both.drafted, both.accepted) == (40, 22, 8, 6)
    assert both.drafted_at == (3, 3, 2) and both.accepted_at == (3, 2, 1)
    assert (both.gen_ms, both.ttft_ms, both.paused) == (800.0, 95.0, True)
    assert both.tokens_per_s == 22 / 0.8  # the request's speed: they ran together
    assert both.by_drafter == (("ngram-simple", 8, 6, 3), ("suffix", 0, 0, 0))
    assert combined([one]) is one
