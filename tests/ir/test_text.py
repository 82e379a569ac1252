"""The IR's text form: golden printing, exact round trips, and parse errors with locations."""
from __future__ import annotations

from pathlib import Path

import pytest

from polytile import dtypes
from polytile.errors import IRError
from polytile.ir.nodes import (
    Affine,
    Block,
    Constant,
    Dim,
    Function,
    Index,
    Intrinsic,
    Load,
    LoadIndex,
    Refinement,
    Special,
    Store,
    TensorShape,
)
from polytile.ir.parser import parse_block, parse_function
from polytile.ir.printer import format_block, format_function

GOLDEN = Path(__file__).parents[1] / "golden" / "ir"
GOLDEN_FILES = sorted(GOLDEN.glob("*.ir"))
F32 = dtypes.FLOAT32


def _view(direction: str, name: str, access: list[Affine], sizes: tuple[int, ...],
          strides: tuple[int, ...], agg: str = "assign") -> Refinement:
    dims = tuple(Dim(s, t) for s, t in zip(sizes, strides))
    return Refinement(direction, name, name, tuple(access), TensorShape(F32, dims), agg)


def _top(direction: str, name: str, sizes: tuple[int, ...], strides: tuple[int, ...]
         ) -> Refinement:
    dims = tuple(Dim(s, t) for s, t in zip(sizes, strides))
    return Refinement(direction, "", name, (Affine.constant(0),) * len(dims),
                      TensorShape(F32, dims))


def matmul_ir() -> Function:
    """matmul.ir, built with the node constructors."""
    i, j, k = (Affine.index(n) for n in "ijk")
    init = Block("init", (Index("i", 5), Index("j", 3)), (),
                 (_view("out", "C", [i, j], (1, 1), (3, 1)),),
                 (Constant("$z", 0.0, F32), Store("C", "$z")))
    kernel = Block(
        "kernel", (Index("i", 5), Index("j", 3), Index("k", 7)), (),
        (_view("in", "A", [i, k], (1, 1), (7, 1)), _view("in", "B", [k, j], (1, 1), (3, 1)),
         _view("out", "C", [i, j], (1, 1), (3, 1), "add")),
        (Load("$a", "A"), Load("$b", "B"), Intrinsic("mul", ("$a", "$b"), "$p", F32),
         Store("C", "$p")),
        frozenset({"contraction"}))
    main = Block("main", (), (),
                 (_top("in", "A", (5, 7), (7, 1)), _top("in", "B", (7, 3), (3, 1)),
                  _top("out", "C", (5, 3), (3, 1))),
                 (init, kernel), frozenset({"program"}))
    return Function("matmul", ("A", "B", "C"), main)


def test_printer_matches_golden_text() -> None:
    assert format_function(matmul_ir()) == (GOLDEN / "matmul.ir").read_text()


def test_parser_builds_the_same_ir() -> None:
    assert parse_function((GOLDEN / "matmul.ir").read_text()) == matmul_ir()


@pytest.mark.parametrize("path", GOLDEN_FILES, ids=lambda p: p.stem)
def test_text_ir_text_is_identity(path: Path) -> None:
    text = path.read_text()
    assert format_function(parse_function(text, path.name)) == text


@pytest.mark.parametrize("path", GOLDEN_FILES, ids=lambda p: p.stem)
def test_ir_text_ir_is_identity(path: Path) -> None:
    fn = parse_function(path.read_text())
    assert parse_function(format_function(fn)) == fn


def test_every_statement_form_round_trips() -> None:
    n = Affine.index("n")
    block = Block(
        "odd", (Index("n", 4), Index("m", 1, Affine.of({"p": 4}, -2)), Index("w", 3, n)),
        (Affine.of({"n": -2, "m": 1}, 5),),
        (Refinement("inout", "X", "Y", (n, Affine.constant(-1)),
                    TensorShape(dtypes.BFLOAT16, (Dim(1, 8), Dim(8, 1))), "max", "L1 cache"),
         Refinement("none", "", "T", (), TensorShape(dtypes.INT8, ()), location="stack")),
        (Load("$i", "T"), Load("$y", "Y", (None, "$i")), Load("$z", "Y", (None, None)),
         Load("$o", "Y", (), "$i"), Load("$q", "Y", (None, "$i"), "$i"),
         LoadIndex("$n", Affine.of({"n": 3, "m": -1}, 7)),
         Constant("$a", -0.0, F32), Constant("$b", float("inf"), F32),
         Constant("$c", -12, dtypes.INT64), Constant("$d", True, dtypes.BOOL),
         Constant("$e", 1e-30, dtypes.FLOAT64), Intrinsic("select", ("$d", "$a", "$b"), "$s", F32),
         Intrinsic("neg", ("$s",), "$t", F32), Store("Y", "$y"),
         Special("copy", ("T",), ("Y",), (("axis", "0"), ("note", 'a "quoted" value'))),
         Special("zero", (), ("T",)),
         Block("empty", comment="first line\n\n  indented line")),
        frozenset({"tile", "has space", "x.y-z"}), "")
    text = format_block(block)
    assert parse_block(text) == block
    assert format_block(parse_block(text)) == text
    assert '#"has space"' in text and "@\"L1 cache\"" in text
    assert "m = 4*p - 2" in text and "w:3 = n" in text
    assert "$y = load(Y[_, $i])" in text and "$z = load(Y[_, _])" in text
    assert "$o = load(Y + $i)" in text and "$q = load(Y[_, $i] + $i)" in text


def test_two_leading_digit_names_and_numbers() -> None:
    text = "block b [2LUT:3] (\n  -2LUT + 1 >= 0\n) {\n  $x = const(1e5, float32)\n}\n"
    block = parse_block(text)
    assert block.idxs == (Index("2LUT", 3),)
    assert block.constraints == (Affine.of({"2LUT": -1}, 1),)
    assert block.stmts == (Constant("$x", 1e5, F32),)


@pytest.mark.parametrize("text, where, message", [
    ("function f() {\n  block main () {\n    $x = load(A\n  }\n}\n", "4:3", "expected ')'"),
    ("function f() {\n  block main () {\n  }\n}\n}", "5:1", "expected end of input"),
    ("function f() {\n  block main (\n    in A[0] float33(4:1)\n  ) {\n  }\n}\n", "3:13",
     "unknown dtype 'float33'"),
    ("function f() {\n  block main (\n    in A[0] float32(4:1):sum\n  ) {\n  }\n}\n", "3:26",
     "unknown aggregation 'sum'"),
    ("function f() {\n  block main [i:4] (\n    i > 0\n  ) {\n  }\n}\n", "3:7",
     "unexpected character '>'"),
    ("function f() {\n  block main [i:4] (\n    i = 0\n  ) {\n  }\n}\n", "3:7",
     "expected '>='"),
    ("function f() {\n  block main [i:4] (\n    i >= 1\n  ) {\n  }\n}\n", "3:10",
     "expected '0'"),
    ("function f() {\n  block main () {\n    // a note\n    $x = const(1, int32)\n  }\n}\n",
     "4:5", "expected 'block' after a comment"),
    ("function f() {\n  block main () {\n    $x = const(1, int32) ?\n  }\n}\n", "3:26",
     "unexpected character '?'"),
    ("function f() {\n  block main [i] () {\n  }\n}\n", "2:16", "expected ':' and a range"),
])
def test_parse_errors_name_line_and_column(text: str, where: str, message: str) -> None:
    with pytest.raises(IRError) as info:
        parse_function(text, "bad.ir")
    assert message in info.value.message
    assert f"bad.ir:{where}" in str(info.value)
