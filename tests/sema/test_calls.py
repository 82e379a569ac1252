"""TC functions calling TC functions (issue 17, graph level): the call is inlined in
semantics, so a caller computes what calling its callees one after the other computes;
bad calls are errors at the call."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import polytile as pt
from polytile.sema.printer import format_function

ATTENTION = """
def scores(float(M,D) Q, float(N,D) K, float s) -> (S) {
  S(i,j) +=! Q(i,d) * K(j,d) * s
}
def softmax(float(M,N) X) -> (Y) {
  mx(i) max=! X(i,j)
  e(i,j) = exp(X(i,j) - mx(i))
  z(i) +=! e(i,j)
  Y(i,j) = e(i,j) / z(i)
}
def attention(float(M,D) Q, float(N,D) K, float(N,E) V, float s) -> (O) {
  S = scores(Q, K, s)
  P = softmax(S)
  O(i,e) +=! P(i,j) * V(j,e)
}
def both(float(M,D) Q, float(N,D) K, float s) -> (A, B) {
  (A, B) = with_mean(Q, K, s)
}
def with_mean(float(M,D) Q, float(N,D) K, float s) -> (A, B) {
  A = scores(Q, K, s)
  B(i) +=! A(i,j) / N
}
"""


def _random(rng: np.random.Generator, *shape: int) -> np.ndarray:
    """Random float32 data in a non-contiguous view (every other column)."""
    full = rng.standard_normal((*shape[:-1], 2 * shape[-1])).astype(np.float32)
    return full[..., ::2]


def test_attention_inlines_and_matches_separate_calls() -> None:
    rng = np.random.default_rng(1)
    Q, K, V = _random(rng, 5, 7), _random(rng, 9, 7), _random(rng, 9, 3)
    for backend in ("interp", "c"):
        mod = pt.define(ATTENTION, backend=backend)
        separate = mod.softmax(mod.scores(Q, K, 0.3)) @ V
        np.testing.assert_allclose(mod.attention(Q, K, V, 0.3), separate, rtol=1e-5,
                                   atol=1e-6)
        A, B = mod.both(Q, K, 0.3)
        np.testing.assert_allclose(A, mod.scores(Q, K, 0.3), rtol=1e-6)
        np.testing.assert_allclose(B, A.sum(1) / 9, rtol=1e-5, atol=1e-6)


def test_inlined_program_text() -> None:
    """Temporaries of the callee get fresh names (`e` would meet the caller's index `e`);
    the callee's sizes are the caller's."""
    fn = pt.define(ATTENTION, backend="interp").program.get("attention")
    assert format_function(fn).splitlines()[:7] == [
        ("def attention(float32(M, D) Q, float32(N, D) K, float32(N, E) V, float32 s) -> "
         "(float32(M, E) O)"),
        "  temporary float32(M, N) S",
        "  temporary float32(M) mx_softmax",
        "  temporary float32(M, N) e_softmax",
        "  temporary float32(M) z_softmax",
        "  temporary float32(M, N) P",
        "  S(i, j) +=! Q(i, d) * K(j, d) * s",
    ]
    assert fn.sizes == ("M", "D", "N", "E")


# Index names the callees may use, several of which mean something in the caller.
NAMES = ["i", "j", "k", "M", "N", "T", "Y", "b", "X"]
OPS = ["x({i},{j}) * c", "exp(x({i},{j})) - c", "fmaxf(x({i},{j}), c)", "x({i},{j}) / A"]


def _program(i: str, j: str, a: str, b: str, op: str, reduce: str) -> str:
    body = op.format(i=i, j=j)
    return f"""
def f(float(A,B) x, float c) -> (y) {{
  y({i},{j}) = {body}
}}
def g(float(P,Q) t, float(Q) v) -> (r) {{
  r({a}) {reduce} t({a},{b}) * v({b}) / Q
}}
def caller(float(M,N) X, float(N) b, float c) -> (Y, T) {{
  T = f(X, c)
  Y = g(T, b)
}}
"""


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from(NAMES), min_size=4, max_size=4, unique=True),
       st.sampled_from(OPS), st.sampled_from(["+=!", "max=!"]),
       st.integers(1, 7), st.integers(1, 9), st.integers(0, 2**32 - 1))
def test_inlining_preserves_results(names: list[str], op: str, reduce: str, m: int, n: int,
                                    seed: int) -> None:
    src = _program(names[0], names[1], names[2], names[3], op, reduce)
    mod = pt.define(src, backend="interp")
    rng = np.random.default_rng(seed)
    X, b = _random(rng, m, n), _random(rng, n)
    Y, T = mod.caller(X, b, 0.25)
    T_alone = mod.f(X, 0.25)
    np.testing.assert_allclose(T, T_alone, rtol=1e-6)
    np.testing.assert_allclose(Y, mod.g(T_alone, b), rtol=1e-5, atol=1e-6)


def test_nested_calls_compile_with_odd_sizes() -> None:
    src = _program("i", "j", "i", "j", "exp(x({i},{j})) - c", "+=!") + """
def outer(float(M,N) X, float(N) b, float c) -> (Z) {
  (Y, T) = caller(X, b, c)
  Z(i) = Y(i) + T(i, 0)
}
"""
    mod = pt.define(src)
    rng = np.random.default_rng(2)
    X, b = _random(rng, 13, 11), _random(rng, 11)
    T = np.exp(X) - 0.5
    expected = (T * b).sum(1) / 11 + T[:, 0]
    np.testing.assert_allclose(mod.outer(X, b, 0.5), expected, rtol=1e-5, atol=1e-6)


def test_declared_callee_output_shape_flows() -> None:
    src = """
def hist(int32(N) idx, float(N) w, float(B) bins) -> (float(B) h) {
  h(k) = 0
  h(idx(n)) += w(n)
}
def caller(int32(N) idx, float(N) w, float(C) bins) -> (out) {
  h = hist(idx, w, bins)
  out(k) = h(k) * 2
}
"""
    mod = pt.define(src, backend="interp")
    idx = np.array([0, 2, 2, 4, 1], np.int32)
    w = np.arange(5, dtype=np.float32) + 1
    out = mod.caller(idx, w, np.zeros(5, np.float32))
    np.testing.assert_allclose(out, 2 * np.bincount(idx, w, minlength=5))


# ---------------------------------------------------------------- errors at the call

def _error(src: str) -> pt.PolytileError:
    with pytest.raises(pt.PolytileError) as info:
        pt.define(src, backend="interp", name="calls.tc")
    return info.value


def _at(err: pt.PolytileError, line: int, col: int, *words: str) -> None:
    assert err.loc is not None, err
    assert (err.loc.line, err.loc.col) == (line, col), str(err)
    assert str(err).startswith(f"calls.tc:{line}:{col}: "), str(err)
    for w in words:
        assert w in str(err), str(err)


SCORES = "def scores(float(M,D) Q, float(N,D) K) -> (S) { S(i,j) +=! Q(i,d) * K(j,d) }\n"


def test_size_mismatch_is_an_error_at_the_argument() -> None:
    err = _error(SCORES + "def c(float(M,D) Q, float(N,E) K) -> (S) {\n  S = scores(Q, K)\n}")
    _at(err, 3, 17, "scores declares dimension 1", "as D", "K has E")


def test_constant_dimension_mismatch() -> None:
    src = ("def f(float(3,N) x) -> (y) { y(i,j) = x(i,j) }\n"
           "def c(float(M,N) x) -> (y) {\n  y = f(x)\n}")
    _at(_error(src), 3, 9, "as 3", "x has M")


def test_size_mismatch_through_a_temporary() -> None:
    src = (SCORES + "def c(float(M,D) Q, float(N,D) K) -> (S) {\n"
           "  T(i,d) = Q(i,d + 1) where d in 0:D - 1\n  S = scores(T, K)\n}")
    _at(_error(src), 4, 17, "which is D - 1 (from dimension 1 of T)", "K has D")


@pytest.mark.parametrize("body, line, col, words", [
    ("  S = scores(Q)", 3, 3, ["scores takes 2 arguments"]),
    ("  (S, R) = scores(Q, K)", 3, 3, ["returns 1 tensors"]),
    ("  S = scores(Q, V)", 3, 17, ["K has 2 dimensions, but V has 1"]),
    ("  S = scores(Q, s)", 3, 17, ["s is a scalar"]),
    ("  S = scores(Q, R)", 3, 17, ["R is not a tensor computed before"]),
    ("  K = scores(Q, Q)", 3, 3, ["K is an input"]),
    ("  S = scores(Q, S)", 3, 3, ["S is both an argument and a result"]),
    ("  S = scores(Q, I)", 3, 17, ["parameter K is float32, but I is int32"]),
])
def test_bad_calls(body: str, line: int, col: int, words: list[str]) -> None:
    src = (SCORES + "def c(float(M,D) Q, float(N,D) K, float(N) V, int32(N,D) I, float s)"
           f" -> (S) {{\n{body}\n}}")
    _at(_error(src), line, col, *words)


def test_recursion_and_cycles_are_errors() -> None:
    own = "def f(float(N) x) -> (y) {\n  y = f(x)\n}"
    _at(_error(own), 2, 3, "f calls itself (f -> f)")
    cycle = ("def f(float(N) x) -> (y) {\n  y = g(x)\n}\n"
             "def g(float(N) x) -> (y) {\n  y = f(x)\n}")
    _at(_error(cycle), 5, 3, "(f -> g -> f)")


def test_index_names_do_not_capture_caller_names() -> None:
    """The callee's index `N` and `where` name `s` mean nothing in the callee but a size
    and a scalar in the caller: they are renamed."""
    src = """
def f(float(A) x) -> (y) {
  y(N) = x(N) * s where s = 2
}
def c(float(N) x, float s) -> (z) {
  t = f(x)
  z(i) = t(i) + s + N
}
"""
    mod = pt.define(src, backend="interp")
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_allclose(mod.c(x, 0.5), 2 * x + 0.5 + 4)
