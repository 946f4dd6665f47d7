"""The lookup on code: renames learnt as words and from a key's line, a middle read as the
prefix's continuation and ended before the suffix (pure: a toy tokenizer)."""

from localspec.drafters.fim_layout import middle_after_prefix
from localspec.drafters.ngram import STRONG_KEY, NgramDrafter, NgramParams
from localspec.drafters.renames import WordRenames, case_forms, renamed_word

# a vocabulary where, as in Qwen's, a name is one token after one character and two after
# another: "\tuser" and "(user" are single tokens, "\tinvoice" and "(invoice" are not
# fmt: off
PIECES = [
    "}\n", "func", " Get", "User", "Invoice", "(w", ")", " {\n", "\tuser", "\tin", "voice",
    " :=", " load", "\n", "\treturn", " Encode", "(user", "(in", "}", ".User", ".In", "s",
    "<PRE>", "<SUF>", "<MID>",
]
# fmt: on


class ToyVocab:
    """Greedy longest-match tokenizer over ``pieces`` (what the drafter needs of a model)."""

    def __init__(self, pieces: list[str] = PIECES) -> None:
        self.pieces = pieces

    def piece(self, token: int) -> bytes:
        return self.pieces[token].encode()

    def tokenize(
        self, text: str, add_special: bool = False, parse_special: bool = False
    ) -> list[int]:
        tokens = []
        while text:
            best = max((p for p in self.pieces if text.startswith(p)), key=len)
            tokens.append(self.pieces.index(best))
            text = text[len(best) :]
        return tokens


VOCAB = ToyVocab()


def toks(text: str) -> list[int]:
    return VOCAB.tokenize(text)


def test_a_rename_is_the_one_identifier_two_texts_differ_by() -> None:
    assert renamed_word("\tuser", "\tinvoice") == ("user", "invoice")
    assert renamed_word("s.store.User(", "s.store.Invoice(") == ("User", "Invoice")
    assert renamed_word("user, err", "invoice, id") is None  # two differences
    assert renamed_word("user)", "user]") is None  # not a name
    assert renamed_word("a", "a") is None
    assert case_forms("User", "Invoice") == [
        ("User", "Invoice"),
        ("user", "invoice"),
        ("USER", "INVOICE"),
    ]


def test_a_word_rename_rewrites_every_spelling_of_the_old_name() -> None:
    words = WordRenames(VOCAB)
    assert words.learn(toks("\tuser"), toks("\tinvoice"))  # "\tin" "voice" for "\tuser"
    assert words.rewrite(toks("(user")[0]) == tuple(toks("(invoice"))
    assert words.rewrite(toks(".User")[0]) == tuple(toks(".Invoice"))
    assert words.rewrite(toks(" load")[0]) is None
    words.forget(toks("(user")[0])  # the output kept "(user" after all
    assert words.rewrite(toks("(user")[0]) is None and words.rewrite(toks(".User")[0])


def test_a_middle_s_first_tokens_extend_the_prefix() -> None:
    """``[PRE] prefix [SUF] suffix [MID]``: the key at the middle's start is the prefix's
    end, not the suffix's: the copy begins at the first drafted token."""
    pre, suf, mid = 100, 101, 102
    prefix = [10, 11, 12, 13, 14, 15, 16, 17, 5, 10, 11, 12, 13]
    prompt = [pre, *prefix, suf, 7, 8, mid]
    params = NgramParams(size_n=6, size_m=4, min_n=4)
    assert NgramDrafter(params).propose(prompt, 4).tokens == []
    drafter = NgramDrafter(params, fim=(pre, suf, mid))
    assert drafter.propose(prompt, 4).tokens == [14, 15, 16, 17]
    assert drafter.propose([*prompt, 14, 15], 2).tokens == [16, 17]  # the middle goes on
    assert middle_after_prefix([1, 2, 3], (pre, suf, mid)) == [1, 2, 3]  # not a FIM prompt
    reordered = middle_after_prefix([pre, 1, suf, 2, mid, 3], (pre, suf, mid))
    assert reordered == [suf, 2, mid, pre, 1, 3]


def test_a_rename_on_the_key_s_line_is_drafted_in_every_spelling() -> None:
    """The function below its sibling is renamed on its first line (``GetUser`` to
    ``GetInvoice``): the copy of the sibling's body writes ``invoice`` for ``user`` in each
    of its spellings, before the output has written either."""
    sibling = "}\nfunc GetUser(w) {\n\tuser := load(w)\n\treturn Encode(user)\n}\n"
    prompt = toks(sibling + "}\nfunc GetInvoice(w) {\n")
    drafter = NgramDrafter(NgramParams(size_n=12, size_m=16, min_n=3), vocab=VOCAB)
    body = toks("\tinvoice := load(w)\n\treturn Encode(invoice)\n")
    first = drafter.propose(prompt, 16).tokens
    assert first and first == body[: len(first)]
    written = [*prompt, *first]
    rest = drafter.propose(written, 16).tokens
    assert [*first, *rest][: len(body)] == body
    # without the tokenizer, the token rename alone: "User" -> "Invoice", not "\tuser"
    plain = NgramDrafter(NgramParams(size_n=12, size_m=16, min_n=3)).propose(prompt, 16)
    assert plain.tokens[0] == toks("\tuser")[0]


def test_a_middle_s_draft_stops_before_the_suffix_s_first_line() -> None:
    """The sibling's copy goes on with ``}`` and the next function; the suffix starts with
    ``}``: the draft stops before it, where the model ends the middle."""
    fim = (PIECES.index("<PRE>"), PIECES.index("<SUF>"), PIECES.index("<MID>"))
    prefix = toks("}\nfunc GetUser(w) {\n\tuser := load(w)\n}\nfunc GetInvoice(w) {\n")
    prompt = [fim[0], *prefix, fim[1], *toks("}\n"), fim[2]]
    drafter = NgramDrafter(NgramParams(size_n=12, size_m=16, min_n=3), fim=fim, vocab=VOCAB)
    body = toks("\tinvoice := load(w)")
    first = drafter.propose(prompt, 16).tokens
    assert first == body[: len(first)] and len(first) == 6
    assert drafter.propose([*prompt, *first], 16).tokens == toks("\n")
    # a suffix that is not where the copy goes on cuts nothing
    other = [fim[0], *prefix, fim[1], *toks("\treturn"), fim[2]]
    drafter = NgramDrafter(NgramParams(size_n=12, size_m=16, min_n=3), fim=fim, vocab=VOCAB)
    drafted = drafter.propose([*other, *first], 16).tokens
    assert drafted[:3] == toks("\n}\nfunc")


def test_a_middle_s_first_draft_is_a_weak_match_however_long_its_key() -> None:
    """The prefix's end recurs at each block's end; which block comes next is the model's
    choice: until the middle has tokens of its own in the key, the match counts as weak."""
    pre, suf, mid = 100, 101, 102
    block_end = list(range(20, 32))  # twelve tokens that close every block
    prefix = [1, *block_end, 40, 41, 42, 43, 2, *block_end]
    prompt = [pre, *prefix, suf, 7, mid]
    drafter = NgramDrafter(NgramParams(size_n=12, size_m=8, min_n=4), fim=(pre, suf, mid))
    first = drafter.propose(prompt, 8)
    assert first.tokens == [40, 41, 42, 43, 2, *block_end[:3]] and first.match < STRONG_KEY
    assert drafter.propose([*prompt, 40], 8).match < STRONG_KEY
    assert drafter.propose([*prompt, 40, 41], 8).match == STRONG_KEY


def test_a_number_written_for_another_is_aligned_where_it_ends_and_not_learnt() -> None:
    """A table's row copied with another value (``750`` for ``400``): after the new number's
    ``0`` the source's next digits are the old value's rest, so no copy resumes there; the
    ``},`` after it resumes the copy at the next row, which keeps its own ``400``: numbers
    are values, not names to rename."""
    vocab = ToyVocab(['{"', "a", "b", '", ', ", ", "},\n", *"0123456789"])
    rows = vocab.tokenize('{"a", 1, 400},\n{"b", 400, 6},\n')
    prompt = [*rows, *vocab.tokenize('{"a", 1, ')]
    drafter = NgramDrafter(NgramParams(size_n=12, size_m=16, min_n=3), vocab=vocab)
    assert drafter.propose(prompt, 4).tokens == vocab.tokenize("400},\n")
    written = [*prompt, *vocab.tokenize("750")]
    assert drafter.propose(written, 8).tokens == []
    resumed = drafter.propose([*written, *vocab.tokenize("},\n")], 16)
    assert resumed.tokens == vocab.tokenize('{"b", 400, 6') and resumed.match == 1  # 8 at most
