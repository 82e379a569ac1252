"""The CUDA kernels polytile prints, run on the CPU: the whole call path of
`define(..., target="cuda-sm90")` (NVRTC builds the CUBIN into the cache, CUDAKernel
copies, launches and reads back through the driver API) with the driver emulated
(tests/gpu/cuda_emulation.py: the printed CUDA C++ compiled by g++ under a header that
gives `__shared__`, `__syncthreads()`, `threadIdx` and `blockIdx` their meaning, a
block's threads an OpenMP team). Results are compared with the NumPy references on
random inputs. Kernels with staged tiles, register tiles and reductions across a block
run in the ordinary test run; the whole corpus is slow."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
from conformance.programs import CASES, Case
from conformance.test_conformance import as_tuple, assert_agrees, relayout

import polytile as pt
from polytile.config import Config
from polytile.errors import OutOfBoundsError
from polytile.runtime import cuda as runtime

PROBLEM = runtime.nvrtc_problem() or (None if shutil.which("g++") else "g++ (for the emulation)")
pytestmark = pytest.mark.skipif(PROBLEM is not None, reason=f"the emulation needs {PROBLEM}")


def run(case: Case, config: Config, layout: str = "c") -> None:
    rng = np.random.default_rng(1)
    args = case.make_inputs(rng)
    initial = case.make_out(rng, args) if case.make_out else {}
    want = as_tuple(case.numpy_reference(*args, **{k: v.copy() for k, v in initial.items()}))
    fn = pt.define(case.source, target="cuda-sm90", config=config)[case.function]
    got = as_tuple(fn(*(relayout(a, layout) for a in args),
                      out={k: v.copy() for k, v in initial.items()} or None))
    for output, g, w in zip(fn.fn.outputs, got, want):
        assert_agrees(g, w, case.tolerance, f"{case.name}: output {output.name}")


TMM = "def tmm(float(M,K) A, float(N,K) B) -> (C) {\n  C(m,n) +=! A(m,k) * B(n,k)\n}\n"
TBMM = ("def tbmm(float(B,N,M) X, float(B,K,M) Y) -> (Z) {\n"
        "  Z(b,n,k) +=! X(b,n,m) * Y(b,k,m)\n}\n")
SOFTMAX = ("def softmax(float(N,M) X) -> (Y) {\n  mx(n) max=! X(n,m)\n"
           "  e(n,m) = exp(X(n,m) - mx(n))\n  s(n) +=! e(n,m)\n  Y(n,m) = e(n,m) / s(n)\n}\n")


def test_staged_tmm_with_boundary_blocks(emulated: Config) -> None:
    """37 x 29 outputs in 16 x 16 tiles, K = 53 in tiles of 16: every tile has a
    boundary; strided inputs go through the launcher's copies."""
    rng = np.random.default_rng(0)
    A = rng.standard_normal((37, 53)).astype(np.float32)
    B = rng.standard_normal((29, 53)).astype(np.float32)
    tmm = pt.define(TMM, target="cuda-sm90", config=emulated).tmm
    np.testing.assert_allclose(tmm(A, B), A @ B.T, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(tmm(np.asfortranarray(A), B), A @ B.T, rtol=1e-5, atol=1e-4)
    driver = runtime.cuda_device().driver
    assert [(name, grid, block) for name, grid, block in driver.launched[:2]] == [
        ("pt_k0", (4, 5, 1), (8, 8, 1)), ("pt_k1", (2, 3, 1), (8, 8, 1))]
    assert not driver.memory            # every device buffer freed


def test_staged_tbmm_in_three_dimensions(emulated: Config) -> None:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((3, 21, 40)).astype(np.float32)
    Y = rng.standard_normal((3, 19, 40)).astype(np.float32)
    tbmm = pt.define(TBMM, target="cuda-sm90", config=emulated).tbmm
    np.testing.assert_allclose(tbmm(X, Y), np.einsum("bnm,bkm->bnk", X, Y),
                               rtol=1e-5, atol=1e-4)


def test_softmax_reduces_across_blocks_of_threads(emulated: Config) -> None:
    X = np.random.default_rng(0).standard_normal((7, 100)).astype(np.float32)
    X[3, 41] = np.nan                   # NaN wins the row maximum, as in NumPy
    softmax = pt.define(SOFTMAX, target="cuda-sm90", config=emulated).softmax
    e = np.exp(X - X.max(axis=1, keepdims=True))
    np.testing.assert_allclose(softmax(X), e / e.sum(axis=1, keepdims=True),
                               rtol=1e-5, atol=1e-6)


def test_a_fused_softmax_runs_a_row_per_block(emulated: Config) -> None:
    """The row group (tests/gpu/test_row_groups.py): one launch, a block of 64 threads
    per row of 1029, the row's intermediates in shared memory, a NaN in one row."""
    X = np.random.default_rng(0).standard_normal((5, 1029)).astype(np.float32)
    X[3, 41] = np.nan
    module = pt.define(SOFTMAX, target="cuda-sm90", config=emulated)
    assert module.compiler is not None
    module.compiler.options = {"fuse.strategy": "rows"}
    e = np.exp(X - X.max(axis=1, keepdims=True))
    np.testing.assert_allclose(module.softmax(relayout(X, "strided")),
                               e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-6)
    driver = runtime.cuda_device().driver
    assert [(name, grid, block) for name, grid, block in driver.launched] == [
        ("pt_k0", (5, 1, 1), (64, 1, 1))]


def test_an_out_of_range_subscript_is_reported(emulated: Config) -> None:
    src = "def g(float(N) X, int32(M) I) -> (Y) {\n  Y(i) = X(I(i))\n}\n"
    g = pt.define(src, target="cuda-sm90", config=emulated).g
    X = np.arange(5, dtype=np.float32)
    np.testing.assert_array_equal(g(X, np.array([4, 0, 2], np.int32)), [4, 0, 2])
    with pytest.raises(OutOfBoundsError, match="I is indexed at 7|X is indexed at 7"):
        g(X, np.array([1, 7, 2], np.int32))


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_conformance_emulated(case: Case, emulated: Config) -> None:
    run(case, emulated, "f" if CASES.index(case) % 2 else "strided")
