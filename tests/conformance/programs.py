"""The conformance corpus: TC programs, each with an input generator and an independent
NumPy implementation written here (nothing in this file calls polytile).

Every backend must agree with the NumPy reference on every case; `test_conformance.py`
runs them through each backend, and later issues run the same corpus through the
compiled C code. A case is

    Case(name, source, function, make_inputs, numpy_reference, tolerance, make_out)

* `make_inputs(rng) -> tuple` gives the call's arguments (arrays and scalars), with
  sizes drawn from small primes and 1 so that nothing divides a tile evenly;
* `numpy_reference(*args, **initial) -> outputs` returns one array or a tuple in the
  declared order, with the dtype the TC output must have; `initial` holds the starting
  values of in/out outputs (the paper's sgemm reads C);
* `tolerance` is the largest relative error in norm, ||got - want|| / ||want||, for
  floating outputs (0 = exact; integer and bool outputs are always compared exactly);
* `make_out(rng, args) -> {name: array}` gives in/out outputs their initial values.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
from scipy import special

PAPER = Path(__file__).resolve().parents[1] / "paper"

F32, F64, F16, BF16 = 1e-5, 1e-12, 1e-2, 2e-2
EXACT = 0.0
SIZES = (1, 2, 3, 5, 7, 11, 13)
bf16 = np.dtype(ml_dtypes.bfloat16)


@dataclass(frozen=True)
class Case:
    name: str
    source: str
    function: str
    make_inputs: Callable[[np.random.Generator], tuple]
    numpy_reference: Callable[..., Any]
    tolerance: float = F32
    make_out: Callable[[np.random.Generator, tuple], dict[str, np.ndarray]] | None = None


CASES: list[Case] = []


def case(name: str, source: str, inputs: Callable[[np.random.Generator], tuple],
         reference: Callable[..., Any], tolerance: float = F32, function: str | None = None,
         make_out: Callable[[np.random.Generator, tuple], dict[str, np.ndarray]] | None = None
         ) -> None:
    if function is None:
        match = re.search(r"def\s+(\w+)\s*\(", source)
        assert match is not None
        function = match.group(1)
    assert all(c.name != name for c in CASES), name
    CASES.append(Case(name, source, function, inputs, reference, tolerance, make_out))


def paper(file: str, function: str | None = None) -> str:
    """A program of the TC paper exactly as printed (tests/paper/*.tc); with `function`,
    only that `def` of the file."""
    text = (PAPER / file).read_text()
    if function is None:
        return text
    start = text.index(f"def {function}(")
    end = text.find("\ndef ", start + 1)
    return text[start:] if end < 0 else text[start:end + 1]


# ------------------------------------------------------------------ input helpers

def dim(rng: np.random.Generator, lo: int = 1, hi: int = 13) -> int:
    return int(rng.choice([s for s in SIZES if lo <= s <= hi]))


def normal(rng: np.random.Generator, *shape: int, dtype: Any = np.float32) -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


def uniform(rng: np.random.Generator, lo: float, hi: float, *shape: int,
            dtype: Any = np.float32) -> np.ndarray:
    return rng.uniform(lo, hi, shape).astype(dtype)


def nonzero_ints(rng: np.random.Generator, bound: int, *shape: int,
                 dtype: Any = np.int32) -> np.ndarray:
    """Integers in [-bound, bound] without 0."""
    mag = rng.integers(1, bound + 1, shape)
    return (mag * rng.choice([-1, 1], shape)).astype(dtype)


def f32(x: Any) -> np.ndarray:
    return np.asarray(x, dtype=np.float64).astype(np.float32)


def f64(x: Any) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def wrap(x: Any, dtype: Any) -> np.ndarray:
    """Two's-complement wrap-around of exact integers into `dtype`."""
    info = np.iinfo(dtype)
    span = int(info.max) - int(info.min) + 1
    v = (np.asarray(x, dtype=object) - int(info.min)) % span + int(info.min)
    return np.asarray(v.astype(np.int64) if info.max < 2**63 else v.astype(np.uint64)
                      ).astype(dtype)


def trunc_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C's integer division on exact integers: truncates toward zero."""
    return np.fix(f64(a) / f64(b)).astype(np.int64)


# ================================================================== contractions

case("mv (paper, two statements)", paper("mv.tc"),
     lambda rng: (normal(rng, dim(rng), k := dim(rng)), normal(rng, k)),
     lambda A, x: f32(f64(A) @ f64(x)))

case("mv (paper, +=!)", paper("mv_init.tc"),
     lambda rng: (normal(rng, dim(rng), k := dim(rng)), normal(rng, k)),
     lambda A, x: f32(f64(A) @ f64(x)))

case("mm (paper Fig. 11)", paper("mm.tc"),
     lambda rng: (normal(rng, dim(rng), k := dim(rng)), normal(rng, k, dim(rng))),
     lambda A, B: f32(f64(A) @ f64(B)))


def _sgemm_out(rng: np.random.Generator, args: tuple) -> dict[str, np.ndarray]:
    return {"C": normal(rng, args[2].shape[0], args[3].shape[1])}


case("sgemm (paper Fig. 1, C in/out)", paper("sgemm.tc"),
     lambda rng: (np.float32(rng.uniform(0.5, 2)), np.float32(rng.uniform(-2, -0.5)),
                  normal(rng, dim(rng), m := dim(rng)), normal(rng, m, dim(rng))),
     lambda a, b, A, B, C: f32(float(b) * f64(C) + float(a) * (f64(A) @ f64(B))),
     make_out=_sgemm_out)

case("tmm (paper)", paper("tmm.tc"),
     lambda rng: (normal(rng, dim(rng), k := dim(rng)), normal(rng, dim(rng), k)),
     lambda A, B: f32(f64(A) @ f64(B).T))

case("tbmm (paper)", paper("tbmm.tc"),
     lambda rng: (normal(rng, b := dim(rng, 1, 5), dim(rng), m := dim(rng)),
                  normal(rng, b, dim(rng), m)),
     lambda X, Y: f32(np.einsum("bnm,bkm->bnk", f64(X), f64(Y))))

case("batched mm", """
def bmm(float(B,M,K) X, float(B,K,N) Y) -> (Z) {
  Z(b,i,j) +=! X(b,i,k) * Y(b,k,j)
}""",
     lambda rng: (normal(rng, b := dim(rng, 1, 5), dim(rng), k := dim(rng)),
                  normal(rng, b, k, dim(rng))),
     lambda X, Y: f32(f64(X) @ f64(Y)))

case("outer product", """
def outer(float(M) a, float(N) b) -> (O) {
  O(i,j) = a(i) * b(j)
}""",
     lambda rng: (normal(rng, dim(rng)), normal(rng, dim(rng))),
     lambda a, b: f32(np.outer(f64(a), f64(b))))

case("outerProductMM (paper)", paper("outerProductMM.tc"),
     lambda rng: (normal(rng, dim(rng, 1, 5), dim(rng, 1, 5), r := dim(rng)),
                  normal(rng, dim(rng, 1, 5), r, dim(rng, 1, 5))),
     lambda A, B: f32(np.einsum("pqr,srt->psqt", f64(A), f64(B))))

case("3-tensor contraction", """
def contract3(float(P,I,J) A, float(J,K,Q) B, float(I,K) C) -> (D) {
  D(p,q) +=! A(p,i,j) * B(j,k,q) * C(i,k)
}""",
     lambda rng: (normal(rng, dim(rng, 1, 7), i := dim(rng, 1, 7), j := dim(rng, 1, 7)),
                  normal(rng, j, k := dim(rng, 1, 7), dim(rng, 1, 7)), normal(rng, i, k)),
     lambda A, B, C: f32(np.einsum("pij,jkq,ik->pq", f64(A), f64(B), f64(C))))

case("bilinear form", """
def bilinear(float(B,I) X, float(O,I,J) W, float(B,J) Y) -> (Z) {
  Z(b,o) +=! X(b,i) * W(o,i,j) * Y(b,j)
}""",
     lambda rng: (normal(rng, b := dim(rng, 1, 7), i := dim(rng, 1, 7)),
                  normal(rng, dim(rng, 1, 7), i, j := dim(rng, 1, 7)), normal(rng, b, j)),
     lambda X, W, Y: f32(np.einsum("bi,oij,bj->bo", f64(X), f64(W), f64(Y))))

case("kronecker product", """
def kron(float(M,N) A, float(P,Q) B) -> (K) {
  K(i,j,k,l) = A(i,j) * B(k,l)
}""",
     lambda rng: (normal(rng, dim(rng, 1, 5), dim(rng, 1, 5)),
                  normal(rng, dim(rng, 1, 5), dim(rng, 1, 5))),
     lambda A, B: f32(np.einsum("ij,kl->ijkl", f64(A), f64(B))))

case("squared distance matrix", """
def sqdist(float(M,D) X, float(N,D) Y) -> (Dist) {
  Dist(i,j) +=! (X(i,k) - Y(j,k)) * (X(i,k) - Y(j,k))
}""",
     lambda rng: (normal(rng, dim(rng), d := dim(rng)), normal(rng, dim(rng), d)),
     lambda X, Y: f32(((f64(X)[:, None, :] - f64(Y)[None, :, :]) ** 2).sum(-1)))

case("dot product, 0-d output", """
def dot(float(N) x, float(N) y) -> (d) {
  d() +=! x(i) * y(i)
}""",
     lambda rng: (normal(rng, n := dim(rng)), normal(rng, n)),
     lambda x, y: f32(np.dot(f64(x), f64(y))))

case("sum of all elements, 0-d output without parentheses", """
def total(float(M,N) A) -> (s) {
  s +=! A(i,j)
}""",
     lambda rng: (normal(rng, dim(rng), dim(rng)),),
     lambda A: f32(f64(A).sum()))

case("trace", """
def trace(float(N,N) A) -> (t) {
  t +=! A(i,i)
}""",
     lambda rng: (normal(rng, n := dim(rng), n),),
     lambda A: f32(np.trace(f64(A))))

case("frobenius norm through a 0-d temporary", """
def fro(float(M,N) A) -> (r) {
  s +=! A(i,j) * A(i,j)
  r = sqrt(s)
}""",
     lambda rng: (normal(rng, dim(rng), dim(rng)),),
     lambda A: f32(np.linalg.norm(f64(A))))

case("double-precision mm", """
def dmm(double(M,K) A, double(K,N) B) -> (C) {
  C(m,n) +=! A(m,k) * B(k,n)
}""",
     lambda rng: (normal(rng, dim(rng), k := dim(rng), dtype=np.float64),
                  normal(rng, k, dim(rng), dtype=np.float64)),
     lambda A, B: A @ B, F64)

case("row sums into a declared float64 output", """
def rowsum(float(M,N) A) -> (float64(M) S) {
  S(i) +=! A(i,j)
}""",
     lambda rng: (normal(rng, dim(rng), dim(rng)),),
     lambda A: f64(A).sum(axis=1), F64)

# ================================================================== layers of the paper

case("fcrelu (paper)", paper("fcrelu.tc"),
     lambda rng: (normal(rng, dim(rng), i := dim(rng)), normal(rng, i, i), normal(rng, i)),
     lambda x, w, b: f32(np.maximum(f64(x) @ f64(w).T + f64(b), 0)))

case("MLP1 (paper Fig. 15)", paper("production_model.tc", "MLP1"),
     lambda rng: (normal(rng, dim(rng), m := dim(rng)), normal(rng, o := dim(rng), m),
                  normal(rng, o)),
     lambda I, W1, B1: f32(np.maximum(f64(I) @ f64(W1).T + f64(B1), 0)))

MLP3_FIXED = paper("production_model.tc", "MLP3").replace(
    "def MLP3(float(B,M) I,", "def MLP3(float(B,N) O1,").replace("(O1,O2,O3,O4)", "(O2,O3,O4)")


def _mlp3_inputs(rng: np.random.Generator) -> tuple:
    b, n, o, p, q = (dim(rng) for _ in range(5))
    return (normal(rng, b, n), normal(rng, o, n), normal(rng, o), normal(rng, p, o),
            normal(rng, p), normal(rng, q, p), normal(rng, q))


def _mlp3_reference(O1, W2, B2, W3, B3, W4, B4):  # type: ignore[no-untyped-def]
    o2 = np.maximum(f64(O1) @ f64(W2).T + f64(B2), 0)
    o3 = np.maximum(o2 @ f64(W3).T + f64(B3), 0)
    o4 = np.maximum(o3 @ f64(W4).T + f64(B4), 0)
    return f32(o2), f32(o3), f32(o4)


case("MLP3 (paper Fig. 15, O1 made an input)", MLP3_FIXED, _mlp3_inputs, _mlp3_reference)


def _lut_inputs(rng: np.random.Generator) -> tuple:
    b, d, e1, e2 = dim(rng), dim(rng), dim(rng), dim(rng)
    return (normal(rng, e1, d), rng.integers(0, e1, (b, dim(rng))).astype(np.int32),
            normal(rng, e2, d), rng.integers(0, e2, (b, dim(rng))).astype(np.int32))


case("2LUT (paper)", paper("2LUT.tc"), _lut_inputs,
     lambda L1, I1, L2, I2: (f32(f64(L1)[I1].sum(axis=1)), f32(f64(L2)[I2].sum(axis=1))))

case("gather (paper)", paper("gather.tc"),
     lambda rng: (normal(rng, n := dim(rng)),
                  rng.integers(0, n, (dim(rng), dim(rng))).astype(np.int32)),
     lambda X, I: X[I], EXACT)

case("conv1d (paper §3.1, with +=!)", paper("conv1d.tc").replace("O(i) =", "O(i) +=!"),
     lambda rng: (normal(rng, m := dim(rng, 2)), normal(rng, dim(rng, 1, m))),
     lambda I, K: f32(np.correlate(f64(I), f64(K), mode="valid")))

case("conv2d (paper)", paper("conv2d.tc"),
     lambda rng: (normal(rng, dim(rng, 1, 3), ip := dim(rng, 1, 5), dim(rng, 3), dim(rng, 2)),
                  normal(rng, dim(rng, 1, 5), ip, dim(rng, 1, 3), dim(rng, 1, 2))),
     lambda I, W: f32(_conv2d(f64(I), f64(W), 1, 1)))


def _conv2d(x: np.ndarray, w: np.ndarray, sh: int, sw: int, dh: int = 1,
            dw: int = 1) -> np.ndarray:
    """Direct NCHW convolution (cross-correlation), valid padding."""
    n, _, h, wd = x.shape
    f, _, kh, kw = w.shape
    oh = (h - dh * (kh - 1) - 1) // sh + 1
    ow = (wd - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, f, oh, ow))
    for a in range(kh):
        for b in range(kw):
            patch = x[:, :, a * dh:a * dh + sh * (oh - 1) + 1:sh,
                      b * dw:b * dw + sw * (ow - 1) + 1:sw]
            out += np.einsum("nchw,fc->nfhw", patch, w[:, :, a, b])
    return out


case("sconv2d (paper, strides as scalar arguments)", paper("sconv2d.tc"),
     lambda rng: (int(rng.integers(1, 4)), int(rng.integers(1, 4)),
                  normal(rng, dim(rng, 1, 3), c := dim(rng, 1, 5), dim(rng, 5), dim(rng, 3)),
                  normal(rng, f := dim(rng, 1, 5), c, dim(rng, 1, 3), dim(rng, 1, 3)),
                  normal(rng, f)),
     lambda sh, sw, I, W, B: f32(_conv2d(f64(I), f64(W), sh, sw)
                                 + f64(B)[None, :, None, None]))

case("strided conv2d with constant strides", """
def conv_s2(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) {
  O(n,f,h,w) +=! I(n,c, 2 * h + kh, 3 * w + kw) * Wt(f,c,kh,kw)
}""",
     lambda rng: (normal(rng, dim(rng, 1, 3), c := dim(rng, 1, 5), dim(rng, 3), dim(rng, 3)),
                  normal(rng, dim(rng, 1, 5), c, dim(rng, 1, 3), dim(rng, 1, 3))),
     lambda I, W: f32(_conv2d(f64(I), f64(W), 2, 3)))

case("dilated conv2d (scalar dilation)", """
def dilated(int d, float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) {
  O(n,f,h,w) +=! I(n,c, h + d * kh, w + d * kw) * Wt(f,c,kh,kw)
}""",
     lambda rng: (2, normal(rng, dim(rng, 1, 3), c := dim(rng, 1, 3), dim(rng, 7),
                            dim(rng, 7)),
                  normal(rng, dim(rng, 1, 3), c, dim(rng, 1, 3), dim(rng, 1, 3))),
     lambda d, I, W: f32(_conv2d(f64(I), f64(W), 1, 1, d, d)))


def _gconv_reference(I, W1, B):  # type: ignore[no-untyped-def]
    n, g, _, h, w = I.shape
    _, f, _, kh, kw = W1.shape
    out = np.zeros((n, g, f, h - kh + 1, w - kw + 1))
    for gi in range(g):
        out[:, gi] = _conv2d(f64(I[:, gi]), f64(W1[gi]), 1, 1)
    return f32(out + f64(B)[None, None, :, None, None])


case("gconv (paper, bias indexed by the output channel)",
     paper("gconv.tc").replace("float(M) B", "float(F) B").replace("B(m)", "B(o)"),
     lambda rng: (normal(rng, dim(rng, 1, 2), g := dim(rng, 1, 3), c := dim(rng, 1, 3),
                         dim(rng, 2, 7), dim(rng, 2, 7)),
                  normal(rng, g, f := dim(rng, 1, 3), c, dim(rng, 1, 2), dim(rng, 1, 2)),
                  normal(rng, f)),
     _gconv_reference)


def _depthwise_reference(I, K):  # type: ignore[no-untyped-def]
    n, c, h, w = I.shape
    _, kh, kw = K.shape
    out = np.zeros((n, c, h - kh + 1, w - kw + 1))
    for a in range(kh):
        for b in range(kw):
            out += f64(I)[:, :, a:a + h - kh + 1, b:b + w - kw + 1] * \
                f64(K)[None, :, a, b, None, None]
    return f32(out)


case("depthwise conv2d", """
def depthwise(float(N,C,H,W) I, float(C,KH,KW) K) -> (O) {
  O(n,c,h,w) +=! I(n,c,h + kh,w + kw) * K(c,kh,kw)
}""",
     lambda rng: (normal(rng, dim(rng, 1, 3), c := dim(rng, 1, 5), dim(rng, 3), dim(rng, 3)),
                  normal(rng, c, dim(rng, 1, 3), dim(rng, 1, 3))),
     _depthwise_reference)

# ================================================================== pooling


def _pool(x: np.ndarray, k: int, s: int, fn: Callable[..., np.ndarray]) -> np.ndarray:
    h, w = x.shape[2:]
    oh, ow = (h - k) // s + 1, (w - k) // s + 1
    windows = np.stack([x[:, :, a:a + s * (oh - 1) + 1:s, b:b + s * (ow - 1) + 1:s]
                        for a in range(k) for b in range(k)])
    return fn(windows, axis=0)


case("maxpool2x2 (paper)", paper("maxpool2x2.tc"),
     lambda rng: (normal(rng, dim(rng, 1, 3), dim(rng, 1, 5), dim(rng, 2), dim(rng, 2)),),
     lambda x: _pool(x, 2, 2, np.max), EXACT)

case("average pool 3x3, stride 2", """
def avgpool(float(B,C,H,W) I) -> (O) {
  O(b,c,i,j) +=! I(b,c,2 * i + kh,2 * j + kw) / 9 where kh in 0:3, kw in 0:3
}""",
     lambda rng: (normal(rng, dim(rng, 1, 3), dim(rng, 1, 5), dim(rng, 3), dim(rng, 3)),),
     lambda x: f32(_pool(f64(x), 3, 2, np.sum) / 9))

case("min pool 2x2, stride 1", """
def minpool(float(B,C,H,W) I) -> (O) {
  O(b,c,i,j) min=! I(b,c,i + kh,j + kw) where kh in 0:2, kw in 0:2
}""",
     lambda rng: (normal(rng, dim(rng, 1, 3), dim(rng, 1, 5), dim(rng, 2), dim(rng, 2)),),
     lambda x: _pool(x, 2, 1, np.min), EXACT)

case("global average pool (sizes in expressions)", """
def gap(float(N,C,H,W) I) -> (O) {
  O(n,c) +=! I(n,c,h,w) / (H * W)
}""",
     lambda rng: (normal(rng, dim(rng, 1, 5), dim(rng, 1, 5), dim(rng), dim(rng)),),
     lambda x: f32(f64(x).mean(axis=(2, 3))))

case("int32 max pool", """
def imaxpool(int32(H,W) I) -> (O) {
  O(i,j) max=! I(2 * i + a, 2 * j + b) where a in 0:2, b in 0:2
}""",
     lambda rng: (nonzero_ints(rng, 1000, dim(rng, 2), dim(rng, 2)),),
     lambda x: _pool(x[None, None], 2, 2, np.max)[0, 0], EXACT)

# ================================================================== normalizations


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


SOFTMAX = """
def softmax(float(N,C) X) -> (Y) {
  mx(n) max=! X(n,c)
  e(n,c) = exp(X(n,c) - mx(n))
  s(n) +=! e(n,c)
  Y(n,c) = e(n,c) / s(n)
}"""

case("softmax (three temporaries)", SOFTMAX,
     lambda rng: (3 * normal(rng, dim(rng), dim(rng)),),
     lambda x: f32(_softmax(f64(x))))

case("softmax in double", SOFTMAX.replace("float(N,C)", "double(N,C)"),
     lambda rng: (3 * normal(rng, dim(rng), dim(rng), dtype=np.float64),),
     lambda x: _softmax(x), F64)

case("log-softmax", """
def logsoftmax(float(N,C) X) -> (Y) {
  mx(n) max=! X(n,c)
  s(n) +=! exp(X(n,c) - mx(n))
  Y(n,c) = X(n,c) - mx(n) - log(s(n))
}""",
     lambda rng: (3 * normal(rng, dim(rng), dim(rng)),),
     lambda x: f32(np.log(_softmax(f64(x)))))

case("scaled dot-product attention", """
def attention(float(B,T,D) Q, float(B,S,D) K, float(B,S,E) V) -> (O) {
  sc(b,t,s) +=! Q(b,t,d) * K(b,s,d)
  mx(b,t) max=! sc(b,t,s)
  p(b,t,s) = exp((sc(b,t,s) - mx(b,t)) / sqrt(float(D)))
  z(b,t) +=! p(b,t,s)
  O(b,t,e) +=! p(b,t,s) * V(b,s,e) / z(b,t)
}""",
     lambda rng: (normal(rng, b := dim(rng, 1, 3), dim(rng), d := dim(rng)),
                  normal(rng, b, s := dim(rng), d), normal(rng, b, s, dim(rng))),
     lambda Q, K, V: f32(_softmax(np.einsum("btd,bsd->bts", f64(Q), f64(K))
                                  / np.sqrt(Q.shape[2])) @ f64(V)))

case("layernorm (scalar eps)", """
def layernorm(float(N,D) X, float(D) g, float(D) b, float eps) -> (Y) {
  mean(n) +=! X(n,d) / D
  xc(n,d) = X(n,d) - mean(n)
  var(n) +=! xc(n,d) * xc(n,d) / D
  Y(n,d) = xc(n,d) * rsqrt(var(n) + eps) * g(d) + b(d)
}""",
     lambda rng: (normal(rng, dim(rng), d := dim(rng, 2)), normal(rng, d), normal(rng, d),
                  np.float32(1e-5)),
     lambda X, g, b, eps: f32((f64(X) - f64(X).mean(1, keepdims=True))
                              / np.sqrt(f64(X).var(1, keepdims=True) + float(eps)) * f64(g)
                              + f64(b)))


def _batchnorm_reference(X, gamma, beta, eps):  # type: ignore[no-untyped-def]
    x = f64(X)
    mean = x.mean(axis=(0, 2, 3))
    var = x.var(axis=(0, 2, 3))
    y = (gamma[None, :, None, None] * (x - mean[None, :, None, None])
         / np.sqrt(var[None, :, None, None] + float(eps)) + beta[None, :, None, None])
    return f32(y), f32(mean), f32(var)


case("batchnorm with batch statistics (three outputs)", """
def batchnorm(float(N,C,H,W) X, float(C) gamma, float(C) beta, float eps)
    -> (Y, mean, var) {
  mean(c) +=! X(n,c,h,w) / (N * H * W)
  var(c) +=! (X(n,c,h,w) - mean(c)) * (X(n,c,h,w) - mean(c)) / (N * H * W)
  Y(n,c,h,w) = gamma(c) * (X(n,c,h,w) - mean(c)) / sqrt(var(c) + eps) + beta(c)
}""",
     lambda rng: (normal(rng, dim(rng, 1, 5), c := dim(rng, 1, 5), dim(rng, 2, 5),
                         dim(rng, 2, 5)), normal(rng, c), normal(rng, c), np.float32(1e-3)),
     _batchnorm_reference)

case("batchnorm inference (running statistics)", """
def bn_infer(float(N,C,H,W) X, float(C) mean, float(C) var, float(C) gamma, float(C) beta)
    -> (Y) {
  Y(n,c,h,w) = (X(n,c,h,w) - mean(c)) * rsqrt(var(c) + 1e-5) * gamma(c) + beta(c)
}""",
     lambda rng: (normal(rng, dim(rng, 1, 3), c := dim(rng), dim(rng), dim(rng)),
                  normal(rng, c), uniform(rng, 0.5, 2, c), normal(rng, c), normal(rng, c)),
     lambda X, m, v, g, b: f32((f64(X) - f64(m)[:, None, None]) / np.sqrt(
         f64(v)[:, None, None] + 1e-5) * f64(g)[:, None, None] + f64(b)[:, None, None]))


def _groupnorm_reference(X, gamma, beta):  # type: ignore[no-untyped-def]
    x = f64(X)
    mean = x.mean(axis=(2, 3), keepdims=True)
    var = x.var(axis=(2, 3), keepdims=True)
    return f32((x - mean) / np.sqrt(var + 1e-5) * f64(gamma)[None, :, :, None]
               + f64(beta)[None, :, :, None])


case("groupnorm", """
def groupnorm(float(N,G,D,S) X, float(G,D) gamma, float(G,D) beta) -> (Y) {
  mean(n,g) +=! X(n,g,d,s) / (D * S)
  var(n,g) +=! (X(n,g,d,s) - mean(n,g)) * (X(n,g,d,s) - mean(n,g)) / (D * S)
  Y(n,g,d,s) = (X(n,g,d,s) - mean(n,g)) * rsqrt(var(n,g) + 1e-5) * gamma(g,d) + beta(g,d)
}""",
     lambda rng: (normal(rng, dim(rng, 1, 3), g := dim(rng, 1, 5), d := dim(rng, 1, 5),
                         dim(rng, 2)), normal(rng, g, d), normal(rng, g, d)),
     _groupnorm_reference)

case("RMSnorm", """
def rmsnorm(float(N,D) X, float(D) w) -> (Y) {
  ms(n) +=! X(n,d) * X(n,d)
  Y(n,d) = X(n,d) * w(d) / sqrt(ms(n) / D + 1e-6)
}""",
     lambda rng: (normal(rng, dim(rng), d := dim(rng)), normal(rng, d)),
     lambda X, w: f32(f64(X) * f64(w) / np.sqrt((f64(X) ** 2).mean(1, keepdims=True) + 1e-6)))

# ================================================================== gathers and lookup tables

case("lookup table with an offset index", """
def lut1(float(E,D) LUT, int(B,L) I) -> (O) {
  O(i,j) +=! LUT(I(i,k) + 1, j)
}""",
     lambda rng: (normal(rng, e := dim(rng, 2), dim(rng)),
                  rng.integers(0, e - 1, (dim(rng), dim(rng))).astype(np.int32)),
     lambda LUT, I: f32(f64(LUT)[I + 1].sum(axis=1)))

case("embedding rows", """
def embed(float(V,D) E, int64(N) I) -> (O) {
  O(i,j) = E(I(i), j)
}""",
     lambda rng: (normal(rng, v := dim(rng), dim(rng)),
                  rng.integers(0, v, dim(rng)).astype(np.int64)),
     lambda E, I: E[I], EXACT)

case("gather of a gather", """
def gather2(float(N) X, int(M) I, int(P) J) -> (Z) {
  Z(i) = X(I(J(i)))
}""",
     lambda rng: (normal(rng, n := dim(rng)), rng.integers(0, n, m := dim(rng)).astype(np.int32),
                  rng.integers(0, m, dim(rng)).astype(np.int32)),
     lambda X, I, J: X[I[J]], EXACT)

case("gather with a reversed column", """
def gcols(float(R,M) X, int16(N) I) -> (Z) {
  Z(i,j) = X(I(i), M - 1 - j)
}""",
     lambda rng: (normal(rng, r := dim(rng), dim(rng)),
                  rng.integers(0, r, dim(rng)).astype(np.int16)),
     lambda X, I: X[I.astype(np.int64)][:, ::-1], EXACT)

case("gather by a truncated float index", """
def fgather(float(N) X, float(M) F) -> (Y) {
  Y(i) = X(int32(F(i)))
}""",
     lambda rng: (normal(rng, n := dim(rng)), uniform(rng, 0, n - 0.01, dim(rng))),
     lambda X, F: X[F.astype(np.int64)], EXACT)

def _shift_conv(I: np.ndarray, SH: np.ndarray, SW: np.ndarray, W: np.ndarray,
                pad: int = 1) -> np.ndarray:
    """Shift convolution (Wu et al.): channel c of I moved by (SH[c], SW[c]), valid range,
    then a 1x1 convolution with W (F, C)."""
    _, c, h, w = I.shape
    moved = np.stack([f64(I)[:, k, pad + SH[k]:pad + SH[k] + h - 2 * pad,
                             pad + SW[k]:pad + SW[k] + w - 2 * pad] for k in range(c)], axis=1)
    return f32(np.einsum("nchw,fc->nfhw", moved, f64(W)))


case("shift convolution (data-dependent subscripts in a reduction)", """
def shiftconv(float(N,C,H,W) I, int(C) SH, int(C) SW, float(F,C) Wt) -> (O) {
  O(n,f,h,w) +=! I(n, c, h + 1 + SH(c), w + 1 + SW(c)) * Wt(f,c) where h in 0:H-2, w in 0:W-2
}""",
     lambda rng: (normal(rng, dim(rng, 1, 3), c := dim(rng, 1, 7), dim(rng, 3), dim(rng, 3)),
                  rng.integers(-1, 2, c).astype(np.int32), rng.integers(-1, 2, c).astype(np.int32),
                  normal(rng, dim(rng, 1, 7), c)),
     _shift_conv)


def _sparse_filter(I: np.ndarray, DH: np.ndarray, DW: np.ndarray, W: np.ndarray) -> np.ndarray:
    n, _, h, w = I.shape
    out = np.zeros((n, W.shape[0], h - 2, w - 2))
    for x in range(len(DH)):
        out += np.einsum("nchw,kc->nkhw", f64(I)[:, :, DH[x]:DH[x] + h - 2, DW[x]:DW[x] + w - 2],
                         f64(W)[:, :, x])
    return f32(out)


case("sparse filter taps from data (paper: nc(h+off_h[x])(w+off_w[x]), kcx -> nkhw)", """
def sparse(float(N,C,H,W) I, int(X) DH, int(X) DW, float(K,C,X) Wt) -> (O) {
  O(n,k,h,w) +=! I(n, c, h + DH(x), w + DW(x)) * Wt(k,c,x) where h in 0:H-2, w in 0:W-2
}""",
     lambda rng: (normal(rng, dim(rng, 1, 3), c := dim(rng, 1, 5), dim(rng, 3), dim(rng, 3)),
                  rng.integers(0, 3, x := dim(rng, 1, 7)).astype(np.int32),
                  rng.integers(0, 3, x).astype(np.int32), normal(rng, dim(rng, 1, 5), c, x)),
     _sparse_filter)

case("gathered reduction operand (shared index list)", """
def bag(float(M,E) X, int(K) J, float(K,N) Y) -> (O) {
  O(i,j) +=! X(i, J(k)) * Y(k,j)
}""",
     lambda rng: (normal(rng, dim(rng), e := dim(rng)),
                  rng.integers(0, e, k := dim(rng)).astype(np.int32), normal(rng, k, dim(rng))),
     lambda X, J, Y: f32(f64(X)[:, J] @ f64(Y)))

case("let binding in a subscript", """
def letsub(float(N) A) -> (B) {
  B(i) = A(j) - A(i) where j = i + 1
}""",
     lambda rng: (normal(rng, dim(rng, 2)),),
     lambda A: np.diff(A), EXACT)

case("bool scalar argument", """
def flagged(bool flag, float(N) X) -> (Y) {
  Y(i) = flag ? X(i) : -X(i)
}""",
     lambda rng: (bool(rng.random() < 0.5), normal(rng, dim(rng))),
     lambda flag, X: X if flag else -X, EXACT)

case("upsample x2 (non-affine subscript)", """
def upsample(float(N) X) -> (Y) {
  Y(i) = X(i / 2) where i in 0:2 * N
}""",
     lambda rng: (normal(rng, dim(rng)),),
     lambda X: np.repeat(X, 2), EXACT)

# ================================================================== elementwise, casts, selects

case("transpose", """
def transpose(float(M,N) A) -> (B) {
  B(i,j) = A(j,i)
}""",
     lambda rng: (normal(rng, dim(rng), dim(rng)),),
     lambda A: A.T.copy(), EXACT)

case("4-d permutation", """
def permute(float(A,B,C,D) X) -> (Y) {
  Y(a,b,c,d) = X(d,b,a,c)
}""",
     lambda rng: (normal(rng, dim(rng, 1, 5), dim(rng, 1, 5), dim(rng, 1, 5), dim(rng, 1, 5)),),
     lambda X: np.transpose(X, (2, 1, 3, 0)).copy(), EXACT)

case("diagonal", """
def diag(float(N,N) A) -> (D) {
  D(i) = A(i,i)
}""",
     lambda rng: (normal(rng, n := dim(rng), n),),
     lambda A: np.diag(A).copy(), EXACT)

case("reverse with a size in the subscript", """
def flip(float(N) A) -> (B) {
  B(i) = A(N - 1 - i)
}""",
     lambda rng: (normal(rng, dim(rng)),),
     lambda A: A[::-1].copy(), EXACT)

case("strided slice I(3*i + 1)", """
def slice3(float(N) X) -> (Y) {
  Y(i) = X(3 * i + 1)
}""",
     lambda rng: (normal(rng, dim(rng, 2)),),
     lambda X: X[1::3].copy(), EXACT)

case("shift with a where lower bound", """
def shift(float(N) A) -> (B) {
  B(i) = A(i - 1) where i in 1:N + 1
}""",
     lambda rng: (normal(rng, dim(rng)),),
     lambda A: np.concatenate([[np.float32(0)], A]), EXACT)

case("bias add with a constant dimension", """
def biasadd(float(M,4) X, float(4) b) -> (Y) {
  Y(i,j) = X(i,j) + b(j)
}""",
     lambda rng: (normal(rng, dim(rng), 4), normal(rng, 4)),
     lambda X, b: X + b, EXACT)

case("normalize by a dimension (A.0 syntax)", """
def bydim(float(N,M) X) -> (Y) {
  Y(i,j) = X(i,j) / X.0 + X.1
}""",
     lambda rng: (normal(rng, dim(rng), dim(rng)),),
     lambda X: f32(f64(X) / X.shape[0] + X.shape[1]))

case("where let binding and exists", """
def letexists(float(N) X, float(M) Z) -> (Y) {
  Y(i) = t * t + t where t = X(i) - 1, exists Z(i)
}""",
     lambda rng: (normal(rng, n := dim(rng)), normal(rng, dim(rng, 1, n))),
     lambda X, Z: f32((f64(X)[:Z.shape[0]] - 1) ** 2 + f64(X)[:Z.shape[0]] - 1))

case("relu by ternary", """
def relu_t(float(N,M) X) -> (Y) {
  Y(i,j) = X(i,j) > 0 ? X(i,j) : 0
}""",
     lambda rng: (normal(rng, dim(rng), dim(rng)),),
     lambda X: np.where(X > 0, X, np.float32(0)), EXACT)

case("relu and sigmoid builtins", """
def acts(float(N) X) -> (R, S, L) {
  R(i) = relu(X(i))
  S(i) = sigmoid(X(i))
  L(i) = X(i) >= 0 ? X(i) : 0.01 * X(i)
}""",
     lambda rng: (3 * normal(rng, dim(rng)),),
     lambda X: (np.maximum(X, 0), f32(1 / (1 + np.exp(-f64(X)))),
                f32(np.where(X >= 0, f64(X), 0.01 * f64(X)))))

case("clamp with fmaxf/fminf and scalar bounds", """
def clamp(float(N) X, float lo, float hi) -> (Y) {
  Y(i) = fminf(fmaxf(X(i), lo), hi)
}""",
     lambda rng: (2 * normal(rng, dim(rng)), np.float32(-0.5), np.float32(0.75)),
     lambda X, lo, hi: np.clip(X, lo, hi), EXACT)

case("clamp with nested ternaries and min/max", """
def clamp2(float(N) X) -> (Y, Z) {
  Y(i) = X(i) < -1 ? -1 : X(i) > 1 ? 1 : X(i)
  Z(i) = min(max(X(i), -1), 1)
}""",
     lambda rng: (2 * normal(rng, dim(rng)),),
     lambda X: (np.clip(X, -1, 1), np.clip(X, -1, 1)), EXACT)

case("logical operators select", """
def logic(float(N) X, float(N) Z) -> (Y) {
  Y(i) = (X(i) > 0 && Z(i) < 0) || !(X(i) > -1) ? X(i) * Z(i) : X(i) + Z(i)
}""",
     lambda rng: (normal(rng, n := dim(rng)), normal(rng, n)),
     lambda X, Z: np.where(((X > 0) & (Z < 0)) | ~(X > -1), X * Z, X + Z), EXACT)

case("any nonzero condition selects the first branch", """
def truthy(float(N) X, int(N) K) -> (Y, Z, W) {
  Y(i) = X(i) ? 1 : 2
  Z(i) = K(i) ? X(i) : -X(i)
  W(i) = !X(i) || (K(i) && -1)
}""",
     lambda rng: (np.concatenate([[0.5, -0.25, 0, np.nan], normal(rng, n := dim(rng))]
                                 ).astype(np.float32),
                  rng.integers(-1, 2, n + 4).astype(np.int32)),
     lambda X, K: (np.where(X != 0, 1, 2).astype(np.int32), np.where(K != 0, X, -X),
                   (X == 0) | (K != 0)), EXACT)

case("arithmetic on bools promotes to int32", """
def boolmath(bool(N) P, bool(N) Q) -> (S, D, Neg, Sel) {
  S(i) = P(i) + Q(i)
  D(i) = P(i) - Q(i)
  Neg(i) = -P(i)
  Sel(i) = P(i) ? Q(i) : -1
}""",
     lambda rng: (rng.random(n := dim(rng)) < 0.5, rng.random(n) < 0.5),
     lambda P, Q: (P.astype(np.int32) + Q, P.astype(np.int32) - Q, -P.astype(np.int32),
                   np.where(P, Q.astype(np.int32), -1).astype(np.int32)), EXACT)

case("math functions of integers compute in float32", """
def intmath(int(N) A, int(N) B) -> (P, E, F) {
  P(i) = pow(A(i), B(i))
  E(i) = exp(A(i) / 4)
  F(i) = fmod(A(i), 3)
}""",
     lambda rng: (nonzero_ints(rng, 5, n := dim(rng)), nonzero_ints(rng, 3, n)),
     lambda A, B: (f32(np.power(f64(A), f64(B))), f32(np.exp(f64(trunc_div(A, 4)))),
                   f32(np.fmod(f64(A), 3))))

case("comparisons into bool outputs", """
def compare(float(N) A, float(N) B) -> (LT, LE, EQ, NE, GT, GE) {
  LT(i) = A(i) < B(i)
  LE(i) = A(i) <= B(i)
  EQ(i) = A(i) == B(i)
  NE(i) = A(i) != B(i)
  GT(i) = A(i) > B(i)
  GE(i) = A(i) >= B(i)
}""",
     lambda rng: (normal(rng, n := dim(rng)).round(), normal(rng, n).round()),
     lambda A, B: (A < B, A <= B, A == B, A != B, A > B, A >= B), EXACT)

case("bool inputs and outputs", """
def boolops(bool(N) P, bool(N) Q, float(N) X) -> (R, Y) {
  R(i) = (P(i) && !Q(i)) || (Q(i) && !P(i))
  Y(i) = P(i) ? X(i) : -X(i)
}""",
     lambda rng: (rng.random(n := dim(rng)) < 0.5, rng.random(n) < 0.5, normal(rng, n)),
     lambda P, Q, X: (P ^ Q, np.where(P, X, -X)), EXACT)

case("count true values", """
def count(bool(M,N) P) -> (C) {
  C(i) +=! int32(P(i,j))
}""",
     lambda rng: (rng.random((dim(rng), dim(rng))) < 0.5,),
     lambda P: P.sum(axis=1).astype(np.int32), EXACT)

case("float to int32 cast truncates", """
def tocast(float(N) X) -> (I, F) {
  I(i) = int32(X(i) * 10)
  F(i) = float(I(i)) / 4
}""",
     lambda rng: (3 * normal(rng, dim(rng)),),
     lambda X: ((X * np.float32(10)).astype(np.int32),
                ((X * np.float32(10)).astype(np.int32) / 4).astype(np.float32)), EXACT)

case("double to float and back", """
def precision(double(N) D) -> (F, G) {
  F(i) = float(D(i))
  G(i) = double(F(i)) - D(i)
}""",
     lambda rng: (normal(rng, dim(rng), dtype=np.float64),),
     lambda D: (D.astype(np.float32), D.astype(np.float32).astype(np.float64) - D), EXACT)

case("int32 to int8 cast wraps", """
def narrow(int32(N) A) -> (B) {
  B(i) = int8(A(i))
}""",
     lambda rng: (nonzero_ints(rng, 1000, dim(rng)),),
     lambda A: wrap(A.astype(np.int64), np.int8), EXACT)

case("round half away from zero, floor, ceil, trunc", """
def rounding(float(N) X) -> (R, Fl, Ce, T) {
  R(i) = round(X(i))
  Fl(i) = floor(X(i))
  Ce(i) = ceil(X(i))
  T(i) = trunc(X(i))
}""",
     lambda rng: (np.concatenate([np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5], np.float32),
                                  3 * normal(rng, dim(rng))]),),
     lambda X: (np.where(X >= 0, np.floor(X + np.float32(0.5)), np.ceil(X - np.float32(0.5))
                         ).astype(np.float32), np.floor(X), np.ceil(X), np.trunc(X)), EXACT)


def _math_inputs(rng: np.random.Generator) -> tuple:
    n = dim(rng)
    return (uniform(rng, -0.9, 0.9, n), uniform(rng, 0.5, 3.0, n))


def _math_reference(X, P):  # type: ignore[no-untyped-def]
    x, p = f64(X), f64(P)
    outs = [np.exp(x), np.exp2(x), np.expm1(x), np.log(p), np.log2(p), np.log10(p),
            np.log1p(p), np.sqrt(p), 1 / np.sqrt(p), np.cbrt(x), np.sin(x), np.cos(x),
            np.tan(x), np.arcsin(x), np.arccos(x), np.arctan(x), np.sinh(x), np.cosh(x),
            np.tanh(x), np.arcsinh(x), np.arccosh(1 + p), np.arctanh(x), special.erf(x),
            special.erfc(x), np.abs(x), np.abs(x)]
    return tuple(f32(o) for o in outs)


UNARY_MATH = ["exp(X(i))", "exp2(X(i))", "expm1(X(i))", "log(P(i))", "log2(P(i))",
              "log10(P(i))", "log1p(P(i))", "sqrt(P(i))", "rsqrt(P(i))", "cbrt(X(i))",
              "sin(X(i))", "cos(X(i))", "tan(X(i))", "asin(X(i))", "acos(X(i))", "atan(X(i))",
              "sinh(X(i))", "cosh(X(i))", "tanh(X(i))", "asinh(X(i))", "acosh(1 + P(i))",
              "atanh(X(i))", "erf(X(i))", "erfc(X(i))", "fabs(X(i))", "abs(X(i))"]

case("unary math builtins", "def unary(float(N) X, float(N) P) -> ("
     + ", ".join(f"Y{k}" for k in range(len(UNARY_MATH))) + ") {\n"
     + "".join(f"  Y{k}(i) = {e}\n" for k, e in enumerate(UNARY_MATH)) + "}\n",
     _math_inputs, _math_reference)


def _binary_math_reference(X, P):  # type: ignore[no-untyped-def]
    x, p = f64(X), f64(P)
    outs = [np.arctan2(x, p), np.power(p, x), np.fmod(x, p / 4), np.hypot(x, p),
            np.copysign(p, x), x * p + x, np.fmax(x, p - 2), np.fmin(x, p - 2)]
    return tuple(f32(o) for o in outs)


case("binary and ternary math builtins", """
def binary(float(N) X, float(N) P) -> (A, B, C, D, E, F, G, H) {
  A(i) = atan2(X(i), P(i))
  B(i) = pow(P(i), X(i))
  C(i) = fmod(X(i), P(i) / 4)
  D(i) = hypot(X(i), P(i))
  E(i) = copysign(P(i), X(i))
  F(i) = fma(X(i), P(i), X(i))
  G(i) = fmax(X(i), P(i) - 2)
  H(i) = fmin(X(i), P(i) - 2)
}""",
     _math_inputs, _binary_math_reference)

case("leaky chain of pointwise in-place updates", """
def inplace(float(N) X) -> (Y) {
  Y(i) = X(i)
  Y(i) = Y(i) * Y(i)
  Y(i) = Y(i) - X(i)
  Y(i) = fmaxf(Y(i), 0)
}""",
     lambda rng: (normal(rng, dim(rng)),),
     lambda X: f32(np.maximum(f64(X) * f64(X) - f64(X), 0)))

# ================================================================== reductions

case("product reduction", """
def prod(float(M,N) X) -> (P) {
  P(i) *=! X(i,j)
}""",
     lambda rng: (uniform(rng, 0.5, 1.5, dim(rng), dim(rng)),),
     lambda X: f32(f64(X).prod(axis=1)))


def _with_nans(rng: np.random.Generator) -> tuple:
    x = normal(rng, m := dim(rng, 2), dim(rng, 2))
    x[rng.integers(0, m), 0] = np.nan
    x[0, -1] = np.nan
    return (x,)


case("max and min reductions propagate NaN", """
def nanred(float(M,N) X) -> (Mx, Mn) {
  Mx(i) max=! X(i,j)
  Mn(i) min=! X(i,j)
}""",
     _with_nans, lambda X: (np.max(X, axis=1), np.min(X, axis=1)), EXACT)

case("fmax and fmin ignore NaN", """
def nanpick(float(N) A, float(N) B) -> (Mx, Mn) {
  Mx(i) = fmax(A(i), B(i))
  Mn(i) = fminf(A(i), B(i))
}""",
     lambda rng: (np.array([np.nan, 1, np.nan, -2, 3], np.float32),
                  np.array([2, np.nan, np.nan, 5, -1], np.float32)),
     lambda A, B: (np.fmax(A, B), np.fmin(A, B)), EXACT)

case("max= and min= on initialized outputs", """
def runmax(float(M,N) X) -> (Mx, Mn) {
  Mx(i) = 0
  Mx(i) max= X(i,j)
  Mn(i) = X(i,0)
  Mn(i) min= X(i,j)
}""",
     lambda rng: (normal(rng, dim(rng), dim(rng)),),
     lambda X: (np.maximum(X.max(axis=1), 0), X.min(axis=1)), EXACT)

case("! form without a reduction index overwrites", """
def bangcopy(float(N) A) -> (B, C) {
  B(i) = 7
  B(i) +=! A(i)
  C(i) max=! A(i) * 2
}""",
     lambda rng: (normal(rng, dim(rng)),),
     lambda A: (A, A * np.float32(2)), EXACT)

case("prefix sum by a masked reduction", """
def cumsum(float(N) A) -> (C) {
  C(i) +=! k <= i ? A(k) : 0 where i in 0:N, k in 0:N
}""",
     lambda rng: (normal(rng, dim(rng)),),
     lambda A: f32(np.cumsum(f64(A))))

case("mean over an integer tensor", """
def imean(int32(M,K) A) -> (Mean) {
  Mean(i) +=! float(A(i,k)) / K
}""",
     lambda rng: (nonzero_ints(rng, 100, dim(rng), dim(rng)),),
     lambda A: f32(f64(A).mean(axis=1)))

# ================================================================== several functions, temporaries

MULTI = """
# two functions in one source
def scale(float(N) X, float a) -> (Y) {
  Y(i) = a * X(i)
}
def axpy(float a, float(N) X, float(N) Y) -> (Z) {
  Z(i) = a * X(i) + Y(i)
}
"""

case("multi-function source: scale", MULTI,
     lambda rng: (normal(rng, dim(rng)), np.float32(rng.uniform(-2, 2))),
     lambda X, a: f32(float(a) * f64(X)), function="scale")

case("multi-function source: axpy", MULTI,
     lambda rng: (np.float32(rng.uniform(-2, 2)), normal(rng, n := dim(rng)), normal(rng, n)),
     lambda a, X, Y: f32(float(a) * f64(X) + f64(Y)), function="axpy")

case("two-layer MLP with temporaries", """
def mlp2(float(B,I) X, float(H,I) W1, float(H) B1, float(O,H) W2, float(O) B2) -> (Y) {
  h(b,j) = B1(j)
  h(b,j) += X(b,i) * W1(j,i)
  a(b,j) = tanh(h(b,j))
  Y(b,o) +=! a(b,j) * W2(o,j)
  Y(b,o) = Y(b,o) + B2(o)
}""",
     lambda rng: (normal(rng, dim(rng), i := dim(rng)), normal(rng, h := dim(rng), i),
                  normal(rng, h), normal(rng, o := dim(rng), h), normal(rng, o)),
     lambda X, W1, B1, W2, B2: f32(np.tanh(f64(X) @ f64(W1).T + f64(B1)) @ f64(W2).T
                                   + f64(B2)))

# ================================================================== integer types

case("int8 addition wraps", """
def add8(int8(N) A, int8(N) B) -> (C) {
  C(i) = A(i) + B(i)
}""",
     lambda rng: (nonzero_ints(rng, 127, n := dim(rng), dtype=np.int8),
                  nonzero_ints(rng, 127, n, dtype=np.int8)),
     lambda A, B: wrap(A.astype(np.int64) + B, np.int8), EXACT)

case("int8 with weakly typed literals stays int8", """
def lit8(int8(N) A) -> (C) {
  C(i) = A(i) * 3 + 1
}""",
     lambda rng: (nonzero_ints(rng, 127, dim(rng), dtype=np.int8),),
     lambda A: wrap(A.astype(np.int64) * 3 + 1, np.int8), EXACT)

case("int16 multiplication wraps", """
def mul16(int16(N) A, int16(N) B) -> (C) {
  C(i) = A(i) * B(i)
}""",
     lambda rng: (nonzero_ints(rng, 30000, n := dim(rng), dtype=np.int16),
                  nonzero_ints(rng, 30000, n, dtype=np.int16)),
     lambda A, B: wrap(A.astype(np.int64) * B, np.int16), EXACT)

case("int32 division and modulo truncate toward zero", """
def divmod32(int(N) A, int(N) B) -> (Q, R) {
  Q(i) = A(i) / B(i)
  R(i) = A(i) % B(i)
}""",
     lambda rng: (np.concatenate([[7, -7, 7, -7], nonzero_ints(rng, 1000, n := dim(rng))]
                                 ).astype(np.int32),
                  np.concatenate([[2, 2, -2, -2], nonzero_ints(rng, 20, n)]).astype(np.int32)),
     lambda A, B: (trunc_div(A, B).astype(np.int32),
                   (A.astype(np.int64) - B * trunc_div(A, B)).astype(np.int32)), EXACT)

def _c_divmod(a: int, b: int) -> tuple[int, int]:
    """polytile's integer division: C's, except that x / 0 and x % 0 are 0 (no trap) and
    INT_MIN / -1 wraps around."""
    if b == 0:
        return 0, 0
    q = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)
    return q, a - b * q


case("integer division by zero gives 0, INT_MIN / -1 wraps", """
def divzero(int(N) A, int(N) B) -> (Q, R) {
  Q(i) = A(i) / B(i)
  R(i) = A(i) % B(i)
}""",
     lambda rng: (np.concatenate([[5, -5, 0, -2**31, -2**31, 2**31 - 1],
                                  nonzero_ints(rng, 100, n := dim(rng))]).astype(np.int32),
                  np.concatenate([[0, 0, 0, -1, 1, -1],
                                  rng.integers(-2, 3, n)]).astype(np.int32)),
     lambda A, B: tuple(wrap(np.array([_c_divmod(int(a), int(b))[k] for a, b in zip(A, B)],
                                      dtype=object), np.int32) for k in (0, 1)), EXACT)

case("int32 product reduction wraps", """
def iprod(int32(M,N) A) -> (P) {
  P(i) *=! A(i,j)
}""",
     lambda rng: (nonzero_ints(rng, 5000, dim(rng), dim(rng)),),
     lambda A: wrap(np.prod(A.astype(object), axis=1), np.int32), EXACT)

case("int32 min and max reductions", """
def iminmax(int32(M,N) A) -> (Mx, Mn) {
  Mx(i) max=! A(i,j)
  Mn(i) min=! A(i,j)
}""",
     lambda rng: (nonzero_ints(rng, 2**31 - 1, dim(rng), dim(rng)),),
     lambda A: (A.max(axis=1), A.min(axis=1)), EXACT)

case("int64 sums beyond 32 bits", """
def isum64(long(M,N) A) -> (S) {
  S(i) +=! A(i,j)
}""",
     lambda rng: (nonzero_ints(rng, 2**40, dim(rng), dim(rng), dtype=np.int64),),
     lambda A: A.sum(axis=1), EXACT)

case("uint8 subtraction wraps", """
def sub8(byte(N) A, uint8(N) B) -> (C) {
  C(i) = A(i) - B(i)
}""",
     lambda rng: (rng.integers(1, 256, n := dim(rng)).astype(np.uint8),
                  rng.integers(1, 256, n).astype(np.uint8)),
     lambda A, B: wrap(A.astype(np.int64) - B, np.uint8), EXACT)

case("uint8 sums into int32", """
def bytesum(uint8(M,K) A) -> (S) {
  S(i) +=! int32(A(i,k))
}""",
     lambda rng: (rng.integers(1, 256, (dim(rng), dim(rng))).astype(np.uint8),),
     lambda A: A.astype(np.int64).sum(axis=1).astype(np.int32), EXACT)

case("uint16, uint32 and uint64 arithmetic", """
def unsigned(uint16(N) A, uint32(N) B, uint64(N) C) -> (X, Y, Z) {
  X(i) = A(i) + A(i)
  Y(i) = B(i) * B(i)
  Z(j) +=! C(i) where j in 0:1
}""",
     lambda rng: (rng.integers(1, 2**16, n := dim(rng)).astype(np.uint16),
                  rng.integers(1, 2**32, n).astype(np.uint32),
                  rng.integers(2**62, 2**64, n, dtype=np.uint64)),
     lambda A, B, C: (wrap(A.astype(object) * 2, np.uint16),
                      wrap(B.astype(object) * B.astype(object), np.uint32),
                      wrap(np.array([C.astype(object).sum()]), np.uint64)), EXACT)

case("integer promotions: int8 + int16 and uint8 + int8", """
def promote(int8(N) A, int16(N) B, uint8(N) U) -> (C, D) {
  C(i) = A(i) + B(i)
  D(i) = U(i) + A(i)
}""",
     lambda rng: (nonzero_ints(rng, 127, n := dim(rng), dtype=np.int8),
                  nonzero_ints(rng, 30000, n, dtype=np.int16),
                  rng.integers(1, 256, n).astype(np.uint8)),
     lambda A, B, U: (wrap(A.astype(np.int64) + B, np.int16),
                      (U.astype(np.int64) + A).astype(np.int16)), EXACT)

case("index values in expressions", """
def iota(int32(N) A) -> (B) {
  B(i) = A(i) + 2 * i
}""",
     lambda rng: (nonzero_ints(rng, 100, dim(rng)),),
     lambda A: A.astype(np.int64) + 2 * np.arange(A.shape[0]), EXACT)

# ================================================================== 16-bit floats

case("float16 mm", """
def hmm(half(M,K) A, half(K,N) B) -> (C) {
  C(m,n) +=! A(m,k) * B(k,n)
}""",
     lambda rng: (normal(rng, dim(rng), k := dim(rng), dtype=np.float16),
                  normal(rng, k, dim(rng), dtype=np.float16)),
     lambda A, B: (f64(A) @ f64(B)).astype(np.float16), F16)

case("float16 elementwise with a weak literal", """
def hexp(float16(N) X) -> (Y) {
  Y(i) = exp(X(i)) * 0.5 + X(i)
}""",
     lambda rng: (normal(rng, dim(rng), dtype=np.float16),),
     lambda X: (np.exp(f64(X)) * 0.5 + f64(X)).astype(np.float16), F16)

case("bfloat16 scale and row sums", """
def bsum(bfloat16(M,N) X, bfloat16(N) w) -> (Y, S) {
  Y(i,j) = X(i,j) * w(j)
  S(i) +=! X(i,j)
}""",
     lambda rng: (normal(rng, dim(rng), n := dim(rng), dtype=bf16), normal(rng, n, dtype=bf16)),
     lambda X, w: ((f64(X) * f64(w)).astype(bf16), f64(X).sum(axis=1).astype(bf16)), BF16)
