"""A field-by-field list's next lines, from the order its fields were declared in (pure)."""

from localspec.drafters.field_lines import FieldOrder, next_lines
from localspec.drafters.ngram import NgramDrafter, NgramParams

DATACLASS = """@dataclass
class Invoice:
    number: str
    customer_id: int
    issued_on: date
    paid: bool = False

    def to_dict(self) -> dict:
        return {
            "number": self.number,
            "customer_id": self.customer_id,
            "issued_on": self.issued_on.isoformat(),
            "paid": self.paid,
        }
"""
ROW = """interface InvoiceRow {
  invoice_id: number;
  customer_name: string;
  paid_at: string | null;
}
interface Invoice {
  invoiceId: number;
  customerName: string;
  paidAt: Date | null;
}
"""
FROM_DICT = '    return Invoice(\n        number=data["number"],\n'


def order_of(text: str) -> FieldOrder:
    order = FieldOrder()
    order.learn(text)
    return order


def test_an_order_is_a_run_of_lines_each_declaring_one_name_the_same_way() -> None:
    assert order_of(DATACLASS).after == {
        "number": "customer_id",
        "customer_id": "issued_on",
        "issued_on": "paid",
    }
    assert order_of(ROW).after["customer_name"] == "paid_at"
    assert order_of(ROW).after["invoiceId"] == "customerName"
    statements = "    if x:\n    return y\n    for z in w:\n"  # keywords declare nothing
    prose = "The model writes one line\nafter another line of prose\nuntil it has written it\n"
    short = "    a: int\n    b: int\n"  # two lines: too few to say an order
    mixed = "    a: int\n    b = 2\n    c: int\n"  # not declared the same way
    for text in (statements, prose, short, mixed):
        assert order_of(text).after == {}


def test_the_next_lines_take_the_last_line_s_form_with_the_next_names() -> None:
    order = order_of(DATACLASS)
    rest = '        customer_id=data["customer_id"],\n        issued_on=data["issued_on"],\n'
    rest += '        paid=data["paid"],\n'
    assert next_lines(order, FROM_DICT) == rest
    assert next_lines(order, FROM_DICT + "        cust") == rest[len("        cust") :]
    assert next_lines(order, FROM_DICT + "        total") == ""  # the model departs
    assert next_lines(order, "    return Invoice(\n") == ""  # no list's line yet
    mapped = "  return {\n    invoiceId: row.invoice_id,\n"
    assert next_lines(order_of(ROW), mapped).startswith("    customerName: row.customer_name,\n")


def test_a_line_written_another_way_does_not_set_the_form_of_the_next() -> None:
    """Most of the list's last lines agree on a form; the one that differs (a date parsed)
    is not copied, unless the line being written goes that way."""
    order = order_of(DATACLASS)
    written = FROM_DICT + '        customer_id=data["customer_id"],\n'
    written += '        issued_on=date.fromisoformat(data["issued_on"]),\n'
    assert next_lines(order, written) == '        paid=data["paid"],\n'
    assert next_lines(order, written + "        paid=date") == ('.fromisoformat(data["paid"]),\n')


class CharVocab:
    """One token a character."""

    def piece(self, token: int) -> bytes:
        return chr(token).encode()

    def tokenize(
        self, text: str, add_special: bool = False, parse_special: bool = False
    ) -> list[int]:
        return [ord(c) for c in text]


def test_the_lookup_drafts_a_list_s_next_line_where_nothing_is_there_to_copy() -> None:
    vocab = CharVocab()
    prompt = vocab.tokenize(DATACLASS + "\ndef invoice_from_dict(data):\n")
    drafter = NgramDrafter(NgramParams(), vocab=vocab)
    drafter.begin(prompt)
    draft = drafter.propose([*prompt, *vocab.tokenize(FROM_DICT)], 48)
    rest = '        customer_id=data["customer_id"],\n        issued_on=data["issued_on"],\n'
    assert "".join(map(chr, draft.tokens)) == rest[:48]
    without = NgramDrafter(NgramParams())  # no tokenizer: lookups alone
    exact = NgramDrafter(NgramParams(min_n=12), vocab=vocab)  # llama.cpp's lookup alone
    for lookup in (without, exact):
        lookup.begin(prompt)
        assert not lookup.propose([*prompt, *vocab.tokenize(FROM_DICT)], 48).tokens


def test_a_list_that_gives_each_name_a_value_of_its_own_is_not_drafted() -> None:
    """Each line of a mapping names its field twice (``number=data["number"]``); a list of
    settings gives each its own value, which no order says."""
    compose = "  db:\n    image: postgres:16\n    restart: always\n    ports: 5432\n"
    order = order_of(compose)
    assert order.after["image"] == "restart"
    assert next_lines(order, "  cache:\n    image: redis:7\n") == ""


def test_a_mapping_names_its_field_anywhere_on_the_line() -> None:
    """``profile.bio = form.cleaned_data["bio"]``: the field is not the line's first name."""
    form = "class ProfileForm(forms.Form):\n    display_name = forms.CharField(max_length=80)\n"
    form += "    bio = forms.CharField(widget=forms.Textarea, required=False)\n"
    form += "    website = forms.URLField(required=False)\n"
    written = '    profile.display_name = form.cleaned_data["display_name"]\n'
    assert next_lines(order_of(form), written) == (
        '    profile.bio = form.cleaned_data["bio"]\n'
        '    profile.website = form.cleaned_data["website"]\n'
    )


def test_a_list_aligned_in_columns_keeps_its_column() -> None:
    """gofmt pads a struct literal's names to one column: a longer or shorter name moves
    the padding, not the column (one space at least)."""
    row = "type OrderRow struct {\n\tID         int64\n\tCustomerID int64\n\tStatus     string\n}\n"
    order = order_of(row)
    written = "\treturn Order{\n\t\tID:         r.ID,\n"
    following = "\t\tCustomerID: r.CustomerID,\n\t\tStatus:     r.Status,\n"
    assert next_lines(order, written) == following
    after_one = written + "\t\tCustomerID: r.CustomerID,\n"  # the padded line sets it still
    assert next_lines(order, after_one) == "\t\tStatus:     r.Status,\n"
    unaligned = "\treturn Order{\n\t\tID: r.ID,\n"
    assert next_lines(order, unaligned) == "\t\tCustomerID: r.CustomerID,\n\t\tStatus: r.Status,\n"
