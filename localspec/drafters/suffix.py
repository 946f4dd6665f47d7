"""``suffix``: draft what followed the context's tail in earlier generations of the same
target (``engine/spec_memory.py``): a regenerated answer, the 10th record of a scripted batch,
the file an agent writes again. Free to ask, like ``ngram-simple``; chained before it, a
lookup that finds nothing costs nothing."""

from __future__ import annotations

from collections.abc import Sequence

from localspec.engine.drafting import Draft
from localspec.engine.spec_memory import SpecMemory

# From this length on, a match is copied text, verified at once (adaptive.STRONG_MATCH).
# What followed one shorter match in an *earlier* request is mostly the shared skeleton of two
# different texts (the field names of two JSON records, the "Args:" of two docstrings), whose
# values differ: measured, such drafts cost a batch of records 8-12% (docs/benchmarks.md). So
# shorter matches draft only what the earlier places agree on (``SpecMemory.agreed``), which
# stops where the values start.
MIN_MATCH = 12


class SuffixDrafter:
    name = "suffix"
    catch_up_per_token: float | None = None  # nothing to follow: the memory is shared

    def __init__(self, memory: SpecMemory) -> None:
        self.memory = memory

    def begin(self, prompt: Sequence[int]) -> None:
        """The memory holds earlier generations only: nothing to prepare."""

    def propose(self, context: Sequence[int], n_max: int) -> Draft:
        recall = self.memory.recall(context)
        if recall is None or n_max <= 0:
            return Draft()
        if recall.longest >= MIN_MATCH:
            tokens = self.memory.follow(recall.longest_end, n_max)
        else:
            tokens, _ = self.memory.agreed(recall, n_max)
        return Draft(tokens, match=recall.longest) if tokens else Draft()

    def accepted(self, n_accepted: int) -> None:
        """Stateless between rounds."""

    def close(self) -> None:
        """The memory outlives the generation."""
