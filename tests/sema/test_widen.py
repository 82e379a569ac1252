"""Reductions into float16 and bfloat16 tensors sum in float32 and round once
(polytile/sema/widen.py), in the compiled code as in the reference interpreter: a long
bfloat16 sum with cancellation, `+=!`, `+=` onto a tensor's values, `*=`, float16, on the
C backend; what the lowered IR holds; what is left alone."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import polytile as pt
from polytile.ir.lower import lower
from polytile.ir.nodes import Block
from polytile.sema.canonical import canonical
from polytile.sema.specialize import specialize

BF16 = ml_dtypes.bfloat16
SUM = "def f(bfloat16(N,K) A) -> (bfloat16(N) O) {\n  O(n) +=! A(n,k)\n}\n"
ONTO = ("def f(bfloat16(N,K) A, bfloat16(N) B) -> (bfloat16(N) O) {\n"
        "  O(n) = B(n)\n  O(n) += A(n,k)\n}\n")
PRODUCT = "def f(bfloat16(N,K) A) -> (bfloat16(N) O) {\n  O(n) *=! A(n,k)\n}\n"
HALF = "def f(half(N,K) A) -> (half(N) O) {\n  O(n) +=! A(n,k)\n}\n"


def blocks(source: str, **shapes: tuple[int, ...]) -> list[Block]:
    fn = next(iter(pt.define(source, backend="interp")._functions.values())).fn
    return [s for s in lower(canonical(specialize(fn, shapes, {}))).body.stmts
            if isinstance(s, Block)]


def test_the_reduction_goes_to_a_float32_temporary_rounded_once() -> None:
    names = [(b.name, b.refs[0].into, b.refs[0].shape.dtype.name)
             for b in blocks(ONTO, A=(4, 9), B=(4,))]
    assert names == [("s0", "o0", "bfloat16"), ("s1", "o0_f32", "float32"),
                     ("s2", "o0_f32", "float32"), ("s3", "o0", "bfloat16")]
    # with `!` the temporary starts at the identity, not at the tensor's values
    assert [b.name for b in blocks(SUM, A=(4, 9))] == ["s0_init", "s0", "s1"]


def test_what_is_exact_or_rounds_once_anyway_is_left_alone() -> None:
    for source in ("def f(bfloat16(N,K) A) -> (bfloat16(N) O) {\n  O(n) max=! A(n,k)\n}\n",
                   "def f(bfloat16(N) A) -> (bfloat16(N) O) {\n  O(n) +=! A(n) * 2\n}\n",
                   "def f(float(N,K) A) -> (O) {\n  O(n) +=! A(n,k)\n}\n"):
        shapes = {"A": (4, 9) if "N,K" in source else (4,)}
        assert not any("f32" in b.refs[0].into for b in blocks(source, **shapes))


def float32_reference(a: np.ndarray, op: str, start: np.ndarray | None = None) -> np.ndarray:
    wide = a.astype(np.float32)
    total = wide.sum(1, dtype=np.float32) if op == "sum" else wide.prod(1, dtype=np.float32)
    if start is not None:
        total = total + start.astype(np.float32)
    return total


@pytest.mark.parametrize("k", [7, 108, 1000])
def test_a_long_bfloat16_sum_matches_the_reference(k: int) -> None:
    """Terms of both signs that nearly cancel: summed in bfloat16 one by one, the result
    was far off (the gradient fuzzer's seed-99 find: 46% over 108 terms)."""
    rng = np.random.default_rng(k)
    big = rng.standard_normal((5, k)) * 1000
    a = np.concatenate([big, -big + rng.standard_normal((5, k))], 1).astype(BF16)
    compiled, reference = pt.define(SUM).f, pt.define(SUM, backend="interp").f
    got, want = compiled(a), reference(a)
    within_ulps(got, want, 2)
    # one rounding to bfloat16 (half an ulp) and float32's in the sum of 2k terms
    exact = a.astype(np.float64).sum(1)
    slack = 2 * k * np.abs(a.astype(np.float64)).max() * 2.0**-24
    assert np.all(np.abs(got.astype(np.float64) - exact) <= np.abs(exact) * 2.0**-8 + slack)


def within_ulps(got: np.ndarray, want: np.ndarray, ulps: int) -> None:
    """Each element within `ulps` units in the last place of the narrow type: float32
    sums in two orders may round to neighbouring 16-bit values."""
    bits = 8 if got.dtype == BF16 else 11
    g, w = got.astype(np.float64), want.astype(np.float64)
    assert np.all(np.abs(g - w) <= ulps * np.abs(w) * 2.0**(1 - bits) + 1e-30), (g, w)


def test_onto_values_products_and_float16() -> None:
    rng = np.random.default_rng(3)
    a = (1 + rng.standard_normal((6, 40)) / 16).astype(BF16)
    b = rng.standard_normal(6).astype(BF16)
    for source, args in ((ONTO, (a, b)), (PRODUCT, (a,)),
                         (HALF, (a.astype(np.float32).astype(np.float16),))):
        within_ulps(pt.define(source).f(*args), pt.define(source, backend="interp").f(*args), 2)


DIAGONAL = ("def f(bfloat16(N,K) A, bfloat16(N,N) B) -> (bfloat16(N,N) O) {\n"
            "  O(i,j) = B(i,j)\n  O(i,i) += A(i,k)\n}\n")
SCATTER = ("def f(bfloat16(H) X, bfloat16(R,K) W, bfloat16(L) Z) -> (bfloat16(L) D) {\n"
           "  D(l) = Z(l)\n  D(h + r) += X(h) * W(r,k)\n}\n")


def test_scatters_sum_in_float32_too() -> None:
    """A scatter may add into any element: the whole tensor is copied into the float32
    temporary and back. (`O(i,i)` came out 9 ulps off before.)"""
    rng = np.random.default_rng(4)
    a = rng.standard_normal((5, 300)).astype(BF16)
    b = rng.standard_normal((5, 5)).astype(BF16)
    x = rng.standard_normal(40).astype(BF16)
    w = rng.standard_normal((7, 60)).astype(BF16)
    z = rng.standard_normal(46).astype(BF16)
    for source, args in ((DIAGONAL, (a, b)), (SCATTER, (x, w, z))):
        within_ulps(pt.define(source).f(*args), pt.define(source, backend="interp").f(*args), 2)
    fn = next(iter(pt.define(SCATTER, backend="interp")._functions.values())).fn
    spec = specialize(fn, {"X": (40,), "W": (7, 60), "Z": (46,)}, {})
    lowered = [s for s in lower(canonical(spec)).body.stmts
               if isinstance(s, Block)]
    assert [b.refs[0].into for b in lowered] == ["o0", "o0_f32", "o0_f32", "o0"]
