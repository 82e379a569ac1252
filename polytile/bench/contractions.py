"""Contraction-like workloads from the TC paper (§7): tmm, tbmm, gconv, MLP1, MLP3, 2LUT;
and the shift convolution of the extended tensor contractions paper.

Sizes are given by the caller (polytile.bench.workloads lists them). The NumPy
versions use BLAS the way a NumPy user would; the PyTorch versions are eager calls.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from polytile.bench.workload import Arrays, Workload, torch_module, uniform

TMM = """
def tmm(float(M,K) A, float(N,K) B) -> (C) {
  C(m,n) +=! A(m,kk) * B(n,kk)
}
"""

TBMM = """
def tbmm(float(B,N,M) X, float(B,K,M) Y) -> (Z) {
  Z(b,n,k) +=! X(b,n,m) * Y(b,k,m)
}
"""

# The paper's bias B(m) has an index that appears nowhere else; the bias is per group
# and filter, as in a framework's grouped convolution.
GCONV = """
def gconv(float(N,G,C,H,W) I, float(G,F,C,KH,KW) W1, float(G,F) B) -> (O) {
  O(n,g,o,h,w) +=! I(n,g,i, h + kh, w + kw) * W1(g,o,i,kh,kw)
  O(n,g,o,h,w) = O(n,g,o,h,w) + B(g,o)
}
"""

# The shift convolution of the extended tensor contractions paper (Wu et al.'s shift
# layer then a 1x1 convolution): every channel moved by its own data-dependent offset in
# [-1, 1], valid range only.
SHIFT_CONV = """
def shiftconv(float(N,C,H,W) I, int(C) SH, int(C) SW, float(O,C) Wt) -> (Out) {
  Out(n,o,h,w) +=! I(n, c, h + 1 + SH(c), w + 1 + SW(c)) * Wt(o,c) where h in 0:H-2, w in 0:W-2
}
"""

MLP1 = """
def MLP1(float(B,M) I, float(N,M) W1, float(N) B1) -> (O1) {
  O1(b,n) = B1(n)
  O1(b,n) += I(b,m) * W1(n,m)
  O1(b,n) = fmaxf(O1(b,n), 0)
}
"""

# The paper's MLP3 (Fig. 15) returns O2 and O3 as well; here they are temporaries, so
# the comparison with a framework (which returns only the last layer) is like for like.
MLP3 = """
def MLP3(float(B,M) I, float(O,M) W2, float(O) B2, float(P,O) W3, float(P) B3,
         float(Q,P) W4, float(Q) B4) -> (O4) {
  O2(b,o) = B2(o)
  O2(b,o) += I(b,m) * W2(o,m)
  O2(b,o) = fmaxf(O2(b,o), 0)
  O3(b,p) = B3(p)
  O3(b,p) += O2(b,o) * W3(p,o)
  O3(b,p) = fmaxf(O3(b,p), 0)
  O4(b,q) = B4(q)
  O4(b,q) += O3(b,p) * W4(q,p)
  O4(b,q) = fmaxf(O4(b,q), 0)
}
"""

TWO_LUT = """
def 2LUT(float(E1,D) LUT1, int(B,L1) I1, float(E2,D) LUT2, int(B,L2) I2) -> (O1, O2) {
  O1(i,j) +=! LUT1(I1(i,k),j)
  O2(i,j) +=! LUT2(I2(i,k),j)
}
"""


def tmm(m: int, k: int, n: int) -> Workload:
    return Workload(
        "tmm", (("M", m), ("K", k), ("N", n)), TMM, "tmm",
        lambda rng: (uniform(rng, m, k), uniform(rng, n, k)),
        lambda a, b: a @ b.T,
        torch=lambda a, b: a @ b.T,
        flops=2.0 * m * n * k, rtol=1e-3, atol=1e-3)


def tbmm(b: int, n: int, m: int, k: int) -> Workload:
    return Workload(
        "tbmm", (("B", b), ("N", n), ("M", m), ("K", k)), TBMM, "tbmm",
        lambda rng: (uniform(rng, b, n, m), uniform(rng, b, k, m)),
        lambda x, y: np.matmul(x, y.transpose(0, 2, 1)),
        torch=lambda x, y: torch_module().bmm(x, y.transpose(1, 2)),
        flops=2.0 * b * n * m * k, rtol=1e-3, atol=1e-3)


def _gconv_numpy(i: np.ndarray, w: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """im2col (one copy) and one batched matmul per group, as a NumPy user would."""
    n, g, c, _, _ = i.shape
    _, f, _, kh, kw = w.shape
    windows = sliding_window_view(i, (kh, kw), axis=(3, 4))    # n g c oh ow kh kw
    oh, ow = windows.shape[3:5]
    cols = windows.transpose(1, 0, 3, 4, 2, 5, 6).reshape(g, n * oh * ow, c * kh * kw)
    out = np.matmul(cols, w.reshape(g, f, c * kh * kw).transpose(0, 2, 1))  # g, n*oh*ow, f
    out = out.reshape(g, n, oh, ow, f).transpose(1, 0, 4, 2, 3)
    return np.add(out, bias[None, :, :, None, None])


def _gconv_torch(i: Any, w: Any, bias: Any) -> Any:
    n, g, c, h, wd = i.shape
    _, f, _, kh, kw = w.shape
    out = torch_module().nn.functional.conv2d(i.reshape(n, g * c, h, wd), w.reshape(g * f, c, kh, kw),
                                        bias.reshape(-1), groups=g)
    return out.reshape(n, g, f, h - kh + 1, wd - kw + 1)


def gconv(n: int, g: int, f: int, c: int, h: int, w: int, k: int = 3) -> Workload:
    oh, ow = h - k + 1, w - k + 1
    return Workload(
        "gconv", (("N", n), ("G", g), ("F", f), ("C", c), ("H", h), ("W", w)), GCONV, "gconv",
        lambda rng: (uniform(rng, n, g, c, h, w), uniform(rng, g, f, c, k, k),
                     uniform(rng, g, f)),
        _gconv_numpy, torch=_gconv_torch,
        flops=2.0 * n * g * f * c * oh * ow * k * k, rtol=1e-3, atol=1e-3,
        note=f"{k}x{k} kernel, stride 1, no padding")


def _shift_conv_numpy(i: np.ndarray, sh: np.ndarray, sw: np.ndarray, wt: np.ndarray
                      ) -> np.ndarray:
    """Gather the shifted channels (one copy), then one batched matmul, as a NumPy user would."""
    n, c, h, w = i.shape
    moved = np.empty((n, c, h - 2, w - 2), np.float32)
    for k in range(c):
        a, b = 1 + int(sh[k]), 1 + int(sw[k])
        moved[:, k] = i[:, k, a:a + h - 2, b:b + w - 2]
    return np.matmul(wt, moved.reshape(n, c, -1)).reshape(n, -1, h - 2, w - 2)


def shift_conv(n: int, c: int, o: int, h: int, w: int) -> Workload:
    return Workload(
        "shiftconv", (("N", n), ("C", c), ("O", o), ("H", h), ("W", w)), SHIFT_CONV,
        "shiftconv",
        lambda rng: (uniform(rng, n, c, h, w), rng.integers(-1, 2, c).astype(np.int32),
                     rng.integers(-1, 2, c).astype(np.int32), uniform(rng, o, c)),
        _shift_conv_numpy, flops=2.0 * n * o * c * (h - 2) * (w - 2), rtol=1e-3, atol=1e-3,
        note="shifts in [-1, 1] from data, valid range")


def _dense_relu_numpy(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    y = x @ w.T
    y += b
    return np.maximum(y, 0, out=y)


def _dense_relu_torch(x: Any, w: Any, b: Any) -> Any:
    torch = torch_module()
    return torch.relu_(torch.addmm(b, x, w.T))


def mlp1(b: int, m: int, n: int) -> Workload:
    return Workload(
        "MLP1", (("B", b), ("M", m), ("N", n)), MLP1, "MLP1",
        lambda rng: (uniform(rng, b, m), uniform(rng, n, m), uniform(rng, n)),
        _dense_relu_numpy, torch=_dense_relu_torch,
        flops=2.0 * b * m * n, rtol=1e-3, atol=1e-3)


def _mlp3(fn: Callable[..., Any]) -> Callable[..., Any]:
    def run(x: Any, w2: Any, b2: Any, w3: Any, b3: Any, w4: Any, b4: Any) -> Any:
        return fn(fn(fn(x, w2, b2), w3, b3), w4, b4)
    return run


def mlp3(b: int, m: int, o: int, p: int, q: int) -> Workload:
    # Scaled by 1/sqrt(fan-in) so activations keep their size through the layers.
    def inputs(rng: np.random.Generator) -> Arrays:
        return (uniform(rng, b, m), uniform(rng, o, m) / np.float32(math.sqrt(m)),
                uniform(rng, o), uniform(rng, p, o) / np.float32(math.sqrt(o)),
                uniform(rng, p), uniform(rng, q, p) / np.float32(math.sqrt(p)),
                uniform(rng, q))
    return Workload(
        "MLP3", (("B", b), ("M", m), ("O", o), ("P", p), ("Q", q)), MLP3, "MLP3", inputs,
        _mlp3(_dense_relu_numpy), torch=_mlp3(_dense_relu_torch),
        flops=2.0 * b * (m * o + o * p + p * q), rtol=1e-3, atol=1e-4)


def _lut_numpy(lut1: np.ndarray, i1: np.ndarray, lut2: np.ndarray, i2: np.ndarray
               ) -> Arrays:
    return lut1[i1].sum(axis=1), lut2[i2].sum(axis=1)


def _lut_numpy_out(lut1: np.ndarray, i1: np.ndarray, lut2: np.ndarray, i2: np.ndarray, *,
                   out: Arrays) -> Arrays:
    np.sum(lut1[i1], axis=1, out=out[0])
    np.sum(lut2[i2], axis=1, out=out[1])
    return out


def _lut_torch(lut1: Any, i1: Any, lut2: Any, i2: Any) -> Any:
    bag = torch_module().nn.functional.embedding_bag
    return bag(i1, lut1, mode="sum"), bag(i2, lut2, mode="sum")


def two_lut(e: int, d: int, b: int, lookups: int) -> Workload:
    def inputs(rng: np.random.Generator) -> Arrays:
        return (rng.random((e, d), dtype=np.float32),
                rng.integers(0, e, (b, lookups), dtype=np.int32),
                rng.random((e, d), dtype=np.float32),
                rng.integers(0, e, (b, lookups), dtype=np.int32))
    traffic = 2.0 * (b * lookups * d * 4 + b * lookups * 4 + b * d * 4)
    return Workload(
        "2LUT", (("E", e), ("D", d), ("B", b), ("L", lookups)), TWO_LUT, "2LUT", inputs,
        _lut_numpy, _lut_numpy_out, _lut_torch, bytes=traffic, memory_bound=True,
        rtol=1e-5, atol=1e-4, note="torch: embedding_bag(mode='sum')")

