"""The workloads of FusionStitching (issue 17), each one TC function whose statements are
the ops of the graph that `polytile bench --fusion` plans:

    attention          BERT-style: QK^T * scale + mask -> softmax -> .V, residual,
                       layernorm, GELU (per head)
    interests          the multi-interests motif: bmm -> elementwise ops and two
                       reductions (masked softmax, capsule squash) -> bmm
    logreg             a logistic-regression training step (forward, gradient, update)
    perceptron         a one-layer perceptron, forward and backward
    vae-encoder        a variational encoder: hidden layer, mean and log-variance heads,
                       the reparameterized sample and the KL term
    ln-gelu-residual   layernorm -> GELU -> residual add

NumPy versions (float64 inside, float32 out) are the oracle; the PyTorch versions are
eager calls of the framework's operators (and, through torch.compile, inductor's input);
the JAX versions, written beside them with the same operators in jax.numpy, are what
jax.jit compiles. Scalars go to JAX as arguments, so a jitted version is traced once.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from scipy import special  # type: ignore[import-untyped]

from polytile.bench.workload import EPS, Workload, jax_module, normal, torch_module, uniform

ATTENTION = """
def attention(float(H,S,E) Q, float(H,S,E) K, float(H,S,E) V, float(S,S) M,
              float(H,S,E) R, float(E) gamma, float(E) beta, float scale) -> (Y) {
  P(h,i,j) +=! Q(h,i,e) * K(h,j,e)
  P(h,i,j) = P(h,i,j) * scale + M(i,j)
  mx(h,i) max=! P(h,i,j)
  P(h,i,j) = exp(P(h,i,j) - mx(h,i))
  s(h,i) +=! P(h,i,j)
  P(h,i,j) = P(h,i,j) / s(h,i)
  A(h,i,e) +=! P(h,i,j) * V(h,j,e)
  Z(h,i,e) = A(h,i,e) + R(h,i,e)
  mean(h,i) +=! Z(h,i,e)
  mean(h,i) = mean(h,i) / E
  var(h,i) +=! (Z(h,i,e) - mean(h,i)) * (Z(h,i,e) - mean(h,i))
  rstd(h,i) = rsqrt(var(h,i) / E + 1e-5)
  N(h,i,e) = (Z(h,i,e) - mean(h,i)) * rstd(h,i) * gamma(e) + beta(e)
  Y(h,i,e) = 0.5 * N(h,i,e) * (1 + erf(N(h,i,e) * 0.7071067811865476))
}
"""

INTERESTS = """
def interests(float(B,L,D) X, float(B,K,D) C, float(B,L) mask) -> (O) {
  S(b,k,l) +=! C(b,k,d) * X(b,l,d)
  S(b,k,l) = S(b,k,l) * 0.125
  S(b,k,l) = mask(b,l) > 0 ? S(b,k,l) : -1e9
  mx(b,k) max=! S(b,k,l)
  W(b,k,l) = exp(S(b,k,l) - mx(b,k))
  s(b,k) +=! W(b,k,l)
  W(b,k,l) = W(b,k,l) / s(b,k)
  W(b,k,l) = W(b,k,l) * mask(b,l)
  O(b,k,d) +=! W(b,k,l) * X(b,l,d)
  n(b,k) +=! O(b,k,d) * O(b,k,d)
  f(b,k) = n(b,k) / (1 + n(b,k)) * rsqrt(n(b,k) + 1e-9)
  O(b,k,d) = O(b,k,d) * f(b,k)
}
"""

LOGREG = """
def logreg(float(N,D) X, float(N) y, float(D) w, float b, float lr) -> (w2, b2) {
  z(n) +=! X(n,d) * w(d)
  z(n) = z(n) + b
  p(n) = 1 / (1 + exp(-z(n)))
  g(n) = (p(n) - y(n)) / N
  gw(d) +=! X(n,d) * g(n)
  gb +=! g(n)
  w2(d) = w(d) - lr * gw(d)
  b2 = b - lr * gb
}
"""

PERCEPTRON = """
def perceptron(float(B,I) X, float(O,I) W, float(O) bias, float(B,O) T)
    -> (Y, dW, dbias, dX) {
  Z(b,o) +=! X(b,i) * W(o,i)
  Y(b,o) = 1 / (1 + exp(-(Z(b,o) + bias(o))))
  G(b,o) = (Y(b,o) - T(b,o)) * Y(b,o) * (1 - Y(b,o))
  dW(o,i) +=! G(b,o) * X(b,i)
  dbias(o) +=! G(b,o)
  dX(b,i) +=! G(b,o) * W(o,i)
}
"""

VAE_ENCODER = """
def vae_encoder(float(B,I) X, float(H,I) W1, float(H) b1, float(Z,H) Wm, float(Z) bm,
                float(Z,H) Wv, float(Z) bv, float(B,Z) eps) -> (Zs, KL) {
  h(b,j) +=! X(b,i) * W1(j,i)
  h(b,j) = fmaxf(h(b,j) + b1(j), 0)
  mu(b,z) +=! h(b,j) * Wm(z,j)
  mu(b,z) = mu(b,z) + bm(z)
  lv(b,z) +=! h(b,j) * Wv(z,j)
  lv(b,z) = lv(b,z) + bv(z)
  Zs(b,z) = mu(b,z) + exp(0.5 * lv(b,z)) * eps(b,z)
  KL(b) +=! -0.5 * (1 + lv(b,z) - mu(b,z) * mu(b,z) - exp(lv(b,z)))
}
"""

LN_GELU_RESIDUAL = """
def ln_gelu_residual(float(N,D) X, float(D) gamma, float(D) beta, float(N,D) R) -> (Y) {
  mean(n) +=! X(n,d)
  mean(n) = mean(n) / D
  var(n) +=! (X(n,d) - mean(n)) * (X(n,d) - mean(n))
  rstd(n) = rsqrt(var(n) / D + 1e-5)
  H(n,d) = (X(n,d) - mean(n)) * rstd(n) * gamma(d) + beta(d)
  G(n,d) = 0.5 * H(n,d) * (1 + erf(H(n,d) * 0.7071067811865476))
  Y(n,d) = G(n,d) + R(n,d)
}
"""


def _f64(*arrays: np.ndarray) -> list[np.ndarray]:
    return [np.asarray(a, np.float64) for a in arrays]


def _layernorm(z: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
    mean = z.mean(-1, keepdims=True)
    var = ((z - mean) ** 2).mean(-1, keepdims=True)
    return (z - mean) / np.sqrt(var + EPS) * gamma + beta


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + special.erf(x * np.sqrt(0.5)))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def _jax_layernorm(z: Any, gamma: Any, beta: Any) -> Any:
    import jax
    mean = z.mean(-1, keepdims=True)
    var = jax_module().square(z - mean).mean(-1, keepdims=True)
    return (z - mean) * jax.lax.rsqrt(var + EPS) * gamma + beta


def _jax_gelu(x: Any) -> Any:
    import jax
    return jax.nn.gelu(x, approximate=False)


def _f32(*arrays: np.ndarray) -> Any:
    out = tuple(np.asarray(a, np.float32) for a in arrays)
    return out if len(out) > 1 else out[0]


# ------------------------------------------------------------------ attention
def attention(h: int, s: int, e: int) -> Workload:
    def make(rng: np.random.Generator) -> tuple[Any, ...]:
        mask = np.where(rng.random((s, s)) < 0.1, -1e4, 0).astype(np.float32)
        return (normal(rng, h, s, e), normal(rng, h, s, e), normal(rng, h, s, e), mask,
                normal(rng, h, s, e), normal(rng, e), normal(rng, e),
                np.float32(1 / np.sqrt(e)))

    def numpy(q, k, v, m, r, g, b, scale):  # type: ignore[no-untyped-def]
        q, k, v, m, r, g, b = _f64(q, k, v, m, r, g, b)
        p = _softmax(q @ k.transpose(0, 2, 1) * float(scale) + m)
        return _f32(_gelu(_layernorm(p @ v + r, g, b)))

    def torch(q, k, v, m, r, g, b, scale):  # type: ignore[no-untyped-def]
        t = torch_module()
        p = t.softmax(q @ k.transpose(1, 2) * float(scale) + m, -1)
        z = t.nn.functional.layer_norm(p @ v + r, (e,), g, b, EPS)
        return t.nn.functional.gelu(z)

    def jax(q, k, v, m, r, g, b, scale):  # type: ignore[no-untyped-def]
        import jax as jx
        p = jx.nn.softmax(q @ k.transpose(0, 2, 1) * scale + m, axis=-1)
        return _jax_gelu(_jax_layernorm(p @ v + r, g, b))

    return Workload("attention", (("H", h), ("S", s), ("E", e)), ATTENTION, "attention",
                    make, numpy, torch=torch, jax=jax, flops=4.0 * h * s * s * e, rtol=1e-3,
                    atol=1e-4, note="one BERT attention head block per h")


# ------------------------------------------------------------------ multi-interests
def interests(b: int, k: int, length: int, d: int) -> Workload:
    def make(rng: np.random.Generator) -> tuple[Any, ...]:
        mask = (rng.random((b, length)) < 0.8).astype(np.float32)
        mask[:, 0] = 1
        return normal(rng, b, length, d), normal(rng, b, k, d), mask

    def numpy(x, c, mask):  # type: ignore[no-untyped-def]
        x, c, mask = _f64(x, c, mask)
        s = np.einsum("bkd,bld->bkl", c, x) * 0.125
        s = np.where(mask[:, None, :] > 0, s, -1e9)
        w = _softmax(s) * mask[:, None, :]
        o = np.einsum("bkl,bld->bkd", w, x)
        n = (o * o).sum(-1, keepdims=True)
        return _f32(o * (n / (1 + n) / np.sqrt(n + 1e-9)))

    def torch(x, c, mask):  # type: ignore[no-untyped-def]
        t = torch_module()
        s = t.bmm(c, x.transpose(1, 2)) * 0.125
        s = t.where(mask[:, None, :] > 0, s, t.full_like(s, -1e9))
        w = t.softmax(s, -1) * mask[:, None, :]
        o = t.bmm(w, x)
        n = (o * o).sum(-1, keepdim=True)
        return o * (n / (1 + n) * t.rsqrt(n + 1e-9))

    def jax(x, c, mask):  # type: ignore[no-untyped-def]
        import jax as jx
        jnp = jax_module()
        s = jnp.einsum("bkd,bld->bkl", c, x) * 0.125
        s = jnp.where(mask[:, None, :] > 0, s, -1e9)
        w = jx.nn.softmax(s, axis=-1) * mask[:, None, :]
        o = jnp.einsum("bkl,bld->bkd", w, x)
        n = (o * o).sum(-1, keepdims=True)
        return o * (n / (1 + n) * jx.lax.rsqrt(n + 1e-9))

    return Workload("interests", (("B", b), ("K", k), ("L", length), ("D", d)), INTERESTS,
                    "interests", make, numpy, torch=torch, jax=jax, flops=4.0 * b * k * length * d,
                    rtol=1e-3, atol=1e-4, note="masked softmax routing and squash")


# ------------------------------------------------------------------ logistic regression
def logreg(n: int, d: int) -> Workload:
    def make(rng: np.random.Generator) -> tuple[Any, ...]:
        return (normal(rng, n, d), (rng.random(n) < 0.5).astype(np.float32),
                uniform(rng, d) * 0.1, np.float32(0.1), np.float32(0.5))

    def numpy(x, y, w, b, lr):  # type: ignore[no-untyped-def]
        x, y, w = _f64(x, y, w)
        g = (_sigmoid(x @ w + float(b)) - y) / n
        return _f32(w - float(lr) * (x.T @ g), float(b) - float(lr) * g.sum())

    def torch(x, y, w, b, lr):  # type: ignore[no-untyped-def]
        t = torch_module()
        g = (t.sigmoid(x @ w + float(b)) - y) / n
        return w - float(lr) * (x.T @ g), float(b) - float(lr) * g.sum()

    def jax(x, y, w, b, lr):  # type: ignore[no-untyped-def]
        import jax as jx
        g = (jx.nn.sigmoid(x @ w + b) - y) / n
        return w - lr * (x.T @ g), b - lr * g.sum()

    return Workload("logreg", (("N", n), ("D", d)), LOGREG, "logreg", make, numpy,
                    torch=torch, jax=jax, flops=4.0 * n * d, rtol=1e-3, atol=1e-5,
                    note="one gradient step")


# ------------------------------------------------------------------ perceptron
def perceptron(b: int, i: int, o: int) -> Workload:
    def make(rng: np.random.Generator) -> tuple[Any, ...]:
        return (normal(rng, b, i), uniform(rng, o, i) * 0.1, uniform(rng, o),
                (rng.random((b, o)) < 0.5).astype(np.float32))

    def numpy(x, w, bias, t):  # type: ignore[no-untyped-def]
        x, w, bias, t = _f64(x, w, bias, t)
        y = _sigmoid(x @ w.T + bias)
        g = (y - t) * y * (1 - y)
        return _f32(y, g.T @ x, g.sum(0), g @ w)

    def torch(x, w, bias, t):  # type: ignore[no-untyped-def]
        y = torch_module().sigmoid(x @ w.T + bias)
        g = (y - t) * y * (1 - y)
        return y, g.T @ x, g.sum(0), g @ w

    def jax(x, w, bias, t):  # type: ignore[no-untyped-def]
        import jax as jx
        y = jx.nn.sigmoid(x @ w.T + bias)
        g = (y - t) * y * (1 - y)
        return y, g.T @ x, g.sum(0), g @ w

    return Workload("perceptron", (("B", b), ("I", i), ("O", o)), PERCEPTRON, "perceptron",
                    make, numpy, torch=torch, jax=jax, flops=6.0 * b * i * o, rtol=1e-3, atol=1e-4,
                    note="forward and backward, squared error through a sigmoid")


# ------------------------------------------------------------------ variational encoder
def vae_encoder(b: int, i: int, h: int, z: int) -> Workload:
    def make(rng: np.random.Generator) -> tuple[Any, ...]:
        return (uniform(rng, b, i), uniform(rng, h, i) * 0.1, uniform(rng, h) * 0.1,
                uniform(rng, z, h) * 0.1, uniform(rng, z) * 0.1, uniform(rng, z, h) * 0.1,
                uniform(rng, z) * 0.1, normal(rng, b, z))

    def numpy(x, w1, b1, wm, bm, wv, bv, eps):  # type: ignore[no-untyped-def]
        x, w1, b1, wm, bm, wv, bv, eps = _f64(x, w1, b1, wm, bm, wv, bv, eps)
        hid = np.maximum(x @ w1.T + b1, 0)
        mu, lv = hid @ wm.T + bm, hid @ wv.T + bv
        return _f32(mu + np.exp(0.5 * lv) * eps,
                    (-0.5 * (1 + lv - mu * mu - np.exp(lv))).sum(1))

    def torch(x, w1, b1, wm, bm, wv, bv, eps):  # type: ignore[no-untyped-def]
        t = torch_module()
        hid = t.relu(x @ w1.T + b1)
        mu, lv = hid @ wm.T + bm, hid @ wv.T + bv
        return mu + t.exp(0.5 * lv) * eps, (-0.5 * (1 + lv - mu * mu - t.exp(lv))).sum(1)

    def jax(x, w1, b1, wm, bm, wv, bv, eps):  # type: ignore[no-untyped-def]
        jnp = jax_module()
        hid = jnp.maximum(x @ w1.T + b1, 0)
        mu, lv = hid @ wm.T + bm, hid @ wv.T + bv
        return (mu + jnp.exp(0.5 * lv) * eps,
                (-0.5 * (1 + lv - mu * mu - jnp.exp(lv))).sum(1))

    return Workload("vae-encoder", (("B", b), ("I", i), ("H", h), ("Z", z)), VAE_ENCODER,
                    "vae_encoder", make, numpy, torch=torch, jax=jax,
                    flops=2.0 * b * h * (i + 2 * z), rtol=1e-3, atol=1e-4,
                    note="ReLU hidden layer, mean and log-variance heads")


# ------------------------------------------------------------------ layernorm -> GELU -> residual
def ln_gelu_residual(n: int, d: int) -> Workload:
    def make(rng: np.random.Generator) -> tuple[Any, ...]:
        return normal(rng, n, d), normal(rng, d), normal(rng, d), normal(rng, n, d)

    def numpy(x, g, b, r):  # type: ignore[no-untyped-def]
        x, g, b, r = _f64(x, g, b, r)
        return _f32(_gelu(_layernorm(x, g, b)) + r)

    def torch(x, g, b, r):  # type: ignore[no-untyped-def]
        f = torch_module().nn.functional
        return f.gelu(f.layer_norm(x, (d,), g, b, EPS)) + r

    def jax(x, g, b, r):  # type: ignore[no-untyped-def]
        return _jax_gelu(_jax_layernorm(x, g, b)) + r

    return Workload("ln-gelu-residual", (("N", n), ("D", d)), LN_GELU_RESIDUAL,
                    "ln_gelu_residual", make, numpy, torch=torch, jax=jax,
                    bytes=(3.0 * n * d + 2 * d) * 4, memory_bound=True, rtol=1e-3, atol=1e-4,
                    note="eps=1e-5, erf GELU")


def fusion_set(quick: bool) -> list[Workload]:
    if quick:
        return [attention(2, 9, 7), interests(3, 2, 7, 5), logreg(37, 11),
                perceptron(9, 7, 5), vae_encoder(5, 13, 7, 3), ln_gelu_residual(33, 67)]
    return [attention(12, 128, 64), interests(256, 4, 50, 64), logreg(8192, 256),
            perceptron(512, 256, 128), vae_encoder(256, 784, 400, 20),
            ln_gelu_residual(4096, 1024)]
