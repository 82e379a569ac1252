"""Run conformance cases through compiled kernels in this process: the body of the
sanitizer job (tests/runtime/test_sanitize.py runs it under `polytile sanitize`).

    python tests/runtime/sanitized_corpus.py [--every N] [NAME_SUBSTRING ...]
        (no names: every case; --every N: every N-th of them)

Prints one line per case and exits non-zero on the first disagreement; a sanitizer
report ends the process by itself.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

from conformance.programs import CASES  # noqa: E402
from conformance.test_conformance import run_case  # noqa: E402

import polytile as pt  # noqa: E402

# Sizes at tile boundaries: primes, 1, and sizes one past a vector width.
BOUNDARY = [(97, 13, 31), (1, 1, 1), (3, 17, 5), (17, 33, 9), (65, 7, 129)]
MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
TMM = "def tmm(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,k) * B(n,k) }"
GATHER = "def g(float(E,D) T, int32(B) I) -> (O) { O(b,d) = T(I(b),d) }"


def boundary_sizes() -> None:
    rng = np.random.default_rng(0)
    mm, tmm = pt.define(MM).mm, pt.define(TMM).tmm
    for m, k, n in BOUNDARY:
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        np.testing.assert_allclose(mm(a, b), a @ b, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(tmm(a, b.T.copy()), a @ b, rtol=1e-4, atol=1e-4)
        print(f"ok mm/tmm {m}x{k}x{n}", flush=True)


def gathers_at_the_bounds() -> None:
    g = pt.define(GATHER).g
    table = np.random.default_rng(1).standard_normal((13, 7)).astype(np.float32)
    index = np.array([0, 12, 12, 0, 6], np.int32)       # the first and last rows
    np.testing.assert_array_equal(g(table, index), table[index])
    for bad in (13, -1):
        try:
            g(table, np.array([0, bad], np.int32))
        except pt.PolytileError:
            continue
        raise AssertionError(f"index {bad} was not refused")
    print("ok gathers at the bounds", flush=True)


def main(args: list[str]) -> int:
    every = 1
    if args[:1] == ["--every"]:
        every, args = int(args[1]), args[2:]
    cases = [c for c in CASES if not args or any(n in c.name for n in args)][::every]
    for case in cases:
        run_case(case, "c", seed=0)
        print(f"ok {case.name}", flush=True)
    boundary_sizes()
    gathers_at_the_bounds()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
