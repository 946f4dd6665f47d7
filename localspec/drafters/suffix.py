"""``suffix``: draft what followed the context's tail in earlier generations of the same
target (``engine/spec_memory.py``): a regenerated answer, the 10th record of a scripted batch,
the file an agent writes again. Free to ask, like ``ngram-simple``; chained before it, a
lookup that finds nothing costs nothing."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from localspec.engine.drafting import Draft
from localspec.engine.spec_memory import Recall, SpecMemory

# From this length on, a match is copied text, verified at once (adaptive.STRONG_MATCH).
# What followed a shorter match in an *earlier* request is often the shared skeleton of two
# different texts (the field names of two JSON records, the "Args:" of two docstrings), whose
# values differ. So a shorter match drafts what the earlier places agree on
# (``SpecMemory.agreed``), which stops where the values start; where they do not agree (or
# one place is all there is), the most recent longest match's continuation is drafted as the
# weak match it is: the controller verifies it only while drafts on keys of that length keep
# paying in this answer, and otherwise checks it for free as a shadow guess, leaving the
# round to the drafter chained after (docs/benchmarks.md).
MIN_MATCH = 12
# After the output departs from a remembered text it was copying (an edited line of a file
# written again), a short match just past the point of departure is that text resuming, not
# chance: it is followed again, with the evidence of the copy it continues (drafted as a
# strong match: waiting for 12 tokens to match again costs a dozen plain steps per edit). How
# far past (beyond the tokens written since), and for how long after the copy's last draft,
# the copy is looked for.
RESYNC_WINDOW = 16
RESYNC_GAP = 64


class SuffixDrafter:
    name = "suffix"
    catch_up_per_token: float | None = None  # nothing to follow: the memory is shared

    def __init__(self, memory: SpecMemory) -> None:
        self.memory = memory
        # the last copy: the memory position that continued it, and the context length then
        self._anchor: tuple[int, int] | None = None

    def begin(self, prompt: Sequence[int]) -> None:
        """The memory holds earlier generations only: nothing to prepare."""
        self._anchor = None

    def propose(self, context: Sequence[int], n_max: int) -> Draft:
        recall = self.memory.recall(context)
        if recall is None or n_max <= 0:
            return Draft()
        match = recall.longest
        end = recall.longest_end if match >= MIN_MATCH else self._resync(recall, context)
        if end is None:
            tokens, _ = self.memory.agreed(recall, n_max)
            if not tokens:  # no agreement: one place's word, weighed by the controller
                tokens = self.memory.follow(recall.longest_end, n_max)
        else:
            match = max(match, MIN_MATCH)  # a long match, or the copy it resumes
            self._anchor = (end, len(context))
            tokens = self.memory.follow(end, n_max)
        return Draft(tokens, match=match) if tokens else Draft()

    def _resync(self, recall: Recall, context: Sequence[int]) -> int | None:
        """A recalled place just past where the last copy would have been by now, in the same
        generation: the remembered text resuming after an edit (None: no such place)."""
        if self._anchor is None:
            return None
        anchor, at = self._anchor
        written = len(context) - at
        if written > RESYNC_GAP:
            self._anchor = None
            return None
        expected = anchor + written  # where the copy would be had nothing been edited
        ends = recall.ends[(recall.ends > anchor) & (recall.ends <= expected + RESYNC_WINDOW)]
        for end in ends[np.argsort(np.abs(ends - expected), kind="stable")]:  # nearest first
            if self.memory.same_generation(anchor, int(end)):
                return int(end)
        return None

    def accepted(self, n_accepted: int) -> None:
        """The copy's place is found again from the context: nothing to sync."""

    def close(self) -> None:
        """The memory outlives the generation."""
