"""A compiled kernel's run-time failures reach the caller as the right error: an
allocation that fails is a KernelError about memory (it was reported as an
out-of-bounds index whose value was the byte count)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import polytile as pt
from polytile.config import Config


def test_a_temporary_too_large_to_allocate_is_a_kernel_error(tmp_path: Path) -> None:
    mod = pt.define("""def f(float(N) A, float(M) B) -> (O) {
      T(i,j) = A(i) * B(j)
      O(j) +=! T(i,j)
    }""", config=Config(cache_dir=tmp_path))
    # T would be 144 TB: more than the address space, so no overcommit setting grants it.
    n = 6_000_000
    with pytest.raises(pt.KernelError, match="out of memory allocating a 144000000000000-byte"):
        mod.f(np.ones(n, np.float32), np.ones(n, np.float32))
    small = np.arange(3, dtype=np.float32)
    np.testing.assert_allclose(mod.f(small, small), small * small.sum())


def test_a_gather_out_of_range_is_an_out_of_bounds_error(tmp_path: Path) -> None:
    mod = pt.define("def g(float(E) T, int32(B) I) -> (O) { O(b) = T(I(b)) }",
                    config=Config(cache_dir=tmp_path))
    with pytest.raises(pt.OutOfBoundsError, match="T is indexed at 7 in dimension 0"):
        mod.g(np.ones(4, np.float32), np.array([0, 7], np.int32))
