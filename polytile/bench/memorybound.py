"""Memory-bound workloads: softmax, layernorm, batchnorm, group norm, bias+GELU+residual.

Each is a chain of small operators that a framework runs as several passes over memory
and polytile should run as one fused kernel. They are benchmarked twice (fresh outputs
and preallocated `out=`), so their rate is given in GB/s of compulsory traffic.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import special  # type: ignore[import-untyped]

from polytile.bench.workload import EPS, Arrays, Workload, normal, torch_module

SOFTMAX = """
def softmax(float(N,D) X) -> (Y) {
  mx(n) max=! X(n,d)
  Y(n,d) = exp(X(n,d) - mx(n))
  s(n) +=! Y(n,d)
  Y(n,d) = Y(n,d) / s(n)
}
"""

LAYERNORM = """
def layernorm(float(N,D) X, float(D) gamma, float(D) beta) -> (Y) {
  mean(n) +=! X(n,d)
  mean(n) = mean(n) / D
  var(n) +=! (X(n,d) - mean(n)) * (X(n,d) - mean(n))
  rstd(n) = rsqrt(var(n) / D + 1e-5)
  Y(n,d) = (X(n,d) - mean(n)) * rstd(n) * gamma(d) + beta(d)
}
"""

# Training-mode batch normalization: statistics over the batch and the image (biased
# variance), as torch.nn.functional.batch_norm(training=True) computes them.
BATCHNORM = """
def batchnorm(float(N,C,H,W) X, float(C) gamma, float(C) beta) -> (Y) {
  mean(c) +=! X(n,c,h,w)
  mean(c) = mean(c) / (N * H * W)
  var(c) +=! (X(n,c,h,w) - mean(c)) * (X(n,c,h,w) - mean(c))
  scale(c) = gamma(c) * rsqrt(var(c) / (N * H * W) + 1e-5)
  Y(n,c,h,w) = (X(n,c,h,w) - mean(c)) * scale(c) + beta(c)
}
"""

# The channels C = G*D arrive split into groups: a free reshape of an NCHW array.
GROUPNORM = """
def groupnorm(float(N,G,D,H,W) X, float(G,D) gamma, float(G,D) beta) -> (Y) {
  mean(n,g) +=! X(n,g,d,h,w)
  mean(n,g) = mean(n,g) / (D * H * W)
  var(n,g) +=! (X(n,g,d,h,w) - mean(n,g)) * (X(n,g,d,h,w) - mean(n,g))
  rstd(n,g) = rsqrt(var(n,g) / (D * H * W) + 1e-5)
  Y(n,g,d,h,w) = (X(n,g,d,h,w) - mean(n,g)) * rstd(n,g) * gamma(g,d) + beta(g,d)
}
"""

# GELU in its exact erf form, PyTorch's default.
GELU = """
def bias_gelu_residual(float(N,D) X, float(D) bias, float(N,D) R) -> (Y) {
  Y(n,d) = R(n,d) + 0.5 * (X(n,d) + bias(d)) * (1 + erf((X(n,d) + bias(d)) * 0.7071067811865476))
}
"""


# ------------------------------------------------------------------ softmax
def _softmax_numpy(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    e /= e.sum(axis=1, keepdims=True)
    return e


def _softmax_numpy_out(x: np.ndarray, *, out: Arrays) -> Arrays:
    (y,) = out
    np.subtract(x, x.max(axis=1, keepdims=True), out=y)
    np.exp(y, out=y)
    np.divide(y, y.sum(axis=1, keepdims=True), out=y)
    return out


def _softmax_torch_out(x: Any, *, out: Any) -> Any:
    return torch_module().ops.aten._softmax.out(x, 1, False, out=out[0])


def softmax(n: int, d: int) -> Workload:
    return Workload(
        "softmax", (("N", n), ("D", d)), SOFTMAX, "softmax", lambda rng: (normal(rng, n, d),),
        _softmax_numpy, _softmax_numpy_out, lambda x: torch_module().softmax(x, 1),
        _softmax_torch_out, bytes=2.0 * n * d * 4, memory_bound=True, rtol=1e-4, atol=1e-8,
        note="over the last axis")


# ------------------------------------------------------------------ normalizations
def _normalize_numpy(x: np.ndarray, axes: tuple[int, ...], gamma: np.ndarray,
                     beta: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """(x - mean) / sqrt(var + eps) * gamma + beta, statistics over `axes`."""
    mean = x.mean(axis=axes, keepdims=True)
    if out is None:
        centered = x - mean
        var = np.mean(centered * centered, axis=axes, keepdims=True)
        centered *= 1.0 / np.sqrt(var + EPS)
        centered *= gamma
        centered += beta
        return centered
    np.subtract(x, mean, out=out)
    count = math.prod(x.shape[a] for a in axes)
    var = _sum_of_squares(out, axes) / count
    out *= 1.0 / np.sqrt(var + EPS)
    out *= gamma
    out += beta
    return out


def _sum_of_squares(x: np.ndarray, axes: Sequence[int]) -> np.ndarray:
    """Sum of x*x over `axes` (keepdims) without a temporary of x's size."""
    letters = "abcdefgh"[:x.ndim]
    kept = "".join(c for i, c in enumerate(letters) if i not in axes)
    result = np.einsum(f"{letters},{letters}->{kept}", x, x)
    return result.reshape([1 if i in axes else s for i, s in enumerate(x.shape)])


def layernorm(n: int, d: int) -> Workload:
    def numpy(x: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
        return _normalize_numpy(x, (1,), g, b)

    def numpy_out(x: np.ndarray, g: np.ndarray, b: np.ndarray, *, out: Arrays) -> Arrays:
        _normalize_numpy(x, (1,), g, b, out[0])
        return out

    return Workload(
        "layernorm", (("N", n), ("D", d)), LAYERNORM, "layernorm",
        lambda rng: (normal(rng, n, d), normal(rng, d), normal(rng, d)), numpy, numpy_out,
        lambda x, g, b: torch_module().nn.functional.layer_norm(x, (d,), g, b, EPS),
        bytes=(2.0 * n * d + 2 * d) * 4, memory_bound=True, rtol=1e-3, atol=1e-4,
        note="over the last axis, eps=1e-5")


def batchnorm(n: int, c: int, h: int, w: int) -> Workload:
    def numpy(x: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
        return _normalize_numpy(x, (0, 2, 3), g.reshape(1, c, 1, 1), b.reshape(1, c, 1, 1))

    def numpy_out(x: np.ndarray, g: np.ndarray, b: np.ndarray, *, out: Arrays) -> Arrays:
        _normalize_numpy(x, (0, 2, 3), g.reshape(1, c, 1, 1), b.reshape(1, c, 1, 1), out[0])
        return out

    def torch(x: Any, g: Any, b: Any) -> Any:
        return torch_module().nn.functional.batch_norm(x, None, None, g, b, training=True,
                                                       eps=EPS)

    return Workload(
        "batchnorm", (("N", n), ("C", c), ("H", h), ("W", w)), BATCHNORM, "batchnorm",
        lambda rng: (normal(rng, n, c, h, w), normal(rng, c), normal(rng, c)), numpy,
        numpy_out, torch, bytes=(2.0 * n * c * h * w + 2 * c) * 4, memory_bound=True,
        rtol=1e-3, atol=1e-4, note="training mode: batch statistics, eps=1e-5")


def groupnorm(n: int, g: int, d: int, h: int, w: int) -> Workload:
    def numpy(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
        return _normalize_numpy(x, (2, 3, 4), gamma.reshape(1, g, d, 1, 1),
                                beta.reshape(1, g, d, 1, 1))

    def numpy_out(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, *,
                  out: Arrays) -> Arrays:
        _normalize_numpy(x, (2, 3, 4), gamma.reshape(1, g, d, 1, 1),
                         beta.reshape(1, g, d, 1, 1), out[0])
        return out

    def torch(x: Any, gamma: Any, beta: Any) -> Any:
        y = torch_module().nn.functional.group_norm(x.reshape(n, g * d, h, w), g,
                                                    gamma.reshape(-1), beta.reshape(-1), EPS)
        return y.reshape(x.shape)

    return Workload(
        "groupnorm", (("N", n), ("G", g), ("D", d), ("H", h), ("W", w)), GROUPNORM,
        "groupnorm", lambda rng: (normal(rng, n, g, d, h, w), normal(rng, g, d),
                                  normal(rng, g, d)),
        numpy, numpy_out, torch, bytes=(2.0 * n * g * d * h * w + 2 * g * d) * 4,
        memory_bound=True, rtol=1e-3, atol=1e-4,
        note=f"{g} groups of {d} channels, eps=1e-5")


# ------------------------------------------------------------------ bias + GELU + residual
_SQRT_HALF = np.float32(math.sqrt(0.5))


def _gelu_numpy(x: np.ndarray, bias: np.ndarray, r: np.ndarray) -> np.ndarray:
    y = x + bias
    t = special.erf(y * _SQRT_HALF)
    t += 1
    y *= t
    y *= 0.5
    y += r
    return y


def _gelu_numpy_out(x: np.ndarray, bias: np.ndarray, r: np.ndarray, *, out: Arrays) -> Arrays:
    (y,) = out
    np.add(x, bias, out=y)
    t = special.erf(y * _SQRT_HALF)
    t += 1
    y *= t
    y *= 0.5
    y += r
    return out


def _gelu_torch(x: Any, bias: Any, r: Any) -> Any:
    return torch_module().nn.functional.gelu(x + bias) + r


def _gelu_torch_out(x: Any, bias: Any, r: Any, *, out: Any) -> Any:
    torch = torch_module()
    (y,) = out
    torch.add(x, bias, out=y)
    torch.ops.aten.gelu_(y)
    y.add_(r)
    return out


def bias_gelu_residual(n: int, d: int) -> Workload:
    return Workload(
        "gelu", (("N", n), ("D", d)), GELU, "bias_gelu_residual",
        lambda rng: (normal(rng, n, d), normal(rng, d), normal(rng, n, d)),
        _gelu_numpy, _gelu_numpy_out, _gelu_torch, _gelu_torch_out,
        bytes=(3.0 * n * d + d) * 4, memory_bound=True, rtol=1e-4, atol=1e-5,
        note="R + GELU(X + bias), erf form")
