import numpy as np

from localspec.drafters.ngram import (
    AGREEING_PLACES,
    NgramDrafter,
    NgramParams,
    agreement,
    find_last_match,
    tail_occurrences,
)


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


def test_a_copy_is_picked_back_up_after_a_renamed_identifier() -> None:
    """Source 14 15 16 17 ...; the output copies up to 13, writes 50 51 where the source has
    14 15 (a new name), then 16: every key holding 50 or 51 matches nowhere, but the copy
    resumes after the source's 16."""
    source = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]
    prompt = [1, 2, 3, *source, 7, 8, 10, 11, 12, 13]
    drafter = NgramDrafter(NgramParams(size_n=6, size_m=8, min_n=4))
    copied = drafter.propose(prompt, 8)
    assert copied.tokens == [14, 15, 16, 17, 18, 19, 20, 21] and copied.match == 4
    resumed = drafter.propose([*prompt, 50, 51, 16], 8)
    assert resumed.tokens == [17, 18, 19, 20, 21, 22, 23, 7] and resumed.match == 1
    # the resumed copy is followed in turn: a second rename two tokens on
    again = drafter.propose([*prompt, 50, 51, 16, 17, 60, 19], 8)
    assert again.tokens == [20, 21, 22, 23, 7, 8, 10, 11]


def test_a_copy_writes_a_learnt_rename_where_the_source_has_the_old_name() -> None:
    """The source uses a name (14 15) three times; the output writes 50 for its first use,
    then follows the source again (16): the re-aligned copy writes 50 at the next uses too.
    A rename the output then does not follow is forgotten."""
    source = [10, 11, 12, 13, 14, 15, 16, 17, 18, 14, 15, 19, 14, 15, 20, 21, 22, 23]
    prompt = [1, 2, 3, *source, 7, 8, 10, 11, 12, 13]
    drafter = NgramDrafter(NgramParams(size_n=6, size_m=8, min_n=4))
    assert drafter.propose(prompt, 8).tokens == [14, 15, 16, 17, 18, 14, 15, 19]
    renamed = drafter.propose([*prompt, 50, 16], 8)
    assert renamed.tokens == [17, 18, 50, 19, 50, 20, 21, 22] and renamed.match == 1
    # the output wrote the old name after all: the next draft copies it as the source has it
    kept = drafter.propose([*prompt, 50, 16, 17, 18, 14], 8)
    assert kept.tokens == [15, 19, 14, 15, 20, 21, 22, 23]


def test_no_copy_is_resumed_far_from_where_the_output_left_it() -> None:
    source = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
    prompt = [*source, 7, 8, 10, 11, 12, 13]
    drafter = NgramDrafter(NgramParams(size_n=6, size_m=8, min_n=4))
    assert drafter.propose(prompt, 8).tokens[:2] == [14, 15]
    # nine tokens of its own since the departure: the copy is left for good
    assert drafter.propose([*prompt, *range(40, 48), 16], 8).tokens == []
    # the output's last token is nowhere in the source after the departure
    assert drafter.propose(prompt, 8).tokens[:2] == [14, 15]
    assert drafter.propose([*prompt, 50, 99], 8).tokens == []
    assert drafter.propose([*prompt, 50, 99, 17], 8).tokens[:2] == [18, 19]  # until it is
    # a new generation forgets the copy
    assert drafter.propose([60, 61, 62, 63, 16], 8).tokens == []


def test_llama_cpps_exact_lookup_resumes_no_copy() -> None:
    source = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]
    prompt = [1, 2, 3, *source, 7, 8, 10, 11, 12, 13]
    drafter = NgramDrafter(NgramParams(size_n=4, size_m=8, min_n=4))
    assert drafter.propose(prompt, 8).tokens[:2] == [14, 15]
    assert drafter.propose([*prompt, 50, 51, 16], 8).tokens == []


def test_a_short_key_whose_places_agree_long_drafts_as_a_strong_match() -> None:
    """The same line written twice already: a short key found at both places, followed by
    the same 14 tokens there, drafts those 14 as a strong (copied) match; a key whose places
    part after a few tokens stays a weak one, capped as short keys are."""
    line = list(range(100, 114))
    context = [1, 2, 3, 4, *line, 60, 61, 1, 2, 3, 4, *line, 70, 71, 72, 1, 2, 3, 4]
    drafter = NgramDrafter(NgramParams(size_n=12, size_m=48, min_n=4))
    draft = drafter.propose(context, 48)
    assert draft.tokens == line
    assert draft.match == 12

    parted = [1, 2, 3, 4, *line, 60, 61, 1, 2, 3, 4, *line[:5], 70, 71, 72, 1, 2, 3, 4]
    weak = drafter.propose(parted, 48)
    assert weak.match == 4
    assert weak.tokens == line[:5]  # what both places say, where they part


def test_a_draft_stops_where_the_keys_places_part() -> None:
    """A full key found at two places that go on differently after three tokens: the draft
    is those three, the places' common word; with one place, or places that agree to the
    end of what is known, it is the whole continuation."""
    key = list(range(200, 212))
    context = [*key, 1, 2, 3, 40, 41, 42, 43, 9, *key, 1, 2, 3, 50, 51, 52, 53, 9, *key]
    drafter = NgramDrafter(NgramParams(size_n=12, size_m=8, min_n=4))
    assert drafter.propose(context, 8).tokens == [1, 2, 3]
    alone = [*key, 1, 2, 3, 50, 51, 52, 53, 9, *key]
    assert drafter.propose(alone, 8).tokens == [1, 2, 3, 50, 51, 52, 53, 9]
    exact = NgramDrafter(NgramParams(size_n=12, size_m=8, min_n=12))  # llama.cpp's lookup
    assert exact.propose(context, 8).tokens == [1, 2, 3, 50, 51, 52, 53, 9]


def brute_force_agreement(history: np.ndarray, n: int, start: int, most: int) -> tuple[int, bool]:
    """agreement's definition, as a plain scan of every earlier place of the key."""
    key = history[history.size - n :]
    places = [s for s in range(history.size - n) if (history[s : s + n] == key).all()]
    others = [s for s in places if s != start][-AGREEING_PLACES:]
    ours = history[start + n : start + n + most]
    agreed, parted = 0, bool(others)
    for other in others:
        same = 0
        while same < ours.size and other + n + same < history.size:
            if history[other + n + same] != ours[same]:
                break
            same += 1
        else:
            parted = False
        agreed = max(agreed, same)
    return agreed, parted


def test_agreement_is_what_a_plain_scan_of_the_places_finds() -> None:
    rng = np.random.default_rng(1)
    for _ in range(2000):
        history = rng.integers(0, 3, size=int(rng.integers(2, 40))).astype(np.int32)
        n, most = int(rng.integers(1, 5)), int(rng.integers(1, 12))
        start = find_last_match(history, n, want=most)
        if start is None:
            continue
        occurrences = tail_occurrences(history, 6)
        assert agreement(history, occurrences, n, start, most) == brute_force_agreement(
            history, n, start, most
        )
