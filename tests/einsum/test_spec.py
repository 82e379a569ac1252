"""The einsum spec parser: the trees it builds, and its errors, which print the spec with
a caret under the offending text (as the TC parser's do)."""
from __future__ import annotations

import pytest

from polytile.einsum.spec import ConstTerm, IndexTerm, TableTerm, parse_spec
from polytile.errors import ParseError


def test_a_convolution_parses_to_its_subscripts() -> None:
    spec = parse_spec("nc(h+r)(w+s), ckrs -> nkhw")
    x, w = spec.operands
    assert [s.plain for s in x.subscripts] == ["n", "c", None, None]
    assert x.subscripts[2].indices == ("h", "r")
    assert [s.plain for s in w.subscripts] == list("ckrs")
    assert [letter.name for letter in spec.output] == list("nkhw")
    assert spec.summed() == ("c", "r", "s")


def test_strides_dilations_constants_and_tables() -> None:
    spec = parse_spec("(2h+3*r-1)(-w+off_w[c,x]),(x)->hw")
    first, second = spec.operands[0].subscripts
    assert [(type(t), getattr(t, "coeff", None)) for t in first.terms] == [
        (IndexTerm, 2), (IndexTerm, 3), (ConstTerm, None)]
    assert first.terms[2] == ConstTerm(-1, first.terms[2].loc)
    assert isinstance(second.terms[1], TableTerm)
    assert (second.terms[0].coeff, second.terms[1].table, second.terms[1].args) == (
        -1, "off_w", ("c", "x"))
    assert spec.table_names() == ("off_w",)
    assert spec.letters() == ("h", "r", "w", "c", "x")


def test_an_error_location_counts_columns_in_the_spec() -> None:
    with pytest.raises(ParseError) as e:
        parse_spec("nc(h+r)(w+s,ckrs->nkhw")
    assert (e.value.loc.line, e.value.loc.col) == (1, 12)


# Each malformed spec and exactly what the error prints.
ERRORS = {
    "ij,jk": """\
<einsum>:1:6: parse error: expected '->' and the output's indices, found the end of the spec
  ij,jk
       ^
hint: an einsum spec names the output: 'ij,jk->ik'""",
    "i(j+k,k->ij": """\
<einsum>:1:6: parse error: expected '+', '-' or ')', found ','
  i(j+k,k->ij
       ^""",
    "iJ->i": """\
<einsum>:1:2: parse error: expected an index, found 'J'
  iJ->i
   ^
hint: indices are the letters a-z""",
    "ij->ii": """\
<einsum>:1:6: parse error: the output names i twice
  ij->ii
       ^
hint: each output index appears once after '->'""",
    "ij->iz": """\
<einsum>:1:6: parse error: the output index z appears in no input
  ij->iz
       ^
hint: every output index must index an input, which gives its range""",
    "i(hr)->i": """\
<einsum>:1:3: parse error: 'hr' is not an index: indices are single lowercase letters
  i(hr)->i
    ^^
hint: write a sum of letters, e.g. (h+r)""",
    "i(h+sh[c)->i": """\
<einsum>:1:9: parse error: expected ',' or ']', found ')'
  i(h+sh[c)->i
          ^
hint: a table's arguments are index letters: off[c, x]""",
    "i3->i": """\
<einsum>:1:2: parse error: expected an index or '(', found '3'
  i3->i
   ^
hint: a constant subscript goes in parentheses, e.g. (3)""",
    "i(h+sh[c])(w+sh[c,x])->i": """\
<einsum>:1:14: parse error: table sh is looked up with 2 index(es) here and with 1 before
  i(h+sh[c])(w+sh[c,x])->i
               ^^^^^^^""",
    "ij->(i)": """\
<einsum>:1:5: parse error: expected an index, found '('
  ij->(i)
      ^
hint: the output's subscripts are plain letters""",
    "i(h+2*)->i": """\
<einsum>:1:7: parse error: expected an index or a table after the coefficient, found ')'
  i(h+2*)->i
        ^""",
    "i$->i": """\
<einsum>:1:2: parse error: expected an index, '(', ',' or '->', found '$'
  i$->i
   ^""",
    "ish[c]->i": """\
<einsum>:1:4: parse error: a table lookup must be inside parentheses
  ish[c]->i
     ^
hint: write the subscript as a sum, e.g. (h+sh[c])""",
    "i(h+99999999999)->i": """\
<einsum>:1:5: parse error: the number 99999999999 is too large
  i(h+99999999999)->i
      ^^^^^^^^^^^
hint: coefficients and offsets are below 2147483648""",
}


@pytest.mark.parametrize("spec", list(ERRORS))
def test_malformed_specs_print_the_spec_with_a_caret(spec: str) -> None:
    with pytest.raises(ParseError) as e:
        parse_spec(spec)
    assert str(e.value) == ERRORS[spec]


def test_a_line_break_is_refused() -> None:
    with pytest.raises(ParseError, match="one line"):
        parse_spec("ij,\njk->ik")
