import numpy as np

from localspec.drafters.ngram import NgramDrafter, NgramParams, find_last_match


def test_last_match_is_the_most_recent_earlier_occurrence() -> None:
    history = np.array([1, 2, 3, 9, 1, 2, 3, 8, 5, 1, 2, 3])
    assert find_last_match(history, 3) == 4  # not 9: that is the key itself
    assert find_last_match(history, 3, min_hits=2) == 4
    assert find_last_match(history, 3, min_hits=3) is None
    assert find_last_match(np.array([1, 2, 3]), 3) is None


def test_a_match_that_can_supply_a_full_draft_is_preferred() -> None:
    history = np.array([5, 5, 5, 5, 5, 5, 5, 5])
    assert find_last_match(history, 2) == 5  # most recent: one token follows
    assert find_last_match(history, 2, want=4) == 2  # the most recent with 4 tokens after it
    assert find_last_match(history, 2, want=10) == 0  # none has 10: the longest continuation


def test_draft_copies_what_followed_the_match() -> None:
    drafter = NgramDrafter(NgramParams(size_n=3, size_m=4, min_n=3))
    context = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3]
    assert drafter.propose(context, 16).tokens == [4, 5, 6, 7]  # size_m caps it
    assert drafter.propose(context, 2).tokens == [4, 5]  # n_max caps it
    assert drafter.propose([*context, 99], 16).tokens == []  # no match for (2, 3, 99)


def test_shorter_keys_are_tried_down_to_min_n() -> None:
    context = [7, 1, 2, 3, 4, 5, 6, 50, 51, 52, 3]
    exact = NgramDrafter(NgramParams(size_n=3, size_m=8, min_n=3))
    assert exact.propose(context, 8).tokens == []
    fallback = NgramDrafter(NgramParams(size_n=3, size_m=8, min_n=1))
    # a 1-token key matched: the draft is capped at twice the key's length
    assert fallback.propose(context, 8).tokens == [4, 5]


def test_history_follows_a_new_context() -> None:
    drafter = NgramDrafter(NgramParams(size_n=2, size_m=3, min_n=2))
    assert drafter.propose([1, 2, 3, 1, 2], 8).tokens == [3, 1, 2]
    assert drafter.propose([5, 6, 7, 5, 6], 8).tokens == [7, 5, 6]  # not stale history


def brute_force_last_match(history: np.ndarray, n: int, min_hits: int, want: int) -> int | None:
    """find_last_match's definition, written as a plain scan of every start."""
    length = history.size
    if length < n + 1:
        return None
    key = history[length - n :]
    hits = [s for s in range(length - n) if (history[s : s + n] == key).all()]
    if len(hits) < min_hits or not hits:
        return None
    full = [h for h in hits if length - (h + n) >= want]
    return full[-1] if full else hits[0]


def test_one_backward_scan_finds_what_a_plain_scan_finds() -> None:
    rng = np.random.default_rng(0)
    for _ in range(2000):  # a 3-token vocabulary: many overlapping, repeated matches
        history = rng.integers(0, 3, size=int(rng.integers(1, 40))).astype(np.int32)
        n, min_hits, want = (int(x) for x in rng.integers(1, [6, 3, 6]))
        expected = brute_force_last_match(history, n, min_hits, want)
        assert find_last_match(history, n, min_hits, want) == expected


def test_a_draft_says_how_long_a_key_it_matched() -> None:
    history = [*range(30), 100, 101, *range(30)]
    drafter = NgramDrafter(NgramParams(size_n=12, size_m=8, min_n=2))
    assert drafter.propose(history[:45], 8).match == 12  # 13 tokens back match: the full key
    assert drafter.propose([*history[:45], 7, 8], 8).match == 2  # only "7 8" recurs
