"""``suffix``: draft what followed the context's tail in earlier generations of the same
target (``engine/spec_memory.py``): a regenerated answer, the 10th record of a scripted batch,
the file an agent writes again. Free to ask, like ``ngram-simple``; chained before it, a
lookup that finds nothing costs nothing."""

from __future__ import annotations

from collections.abc import Sequence

from localspec.engine.drafting import Draft
from localspec.engine.spec_memory import SpecMemory


class SuffixDrafter:
    name = "suffix"
    catch_up_per_token: float | None = None  # nothing to follow: the memory is shared

    def __init__(self, memory: SpecMemory) -> None:
        self.memory = memory

    def begin(self, prompt: Sequence[int]) -> None:
        """The memory holds earlier generations only: nothing to prepare."""

    def propose(self, context: Sequence[int], n_max: int) -> Draft:
        tokens, match = self.memory.lookup(context, n_max)
        return Draft(tokens, match=match) if tokens else Draft()

    def accepted(self, n_accepted: int) -> None:
        """Stateless between rounds."""

    def close(self) -> None:
        """The memory outlives the generation."""
