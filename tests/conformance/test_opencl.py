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
