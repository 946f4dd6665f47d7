"""``draft-self``: the target with some of its layers skipped drafts for the target.

The draft is an ordinary llama.cpp model built from the target's own tensors
(``localspec/derivation/self_draft.py`` derives it), so drafting is exactly ``draft-model``'s
autoregressive loop; only the name (in statistics) and where the model comes from differ.
"""

from __future__ import annotations

from localspec.drafters.draft_model import DraftModelDrafter


class SelfDraftDrafter(DraftModelDrafter):
    name = "draft-self"
