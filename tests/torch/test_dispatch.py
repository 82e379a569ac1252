"""polytile.torch's calls through the native call path (Dispatcher.torch): cached calls
on plain CPU tensors run in C, and every tensor it does not take (another layout, dtype,
device, a subclass) gives the answer of the Python path. Skipped where torch is missing."""
from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is an optional dependency "
                            "(pip install polytile[torch])")

import polytile as pt
import polytile.torch as ptt
from polytile.config import Config
from polytile.runtime import dispatch

SOURCE = """
def scaled(float s, int32 k, float(M,N) A) -> (C, D) {
  C(m,n) = A(m,n) * s + k
  D(m) +=! A(m,n)
}
def half(bfloat16(N) A) -> (C) { C(i) = A(i) * 2 }
"""


@pytest.fixture
def ops(tmp_path: Path) -> tuple[Any, Any]:
    """The same functions as torch ops, with the native call path and without it."""
    assert dispatch.new_dispatcher(Config(cache_dir=tmp_path), wait=True) is not None
    native = pt.define(SOURCE, config=Config(cache_dir=tmp_path))
    python = pt.define(SOURCE, config=Config(cache_dir=tmp_path, native_dispatch=False))
    return native, python


def test_cached_tensor_calls_run_in_c(ops: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
                                      ) -> None:
    native, _ = ops
    op = ptt.op(native.scaled)
    x = torch.randn(5, 7)
    op(0.5, 3, x)                                                     # compiles
    monkeypatch.setattr(ptt, "_run_addresses", _refuse)
    monkeypatch.setattr(native.scaled, "_checked_call", _refuse)
    c, d = op(-1.5, 3, torch.nn.Parameter(x.clone()))
    assert isinstance(c, torch.Tensor) and isinstance(d, torch.Tensor)
    torch.testing.assert_close(c, x * -1.5 + 3)
    torch.testing.assert_close(d, x.sum(1))
    assert native.scaled._dispatch.torch((0.5, 3, x)) is not NotImplemented
    assert native.scaled._dispatch.torch((0.5, 4, x)) is NotImplemented   # another k


def _refuse(*_: Any, **__: Any) -> Any:
    raise AssertionError("the call took the Python path")


class _Sub(torch.Tensor):
    pass


TENSORS = {
    "transposed": lambda x: x.t().contiguous().t(),
    "every other column": lambda x: torch.stack([x, -x], -1).reshape(5, 14)[:, ::2],
    "float64": lambda x: x.double(),
    "int32": lambda x: x.int(),
    "subclass": lambda x: x.as_subclass(_Sub),
    "meta": lambda x: x.to("meta"),
    "other shape": lambda x: x[:3],
    "numpy array": lambda x: x.numpy(),
}


@pytest.mark.parametrize("case", list(TENSORS))
def test_tensors_it_does_not_take_give_the_python_paths_answer(case: str,
                                                               ops: tuple[Any, Any]) -> None:
    x = torch.randn(5, 7)
    results = []
    for module in ops:
        op = ptt.op(module.scaled)
        op(0.5, 3, x)                                                 # cached
        results.append(_outcome(partial(op, 2.0, 3, TENSORS[case](x))))
    (kind, got), (want_kind, want) = results
    assert kind == want_kind
    if kind == "ok" and case != "meta":
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w)
    elif kind != "ok":
        assert got == want


def _outcome(call: Any) -> tuple[str, Any]:
    try:
        return "ok", call()
    except (pt.PolytileError, TypeError, RuntimeError) as e:
        return type(e).__name__, str(e)


def test_bfloat16_in_and_out(ops: tuple[Any, Any]) -> None:
    native, _ = ops
    op = ptt.op(native.half)
    x = torch.randn(33).bfloat16()
    op(x)
    y = op(x)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y, x * 2)


def test_a_training_step_agrees_with_the_python_path(tmp_path: Path) -> None:
    source = """def fcrelu(float(B,I) x, float(O,I) w, float(O) b) -> (y) {
      y(n,o)  = b(o)
      y(n,o) += x(n,i) * w(o,i)
      y(n,o)  = fmaxf(y(n,o), 0)
    }"""
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in [(9, 13), (11, 13), (11,)]]
    grads = []
    for native in (True, False):
        config = Config(cache_dir=tmp_path, native_dispatch=native)
        op = ptt.op(pt.define(source, config=config).fcrelu)
        leaves = [torch.tensor(a, requires_grad=True) for a in arrays]
        for _ in range(2):                                            # compiled, then cached
            for t in leaves:
                t.grad = None
            op(*leaves).backward(torch.ones(9, 11))
        grads.append([t.grad for t in leaves])
    for g, w in zip(*grads, strict=True):
        torch.testing.assert_close(g, w)
