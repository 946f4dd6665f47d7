"""--mode strings: single modes, chains, and the errors users get."""

from __future__ import annotations

import pytest

from localspec.errors import LocalspecError
from localspec.loading import resolve_mode
from localspec.modes import canonical, neural_part, parse_mode


def test_single_and_chained_modes() -> None:
    assert parse_mode("draft-self") == ("draft-self",)
    assert parse_mode("ngram-simple,draft-model") == ("ngram-simple", "draft-model")
    # the lookup drafter always goes first, whatever order the user wrote
    assert parse_mode("draft-mtp, ngram-simple") == ("ngram-simple", "draft-mtp")
    assert canonical("draft-self,ngram-simple") == "ngram-simple+draft-self"
    assert canonical("ngram-simple+draft-self") == "ngram-simple+draft-self"
    assert neural_part("ngram-simple,draft-self") == "draft-self"
    assert neural_part("ngram-simple") is None


@pytest.mark.parametrize(
    "mode",
    ["draft-fast", "ngram-simple,ngram-simple", "draft-model,draft-self", "none,draft-self"],
)
def test_bad_modes_are_refused(mode: str) -> None:
    with pytest.raises(LocalspecError) as err:
        parse_mode(mode)
    assert "mode" in err.value.message and mode in err.value.message


def test_resolve_mode_checks_the_draft_model() -> None:
    assert resolve_mode("ngram-simple,draft-model", has_draft=True) == "ngram-simple+draft-model"
    assert resolve_mode("draft-self", has_draft=False) == "draft-self"
    with pytest.raises(LocalspecError, match="needs a draft model"):
        resolve_mode("ngram-simple,draft-model", has_draft=False)
    with pytest.raises(LocalspecError, match="does not use one"):
        resolve_mode("draft-self", has_draft=True)


def test_the_default_mode_starts_with_the_memory_where_it_is_on() -> None:
    """serve and chat: the suffix lookup first (free when it finds nothing), then the
    drafter a user would get without it."""
    assert resolve_mode(None, has_draft=False) == "ngram-simple"
    assert resolve_mode(None, has_draft=True) == "draft-model"
    assert resolve_mode(None, has_draft=False, suffix_first=True) == "suffix+ngram-simple"
    assert resolve_mode(None, has_draft=True, suffix_first=True) == "suffix+draft-model"
