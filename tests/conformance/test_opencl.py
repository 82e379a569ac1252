"""The conformance corpus and the contraction property on the opencl target (pass `gpu`,
OpenCL C run through pyopencl; on this CPU-only host, PoCL). Each program runs once with
C-ordered inputs and once with the same values Fortran-ordered or strided, against its NumPy
reference. Without pyopencl or a working OpenCL device every test here skips, saying what
is missing (`pytest -rs` lists the reasons)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import polytile as pt
from polytile.errors import OutOfBoundsError
from polytile.runtime.opencl import device_problem

from .programs import CASES, Case
from .test_conformance import run_case
from .test_einsum_property import check_contraction, contractions

PROBLEM = device_problem()
pytestmark = pytest.mark.skipif(PROBLEM is not None,
                                reason=f"the opencl target needs {PROBLEM}")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_conformance_on_opencl(case: Case) -> None:
    run_case(case, "opencl", 0)
    # The same shapes (one compile per program: PoCL compiles each kernel with LLVM), with
    # Fortran-ordered or strided inputs.
    run_case(case, "opencl", 0, "f" if CASES.index(case) % 2 else "strided")


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(contractions(), st.integers(0, 2**32 - 1))
def test_random_contraction_matches_einsum_on_opencl(spec, seed) -> None:
    check_contraction(spec, seed, lambda source: pt.define(source, target="opencl"))


def test_out_of_range_subscript_is_reported() -> None:
    """A failed check in one work-item stops the call with the error the C kernels give."""
    src = "def g(float(N) X, int32(M) I) -> (Y) {\n  Y(i) = X(I(i))\n}\n"
    fn = pt.define(src, target="opencl").g
    X = np.arange(5, dtype=np.float32)
    np.testing.assert_array_equal(fn(X, np.array([4, 0, 2], np.int32)), [4, 0, 2])
    with pytest.raises(OutOfBoundsError, match="I is indexed at 7|X is indexed at 7"):
        fn(X, np.array([1, 7, 2], np.int32))


def _nan_rows(rng: np.random.Generator) -> np.ndarray:
    X = rng.standard_normal((6, 90)).astype(np.float32)
    X[1, 17] = X[4, 89] = np.nan
    return X


# Reductions long enough (>= 16) to run across a work-group's work-items, which the
# corpus's small sizes do not reach: every aggregation, integers, NaN, a scalar output,
# a where-clause.
ACROSS = [
    ("def softmax(float(N,M) X) -> (Y) {\n  mx(n) max=! X(n,m)\n"
     "  e(n,m) = exp(X(n,m) - mx(n))\n  s(n) +=! e(n,m)\n  Y(n,m) = e(n,m) / s(n)\n}\n",
     lambda rng: (rng.standard_normal((7, 100)).astype(np.float32),)),
    ("def nanred(float(M,N) X) -> (Mx, Mn) {\n  Mx(i) max=! X(i,j)\n  Mn(i) min=! X(i,j)\n}\n",
     lambda rng: (_nan_rows(rng),)),
    ("def imin(int32(M,N) X) -> (Y) {\n  Y(i) min=! X(i,j)\n}\n",
     lambda rng: (rng.integers(-1000, 1000, (5, 300)).astype(np.int32),)),
    ("def prod(double(M,N) X) -> (Y) {\n  Y(i) *=! X(i,j)\n}\n",
     lambda rng: (1 + 0.05 * rng.standard_normal((3, 70)),)),
    ("def count(bool(M,N) P) -> (C) {\n  C(i) +=! int32(P(i,j))\n}\n",
     lambda rng: (rng.random((4, 33)) < 0.5,)),
    ("def dot(float(N) x, float(N) y) -> (d) {\n  d +=! x(i) * y(i)\n}\n",
     lambda rng: (rng.standard_normal(1000).astype(np.float32),
                  rng.standard_normal(1000).astype(np.float32))),
    ("def cumsum(float(N) A) -> (C) {\n  C(i) +=! k <= i ? A(k) : 0 where i in 0:N, k in 0:N\n}\n",
     lambda rng: (rng.standard_normal(40).astype(np.float32),)),
]


@pytest.mark.parametrize("source, inputs", ACROSS, ids=[s.split("(")[0][4:] for s, _ in ACROSS])
def test_reductions_across_work_items(source, inputs) -> None:
    name = source.split("(")[0][4:]
    fn = pt.define(source, target="opencl")[name]
    args = inputs(np.random.default_rng(0))
    got, want = fn(*args), pt.define(source, backend="interp")[name](*args)
    for g, w in zip(got if isinstance(got, tuple) else (got,),
                    want if isinstance(want, tuple) else (want,)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    # Across work-items, or (cumsum, whose A(k) every output reads) staged: local memory.
    kernel = next(iter(fn._kernels.values()))
    assert "__local" in kernel.source_path.read_text()


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 70), st.integers(1, 70), st.integers(1, 70), st.booleans(),
       st.booleans(), st.sampled_from(["float", "double"]), st.integers(0, 2**32 - 1))
def test_random_matmuls_with_staging_and_register_tiles(m, n, k, a_t, b_t, dtype, seed) -> None:
    """Sizes past a work-group's tile (16 x 16 points with the defaults): several groups,
    boundary groups cut short, register tiles, staged boxes past the data."""
    a = "A(kk, i)" if a_t else "A(i, kk)"
    b = "B(j, kk)" if b_t else "B(kk, j)"
    a_shape, b_shape = ((k, m) if a_t else (m, k)), ((n, k) if b_t else (k, n))
    source = (f"def mm({dtype}({'K, M' if a_t else 'M, K'}) A, "
              f"{dtype}({'N, K' if b_t else 'K, N'}) B) -> (C) {{\n"
              f"  C(i, j) +=! {a} * {b}\n}}\n")
    rng = np.random.default_rng(seed)
    np_dtype = np.float32 if dtype == "float" else np.float64
    A = rng.standard_normal(a_shape).astype(np_dtype)
    B = rng.standard_normal(b_shape).astype(np_dtype)
    got = pt.define(source, target="opencl").mm(A, B)
    a64, b64 = (A.T if a_t else A).astype(np.float64), (B.T if b_t else B).astype(np.float64)
    want = a64 @ b64
    magnitude = np.abs(a64) @ np.abs(b64)          # each element's sum of |terms|
    assert got.dtype == np_dtype and got.shape == (m, n)
    tolerance = 1e-5 if dtype == "float" else 1e-12
    assert (np.abs(got - want) <= tolerance * magnitude + 1e-30).all(), source
