"""tile (polytile/passes/tile.py): one block -> tiles over an inner block, golden text
before and after, and the same results from the IR interpreter on random data."""
from __future__ import annotations

from collections.abc import Mapping

import pytest

from polytile.ir import nodes as N
from polytile.ir.printer import format_function
from polytile.ir.verify import verify
from polytile.passes.tile import tile

from .helpers import (
    assert_same_meaning,
    block,
    check_pass,
    check_round_trip,
    lowered,
    parent_sizes,
    with_block,
)

MM = """
def mm(float(M,K) A, float(K,N) B) -> (C) {
  C(m,n) +=! A(m,k) * B(k,n)
}
"""


def tiled(fn: N.Function, name: str, sizes: Mapping[str, int]) -> N.Function:
    return with_block(fn, name, tile(block(fn, name), sizes, parent_sizes(fn.body)))


def test_matmul_with_tiles_that_do_not_divide() -> None:
    """10x9 outputs, k:7, tiles 4x4x3: every tiled dimension overflows, so the outer
    views keep the whole tensor and the inner block carries the overflow constraints."""
    before = lowered(MM, {"A": (10, 7), "B": (7, 9)})
    after = tiled(before, "s0", {"m": 4, "n": 4, "k": 3})
    inner = block(after, "s0").stmts[0]
    assert isinstance(inner, N.Block)
    assert len(inner.constraints) == 3
    check_pass("tile_matmul_overflow", before, after)


def test_matmul_with_tiles_that_divide() -> None:
    """8x6 outputs, tiles 4x3: the outer views narrow to one tile, no constraints; the
    reduction index k is not tiled and stays in the inner block only."""
    before = lowered(MM, {"A": (8, 5), "B": (5, 6)})
    after = tiled(before, "s0", {"m": 4, "n": 3})
    outer = block(after, "s0")
    assert [i.name for i in outer.idxs] == ["m_t", "n_t"]
    assert {r.shape.sizes for r in outer.refs} == {(4, 3), (4, 5), (5, 3)}
    inner = outer.stmts[0]
    assert isinstance(inner, N.Block) and not inner.constraints
    # The initializing block is tiled the same way.
    after = tiled(after, "s0_init", {"m": 4, "n": 3})
    check_pass("tile_matmul_dividing", before, after)


def test_tile_of_a_tile() -> None:
    """Tiling the inner block of a non-dividing tiling again: the inner indices are
    constrained, so the second level keeps whole views and substitutes the constraint."""
    before = lowered(MM, {"A": (11, 6), "B": (6, 13)})
    once = tile(block(before, "s0"), {"m": 8, "n": 8}, parent_sizes(before.body), suffix="_c")
    inner = once.stmts[0]
    assert isinstance(inner, N.Block)
    twice = N.Block(once.name, once.idxs, once.constraints, once.refs,
                    (tile(inner, {"m": 3, "n": 4}, parent_sizes(once), suffix="_r",
                          outer_tags=frozenset({"regtiles"})),), once.tags)
    after = with_block(before, "s0", twice)
    check_pass("tile_twice", before, after)


def test_negative_and_strided_subscripts() -> None:
    """B(i) = A(N - 1 - i): a dividing tile of a reversed access starts its view at the
    lowest element it touches; Y(i) = X(3i + 1) with a non-dividing tile keeps X whole."""
    flip = lowered("def flip(float(N) A) -> (B) {\n  B(i) = A(N - 1 - i)\n}\n", {"A": (12,)})
    check_pass("tile_reversed_access", flip, tiled(flip, "s0", {"i": 4}))
    sliced = lowered("def slice3(float(N) X) -> (Y) {\n  Y(i) = X(3 * i + 1)\n}\n",
                     {"X": (23,)})
    check_pass("tile_strided_access", sliced, tiled(sliced, "s0", {"i": 3}))


def test_index_values_follow_the_split() -> None:
    """`index(i)` in the body means the original i, i.e. 5*i_t + i after tiling."""
    before = lowered("def iota(int32(N) A) -> (B) {\n  B(i) = A(i) + 2 * i\n}\n", {"A": (13,)})
    after = tiled(before, "s0", {"i": 5})
    assert "$i = index(i + 5*i_t)" in format_function(after)
    check_pass("tile_index_values", before, after)


def test_gather_keeps_the_gathered_dimension_whole() -> None:
    before = lowered("def gather(float(N) X, int(A,B) I) -> (Z) {\n  Z(i,j) = X(I(i,j))\n}\n",
                     {"X": (7,), "I": (5, 6)})
    after = tiled(before, "s0", {"i": 2, "j": 4})
    check_pass("tile_gather", before, after, int_high={"I": 7})


def test_sizes_at_least_the_range_leave_the_block_alone() -> None:
    before = lowered(MM, {"A": (3, 2), "B": (2, 4)})
    kernel = block(before, "s0")
    assert tile(kernel, {"m": 3, "n": 9}, parent_sizes(before.body)) is kernel
    assert tile(kernel, {}, parent_sizes(before.body)) is kernel


@pytest.mark.parametrize("sizes", [{"m": 1}, {"k": 1}, {"m": 2, "n": 1, "k": 2}])
def test_unit_tiles(sizes: dict[str, int]) -> None:
    before = lowered(MM, {"A": (3, 5), "B": (5, 4)})
    after = tiled(before, "s0", sizes)
    verify(after)
    check_round_trip(after)
    assert_same_meaning(before, after)
