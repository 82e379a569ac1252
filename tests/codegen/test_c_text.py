"""The generated text itself: golden output, and no source name reaching C unchecked.

To accept a deliberate change of the golden text, run with POLYTILE_UPDATE_GOLDEN=1
and review the diff.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest
from c_harness import CKernel, aff, needs_cc, param, rand, view

from polytile import dtypes as D
from polytile.codegen import COptions, generate_c
from polytile.errors import IRError
from polytile.ir.nodes import Block, Constant, Function, Index, Intrinsic, Load, Refinement, Store

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "c"


def scaled_gather() -> Function:
    """Y(i) = 0; Y(i) += A(I(i)) * s, with a 0-d scalar s."""
    a, idx, s, y = (param("in", "A", D.FLOAT32, (5,)), param("in", "I", D.INT32, (3,)),
                    param("in", "s", D.FLOAT32, ()), param("out", "Y", D.FLOAT32, (3,)))
    init = Block("init", (Index("i", 3),), (), (view(y, "y", ("i",), "out"),),
                 (Constant("$zero", 0.0, D.FLOAT32), Store("y", "$zero")))
    body = Block("gather", (Index("i", 3),), (),
                 (view(idx, "ix", ("i",)), view(a, "a", (0,), sizes=(5,)),
                  Refinement("in", "s", "s", (), s.shape), view(y, "y", ("i",), "out", "add")),
                 (Load("$k", "ix"), Load("$a", "a", ("$k",)), Load("$s", "s"),
                  Intrinsic("mul", ("$a", "$s"), "$p", D.FLOAT32), Store("y", "$p")))
    return Function("scaled_gather", ("A", "I", "s", "Y"),
                    Block("main", refs=(a, idx, s, y), stmts=(init, body)))


def test_golden_c_text():
    text = generate_c(scaled_gather()).text
    path = GOLDEN / "scaled_gather.c"
    if os.environ.get("POLYTILE_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), "generated C changed; see the module docstring"


def test_generation_is_deterministic():
    assert generate_c(scaled_gather()).text == generate_c(scaled_gather()).text


@needs_cc
def test_golden_function_runs(tmp_path):
    kernel = CKernel(scaled_gather(), tmp_path)
    rng = np.random.default_rng(3)
    a, idx, s = rand(rng, np.float32, (5,)), np.array([4, 0, 2], np.int32), np.float32(1.5)
    y = np.full(3, 7, np.float32)
    assert kernel(a, idx, np.array(s), y)[0] == 0
    np.testing.assert_allclose(y, a[idx] * s, rtol=1e-6)


EVIL = ['*/ system("rm -rf /"); /*', "a\nb", "x */ #include <evil.h>", "??/", "é", "-1"]


def evil_function(names: list[str]) -> Function:
    """Every name in the IR taken from `names`: function, buffers, indices, scalars, block."""
    fname, bx, by, index, scalar, block, vx, vy = (names * 8)[:8]
    vy = vy + "_out"
    x, y = param("in", bx, D.FLOAT32, (4,)), param("out", by + "2", D.FLOAT32, (4,))
    blk = Block(block, (Index(index, 4),), (aff({index: -1}, 3),),
                (view(x, vx, (index,)), view(y, vy, (index,), "out")),
                (Load("$" + scalar, vx), Intrinsic("neg", ("$" + scalar,), "$" + scalar + "n",
                                                     D.FLOAT32),
                 Store(vy, "$" + scalar + "n")))
    return Function(fname, (x.into, y.into), Block(block + "main", refs=(x, y), stmts=(blk,)))


@needs_cc
@pytest.mark.parametrize("shift", range(len(EVIL)))
def test_source_names_never_reach_c_unchecked(tmp_path, shift):
    names = EVIL[shift:] + EVIL[:shift]
    fn = evil_function(names)
    kernel = CKernel(fn, tmp_path)
    text = kernel.source.text
    for name in EVIL:
        assert name not in text
    # Comments hold only [A-Za-z0-9_] and our own punctuation; none can end early.
    for comment in re.findall(r"/\*(.*?)\*/", text, re.DOTALL):
        assert "/*" not in comment
    assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", kernel.source.symbol)
    x = rand(np.random.default_rng(0), np.float32, (4,))
    y = np.zeros(4, np.float32)
    assert kernel(x, y)[0] == 0
    np.testing.assert_array_equal(y, -x)


def test_symbol_is_validated():
    fn = scaled_gather()
    assert generate_c(fn, COptions(symbol="my_kernel")).symbol == "my_kernel"
    assert "int32_t my_kernel(void **args, int64_t *err)" in generate_c(
        fn, COptions(symbol="my_kernel")).text
    for bad in ("1abc", "a-b", "x; evil()", ""):
        with pytest.raises(IRError):
            generate_c(fn, COptions(symbol=bad))
