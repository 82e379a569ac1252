"""polytile.torch.op: torch tensors in and out without copies, gradients that agree with
torch's own layers and with gradcheck in double precision, and torch.compile tracing
through the op with no graph break. Skipped, with the reason, where torch is missing."""
from __future__ import annotations

import re

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is an optional dependency "
                            "(pip install polytile[torch])")

import polytile as pt
import polytile.torch as ptt

F = torch.nn.functional

LAYERS = """
def fcrelu(float(B,I) x, float(O,I) w, float(O) b) -> (y) {
  y(n,o)  = b(o)
  y(n,o) += x(n,i) * w(o,i)
  y(n,o)  = fmaxf(y(n,o), 0)
}
def mlp3(float(B,I) x, float(O,I) w1, float(O) b1, float(P,O) w2, float(P) b2,
         float(Q,P) w3, float(Q) b3) -> (y) {
  h1(n,o) +=! x(n,i) * w1(o,i)
  h1(n,o) = relu(h1(n,o) + b1(o))
  h2(n,p) +=! h1(n,o) * w2(p,o)
  h2(n,p) = relu(h2(n,p) + b2(p))
  y(n,q) +=! h2(n,p) * w3(q,p)
  y(n,q) = y(n,q) + b3(q)
}
def conv(float(N,C,H,W) x, float(K,C,R,S) w) -> (y) {
  y(n,k,h,v) +=! x(n,c,h+r,v+s) * w(k,c,r,s)
}
def gconv(float(N,G,C,H,W) x, float(G,F,C,R,S) w) -> (y) {
  y(n,g,f,h,v) +=! x(n,g,c,h+r,v+s) * w(g,f,c,r,s)
}
def maxpool(float(N,C,H,W) x) -> (y) {
  y(n,c,h,w) max=! x(n,c,2*h+r,2*w+s) where r in 0:2, s in 0:2
}
def softmax(float(N,C) x) -> (y) {
  m(n) max=! x(n,c)
  e(n,c) = exp(x(n,c) - m(n))
  s(n) +=! e(n,c)
  y(n,c) = e(n,c) / s(n)
}
def layernorm(float(N,D) x, float(D) g, float(D) b) -> (y) {
  mean(n) +=! x(n,d) / D
  xc(n,d) = x(n,d) - mean(n)
  var(n) +=! xc(n,d) * xc(n,d) / D
  y(n,d) = xc(n,d) * rsqrt(var(n) + 1e-5) * g(d) + b(d)
}
def batchnorm(float(N,C) x, float(C) g, float(C) b) -> (y) {
  mean(c) +=! x(n,c) / N
  xc(n,c) = x(n,c) - mean(c)
  var(c) +=! xc(n,c) * xc(n,c) / N
  y(n,c) = xc(n,c) * rsqrt(var(c) + 1e-5) * g(c) + b(c)
}
def embedding_bag(float(E,D) T, int64(B,L) I) -> (y) {
  y(b,d) +=! T(I(b,l),d)
}
"""

# (function, argument shapes (None: an index tensor), torch's own layer)
CASES = [
    ("fcrelu", [(5, 7), (3, 7), (3,)], lambda x, w, b: F.relu(F.linear(x, w, b))),
    ("mlp3", [(4, 10), (8, 10), (8,), (6, 8), (6,), (3, 6), (3,)],
     lambda x, w1, b1, w2, b2, w3, b3: F.linear(F.relu(F.linear(F.relu(F.linear(
         x, w1, b1)), w2, b2)), w3, b3)),
    ("conv", [(2, 3, 9, 8), (4, 3, 3, 2)], F.conv2d),
    ("gconv", [(2, 2, 3, 7, 6), (2, 4, 3, 3, 3)],
     lambda x, w: F.conv2d(x.flatten(1, 2), w.flatten(0, 1), groups=2).unflatten(1, (2, 4))),
    ("maxpool", [(2, 3, 8, 6)], lambda x: F.max_pool2d(x, 2)),
    ("softmax", [(4, 9)], lambda x: torch.softmax(x, 1)),
    ("layernorm", [(4, 16), (16,), (16,)], lambda x, g, b: F.layer_norm(x, (16,), g, b)),
    ("batchnorm", [(6, 5), (5,), (5,)],
     lambda x, g, b: F.batch_norm(x, None, None, g, b, training=True)),
    ("embedding_bag", [(20, 6), None],
     lambda T, I: F.embedding_bag(I, T, mode="sum")),
]


def _arguments(shapes: list, dtype: torch.dtype, seed: int) -> list:
    gen = torch.Generator().manual_seed(seed)
    args = []
    for s in shapes:
        if s is None:
            args.append(torch.randint(0, 20, (5, 4), generator=gen))
        else:
            args.append(torch.randn(*s, dtype=dtype, generator=gen).requires_grad_())
    return args


@pytest.fixture(scope="module")
def ops() -> dict:
    mod = pt.define(LAYERS)
    return {name: ptt.op(mod[name]) for name, _, _ in CASES}


@pytest.fixture(scope="module")
def ops64() -> dict:
    mod = pt.define(re.sub(r"\bfloat\b", "double", LAYERS))
    return {name: ptt.op(mod[name]) for name, _, _ in CASES}


@pytest.mark.parametrize("name, shapes, layer", CASES, ids=[c[0] for c in CASES])
def test_matches_torch_forward_and_backward(ops: dict, name: str, shapes: list,
                                            layer) -> None:
    ours = _arguments(shapes, torch.float32, 0)
    theirs = [a.detach().clone().requires_grad_(a.requires_grad) for a in ours]
    y, want = ops[name](*ours), layer(*theirs)
    assert isinstance(y, torch.Tensor) and y.dtype == want.dtype and y.shape == want.shape
    torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-5)
    seed = torch.randn_like(want)
    y.backward(seed)
    want.backward(seed)
    for a, b in zip(ours, theirs):
        if a.requires_grad:
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("wanted", [(1, 2, 3, 4, 5, 6), (3,), (0, 6)])
def test_only_the_gradients_autograd_asks_for_are_computed(ops: dict, wanted: tuple) -> None:
    """Inputs that do not require grad get none (x, a batch of data, most of all) and
    cost nothing: a gradient function derived for the others, compiled once per set."""
    name, shapes, layer = CASES[1]                            # mlp3
    op = ops[name]
    ours = [a.detach().requires_grad_(k in wanted)
            for k, a in enumerate(_arguments(shapes, torch.float32, 2))]
    theirs = [a.detach().clone().requires_grad_(a.requires_grad) for a in ours]
    seed = torch.randn(4, 3, generator=torch.Generator().manual_seed(5))
    for _ in range(2):
        for a in ours:
            a.grad = None
        op(*ours).backward(seed)
    layer(*theirs).backward(seed)
    for k, (a, b) in enumerate(zip(ours, theirs)):
        if k in wanted:
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-4)
        else:
            assert a.grad is None
    names = frozenset(op.params[k].name for k in wanted)
    gradient, _, _ = op.variants[names]
    assert [o.name for o in gradient.fn.outputs] == [f"d_{op.params[k].name}"
                                                      for k in sorted(wanted)]


def test_a_gradient_that_would_drop_no_product_stays_whole(ops: dict) -> None:
    """Without x, a layer norm's gradient would lose only passes over memory, and its
    column sums their row loop: the whole gradient runs, its d_x unused."""
    name, shapes, layer = CASES[6]                            # layernorm
    op = ops[name]
    ours = [a.detach().requires_grad_(k > 0)
            for k, a in enumerate(_arguments(shapes, torch.float32, 3))]
    theirs = [a.detach().clone().requires_grad_(a.requires_grad) for a in ours]
    seed = torch.randn(4, 16, generator=torch.Generator().manual_seed(6))
    op(*ours).backward(seed)
    layer(*theirs).backward(seed)
    assert ours[0].grad is None
    for a, b in zip(ours[1:], theirs[1:]):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-4)
    assert op.variants[frozenset({"g", "b"})][0] is op.gradient


@pytest.mark.parametrize("name, shapes, layer", CASES, ids=[c[0] for c in CASES])
def test_gradcheck_in_double_precision(ops64: dict, name: str, shapes: list, layer) -> None:
    args = _arguments(shapes, torch.float64, 1)
    assert torch.autograd.gradcheck(ops64[name], tuple(args))


def test_torch_compile_traces_through_without_a_graph_break(ops: dict) -> None:
    fcrelu, softmax = ops["fcrelu"], ops["softmax"]

    def model(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return softmax(fcrelu(x, w, b) * 2).sum(1)

    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    x, w, b = _arguments([(5, 7), (3, 7), (3,)], torch.float32, 2)
    got = compiled(x, w, b)
    torch.testing.assert_close(got, model(x, w, b))
    got.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_zero_copy_and_strided_inputs(ops: dict) -> None:
    x, w, b = _arguments([(7, 5), (3, 7), (3,)], torch.float32, 3)
    xt = x.detach().t()                                  # non-contiguous
    y = ops["fcrelu"](xt, w.detach(), b.detach())
    torch.testing.assert_close(y, F.relu(F.linear(xt, w.detach(), b.detach())))
    nchw = torch.randn(2, 3, 9, 8).to(memory_format=torch.channels_last)
    k = torch.randn(4, 3, 3, 2)
    torch.testing.assert_close(ops["conv"](nchw, k), F.conv2d(nchw, k), rtol=1e-4, atol=1e-5)


def test_module_functions_return_tensors_for_tensors() -> None:
    mod = pt.define("def scale(float(N) x) -> (y) {\n  y(i) = 2 * x(i)\n}")
    x = torch.arange(5, dtype=torch.float32)
    y = mod.scale(x)
    assert isinstance(y, torch.Tensor)
    torch.testing.assert_close(y, 2 * x)
    half = mod.scale(x[::2])                              # a strided view, no copy asked
    torch.testing.assert_close(half, 2 * x[::2])


def test_refuses_what_it_cannot_run(ops: dict) -> None:
    x, w, b = _arguments([(5, 7), (3, 7), (3,)], torch.float32, 4)
    with pytest.raises(pt.ArgumentError, match="dtype float32"):
        ops["fcrelu"](x.double(), w, b)
    with pytest.raises(pt.ArgumentError, match="torch tensor"):
        ops["fcrelu"](np.zeros((5, 7), np.float32), w, b)
    with pytest.raises(pt.ArgumentError, match="mod.name"):
        ptt.op(lambda x: x)                                # type: ignore[arg-type]


def test_einsum_on_tensors_that_require_grad_is_differentiable() -> None:
    x = torch.randn(2, 3, 9, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 3, 3, 2, dtype=torch.float64, requires_grad=True)
    y = pt.einsum("nc(h+r)(v+s),kcrs->nkhv", x, w)
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    want = F.conv2d(x2, w2)
    torch.testing.assert_close(y, want)
    seed = torch.randn_like(want)
    y.backward(seed)
    want.backward(seed)
    torch.testing.assert_close(x.grad, x2.grad)
    torch.testing.assert_close(w.grad, w2.grad)
    shifts = np.array([0, 2, 1], np.int64)
    shifted = lambda x, w: pt.einsum("nc(h+s[c])v,kc->nkhv", x, w, s=shifts)
    assert torch.autograd.gradcheck(shifted, (x, w[:, :, 0, 0].detach().requires_grad_()))


def test_second_derivatives_are_refused_not_zero(ops: dict) -> None:
    x, w, b = _arguments([(5, 7), (3, 7), (3,)], torch.float32, 6)
    y = ops["softmax"](ops["fcrelu"](x, w, b))
    (gx,) = torch.autograd.grad(y.sum() * 0 + (y * y).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|does not require grad"):
        gx.sum().backward()


def test_the_address_path_agrees_with_the_numpy_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once a kernel is compiled for the shapes, contiguous CPU tensors go to it by data
    pointer; offset views, transposed views, a scalar and a wrong dtype still come out
    right (or refused), as on the NumPy path. (The Python path: the native one, which
    takes these calls first, is tested in test_dispatch.py.)"""
    monkeypatch.setenv("POLYTILE_NO_NATIVE_DISPATCH", "1")
    mod = pt.define("def axpy(float(N,M) x, float(N,M) y, float a) -> (z) {\n"
                    "  z(i,j) = a * x(i,j) + y(i,j)\n}")
    op = ptt.op(mod.axpy)
    gen = torch.Generator().manual_seed(5)
    big = torch.randn(9, 13, generator=gen)
    x, y = big[1:8], torch.randn(7, 13, generator=gen)     # x: contiguous, at an offset
    calls: list[bool] = []
    real = ptt._run_addresses

    def spy(compiled, args):  # type: ignore[no-untyped-def]
        result = real(compiled, args)
        calls.append(result is not None)
        return result

    monkeypatch.setattr(ptt, "_run_addresses", spy)
    first = op(x, y, 1.5)                                 # compiles: NumPy path
    assert calls == []
    torch.testing.assert_close(first, 1.5 * x + y)
    torch.testing.assert_close(op(x, y, -0.25), -0.25 * x + y)
    assert calls == [True]
    xt = torch.randn(13, 7, generator=gen).t()            # same shape, not contiguous
    torch.testing.assert_close(op(xt, y, 2.0), 2.0 * xt + y)
    assert calls == [True, False]
    with pytest.raises(pt.ArgumentError, match="dtype float32"):
        op(x.double(), y, 2.0)
    assert calls[-1] is False


def test_outputs_of_the_address_path_reuse_pooled_memory_only_once_released() -> None:
    """A step's outputs come from the output pool as a NumPy call's do (no page faults
    on memory the process used before): a released output's memory is handed out again,
    a live one's never, and each result is right."""
    mod = pt.define("def twice(float(N,M) x) -> (y) {\n  y(i,j) = 2 * x(i,j)\n}")
    op = ptt.op(mod.twice)
    x = torch.randn(300, 400, generator=torch.Generator().manual_seed(2))   # 480 KB
    op(x)                                                 # compiles
    first = op(x)
    kept = first.data_ptr()
    second = op(x + 1)
    assert second.data_ptr() != kept
    torch.testing.assert_close(first, 2 * x)
    torch.testing.assert_close(second, 2 * (x + 1))
    del first
    third = op(x - 1)
    assert third.data_ptr() == kept
    torch.testing.assert_close(third, 2 * (x - 1))
    torch.testing.assert_close(second, 2 * (x + 1))
