"""The suffix drafter's memory of earlier generations: pure lookups, bounds, and chains."""

import numpy as np
import pytest

from localspec.drafters.suffix import MIN_MATCH, SuffixDrafter
from localspec.engine.adaptive import STRONG_MATCH
from localspec.engine.spec_memory import KEY, SpecMemory, matched_backwards
from localspec.errors import LocalspecError
from localspec.modes import canonical, parse_mode


def test_a_regenerated_answer_is_drafted_from_the_earlier_one() -> None:
    memory = SpecMemory()
    prompt, answer = list(range(100, 140)), list(range(500, 560))
    memory.add(prompt + answer)
    drafter = SuffixDrafter(memory)
    draft = drafter.propose(prompt, 16)
    assert draft.tokens == answer[:16] and draft.match == 32  # measured up to MAX_MATCH
    assert drafter.propose([*prompt, *answer[:10]], 5).tokens == answer[10:15]
    assert drafter.propose([1, 2, 3, 4, 5], 8).tokens == []  # nothing like it before


def test_the_longest_match_wins_then_the_most_recent() -> None:
    memory = SpecMemory()
    memory.add([9, 9, 1, 2, 3, 4, 70, 71])  # a 4-token match (plus nothing before)
    memory.add([5, 6, 7, 1, 2, 3, 4, 80, 81])  # matches 7 tokens back
    memory.add([8, 1, 2, 3, 4, 90, 91])  # the most recent, 4 tokens
    tokens, match = memory.lookup([5, 6, 7, 1, 2, 3, 4], 2)
    assert (tokens, match) == ([80, 81], 7)
    tokens, match = memory.lookup([0, 1, 2, 3, 4], 2)
    assert (tokens, match) == ([90, 91], 4)


def test_memory_is_bounded_oldest_first() -> None:
    memory = SpecMemory(max_mb=0.001)  # 62 tokens
    for i in range(10):
        memory.add([i] * 5 + list(range(1000 * i, 1000 * i + 20)))
    assert memory.n_tokens <= memory.max_tokens
    assert memory.lookup([0] * 5, 3) == ([], 0)  # the first generation was evicted
    assert memory.lookup([9] * 5, 3)[0] == [9000, 9001, 9002]
    assert len(memory) == memory.n_tokens // 25


def test_backward_match_counts_equal_tokens_only() -> None:
    doc = np.array([1, 2, 3, 4, 5, 6], dtype=np.int32)
    tail = np.array([9, 3, 4, 5][::-1], dtype=np.int32)
    assert matched_backwards(tail, doc, 5) == 3
    assert matched_backwards(tail[:2], doc, 5) == 2
    assert matched_backwards(tail, doc, 1) == 0  # 1 before doc[1]... only doc[0]=1 vs 5


def test_short_contexts_and_tiny_generations_are_ignored() -> None:
    memory = SpecMemory()
    memory.add([1] * KEY)  # too short to index
    assert len(memory) == 0 and memory.lookup([1, 2], 4) == ([], 0)


def test_suffix_chains_with_other_lookups_and_one_neural_drafter() -> None:
    assert parse_mode("suffix+ngram-simple") == ("suffix", "ngram-simple")
    assert parse_mode("suffix,ngram-simple,draft-model") == (
        "suffix",
        "ngram-simple",
        "draft-model",
    )
    assert canonical("draft-model+suffix") == "suffix+draft-model"
    with pytest.raises(LocalspecError):
        parse_mode("suffix+draft-model+draft-self")
    with pytest.raises(LocalspecError):
        parse_mode("suffix+suffix")


def test_a_cleared_memory_drafts_nothing() -> None:
    memory = SpecMemory()
    memory.add(list(range(40)))
    memory.clear()
    assert memory.lookup(list(range(20)), 4) == ([], 0) and memory.n_tokens == 0


def test_one_short_match_is_drafted_as_weak_a_long_one_as_strong() -> None:
    """What followed one 6-token match of an earlier request is as likely a value of another
    record as text to copy: drafted with its key length, which the controller weighs (it
    verifies weak drafts only while their key length pays); a 12-token match is copied text."""
    memory = SpecMemory()
    memory.add([7, 8, 9, 10, 11, 12, 60, 61, 62, 63])
    drafter = SuffixDrafter(memory)
    skeleton = [1, 2, 3, 7, 8, 9, 10, 11, 12]
    assert memory.lookup(skeleton, 4) == ([60, 61, 62, 63], 6)
    draft = drafter.propose(skeleton, 4)
    assert draft.tokens == [60, 61, 62, 63] and draft.match == 6 < STRONG_MATCH
    memory.add([*range(200, 220), 90, 91])
    draft = drafter.propose(list(range(200, 220)), 2)
    assert draft.tokens == [90, 91] and draft.match >= STRONG_MATCH


def record(i: int, skeleton_end: int = 15) -> list[int]:
    """A JSON-like record: the same field names (10..15, 20..25), its own values."""
    return [1000 + i, 10, 11, 12, 13, 14, skeleton_end, 300 + i, 20, 21, 22, 23, 24, 25, 400 + i]


def test_the_skeleton_earlier_answers_agree_on_is_drafted_up_to_the_values() -> None:
    memory = SpecMemory()
    for i in range(3):
        memory.add(record(i))
    drafter = SuffixDrafter(memory)
    context = [7, 10, 11, 12, 13]  # a new record's first field name
    draft = drafter.propose(context, 8)
    assert draft.tokens == [14, 15] and draft.match == 4  # the values differ: stop there
    assert memory.agreed(memory.recall(context), 8) == ([14, 15], 3)  # type: ignore[arg-type]
    next_field = [*context, 14, 15, 399, 20, 21, 22, 23]  # four tokens past its value
    assert drafter.propose(next_field, 8).tokens == [24, 25]


def test_earlier_answers_that_disagree_draft_only_what_they_share() -> None:
    memory = SpecMemory()
    drafter = SuffixDrafter(memory)
    memory.add(record(0))
    memory.add(record(1))
    # two places are too few to agree: the most recent one's word, as a weak draft
    draft = drafter.propose([7, 10, 11, 12, 13], 8)
    assert draft.tokens == record(1)[5:13] and draft.match == 4
    memory.add(record(2, skeleton_end=16))  # one in three continues otherwise after 14
    assert drafter.propose([7, 10, 11, 12, 13], 8).tokens == [14]
    memory.add(record(3))
    memory.add(record(4))  # 4 of 5 agree: the share asked for (MIN_SHARE)
    assert drafter.propose([7, 10, 11, 12, 13], 8).tokens == [14, 15]


def test_an_agreed_draft_stops_at_the_end_of_the_earlier_generations() -> None:
    memory = SpecMemory()
    for i in range(3):
        memory.add([500 + i, 1, 2, 3, 4, 5, 6])
    assert SuffixDrafter(memory).propose([9, 1, 2, 3, 4], 8).tokens == [5, 6]


def test_a_copy_broken_by_an_edit_resumes_as_soon_as_the_key_matches_again() -> None:
    memory = SpecMemory()
    earlier = list(range(500, 600))  # a file written before
    memory.add(earlier)
    memory.add(list(range(700, 720)) + earlier[60:64] + list(range(900, 920)))  # elsewhere
    drafter = SuffixDrafter(memory)
    copied = earlier[:30]
    assert drafter.propose(copied, 8).tokens == earlier[30:38]  # a long match: copied
    edited = [*copied, 1, 2, *earlier[32:36]]  # two tokens changed, then the file again
    draft = drafter.propose(edited, 8)
    # drafted as the copy it resumes: a strong match, which the controller verifies at once
    assert draft.tokens == earlier[36:44] and draft.match == MIN_MATCH == STRONG_MATCH
    # the same short match without a copy that broke just before is only a weak draft
    assert SuffixDrafter(memory).propose(edited, 8).match == 4


def test_a_short_match_far_from_the_broken_copy_is_not_taken_for_it() -> None:
    memory = SpecMemory()
    earlier = list(range(500, 600))
    memory.add(earlier)
    drafter = SuffixDrafter(memory)
    assert drafter.propose(earlier[:30], 8).tokens == earlier[30:38]
    # 4 tokens of the file from 40 tokens later: not where the copy would resume (weak)
    assert drafter.propose([*earlier[:30], 1, *earlier[70:74]], 8).match == 4
    # long after the copy broke, nothing is resumed
    assert drafter.propose([*earlier[:30], *range(1, 80), *earlier[40:44]], 8).match == 4
