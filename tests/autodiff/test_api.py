"""pt.grad: what it returns, what it refuses, and its checks of the output gradients."""
from __future__ import annotations

import numpy as np
import pytest

import polytile as pt
from polytile.autodiff import backward, forward_saving

from .numeric import gradient_function

CONV = """
def conv(float(N,C,H,W) x, float(K,C,R,S) w) -> (y) {
  y(n,k,h,v) +=! x(n,c,h+r,v+s) * w(k,c,r,s)
}"""


def test_output_gradients_must_have_the_outputs_shapes() -> None:
    grad = gradient_function(pt.grad(pt.define(CONV).conv))
    x = np.ones((1, 2, 5, 5), np.float32)
    w = np.ones((3, 2, 2, 2), np.float32)
    with pytest.raises(pt.ArgumentError, match=r"gradient of y has shape \(1, 3, 5, 5\), but "
                       r"conv gives y the shape \(1, 3, 4, 4\)"):
        grad(x, w, np.ones((1, 3, 5, 5), np.float32))
    d_x, d_w = grad(x, w, np.ones((1, 3, 4, 4), np.float32))
    assert d_x[0, 0, 0, 0] == 3 and d_x[0, 0, 1, 1] == 12 and (d_w == 16).all()


@pytest.mark.parametrize("source, message", [
    ("def f(int32(N) I) -> (O) {\n  O(i) = float(I(i)) * 0.5\n}", "no floating-point input"),
    ("def f(float(N) X) -> (O) {\n  O(i) = int32(X(i))\n}", "no floating-point output"),
    ("def f(float(N) X) -> (O) {\n  O(i) += X(i)\n}", "in/out outputs"),
])
def test_refuses_what_has_no_gradient(source: str, message: str) -> None:
    with pytest.raises(pt.UnsupportedError, match=message):
        pt.grad(pt.define(source).f)


def test_saved_values_replace_recomputation() -> None:
    fn = pt.define("""
def mlp(float(B,I) x, float(O,I) w) -> (y) {
  h(n,o) +=! x(n,i) * w(o,i)
  y(n,o) = tanh(h(n,o))
}""").mlp
    derived = backward(fn.fn, saved=True)
    assert derived.saved == ("h",)
    forward = pt.define(forward_saving(fn.fn, derived.saved)).mlp
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((2, 4)).astype(
        np.float32)
    y, h = forward(x, w)
    d_y = rng.standard_normal(y.shape).astype(np.float32)
    saved = pt.grad(fn, saved=True)
    d_x, d_w = gradient_function(saved)(x, w, h, d_y)
    want_x, want_w = gradient_function(pt.grad(fn))(x, w, d_y)
    np.testing.assert_allclose(d_x, want_x, rtol=1e-6)
    np.testing.assert_allclose(d_w, want_w, rtol=1e-6)
    np.testing.assert_allclose(d_x, ((1 - np.tanh(x @ w.T) ** 2) * d_y) @ w, rtol=1e-5,
                               atol=1e-6)


COUNTED = """
def f(double(N) A, double(M) B, uint8(K) I) -> (O, P) {
  O(k) +=! A(k) * 2 + B(i)
  P(k, l) +=! A(I(l)) * B(k) + A(j) where k in 0:M, l in 0:K, j in 0:N
}
"""


def test_an_index_a_term_does_not_use_counts_in_its_gradient() -> None:
    # O(k) adds A(k) * 2 once per i: dA(k) = 2 M dO(k), and a where clause may not name
    # an index its statement does not use, so the derived statement multiplies by M
    # (the fuzzer found a derived program the front end rejected).
    fn = pt.define(COUNTED, backend="interp").f
    source = pt.grad(fn).source
    assert "where" in source and "float64(max(0, M))" in source
    rng = np.random.default_rng(3)
    args = (rng.standard_normal(5), rng.standard_normal(4),
            rng.integers(0, 5, 3).astype(np.uint8))
    from .numeric import check
    check(fn, args, rng)
    compiled = gradient_function(pt.grad(pt.define(COUNTED).f))
    seeds = (rng.standard_normal(5), rng.standard_normal((4, 3)))
    want = gradient_function(pt.grad(fn))(*args, *seeds)
    for got, expected in zip(compiled(*args, *seeds), want):
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


def test_a_bound_of_three_sizes_is_written_as_nested_two_argument_mins() -> None:
    # `exists B(l, l)` bounds l by K, M and N: min(K, M, N), which TC does not parse
    # (min takes two arguments); the derived program writes min(K, min(M, N)).
    source = """
def f(bool(N, K) B, float(K) C, double(M) A) -> (float() O) {
  O() +=! A(l) where v = C(l), exists B(l, l)
}
"""
    fn = pt.define(source, backend="interp").f
    derived = pt.grad(fn).source
    assert "l in 0:min(K, min(M, N))" in derived
    rng = np.random.default_rng(5)
    args = (rng.random((4, 6)) < 0.5, rng.standard_normal(6).astype(np.float32),
            rng.standard_normal(3))
    seed = np.float32(rng.standard_normal())
    d_c, d_a = gradient_function(pt.grad(fn))(*args, seed)
    np.testing.assert_array_equal(d_c, np.zeros(6, np.float32))
    np.testing.assert_allclose(d_a, [seed] * 3, rtol=1e-6)


def test_the_count_of_an_index_bounded_by_three_sizes_is_tc() -> None:
    # O() adds B() once per i, and i's range ends at min(M, N + 1, N - s): the count that
    # multiplies d_B is a value, which printed min with three arguments (the fuzzer found
    # the derived program the front end rejected).
    source = """
def f(int32 s, float(M, N, N) A, double() B) -> (O) {
  O() +=! B() - A(i, i - 1, i + s)
}
"""
    fn = pt.define(source, backend="interp").f
    derived = pt.grad(fn).source
    assert "min(M, min(N + 1, N - s))" in derived
    rng = np.random.default_rng(7)
    A = rng.standard_normal((5, 4, 4)).astype(np.float32)
    B, seed = np.float64(0.5), np.float64(rng.standard_normal())
    for grad in (pt.grad(fn), pt.grad(pt.define(source).f)):
        d_a, d_b = gradient_function(grad)(1, A, B, seed)
        assert d_b == pytest.approx(2 * seed)          # i in [max(1, -s), min(5, 5, 3))
        want = np.zeros_like(A)
        want[1, 0, 2] = want[2, 1, 3] = -seed
        np.testing.assert_allclose(d_a, want, rtol=1e-6)


def test_an_output_first_written_in_part_starts_at_zero_in_the_gradient() -> None:
    # O(0) is never written by the first statement: it starts at 0 as every output does,
    # and min= then compares against it. The derived program holds O in a temporary,
    # which does not start at 0 (NaN on the compiled side: the fuzzer found the
    # gradient of C(0) lost on cpu-generic), so it zeroes it first. And min= updates
    # O(0:N) only: O(N)'s adjoint passes through to the first statement's C(N - 1).
    source = """
def f(float(N) C, float(M) A) -> (O) {
  O(k) = C(k - 1) + 3 where k in 1:N+1
  O(l) min= C(l) + A(j)
}
"""
    fn = pt.define(source, backend="interp").f
    derived = pt.grad(fn).source
    assert "O_0(i0) = float32(0.0) where i0 in 0:N + 1" in derived
    C = np.array([0.5, -1.0, 2.0, 4.0], np.float32)
    A = np.array([-2.0, 1.0, 0.0], np.float32)
    seed = np.arange(1, 6, dtype=np.float32)
    for grad in (pt.grad(fn), pt.grad(pt.define(source).f)):
        d_c, d_a = gradient_function(grad)(C, A, seed)
        # O = [-1.5, -3, 0, 2, 7]: O(l) = C(l) + A(0) for l < 4 (O(0) against its 0),
        # and min= leaves O(4) = C(3) + 3, whose adjoint passes through to C(3).
        np.testing.assert_allclose(d_c, [1, 2, 3, 4 + 5], rtol=1e-6)
        np.testing.assert_allclose(d_a, [1 + 2 + 3 + 4, 0, 0], rtol=1e-6)


def test_a_scalar_subscript_is_scattered_into_as_a_value() -> None:
    # A(s) with s a scalar argument: the adjoint `d_A(s) += ...` would read s as an
    # index (and the front end refuses it); it is written d_A(int64(s)) (a fuzzer find).
    source = "def f(double(N) A, int64 s) -> (O) {\n  O(k) = A(s) * A(k) + A(N - 1)\n}\n"
    fn = pt.define(source, backend="interp").f
    assert "d_A(int64(s)) += " in pt.grad(fn).source
    rng = np.random.default_rng(11)
    from .numeric import check
    check(fn, (rng.standard_normal(6), np.int64(2)), rng)


def test_adjoints_that_reach_no_input_gradient_are_not_computed() -> None:
    # The product's factors are a scalar argument and integers: nothing of it reaches
    # A's gradient, so the zero-counting temporaries of `*=` are left out (the gradient
    # fuzz saw them computed and never read).
    source = ("def f(float f, float(M) A, int16(N) X) -> (O, P) {\n"
              "  O(l) *=! f - X(j) where l in 0:M\n  P(l) = A(l) * 2\n}\n")
    fn = pt.define(source, backend="interp").f
    derived = pt.grad(fn).source
    assert "zeros" not in derived and "nonzero" not in derived
    rng = np.random.default_rng(2)
    args = (np.float32(0.5), rng.standard_normal(3).astype(np.float32),
            rng.integers(-3, 3, 4).astype(np.int16))
    seeds = (rng.standard_normal(3).astype(np.float32),
             rng.standard_normal(3).astype(np.float32))
    d_a = gradient_function(pt.grad(fn))(*args, *seeds)
    np.testing.assert_allclose(d_a, 2 * seeds[1], rtol=1e-6)


def test_gradients_of_some_inputs_only() -> None:
    """`wrt` drops what only the other inputs' gradients need (here the d_x product)."""
    fn = pt.define("""
def mlp(float(B,I) x, float(O,I) w, float(O) b) -> (y) {
  h(n,o) +=! x(n,i) * w(o,i)
  y(n,o) = tanh(h(n,o) + b(o))
}""").mlp
    derived = backward(fn.fn, saved=True, wrt=["w", "b"])
    assert [g for _, g in derived.gradients] == ["d_w", "d_b"]
    assert "d_x" not in derived.source and "d_h" in derived.source
    with pytest.raises(pt.ArgumentError, match="no floating-point input z"):
        backward(fn.fn, wrt=["z"])
    with pytest.raises(pt.ArgumentError, match="no input of mlp"):
        backward(fn.fn, wrt=[])
