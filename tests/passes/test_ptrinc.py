"""ptrinc (polytile/passes/ptrinc.py): a contraction with data-dependent or several
reduction subscripts reads its operands through a table of per-step element offsets,
built (and bounds-checked) once before it. Golden text before and after, the same
results from the IR interpreter, the same errors for out-of-range data, and the
kernels it must leave alone."""
from __future__ import annotations

import numpy as np
import pytest

from polytile.errors import KernelError
from polytile.ir import nodes as N
from polytile.passes.fuse import fuse
from polytile.passes.ptrinc import parallel_parts, ptrinc, reduction_indices

from .helpers import assert_same_meaning, block, check_pass, lowered, random_buffers, run, target

AVX512 = target("cpu-avx512")
GENERIC = target("cpu-generic")

# Shifts in [0, 2] (the random test data), so the where clauses keep every read inside I.
SHIFT = """def shift(float(N,C,H,W) I, int(C) SH, int(C) SW, float(O,C) Wt) -> (Out) {
  Out(n,o,h,w) +=! I(n, c, h + SH(c), w + SW(c)) * Wt(o,c) where h in 0:H-2, w in 0:W-2
}
"""
# Shifts in [-1, 1], the shift convolution of the paper (Wu et al.).
SHIFT_CENTERED = SHIFT.replace("h + SH(c), w + SW(c)", "h + 1 + SH(c), w + 1 + SW(c)")
CONV = """def conv(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) {
  O(n,f,h,w) +=! I(n,c,h + kh,w + kw) * Wt(f,c,kh,kw)
}
"""
# Sparse filters (the paper's last example): the taps come from data.
SPARSE = """def sparse(float(N,C,H,W) I, int(X) DH, int(X) DW, float(K,C,X) Wt) -> (O) {
  O(n,k,h,w) +=! I(n, c, h + DH(x), w + DW(x)) * Wt(k,c,x) where h in 0:H-2, w in 0:W-2
}
"""
SHIFT_SHAPES = {"I": (2, 5, 7, 6), "SH": (5,), "SW": (5,), "Wt": (3, 5)}
INT_HIGH = {"SH": 3, "SW": 3, "DH": 3, "DW": 3}


def test_shift_convolution_reads_through_a_table() -> None:
    before = lowered(SHIFT, SHIFT_SHAPES)
    after = ptrinc(before, AVX512, {})
    names = [s.name for s in after.body.stmts if isinstance(s, N.Block)]
    assert names == ["s0_init", "s0_bounds", "s0_steps", "s0"]
    (table,) = [r for r in after.body.refs if r.dir == "none"]
    assert table.shape.sizes == (5,) and table.shape.dtype.name == "int64"
    kernel = block(after, "s0")
    # One reduction index: it stays; the gather and its subscript arithmetic are gone.
    assert [i.name for i in kernel.idxs] == ["n", "o", "h", "w", "c"]
    assert not any(isinstance(s, N.Load) and s.dynamic for s in kernel.stmts)
    assert not any(isinstance(s, N.LoadIndex) for s in kernel.stmts)
    assert kernel.ref("I").shape.sizes == (1, 5, 3, 3)     # the window around (n, h, w)
    check_pass("ptrinc_shift", before, after, int_high=INT_HIGH)


def test_convolution_flattens_its_reduction() -> None:
    before = lowered(CONV, {"I": (2, 3, 7, 6), "Wt": (5, 3, 3, 2)})
    after = ptrinc(before, AVX512, {})
    kernel = block(after, "s0")
    assert [i.name for i in kernel.idxs] == ["n", "f", "h", "w", "c_kh_kw"]
    assert kernel.index("c_kh_kw").range == 3 * 3 * 2
    # I needs a table; Wt's step is the flat index itself (c, kh, kw is its memory order).
    (table,) = [r for r in after.body.refs if r.dir == "none"]
    assert table.into == "s0_I_steps"
    steps = {s.into: s for s in kernel.stmts if isinstance(s, N.LoadIndex)}
    assert steps["$Wt_step"].value == N.Affine.index("c_kh_kw")
    assert "s0_bounds" not in [s.name for s in after.body.stmts if isinstance(s, N.Block)]
    check_pass("ptrinc_conv", before, after)


def test_table_of_a_fused_row_is_private_to_the_row() -> None:
    before = fuse(lowered(SPARSE, {"I": (2, 3, 7, 6), "DH": (4,), "DW": (4,),
                                   "Wt": (5, 3, 4)}), AVX512, {"strategy": "rows"})
    after = ptrinc(before, AVX512, {})
    (row,) = [s for s in after.body.stmts if isinstance(s, N.Block)]
    assert "fused" in row.tags
    assert [r.into for r in row.refs if r.dir == "none"] == ["s0_I_steps"]
    assert [s.name for s in row.stmts if isinstance(s, N.Block)] == [
        "s0_init", "s0_bounds", "s0_steps", "s0"]
    check_pass("ptrinc_sparse_fused", before, after, int_high=INT_HIGH)


@pytest.mark.parametrize("source, shapes", [
    (SHIFT_CENTERED, {"I": (3, 4, 9, 11), "SH": (4,), "SW": (4,), "Wt": (5, 4)}),
    (SPARSE.replace("h + DH(x), w + DW(x)", "h + 1 + DH(x), w + 1 + DW(x)"),
     {"I": (2, 3, 6, 9), "DH": (5,), "DW": (5,), "Wt": (4, 3, 5)}),
])
def test_negative_shifts_and_out_of_range_ones_fail_the_same_way(source, shapes) -> None:
    before = lowered(source, shapes)
    after = ptrinc(before, AVX512, {})
    assert "ptrinc" in {t for s in after.body.stmts if isinstance(s, N.Block) for t in s.tags}
    shift_names = [n for n in ("SH", "SW", "DH", "DW") if n in shapes]
    for seed in range(3):
        rng = np.random.default_rng(seed)
        buffers = random_buffers(before, rng)
        for name in shift_names:
            buffers[name] = rng.integers(-1, 2, shapes[name]).astype(np.int32)
        want, got = run(before, buffers), run(after, buffers)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5)
    for name, bad in [(shift_names[0], 2), (shift_names[1], -2), (shift_names[1], 40)]:
        broken = dict(buffers)
        broken[name] = buffers[name].copy()
        broken[name][1] = bad
        dim = 2 if name in ("SH", "DH") else 3
        for fn in (before, after):
            with pytest.raises(KernelError, match=f"in dimension {dim} of I"):
                run(fn, broken)


def test_splits_subscripts_into_parallel_and_reduction_parts() -> None:
    kernel = block(lowered(SHIFT_CENTERED, SHIFT_SHAPES), "s0")
    assert reduction_indices(kernel) == ["c"]
    parts = parallel_parts(kernel, {"n", "o", "h", "w"})
    dynamic = next(s for s in kernel.stmts if isinstance(s, N.Load) and s.dynamic)
    _, _, y, x = dynamic.dynamic
    assert parts[y] == N.Affine.index("h") and parts[x] == N.Affine.index("w")
    assert parts["$SH"] == N.Affine()
    assert parts["$I"] is None          # the gathered value depends on h and w


@pytest.mark.parametrize("source, shapes", [
    # One reduction index and no gather: nothing to precompute.
    ("def tmm(float(M,K) A, float(N,K) B) -> (C) {\n  C(m,n) +=! A(m,k) * B(n,k)\n}\n",
     {"A": (7, 5), "B": (3, 5)}),
    # The gathered row depends on a parallel index: no per-step table.
    ("def lut(float(E,D) L, int(B,K) I) -> (O) {\n  O(i,j) +=! L(I(i,k), j)\n}\n",
     {"L": (5, 3), "I": (4, 6)}),
    # A shift scaled by data: the parallel part is not affine.
    ("def f(float(H) X, int(C) S, int(1) A) -> (Y) {\n"
     + "  Y(h) +=! X(A(0) * h + S(c)) where h in 0:H-4\n}\n",
     {"X": (11,), "S": (3,), "A": (1,)}),
    # The reduction index is data, not only a subscript.
    ("def g(float(M,K,L) A) -> (Y) {\n  Y(m) +=! A(m,k,l) * k\n}\n", {"A": (3, 4, 5)}),
    # Gathered rows read along a long unit-stride reduction index: l stays the vector
    # index, with its row checked once per vector as today.
    ("def rows(float(E,L) X, int(K) J, float(M) V) -> (Y) {\n"
     + "  Y(m) +=! X(J(k), l) * V(m)\n}\n", {"X": (5, 40), "J": (7,), "V": (3,)}),
    # A row sum over contiguous (h, w): w would be the vector index; keep it.
    ("def rsum(float(N,H,W) X) -> (S) {\n  S(n) +=! X(n,h,w)\n}\n", {"X": (3, 5, 40)}),
])
def test_leaves_kernels_where_it_does_not_apply_or_pay(source, shapes) -> None:
    before = lowered(source, shapes)
    assert ptrinc(before, AVX512, {}) == before


def test_options_disable_it_and_bound_the_tables() -> None:
    before = lowered(SHIFT, SHIFT_SHAPES)
    assert ptrinc(before, AVX512, {"enabled": False}) is before
    assert ptrinc(before, AVX512, {"max_table_bytes": 39}) == before       # 5 steps * 8 bytes
    assert ptrinc(before, AVX512, {"max_table_bytes": 40}) != before
    conv = lowered(CONV, {"I": (2, 3, 7, 6), "Wt": (5, 3, 3, 2)})
    assert ptrinc(conv, AVX512, {"min_indices": 4}) == conv
    assert ptrinc(conv, GENERIC, {}) != conv


def test_runs_before_autotile_in_the_shipped_targets() -> None:
    for name in ("cpu-avx512", "cpu-avx2", "cpu-generic"):
        order = [p for p, _ in target(name).passes]
        assert order.index("fuse") < order.index("pack") < order.index("ptrinc") \
            < order.index("autotile"), name


def test_twice_is_once() -> None:
    once = ptrinc(lowered(SHIFT, SHIFT_SHAPES), AVX512, {})
    assert ptrinc(once, AVX512, {}) == once
    conv = ptrinc(lowered(CONV, {"I": (2, 3, 7, 6), "Wt": (5, 3, 3, 2)}), AVX512, {})
    assert ptrinc(conv, AVX512, {}) == conv
    assert_same_meaning(lowered(CONV, {"I": (2, 3, 7, 6), "Wt": (5, 3, 3, 2)}), conv)
