"""pt_vload_n / pt_vstore_n (polytile/codegen/vmath.py): the first n lanes, never memory
past p[n-1], for every n, whole (n >= lanes) and empty (n <= 0) counts included, which take
plain moves instead of the masked ones."""
from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import numpy as np
import pytest

from polytile.codegen.vmath import vector_math
from polytile.targets.target import host_features

# (lanes, the ISA flags whose masked moves the helpers use, the host features they need)
VARIANTS = [(8, ["-mavx2", "-mfma"], {"avx2", "fma"}), (8, [], set()),
            (16, ["-mavx512f"], {"avx512f"}), (16, [], set())]
BODY = """
void load_n(const float *p, long n, float *out) { pt_vstore(out, pt_vload_n(p, n)); }
void store_n(float *p, const float *v, long n) { pt_vstore_n(p, pt_vload(v), n); }
"""


def _library(tmp_path: Path, lanes: int, flags: list[str]) -> ctypes.CDLL:
    source = tmp_path / "moves.c"
    source.write_text("#include <stdint.h>\n#include <math.h>\n" + vector_math(lanes) + BODY)
    subprocess.run(["cc", "-O2", *flags, "-shared", "-fPIC", str(source), "-o",
                    str(tmp_path / "moves.so"), "-lm"], check=True)
    return ctypes.CDLL(str(tmp_path / "moves.so"))


def _ptr(a: np.ndarray) -> ctypes.c_void_p:
    return a.ctypes.data_as(ctypes.c_void_p)


@pytest.mark.parametrize("lanes, flags, needs", VARIANTS,
                         ids=[f"{lanes}-{'-'.join(f) or 'generic'}" for lanes, f, _ in VARIANTS])
def test_masked_moves_touch_exactly_the_first_n_lanes(tmp_path: Path, lanes: int,
                                                      flags: list[str], needs: set[str]) -> None:
    if not needs <= host_features():
        pytest.skip(f"this host has no {', '.join(sorted(needs - host_features()))}")
    lib = _library(tmp_path, lanes, flags)
    rng = np.random.default_rng(lanes)
    for n in (-3, 0, 1, lanes // 2 + 1, lanes - 1, lanes, lanes + 5, 32, 33, 1 << 31):
        k = min(max(n, 0), lanes)
        source = rng.standard_normal(2 * lanes).astype(np.float32)
        got = np.full(lanes, np.nan, np.float32)
        lib.load_n(_ptr(source), ctypes.c_long(n), _ptr(got))
        want = np.where(np.arange(lanes) < k, source[:lanes], 0.0).astype(np.float32)
        np.testing.assert_array_equal(got, want, err_msg=f"load of {n} lanes")
        memory = np.full(2 * lanes, -7.0, np.float32)
        value = rng.standard_normal(lanes).astype(np.float32)
        lib.store_n(_ptr(memory), _ptr(value), ctypes.c_long(n))
        np.testing.assert_array_equal(memory[:k], value[:k], err_msg=f"store of {n} lanes")
        assert (memory[k:] == -7.0).all(), f"a store of {n} lanes wrote past lane {k}"
