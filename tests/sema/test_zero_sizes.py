"""Zero-size dimensions give NumPy's answers (issue 11, defect 8: they raised
RangeInferenceError): empty results, and reductions over an empty range leave their
elements at the initial value (the identity for `!` reductions, as NumPy's sum and
prod give 0 and 1)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

import polytile as pt
from polytile.config import Config

CASES: list[tuple[str, str, list[tuple[int, ...]], Callable[..., Any]]] = [
    ("matmul", "def f(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }",
     [(3, 0), (0, 4)], lambda a, b: a @ b),
    ("matmul M=0", "def f(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }",
     [(0, 5), (5, 4)], lambda a, b: a @ b),
    ("matmul N=0", "def f(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }",
     [(3, 5), (5, 0)], lambda a, b: a @ b),
    ("row products", "def f(float(M,K) A) -> (P) { P(m) *=! A(m,k) }",
     [(4, 0)], lambda a: np.prod(a, axis=1)),
    ("elementwise", "def f(float(N) A, float(N) B) -> (C) { C(i) = exp(A(i)) + B(i) }",
     [(0,), (0,)], lambda a, b: np.exp(a) + b),
    ("softmax rows", """def f(float(N,C) X) -> (Y, mx, s) {
        mx(n) max=! X(n,c)
        s(n) +=! exp(X(n,c) - mx(n))
        Y(n,c) = exp(X(n,c) - mx(n)) / s(n) }""",
     [(0, 6)], lambda x: (np.empty((0, 6)), np.empty(0), np.empty(0))),
    ("temporary", """def f(float(M,K) A) -> (B) {
        T(m,k) = A(m,k) * 2
        B(m) +=! T(m,k) }""", [(3, 0)], lambda a: np.zeros(3)),
]


def gather_case(backend: str, config: Config) -> None:
    mod = pt.define("def f(float(E,D) T, int32(B) I) -> (O) { O(b,d) = T(I(b),d) }",
                    backend=backend, config=config)
    table = np.random.default_rng(1).standard_normal((5, 3)).astype(np.float32)
    out = mod.f(table, np.zeros(0, np.int32))
    assert out.shape == (0, 3)


@pytest.mark.parametrize("backend", ["interp", "c"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_zero_size_dimensions(case: tuple, backend: str, tmp_path: Path) -> None:
    _, source, shapes, reference = case
    mod = pt.define(source, backend=backend, config=Config(cache_dir=tmp_path))
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) + 1.5 for s in shapes]
    got = mod.f(*args)
    want = reference(*args)
    for g, w in zip(got if isinstance(got, tuple) else (got,),
                    want if isinstance(want, tuple) else (want,)):
        assert g.shape == np.shape(w)
        np.testing.assert_allclose(g, w, rtol=1e-5)
    again = mod.f(*args)                        # the cached (fast) path as well
    np.testing.assert_array_equal(again if not isinstance(again, tuple) else again[0],
                                  got if not isinstance(got, tuple) else got[0])


@pytest.mark.parametrize("backend", ["interp", "c"])
def test_gather_with_an_empty_index_tensor(backend: str, tmp_path: Path) -> None:
    gather_case(backend, Config(cache_dir=tmp_path))


def test_max_over_an_empty_range_is_the_identity(tmp_path: Path) -> None:
    """NumPy's max over nothing raises; a `max=!` reduction documents its start value."""
    for backend in ("interp", "c"):
        mod = pt.define("def f(float(M,K) A) -> (B) { B(m) max=! A(m,k) }", backend=backend,
                        config=Config(cache_dir=tmp_path))
        np.testing.assert_array_equal(mod.f(np.ones((2, 0), np.float32)), [-np.inf, -np.inf])
