"""A bfloat16 matmul (512^3) into a bfloat16 and into a float32 output, as the checkout on
PYTHONPATH compiles it: the median of 15 calls and the largest error against float64
(relative to the largest value). Run it with each checkout in turn, twice, to A/B them:

    PYTHONPATH=/path/to/old python benchmarks/bf16_output_ab.py old
    PYTHONPATH=. python benchmarks/bf16_output_ab.py new
"""
from __future__ import annotations

import sys
import time

import ml_dtypes
import numpy as np

import polytile as pt

SIZE = 512
CALLS = 15


def main(label: str) -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((SIZE, SIZE)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((SIZE, SIZE)).astype(ml_dtypes.bfloat16)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    for out in ("bfloat16(M,N) C", "C"):
        mm = pt.define(f"def mm(bfloat16(M,K) A, bfloat16(K,N) B) -> ({out}) {{\n"
                       "  C(m,n) +=! float(A(m,k)) * float(B(k,n))\n}\n").mm
        c = mm(a, b)
        times = []
        for _ in range(CALLS):
            start = time.perf_counter()
            mm(a, b)
            times.append(time.perf_counter() - start)
        error = float(np.abs(c.astype(np.float64) - exact).max() / np.abs(exact).max())
        print(f"{label} output {'bfloat16' if 'bfloat16' in out else 'float32':8s} "
              f"median {1e3 * sorted(times)[CALLS // 2]:.3f} ms, largest error {error:.2e}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
