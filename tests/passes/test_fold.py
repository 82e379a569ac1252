"""Pass fold: a contraction's first writes replace the init block before it (BLAS's
beta = 0). Golden IR of a tiled matmul whose reduction runs in chunks, the programs it
leaves alone, the verifier's refusals of unproved folds, and compiled kernels against
NumPy on sizes that divide no tile, with strided inputs."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import polytile as pt
from polytile.analysis.fold import with_leaf
from polytile.errors import IRError
from polytile.ir import nodes as N
from polytile.ir.verify import verify
from polytile.loops import interp as loops_interp
from polytile.loops.lower import lower
from polytile.loops.text import kernel_text
from polytile.passes.fold import fold
from polytile.passes.pipeline import run_pipeline

from .helpers import block, check_pass, lowered, marked, target, with_block

AVX2 = target("cpu-avx2")
BEFORE = replace(AVX2, passes=tuple(p for p in AVX2.passes if p[0] != "fold"))
TMM = "def tmm(float(M,K) A, float(N,K) B) -> (C) {\n  C(m,n) +=! A(m,k) * B(n,k)\n}\n"
TMM_SHAPES = {"A": (37, 700), "B": (45, 700)}


def _scheduled(source: str, shapes: dict[str, tuple[int, ...]]) -> N.Function:
    return run_pipeline(lowered(source, shapes), BEFORE, {})


def test_a_chunked_matmul_stores_its_first_chunk() -> None:
    before = _scheduled(TMM, TMM_SHAPES)
    after = fold(before, AVX2, {})
    check_pass("fold_tmm", before, after)
    assert marked(after, "folded") == [("s0_init", "s0")]
    ((leaf, first),) = marked(after, "first")
    assert leaf == "s0_tile_tile" and len(first) == 1       # the reduction's chunk index
    assert fold(before, AVX2, {"enabled": False}) == before
    text = kernel_text(lower(after))
    assert "block s0_init: made by the first writes of s0" in text
    assert " = acc0" in text and " add= acc0" in text        # both, under a condition


def test_programs_it_leaves_alone() -> None:
    ones = "def f(float(M,K) A) -> (C) {\n  C(m) = 1\n  C(m) += A(m,k)\n}\n"
    read = ("def f(float(M,K) A) -> (C, D) {\n  C(m) = 0\n  D(m) = C(m) + 1\n"
            "  C(m) += A(m,k)\n}\n")
    for source in (ones, read):
        fn = _scheduled(source, {"A": (40, 300)})
        assert fold(fn, AVX2, {}) == fn, source
    # A scatter writes x[.., 2] from (p, r) = (0, 2), (1, 1), (2, 0): its first write is
    # not where the reduction index c is 0.
    tconv = ("def tconv(float(N,C,P,Q) y, float(C,K,R,S) w) -> (x) {\n"
             "  x(n,k,h,v) = 0 where n in 0:N, k in 0:K, h in 0:P+R-1, v in 0:Q+S-1\n"
             "  x(n,k,p+r,q+s) += y(n,c,p,q) * w(c,k,r,s)\n}\n")
    fn = _scheduled(tconv, {"y": (2, 3, 5, 17), "w": (3, 4, 3, 2)})
    assert fold(fn, AVX2, {}) == fn


def test_the_verifier_refuses_unproved_folds() -> None:
    after = fold(_scheduled(TMM, TMM_SHAPES), AVX2, {})
    verify(after)
    init, contraction = block(after, "s0_init"), block(after, "s0")
    unfolded = replace(init, schedule=replace(init.schedule, folded=None))
    with pytest.raises(IRError, match="first.*without an init block"):
        verify(with_block(after, "s0_init", unfolded))
    plain = with_leaf(contraction, lambda leaf: replace(
        leaf, schedule=replace(leaf.schedule, first=None)))
    with pytest.raises(IRError, match="needs block s0_tile_tile scheduled first"):
        verify(with_block(after, "s0", plain))
    ones = with_leaf(init, lambda leaf: replace(leaf, stmts=(
        replace(leaf.stmts[0], value=1.0), *leaf.stmts[1:])))
    with pytest.raises(IRError, match="starts at 1.0, not the identity"):
        verify(with_block(after, "s0_init", ones))
    lower_bound = with_leaf(contraction, lambda leaf: replace(
        leaf, constraints=(*leaf.constraints, N.Affine.index("k") - 1)))
    with pytest.raises(IRError, match="bounds a reduction index from below"):
        verify(with_block(after, "s0", lower_bound))
    elsewhere = replace(init, schedule=replace(init.schedule, folded="s9"))
    with pytest.raises(IRError, match="no later sibling s9"):
        verify(with_block(after, "s0_init", elsewhere))


@pytest.mark.parametrize("order", [("k", "m"), ("m", "k")])
def test_first_writes_in_either_loop_order(order: tuple[str, ...]) -> None:
    """With k looped outside the sums (order k, m: no register sums, a store per k), the
    stores assign at k = 0 of the first chunk only; the loop IR interpreter starts the
    output at random values, so a missed or extra assignment shows."""
    fn = fold(_scheduled(TMM, TMM_SHAPES), AVX2, {})
    contraction = block(fn, "s0")
    edited = with_block(fn, "s0", with_leaf(contraction, lambda leaf: replace(
        leaf, schedule=replace(leaf.schedule, unroll=("n_o",), order=order))))
    verify(edited)
    text = kernel_text(lower(edited))
    assert ("add= " in text) and (" = acc" in text or "] = v" in text)
    rng = np.random.default_rng(4)
    buffers = {name: rng.standard_normal(shape).astype(np.float32)
               for name, shape in (("A", (37, 700)), ("B", (45, 700)), ("C", (37, 45)))}
    lowered_run = {k: v.copy() for k, v in buffers.items()}
    loops_interp.run(edited, lowered_run)            # C starts at random values
    want = buffers["A"].astype(np.float64) @ buffers["B"].T.astype(np.float64)
    np.testing.assert_allclose(lowered_run["C"], want, rtol=1e-4, atol=2e-3)


MATMULS = [
    (TMM, "tmm", {"A": (37, 700), "B": (45, 700)}),
    (TMM, "tmm", {"A": (5, 129), "B": (70, 129)}),
    (TMM, "tmm", {"A": (7, 1030), "B": (20, 1030)}),
    ("def bmm(float(B,M,K) X, float(B,K,N) Y) -> (Z) {\n  Z(b,m,n) +=! X(b,m,k) * Y(b,k,n)\n}\n",
     "bmm", {"X": (9, 26, 300), "Y": (9, 300, 19)}),
]


@pytest.mark.parametrize("source, name, shapes", MATMULS)
def test_folded_kernels_agree_with_numpy_on_strided_inputs(
        source: str, name: str, shapes: dict[str, tuple[int, ...]]) -> None:
    assert marked(fold(_scheduled(source, shapes), AVX2, {}), "folded")
    rng = np.random.default_rng(7)
    args = [rng.standard_normal((*s[:-1], 2 * s[-1])).astype(np.float32)[..., ::2]
            for s in shapes.values()]
    got = getattr(pt.define(source), name)(*args)
    a, b = (x.astype(np.float64) for x in args)
    want = a @ b.T if name == "tmm" else a @ b
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    again = getattr(pt.define(source), name)(*args)         # a fresh output, written anew
    np.testing.assert_array_equal(again, got)


def test_a_shift_convolution_folds_behind_its_gathered_copy() -> None:
    source = ("def shift(float(N,C,H,W) x, float(C,K) f, int32(C) sh, int32(C) sw) -> (o) {\n"
              "  o(n,k,h,w) +=! x(n, c, h + 1 + sh(c), w + 1 + sw(c)) * f(c,k)\n"
              "    where h in 0:H-2, w in 0:W-2\n}\n")
    shapes = {"x": (2, 150, 13, 11), "f": (150, 20), "sh": (150,), "sw": (150,)}
    assert marked(fold(_scheduled(source, shapes), AVX2, {}), "folded")
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shapes["x"]).astype(np.float32)
    f = rng.standard_normal(shapes["f"]).astype(np.float32)
    sh, sw = (rng.integers(-1, 2, 150).astype(np.int32) for _ in range(2))
    got = pt.define(source).shift(x, f, sh, sw)
    want = np.zeros((2, 20, 11, 9))
    for c in range(150):
        want += np.einsum("nhw,k->nkhw",
                          x[:, c, 1 + sh[c]:12 + sh[c], 1 + sw[c]:10 + sw[c]], f[c])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@settings(max_examples=12, deadline=None)
@given(m=st.integers(1, 40), n=st.integers(1, 70), k=st.integers(1, 600),
       batch=st.integers(1, 3), seed=st.integers(0, 1000))
def test_folded_contractions_agree_with_numpy(m: int, n: int, k: int, batch: int,
                                              seed: int) -> None:
    """Whatever the sizes (a reduction cut into chunks or not, tiles cut short, products
    the pipeline folds or not), a batched product equals NumPy's."""
    source = ("def bmm(float(B,M,K) X, float(B,N,K) Y) -> (Z) {\n"
              "  Z(b,m,n) +=! X(b,m,k) * Y(b,n,k)\n}\n")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, m, k)).astype(np.float32)
    y = rng.standard_normal((batch, n, 2 * k)).astype(np.float32)[:, :, ::2]
    got = pt.define(source).bmm(x, y)
    want = np.einsum("bmk,bnk->bmn", x.astype(np.float64), y.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.sqrt(k))
