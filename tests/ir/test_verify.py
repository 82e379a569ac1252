"""The verifier accepts the golden IR and rejects each broken rule with a message naming
the block and the buffer."""
from __future__ import annotations

from pathlib import Path

import pytest

from polytile.errors import IRError
from polytile.ir.parser import parse_function
from polytile.ir.verify import verify

GOLDEN = Path(__file__).parents[1] / "golden" / "ir"


def golden(name: str) -> str:
    return (GOLDEN / f"{name}.ir").read_text()


def edited(name: str, old: str, new: str) -> str:
    text = golden(name)
    assert text.count(old) == 1, f"{old!r} must occur once in {name}.ir"
    return text.replace(old, new)


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("*.ir")), ids=lambda p: p.stem)
def test_accepts_golden_ir(path: Path) -> None:
    verify(parse_function(path.read_text()))


def test_accepts_tiles_that_fit_only_thanks_to_the_parents_constraint() -> None:
    # The kernel's rows reach 4*i1 + 3, which is 11 > 9 for i1 = 2, unless the tile's
    # own constraint drops that tile's last rows; with it the view fits.
    text = edited("tiled_matmul", "      block kernel [i0:4, j:3, k:5, i = 4*i1] #contraction (\n"
                  "        -i - i0 + 9 >= 0\n",
                  "      block kernel [i0:4, j:3, k:5, i = 4*i1] #contraction (\n")
    text = text.replace("block tile [i1:3, j1:2] #tile (\n",
                        "block tile [i1:3, j1:2] #tile (\n      -i1 + 1 >= 0\n")
    verify(parse_function(text))


BAD = {
    "undeclared buffer in a load": (
        "matmul", "$b = load(B)", "$b = load(D)",
        "block main/kernel: load into $b names buffer D, which the block does not declare"),
    "child view of an undeclared parent buffer": (
        "matmul", "in B <- B[k, j]", "in B <- D[k, j]",
        "block main/kernel: refinement B <- D: the parent block main declares no buffer D"),
    "assign aggregation written by several iterations": (
        "matmul", "float32(1:3, 1:1):add", "float32(1:3, 1:1)",
        ("block main/kernel: iterations (i=0, j=0, k=0) and (i=0, j=0, k=1) both write "
         "element [0, 0] of C, whose aggregation is assign")),
    "assign aggregation written by several tiles": (
        "tiled_matmul", "out C <- C[0, 3*j1] float32(10:6, 3:1)",
        "out C <- C[0, 0] float32(10:6, 3:1)",
        ("block main/tile: iterations (i1=0, j1=0) and (i1=0, j1=1) both write element [0, 0] "
         "of C")),
    "child view outside its parent": (
        "matmul", "out C <- C[i, j] float32(1:3, 1:1)\n",
        "out C <- C[i, j + 1] float32(1:3, 1:1)\n",
        ("block main/init: view C <- C spans 3..3 in dimension 1, outside the parent's 0..2, "
         "at i=0, j=2")),
    "tail tile outside its parent without the constraint": (
        "tiled_matmul", "        -i - i0 + 9 >= 0\n", "",
        ("block main/tile/kernel: view A <- A spans 10..10 in dimension 0, outside the "
         "parent's 0..9, at tile.i1=2, tile.j1=0, i0=2, j=0, k=0, i=8")),
    "store to an in refinement": (
        "gather", "      Y = store($x)", "      X = store($x)",
        "block main/kernel: store of $x writes X, which is an `in` refinement"),
    "child writes a parent's in buffer": (
        "gather", "in I <- I[i] int32(1:1)", "inout I <- I[i] int32(1:1)",
        "block main/kernel: refinement I writes (inout) the parent's `in` buffer I"),
    "scalar used before it is defined": (
        "matmul", "$p = mul($a, $b) : float32", "$p = mul($a, $q) : float32",
        "block main/kernel: mul into $p uses scalar $q before it is defined"),
    "scalar assigned twice": (
        "matmul", "$b = load(B)", "$a = load(B)",
        "block main/kernel: scalar $a is assigned twice"),
    "parent index not passed in": (
        "tiled_matmul", "in B <- B[k, j] float32(1:6, 1:1)",
        "in B <- B[k, j + j1] float32(1:6, 1:1)",
        ("block main/tile/kernel: the offset of B uses j1, which is not one of the block's "
         "indices")),
    "passed index over unknown names": (
        "tiled_matmul", "i = 4*i1]", "i = 4*i2]",
        ("block main/tile/kernel: the value of index i uses i2, which is not one of the "
         "parent's indices")),
    "store of the wrong dtype": (
        "gather", "      Y = store($x)", "      Y = store($n)",
        "block main/kernel: store of int32 scalar $n into float32 buffer Y"),
    "float dynamic offset": (
        "gather", "$x = load(X[$n, _])", "$x = load(X[$n, $n])\n      $f = load(X[$x, _])",
        "block main/kernel: load of X has a non-integer dynamic offset"),
    "strides differ from the parent's": (
        "matmul", "in A <- A[i, k] float32(1:7, 1:1)", "in A <- A[i, k] float32(1:1, 1:7)",
        "block main/kernel: refinement A has strides [1, 7] but its parent A has [7, 1]"),
    "rank differs from the parent's": (
        "gather", "in I <- I[i] int32(1:1)", "in I <- I[i, 0] int32(1:1, 1:1)",
        ("block main/kernel: refinement I is int32 of rank 2 but its parent I is int32 of "
         "rank 1")),
    "aggregation that differs from a non-assign parent": (
        "normalize_rows", "none T[0] float32(1:1) @stack", "none T[0] float32(1:1):max @stack",
        ("block main/row/sum: refinement T aggregates with add inside the parent's T, "
         "which aggregates with max")),
    "read of an element another iteration writes": (
        "normalize_rows", "        $x = load(X)\n        T = store($x)",
        "        $x = load(X)\n        $t = load(T)\n        T = store($x)",
        "block main/row/sum: iteration (j=1) reads element [0] of T that iteration (j=0) writes"),
    "nested block that is not an allocation has no parent buffer": (
        "gather", "in I <- I[i] int32(1:1)", "in I[0] int32(1:1)",
        ("block main/kernel: refinement I has no parent buffer, so it must be a local "
         "allocation (`none`), not `in`")),
    "comparison that does not give bool": (
        "matmul", "$p = mul($a, $b) : float32", "$p = lt($a, $b) : float32",
        "block main/kernel: lt gives bool, not float32"),
    "unknown intrinsic": (
        "matmul", "$p = mul($a, $b) : float32", "$p = fused($a, $b) : float32",
        "block main/kernel: unknown intrinsic 'fused'"),
    "special writing an in buffer": (
        "normalize_rows", "special zero() -> (T)", "special zero() -> (X)",
        "block main/row: special zero writes X, which is an `in` refinement"),
    "parameters differ from the top-level buffers": (
        "matmul", "function matmul(A, B, C)", "function matmul(A, C)",
        ("function matmul: parameters ['A', 'C'] differ from the top-level in/out/inout "
         "refinements ['A', 'B', 'C']")),
    "float flat offset": (
        "pointer_increments", "$x = load(X + $t)", "$f = cast($t) : float32\n      $x = load(X + $f)",
        "block main/kernel: load of X has a non-integer offset $f (float32)"),
    "flat offset used before it is defined": (
        "pointer_increments", "$x = load(X + $t)", "$x = load(X + $u)",
        "block main/kernel: load of X uses scalar $u before it is defined"),
    "flat offset into an empty view": (
        "pointer_increments", "in X <- X[i] float32(4:1)", "in X <- X[i] float32(0:1)",
        "block main/kernel: load of X + $t from an empty view"),
    "duplicate index": (
        "matmul", "block kernel [i:5, j:3, k:7]", "block kernel [i:5, j:3, i:7]",
        "block main/kernel: index i is declared twice"),
}


@pytest.mark.parametrize("case", sorted(BAD), ids=lambda c: c.replace(" ", "_"))
def test_rejects(case: str) -> None:
    name, old, new, message = BAD[case]
    fn = parse_function(edited(name, old, new))
    with pytest.raises(IRError) as info:
        verify(fn)
    assert message in info.value.message
