"""Scatter statements (`dX(h + r) += ...`, `dT(I(b), d) += ...`): what they mean, that the
compiled code agrees with the reference interpreter and with plain NumPy loops, and
the errors for what they may not do."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import polytile as pt

BACKENDS = ["interp", "c"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_transposed_convolution_by_scatter(backend: str) -> None:
    source = """
def tconv(float(N,C,P,Q) y, float(C,K,R,S) w) -> (x) {
  x(n,k,h,v) = 0 where n in 0:N, k in 0:K, h in 0:P+R-1, v in 0:Q+S-1
  x(n,k,p+r,q+s) += y(n,c,p,q) * w(c,k,r,s)
}"""
    rng = np.random.default_rng(0)
    y = rng.standard_normal((2, 3, 5, 7)).astype(np.float32)
    w = rng.standard_normal((3, 4, 3, 2)).astype(np.float32)
    got = pt.define(source, backend=backend).tconv(y, w)
    want = np.zeros((2, 4, 7, 8), np.float32)
    for r in range(3):
        for s in range(2):
            want[:, :, r:r + 5, s:s + 7] += np.einsum("ncpq,ck->nkpq", y, w[:, :, r, s])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@settings(max_examples=15, deadline=None)
@given(a=st.integers(1, 3), b=st.integers(0, 2), c=st.integers(0, 3), m=st.integers(1, 9),
       n=st.integers(1, 6), seed=st.integers(0, 1000))
def test_affine_scatter_matches_loops(a: int, b: int, c: int, m: int, n: int,
                                      seed: int) -> None:
    """Y(a*i + b*j + c) += X(i, j): every iteration adds, repeated elements included."""
    size = a * (m - 1) + b * (n - 1) + c + 1
    source = f"""
def scat(float(M,N) X, float(L) Z) -> (float(L) Y) {{
  Y(t) = Z(t)
  Y({a} * i + {b} * j + {c}) += X(i, j)
}}"""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((m, n)).astype(np.float32)
    Z = rng.standard_normal(size).astype(np.float32)
    want = Z.astype(np.float64)
    for i in range(m):
        for j in range(n):
            want[a * i + b * j + c] += X[i, j]
    for backend in BACKENDS:
        got = pt.define(source, backend=backend).scat(X, Z)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_data_dependent_scatter_adds_and_checks(backend: str) -> None:
    source = """
def hist(float(B,D) V, int32(B) I, float(E,D) T) -> (float(E,D) H) {
  H(e,d) = T(e,d)
  H(I(b), d) += V(b,d)
}"""
    rng = np.random.default_rng(1)
    V = rng.standard_normal((40, 5)).astype(np.float32)
    I = rng.integers(0, 6, 40).astype(np.int32)
    T = rng.standard_normal((6, 5)).astype(np.float32)
    mod = pt.define(source, backend=backend)
    want = T.copy()
    np.add.at(want, I, V)
    np.testing.assert_allclose(mod.hist(V, I, T), want, rtol=1e-5, atol=1e-5)
    I[7] = 6
    with pytest.raises(pt.OutOfBoundsError, match="H is indexed at 6"):
        mod.hist(V, I, T)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_read_in_a_scatter_subscript_is_bounds_checked(backend: str) -> None:
    # d_A(X(1)) with one element in X: the C code read X[1] past its end and reported
    # a garbage index, the interpreter raised a bare IndexError (a gradient fuzz find);
    # the read is checked like one on the right-hand side.
    source = """
def g(float32(M) A, int16(M) X, float32() d_O) -> (float32(M) d_A) {
  d_A(i0) = float32(0.0) where i0 in 0:M
  d_A(X(1)) += d_O()
}"""
    mod = pt.define(source, backend=backend)
    with pytest.raises(pt.OutOfBoundsError, match="X is accessed at 1 in dimension 0"):
        mod.g(np.ones(1, np.float32), np.zeros(1, np.int16), np.float32(1.0))
    got = mod.g(np.ones(2, np.float32), np.array([0, 1], np.int16), np.float32(2.0))
    np.testing.assert_array_equal(got, [0.0, 2.0])


@pytest.mark.parametrize("body, error, message", [
    ("  Y(i + 1) +=! X(i)", pt.TypeCheckError, "only `\\+=` may do"),
    ("  Y(i + 1) max= X(i)", pt.TypeCheckError, "only `\\+=` may do"),
    ("  T(i) = X(i)\n  T(2 * i) += T(i)\n  Y(i) = T(i)", pt.CausalityError,
     "a scatter into T reads T"),
    ("  T(i + 1) += X(i)\n  Y(i) = X(i)", pt.RangeInferenceError,
     "shape of T is not known"),
    ("  Y(i) = X(i)\n  Y(X(i)) += X(i)", pt.TypeCheckError, "not an integer"),
])
def test_scatter_errors(body: str, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        pt.define(f"def f(float(N) X) -> (float(N) Y) {{\n{body}\n}}")


def test_scatter_prints_and_reparses() -> None:
    from polytile.lang.parser import parse
    from polytile.lang.printer import format_module
    text = "def f(float(N) X) -> (float(N, N) Y) {\n  Y(i, j) = 0\n  Y(i, i) += X(i)\n}\n"
    module = parse(text)
    assert parse(format_module(module)) == module
    assert module.defs[0].body[1].scatter and not module.defs[0].body[1].indices
