"""Derive the rational approximation of erf in polytile/codegen/vmath.py (a tool, not a
benchmark: it prints the coefficients vmath.py holds and their error).

    python benchmarks/fit_erf.py

erf(x) ~ x P(x^2) / Q(x^2) on |x| <= CLAMP, P of degree 6, Q of degree 4 with Q(0) = 1,
fitted by linearized least squares (x P(t) - erf(x) Q(t) = 0 at 40000 points, weighted
by 1/Q of the previous iterate) with Lawson's reweighting toward the minimax error. The
error printed is that of the float32 coefficients evaluated in float32 arithmetic
without fused multiply-adds (each operation rounded), against float64 erf; the C code's
own error is measured by tests/codegen/test_vmath.py.
"""
from __future__ import annotations

import numpy as np
from scipy.special import erf

CLAMP = 3.92        # erf(3.92) = 1 - 3.5e-8: beyond it float32 erf is 1 - 2^-24 or 1
P_DEGREE, Q_DEGREE = 6, 4


def fit(iterations: int = 30) -> tuple[np.ndarray, np.ndarray, float]:
    x = np.linspace(0.0, CLAMP, 40001)[1:]
    t, f = x * x, erf(x)
    columns = np.hstack([x[:, None] * t[:, None] ** np.arange(P_DEGREE + 1),
                         -f[:, None] * t[:, None] ** np.arange(1, Q_DEGREE + 1)])
    q = np.ones_like(t)
    lawson = np.ones_like(t)
    best: tuple[float, np.ndarray, np.ndarray] | None = None
    for k in range(iterations):
        w = lawson / np.abs(q)
        solution, *_ = np.linalg.lstsq(columns * w[:, None], f * w, rcond=None)
        p_coeffs = solution[:P_DEGREE + 1]
        q_coeffs = np.concatenate([[1.0], solution[P_DEGREE + 1:]])
        q = np.polynomial.polynomial.polyval(t, q_coeffs)
        error = x * np.polynomial.polynomial.polyval(t, p_coeffs) / q - f
        worst = float(np.abs(error).max())
        if best is None or worst < best[0]:
            best = (worst, p_coeffs, q_coeffs)
        if k > 5:
            lawson = lawson * np.sqrt(np.abs(error))
            lawson /= lawson.max()
    assert best is not None
    return best[1], best[2], best[0]


def float32_error(p_coeffs: np.ndarray, q_coeffs: np.ndarray) -> float:
    x = np.linspace(0.0, CLAMP, 400001, dtype=np.float32)
    t = x * x
    p = np.float32(p_coeffs[-1])
    for c in p_coeffs[-2::-1]:
        p = p * t + np.float32(c)
    q = np.float32(q_coeffs[-1])
    for c in q_coeffs[-2::-1]:
        q = q * t + np.float32(c)
    return float(np.abs((x * p / q).astype(np.float64) - erf(x.astype(np.float64))).max())


def main() -> None:
    p_coeffs, q_coeffs, worst = fit()
    print(f"max |error| {worst:.2e} in float64, {float32_error(p_coeffs, q_coeffs):.2e} "
          "in float32")
    print("P (t^0 first):", ", ".join(str(np.float32(c)) for c in p_coeffs))
    print("Q (t^0 first):", ", ".join(str(np.float32(c)) for c in q_coeffs))


if __name__ == "__main__":
    main()
