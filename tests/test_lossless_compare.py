from localspec.lossless import ANY_TOKEN, compare


def test_identical_and_shorter_are_identical() -> None:
    assert compare([1, 2, 3], [5, 5, 5], [1, 2, 3]).identical
    assert compare([1, 2, 3], [5, 5, 5], [1, 2]).identical


def test_divergence_at_near_tie_to_runner_up_is_ok() -> None:
    report = compare([1, 2, 3], [5.0, 0.05, 5.0], [1, 9, 3], plain_runners_up=[(), (9,), ()])
    assert not report.identical and report.first_divergence == 1 and report.ok


def test_a_third_token_as_near_as_the_runner_up_is_a_near_tie() -> None:
    """Logits 0.07 and 0.17 below the best: a rounding can put either first."""
    assert compare([1, 2, 3], [5.0, 0.07, 5.0], [1, 8, 3], [(), (9, 8), ()]).ok


def test_a_sampled_divergence_is_judged_by_the_draws_margin_alone() -> None:
    """A rounding can tip a draw onto any token: the plain run records ANY_TOKEN."""
    anyone = [(ANY_TOKEN,)] * 3
    assert compare([1, 2, 3], [0.3, 0.01, 0.3], [1, 7, 3], anyone, bound=0.04).ok
    assert not compare([1, 2, 3], [0.3, 0.2, 0.3], [1, 7, 3], anyone, bound=0.04).ok


def test_divergence_elsewhere_is_not_ok() -> None:
    assert not compare([1, 2, 3], [5.0, 2.0, 5.0], [1, 9, 3], [(), (), ()]).ok  # big gap
    assert not compare([1, 2, 3], [5.0, 0.05, 5.0], [1, 7, 3], [(), (9,), ()]).ok  # farther
