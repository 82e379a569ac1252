"""The conformance corpus on the cpu-arm64-dot target: cross-compiled for AArch64 (NEON,
the Armv8.2 dot product) and run under qemu-aarch64 (polytile.runtime.emulated). Each
program runs with C-ordered inputs and with the same values Fortran-ordered or strided,
against its NumPy reference; a sixth of the corpus in every run, all of it in the slow
run (an emulated call costs a process start). int8 matmuls run on sdot/udot and agree
bit for bit with NumPy's int64 product. Without the cross compiler or qemu-aarch64 every
test here skips, saying what is missing."""
from __future__ import annotations

import numpy as np
import pytest

import polytile as pt
from polytile.backends import backend_for
from polytile.config import load_config
from polytile.errors import OutOfBoundsError, UnsupportedError
from polytile.runtime.emulated import cross_problem
from polytile.runtime.toolchain import detect_toolchain
from polytile.targets.target import load_target, select_target

from .programs import CASES, Case
from .test_conformance import run_case

PROBLEM = cross_problem()
pytestmark = pytest.mark.skipif(PROBLEM is not None,
                                reason=f"the cpu-arm64-dot target needs {PROBLEM}")
TARGET = "cpu-arm64-dot"
SAMPLED = [pytest.param(c, id=c.name, marks=() if i % 6 == 0 else pytest.mark.slow)
           for i, c in enumerate(CASES)]


@pytest.mark.parametrize("case", SAMPLED)
def test_conformance_on_arm64(case: Case) -> None:
    run_case(case, "arm64", 0)
    run_case(case, "arm64", 1, "f" if CASES.index(case) % 2 else "strided")


MATMUL = ("def mm({a}(M,K) A, {a}(K,N) B) -> (C) {{\n"
          "  C(m,n) +=! {c}(A(m,k)) * {c}(B(k,n))\n}}\n")


@pytest.mark.parametrize("a, c, instruction", [("int8", "int32", "vdotq_s32"),
                                               ("uint8", "uint32", "vdotq_u32")])
def test_int8_matmuls_run_on_the_dot_product_bit_exactly(a: str, c: str,
                                                         instruction: str) -> None:
    """Sizes that the 4 lanes x 4 bytes of sdot/udot and the 6 x 4 register tile do not
    divide; full-range values, so any saturation or wrong sign extension would show."""
    source = MATMUL.format(a=a, c=c)
    fn = pt.define(source, target=TARGET).mm
    rng = np.random.default_rng(7)
    for m, k, n in [(37, 50, 45), (1, 3, 1), (13, 129, 70)]:
        info = np.iinfo(a)
        A = rng.integers(info.min, info.max + 1, (m, k), dtype=a)
        B = rng.integers(info.min, info.max + 1, (k, n), dtype=a)
        want = (A.astype(np.int64) @ B.astype(np.int64)).astype(c)
        np.testing.assert_array_equal(fn(A, B), want)
    # The 1 x 3 x 1 product has no lane to map; the others run on the instruction.
    sources = [k.source_path.read_text() for k in fn._kernels.values()]
    assert sum(instruction in text for text in sources) == 2


def test_a_failed_check_in_the_emulated_kernel_is_reported() -> None:
    src = "def g(float(N) X, int32(M) I) -> (Y) {\n  Y(i) = X(I(i))\n}\n"
    fn = pt.define(src, target=TARGET).g
    X = np.arange(5, dtype=np.float32)
    np.testing.assert_array_equal(fn(X, np.array([4, 0, 2], np.int32)), [4, 0, 2])
    with pytest.raises(OutOfBoundsError, match="I is indexed at 7|X is indexed at 7"):
        fn(X, np.array([1, 7, 2], np.int32))


def test_the_target_is_never_chosen_for_the_host_and_has_no_sanitizers() -> None:
    assert select_target().name != TARGET
    backend = backend_for(load_target(TARGET))
    with pytest.raises(UnsupportedError, match="no sanitizers"):
        backend.flags(load_target(TARGET), detect_toolchain(load_config()), ("address",))


def test_tuning_the_emulated_target_is_refused() -> None:
    """Timing a kernel under qemu would tune the emulator, not an Arm core."""
    fn = pt.define("def f(float(N) X) -> (Y) {\n  Y(i) = X(i) * 2\n}\n", target=TARGET).f
    with pytest.raises(UnsupportedError, match="emulator"):
        fn.tune(np.ones(40, np.float32), budget_seconds=5)
