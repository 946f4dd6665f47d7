"""Lookups rest while a wide step's budget cuts every draft, and look again."""

from __future__ import annotations

from localspec.engine.lookup_rest import REST_STEPS, UNPAID_STEPS, LookupRest


def cut_steps(rest: LookupRest, width: int, n: int) -> list[bool]:
    """``n`` steps of ``width`` generations whose wanted drafts are all cut: which rested."""
    rested = []
    for _ in range(n):
        rested.append(rest.resting(width))
        if not rested[-1]:
            rest.note(wanted=8, verified=0)
    return rested


def test_lookups_rest_after_steps_that_verified_nothing_then_look_again() -> None:
    rested = cut_steps(LookupRest(), 8, 2 * (UNPAID_STEPS + REST_STEPS))
    assert rested == 2 * ([False] * UNPAID_STEPS + [True] * REST_STEPS)


def test_a_verified_draft_or_a_new_width_ends_the_count_or_the_rest() -> None:
    rest = LookupRest()
    cut_steps(rest, 4, UNPAID_STEPS - 1)
    rest.note(wanted=8, verified=3)  # one step paid: the count starts again
    assert cut_steps(rest, 4, UNPAID_STEPS - 1) == [False] * (UNPAID_STEPS - 1)
    assert cut_steps(rest, 4, 2) == [False, True]  # the count reached: resting
    assert not rest.resting(3)  # a generation ended: the load changed
    assert not rest.resting(1) and not rest.resting(1)  # alone, never (its controller decides)


def test_steps_that_wanted_no_draft_do_not_count() -> None:
    rest = LookupRest()
    rest.resting(4)
    for _ in range(3 * UNPAID_STEPS):
        rest.note(wanted=0, verified=0)
        assert not rest.resting(4)
