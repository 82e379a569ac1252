"""fuse with a fusion plan's groups (option fuse.groups, polytile.graph's decision):
the pass builds exactly those kernels, in the plan's order, and refuses a plan it
cannot build. Golden text before and after, then the IR interpreter on random data."""
from __future__ import annotations

import pytest

from polytile.errors import ArgumentError
from polytile.ir import nodes as N
from polytile.passes.fuse import fuse, fusible_group, row_loop
from polytile.passes.pipeline import check_pass_options

from .helpers import check_pass, lowered, target

GENERIC = target("cpu-generic")
OPENCL = target("opencl")         # no OpenMP region: nothing to stitch phases in

# 0 and 2 share rows; 1 is a column sum. The plan fuses 0 with 2 across 1.
SPLIT = """
def split(float(N,D) X, float(N) w) -> (A, c, B) {
  A(n,d) = X(n,d) * 2
  c(d) +=! X(n,d)
  B(n,d) = A(n,d) + w(n)
}
"""

# Different row extents: N rows, then D rows.
SHAPES = """
def shapes(float(N,D) X) -> (A, T) {
  A(n,d) = X(n,d) * 2
  T(d,n) = X(n,d)
}
"""


def top_blocks(fn: N.Function) -> list[N.Block]:
    return [s for s in fn.body.stmts if isinstance(s, N.Block)]


def test_plan_groups_fuse_across_a_statement_and_keep_the_plans_order() -> None:
    before = lowered(SPLIT, {"X": (7, 5), "w": (7,)})
    after = fuse(before, GENERIC, {"groups": [[0, 2], [1]]})
    names = [b.name for b in top_blocks(after)]
    assert names == ["fused_0", "s1_init", "s1"]
    assert [m.name for m in top_blocks(after)[0].stmts] == ["s0", "s2"]
    check_pass("fuse_plan_split", before, after)


def test_singleton_groups_are_fusion_off_in_the_plans_order() -> None:
    before = lowered(SPLIT, {"X": (7, 5), "w": (7,)})
    after = fuse(before, GENERIC, {"groups": [[1], [0], [2]]})
    assert [b.name for b in top_blocks(after)] == ["s1_init", "s1", "s0", "s2"]


def test_fusible_group_says_what_the_pass_can_build() -> None:
    fn = lowered(SHAPES, {"X": (7, 5)})
    assert not row_loop(fn, GENERIC, [0, 1])
    assert fusible_group(fn, GENERIC, [0, 1])         # stitched in one OpenMP region
    assert not fusible_group(fn, OPENCL, [0, 1])
    split = lowered(SPLIT, {"X": (7, 5), "w": (7,)})
    assert row_loop(split, GENERIC, [0, 2]) and fusible_group(split, OPENCL, [0, 2])


def test_a_group_that_is_not_one_row_loop_is_stitched_on_a_cpu() -> None:
    fn = lowered(SHAPES, {"X": (7, 5)})
    after = fuse(fn, GENERIC, {"groups": [[0, 1]]})
    [stitched] = top_blocks(after)
    assert "stitched" in stitched.tags
    assert [m.name for m in stitched.stmts] == ["s0", "s1"]


def test_a_group_that_is_not_one_row_loop_is_refused_without_openmp() -> None:
    fn = lowered(SHAPES, {"X": (7, 5)})
    with pytest.raises(ArgumentError, match="do not fuse into one row loop"):
        fuse(fn, OPENCL, {"groups": [[0, 1]]})


def test_a_plan_must_name_every_statement_once() -> None:
    fn = lowered(SPLIT, {"X": (7, 5), "w": (7,)})
    with pytest.raises(ArgumentError, match="must name every statement"):
        fuse(fn, GENERIC, {"groups": [[0, 2]]})
    with pytest.raises(ArgumentError, match="must name every statement"):
        fuse(fn, GENERIC, {"groups": [[0, 2], [1, 2]]})


def test_strategy_plan_without_groups_is_refused() -> None:
    fn = lowered(SPLIT, {"X": (7, 5), "w": (7,)})
    with pytest.raises(ArgumentError, match="needs the plan's groups"):
        fuse(fn, GENERIC, {"strategy": "plan"})


def test_malformed_groups_option_is_refused_before_the_pass_runs() -> None:
    with pytest.raises(ArgumentError, match="fuse.groups must be a list"):
        check_pass_options({"fuse.groups": [[0, "1"]]}, GENERIC)
    with pytest.raises(ArgumentError, match="fuse.groups must be a list"):
        check_pass_options({"fuse.groups": [[]]}, GENERIC)
