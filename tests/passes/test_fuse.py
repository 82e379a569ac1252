"""fuse (polytile/passes/fuse.py), including localize: statements sharing the outer
parallel index become one row loop; temporaries used only there shrink to one row.
Golden text before and after, and the same results from the IR interpreter."""
from __future__ import annotations

import pytest

from polytile.bench.memorybound import BATCHNORM
from polytile.errors import ArgumentError
from polytile.ir import nodes as N
from polytile.ir.verify import verify
from polytile.passes.fuse import fuse

from .helpers import assert_same_meaning, check_pass, lowered, target

GENERIC = target("cpu-generic")

SOFTMAX = """
def softmax(float(N,C) X) -> (Y) {
  mx(n) max=! X(n,c)
  e(n,c) = exp(X(n,c) - mx(n))
  s(n) +=! e(n,c)
  Y(n,c) = e(n,c) / s(n)
}
"""


def top_blocks(fn: N.Function) -> list[N.Block]:
    return [s for s in fn.body.stmts if isinstance(s, N.Block)]


def test_softmax_becomes_one_row_loop_with_local_temporaries() -> None:
    before = lowered(SOFTMAX, {"X": (5, 13)})
    after = fuse(before, GENERIC, {})
    (fused,) = top_blocks(after)
    assert "fused" in fused.tags and len(fused.stmts) == 6
    local = [r for r in fused.refs if r.dir == "none"]
    # Declaration order, whatever the process's hash seed.
    assert [r.into for r in local] == ["mx", "e", "s"]
    assert all(r.location == "local" and r.shape.sizes[0] == 1 for r in local)
    assert not [r for r in after.body.refs if r.dir == "none"]
    check_pass("fuse_softmax", before, after)


def test_fcrelu_init_reduction_bias_relu_in_one_kernel() -> None:
    fcrelu = """
def fcrelu(float(B,I) in, float(O,I) weight, float(I) bias) -> (out) {
  out(i,j) = bias(j)
  out(b,o) += in(b,i) * weight(o,i)
  out(i,j) = fmaxf(out(i,j), 0)
}
"""
    before = lowered(fcrelu, {"in": (7, 5), "weight": (5, 5), "bias": (5,)})
    after = fuse(before, GENERIC, {})
    (fused,) = top_blocks(after)
    assert [m.name for m in fused.stmts if isinstance(m, N.Block)] == ["s0", "s1", "s2"]
    check_pass("fuse_fcrelu", before, after)


def test_layernorm_with_a_scalar_argument() -> None:
    layernorm = """
def layernorm(float(N,D) X, float(D) g, float(D) b, float eps) -> (Y) {
  mean(n) +=! X(n,d) / D
  xc(n,d) = X(n,d) - mean(n)
  var(n) +=! xc(n,d) * xc(n,d) / D
  Y(n,d) = xc(n,d) / sqrt(var(n) + eps) * g(d) + b(d)
}
"""
    before = lowered(layernorm, {"X": (4, 11), "g": (11,), "b": (11,)})
    after = fuse(before, GENERIC, {})
    assert len(top_blocks(after)) == 1
    check_pass("fuse_layernorm", before, after)


def test_transposed_read_is_not_fused() -> None:
    """Row i of the second statement reads column i of t, written by every row of the
    first: isl finds the conflict, and the statements stay apart (t stays global)."""
    source = """
def twice(float(N,N) X) -> (Y) {
  t(i,j) = X(i,j) * 2
  Y(i,j) = t(j,i) + X(i,j)
}
"""
    before = lowered(source, {"X": (6, 6)})
    after = fuse(before, GENERIC, {})
    assert after == before
    check_pass("fuse_blocked_by_transpose", before, after)


def test_batchnorm_normalizes_each_channel_in_its_statistics_loop() -> None:
    """The loop over channels computes mean and scale; the normalization, whose first
    index is n, joins it over its second index c (a side member), so each channel's
    images are read the third time while the caches hold them, and mean and scale
    shrink to one element per channel."""
    before = lowered(BATCHNORM, {"X": (3, 4, 5, 6), "gamma": (4,), "beta": (4,)})
    after = fuse(before, GENERIC, {})
    check_pass("fuse_batchnorm", before, after)
    (row,) = top_blocks(after)
    normalize = row.stmts[-1]
    assert isinstance(normalize, N.Block)
    assert [i.name for i in normalize.idxs] == ["c", "n", "h", "w"]
    assert normalize.idxs[0].affine == N.Affine.index("r")
    assert {r.into for r in row.refs if r.dir == "none"} == {"mean", "var", "scale"}


def test_a_side_member_needs_rows_of_runs_and_a_value_of_the_loop() -> None:
    """A statement that would write a column per row (a transpose), or that reads
    nothing the loop touches, keeps its own loop nest."""
    transpose = ("def f(float(N,M) X) -> (Y, T) {\n  s(j) +=! X(j,i)\n"
                 "  Y(j) = s(j) * 2\n  T(i,j) = X(j,i) * s(j)\n}\n")
    fused = fuse(lowered(transpose, {"X": (5, 7)}), GENERIC, {})
    assert ["fused" in b.tags for b in top_blocks(fused)] == [True, False]
    unrelated = ("def f(float(N,M) X, float(K,N,M) Z) -> (Y, T) {\n  Y(i) +=! X(i,j)\n"
                 "  T(k,i,j) = Z(k,i,j) * 3\n}\n")
    fused = fuse(lowered(unrelated, {"X": (5, 7), "Z": (2, 5, 7)}), GENERIC, {})
    assert ["fused" in b.tags for b in top_blocks(fused)] == [True, False]
    # The same statement reading the row sums joins the loop over i.
    related = unrelated.replace("Z(k,i,j) * 3", "Z(k,i,j) * Y(i)")
    fused = fuse(lowered(related, {"X": (5, 7), "Z": (2, 5, 7)}), GENERIC, {})
    assert ["fused" in b.tags for b in top_blocks(fused)] == [True]


def test_a_column_sum_over_the_rows_joins_the_row_loop() -> None:
    """Row sums over i (5 rows), then column sums over i: the column sums join the row
    loop with i as their row, adding into C from every row (aggregation add), and the
    statement that clears C moves in front of the loop."""
    source = """
def sums(float(M,N) X) -> (R, C) {
  t(i,j) = X(i,j) * X(i,j)
  R(i) +=! t(i,j)
  C(j) +=! X(i,j)
}
"""
    before = lowered(source, {"X": (5, 7)})
    after = fuse(before, GENERIC, {})
    blocks = top_blocks(after)
    assert [(b.name, b.idxs[0].range) for b in blocks] == [("s2_init", 7), ("fused_1", 5)]
    fused = blocks[1]
    assert [m.name for m in fused.stmts if isinstance(m, N.Block)] == [
        "s0", "s1_init", "s1", "s2"]
    assert fused.ref("C").agg == "add" and fused.ref("R").agg == "assign"
    check_pass("fuse_column_sum", before, after)


def test_a_column_sum_larger_than_a_quarter_of_L1_keeps_its_own_loop_nest() -> None:
    """Each thread would hold a private copy of the column sums: past a quarter of L1
    (16 KiB here) they stay a separate nest."""
    source = """
def sums(float(M,N) X) -> (R, C) {
  R(i) +=! X(i,j)
  C(j) +=! X(i,j)
}
"""
    before = lowered(source, {"X": (3, 5000)})
    after = fuse(before, GENERIC, {})
    assert [b.name for b in top_blocks(after)] == ["fused_0", "s1_init", "s1"]


def test_a_statement_that_reads_column_sums_runs_after_the_row_loop() -> None:
    """Column sums are complete only after every row: their reader does not join."""
    source = """
def sums(float(M,N) X) -> (R, C) {
  R(i) +=! X(i,j)
  C(j) +=! X(i,j)
  D(i, j) = X(i, j) - C(j)
}
"""
    before = lowered(source, {"X": (3, 5)})
    after = fuse(before, GENERIC, {})
    assert [b.name for b in top_blocks(after)] == ["s1_init", "fused_1", "s2"]


MMRELU = """
def mmrelu(float(M,K) A, float(K,N) B) -> (C) {
  C(m,n) +=! A(m,k) * B(k,n)
  C(m,n) = fmaxf(C(m,n), 0)
}
"""


def test_weights_shared_by_every_row_keep_their_own_loop_nest() -> None:
    """A contraction whose shared input is larger than the L1 budget is not fusible."""
    before = lowered(MMRELU, {"A": (3, 128), "B": (128, 96)})   # B: 48 KiB > 16 KiB
    after = fuse(before, GENERIC, {})
    assert not any("fused" in b.tags for b in top_blocks(after))


def test_an_init_stays_beside_a_contraction_that_keeps_its_own_loop_nest() -> None:
    """A gradient's row loop (d_H) is followed by the init of d_X and its contraction,
    whose weights exceed the L1 budget: the init does not join the row loop (it shares
    nothing with it), so pass fold can make it the contraction's first writes."""
    grad = """
def g(float(B,N) H, float(B,N) dY, float(N,M) W) -> (dX) {
  dH(b,n) = H(b,n) > 0 ? dY(b,n) : 0
  dX(b,m) +=! dH(b,n) * W(n,m)
}
"""
    before = lowered(grad, {"H": (3, 128), "dY": (3, 128), "W": (128, 96)})
    after = fuse(before, GENERIC, {})
    assert [b.name for b in top_blocks(after)] == ["s0", "s1_init", "s1"]
    small = lowered(grad, {"H": (3, 8), "dY": (3, 8), "W": (8, 9)})     # W fits: all fuse
    (fused,) = top_blocks(fuse(small, GENERIC, {}))
    assert [m.name for m in fused.stmts if isinstance(m, N.Block)] == ["s0", "s1_init", "s1"]


def test_strategy_max_fuses_the_contraction_too() -> None:
    """max fusion ignores the L1 budget: init, contraction and relu become one row loop."""
    before = lowered(MMRELU, {"A": (3, 130), "B": (130, 97)})
    after = fuse(before, GENERIC, {"strategy": "max"})
    blocks = top_blocks(after)
    assert [b.name for b in blocks] == ["fused_0"]
    assert [m.name for m in blocks[0].stmts if isinstance(m, N.Block)] == ["s0_init", "s0", "s1"]
    check_pass("fuse_max_mmrelu", before, after)


def test_one_row_that_assigns_and_scatters_into_a_buffer_fuses_without_adding() -> None:
    """With a size of 1, a member whose row index its output ignores (the scatter's k)
    writes no other row's elements; the fused view is not an add over rows, which the
    assigning member inside it would contradict (a gradient fuzz find, seed 104)."""
    source = ("def f(float(N) A, float(3, N) P) -> (D) {\n"
              "  D(i) = A(i) where i in 0:N\n"
              "  D(2 * i) += P(j, k) where j in 0:3, k in 0:N, i in 0:((N + 1) / 2)\n}\n")
    before = lowered(source, {"A": (1,), "P": (3, 1)})
    after = fuse(before, target("cpu-avx2"), {"strategy": "max"})
    [fused] = [s for s in after.body.stmts if isinstance(s, N.Block) and "fused" in s.tags]
    assert {r.into: r.agg for r in fused.refs}["D"] == "assign"
    verify(after)
    assert_same_meaning(before, after)


def test_unknown_strategy_is_an_argument_error() -> None:
    with pytest.raises(ArgumentError, match="fuse.strategy must be one of rows, max, none"):
        fuse(lowered(SOFTMAX, {"X": (5, 13)}), GENERIC, {"strategy": "maximal"})


def test_strategy_none_changes_nothing() -> None:
    before = lowered(SOFTMAX, {"X": (5, 13)})
    assert fuse(before, GENERIC, {"strategy": "none"}) is before
