"""PyTorch operators from TC functions, with gradients derived from the TC.

    import polytile as pt, polytile.torch
    mod = pt.define(TC_SOURCE)
    fcrelu = polytile.torch.op(mod.fcrelu)
    y = fcrelu(x, w, b)            # torch tensors in and out, zero-copy
    y.sum().backward()             # gradients from polytile.autodiff

Each function becomes a `torch.library.custom_op` (its schema from the TC signature,
its fake implementation from range inference, so `torch.compile(fullgraph=True)`
traces through it without a graph break), and so does its gradient. The forward
that autograd runs also returns the intermediate values the gradient reads (the
`saved` of polytile.autodiff.backward), which torch keeps for the backward; the
callable returns only the function's own outputs.

Tensors reach the kernels as NumPy views of their memory and the outputs are
wrapped without a copy; non-contiguous inputs (a transpose, channels-last) are
copied by the launcher first. CUDA tensors are refused until a GPU backend exists.
"""
from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from polytile.api import TCFunction, define
from polytile.autodiff import backward, forward_saving
from polytile.errors import ArgumentError, UnsupportedError
from polytile.interop.adapters import torch_view
from polytile.sema import program as P
from polytile.sema.specialize import specialize

__all__ = ["op"]

_SCALAR_SCHEMA = {"b": "bool", "i": "int", "u": "int", "f": "float"}
_count = itertools.count()
_ops: dict[int, Callable[..., Any]] = {}


def op(fn: TCFunction) -> Callable[..., Any]:
    """A callable on torch tensors computing `fn`, differentiable in its float inputs
    when `fn` is differentiable (polytile.autodiff), registered as a custom op."""
    if not isinstance(fn, TCFunction):
        raise ArgumentError(f"polytile.torch.op takes a function of a defined module "
                            f"(mod.name), got {type(fn).__name__}")
    if id(fn) not in _ops:
        _ops[id(fn)] = _build(fn)
    return _ops[id(fn)]


def _build(fn: TCFunction) -> Callable[..., Any]:
    base = f"{re.sub(r'[^A-Za-z0-9_]', '_', fn.name)}_{next(_count)}"
    try:
        derived = backward(fn.fn, saved=True)
    except UnsupportedError:
        derived = None            # not differentiable: a plain op
    if derived is None:
        return _Call(_custom(fn, f"polytile::{base}"), fn.fn)
    forward = _sibling(fn, forward_saving(fn.fn, derived.saved), fn.name)
    gradient = _sibling(fn, derived.source, derived.name)
    forward_op = _custom(forward, f"polytile::{base}")
    gradient_op = _custom(gradient, f"polytile::{base}_grad")
    _register_autograd(forward_op, gradient_op, fn.fn, forward.fn, derived)
    return _Call(forward_op, fn.fn)


@dataclass(frozen=True)
class _Call:
    """The user's callable: checks the arguments, runs the op, returns the function's
    own outputs (not the saved values)."""

    op: Any
    fn: P.Function

    def __call__(self, *args: Any) -> Any:
        params = self.fn.params
        if len(args) != len(params):
            raise ArgumentError(f"{self.fn.name} takes {len(params)} arguments "
                                f"({', '.join(p.name for p in params)}), got {len(args)}",
                                self.fn.loc)
        for p, a in zip(params, args):
            if p.kind == "input":
                _cpu(a, p)
        result = self.op(*args)
        result = result if isinstance(result, tuple) else (result,)
        n = len(self.fn.outputs)
        return result[0] if n == 1 else tuple(result[:n])


def _sibling(fn: TCFunction, source: str, name: str) -> TCFunction:
    """`name` of `source`, compiled like `fn` (same backend, target and configuration)."""
    compiler = fn.compiler
    module = define(source, backend=fn.backend, name=f"<{name}>",
                    target=compiler.target.name if compiler else None,
                    config=compiler.config if compiler else None)
    return module[name]


# ---------------------------------------------------------------- custom ops

def _schema(fn: P.Function) -> str:
    params = []
    for k, p in enumerate(fn.params):
        kind = "Tensor" if p.kind == "input" else _SCALAR_SCHEMA[p.dtype.kind]
        params.append(f"{kind} a{k}")
    outs = ", ".join("Tensor" for _ in fn.outputs)
    return f"({', '.join(params)}) -> " + (outs if len(fn.outputs) == 1 else f"({outs})")


def _custom(tc: TCFunction, qualname: str) -> Any:
    """A torch custom op running `tc`, with a fake implementation from range inference."""
    fn = tc.fn

    def run(*args: Any) -> Any:
        views = [torch_view(a.detach()) if p.kind == "input" else a
                 for p, a in zip(fn.params, args)]
        result = tc(*views)
        outs = result if isinstance(result, tuple) else (result,)
        tensors = tuple(_tensor(o) for o in outs)
        return tensors[0] if len(tensors) == 1 else tensors

    custom = torch.library.custom_op(qualname, run, mutates_args=(), schema=_schema(fn))

    @custom.register_fake
    def _(*args: Any) -> Any:
        shapes = _output_shapes(fn, args)
        device = next(a.device for p, a in zip(fn.params, args) if p.kind == "input")
        outs = tuple(torch.empty(s, dtype=_torch_dtype(o), device=device)
                     for s, o in zip(shapes, fn.outputs))
        return outs[0] if len(outs) == 1 else outs

    return custom


def _output_shapes(fn: P.Function, args: tuple[Any, ...]) -> list[tuple[int, ...]]:
    """Each output's shape for these arguments, by range inference (TC §3.1)."""
    shapes = {p.name: tuple(int(d) for d in a.shape)
              for p, a in zip(fn.params, args) if p.kind == "input"}
    scalars = {p.name: a for p, a in zip(fn.params, args) if p.kind == "scalar"}
    spec = specialize(fn, shapes, scalars)
    return [spec.shape(o.name) for o in fn.outputs]


def _register_autograd(forward_op: Any, gradient_op: Any, original: P.Function,
                       forward: P.Function, derived: Any) -> None:
    params = original.params
    tensors = [k for k, p in enumerate(params) if p.kind == "input"]
    outputs = [o.name for o in forward.outputs]
    seeds = [outputs.index(o) for o, _ in derived.seeds]
    saved = [outputs.index(v) for v in derived.saved]
    gradient_of = {name: k for k, (name, _) in enumerate(derived.gradients)}

    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        output = output if isinstance(output, tuple) else (output,)
        ctx.save_for_backward(*[inputs[k] for k in tensors], *[output[k] for k in saved])
        ctx.scalars = {k: inputs[k] for k, p in enumerate(params) if p.kind == "scalar"}
        ctx.seed_shapes = [(output[k].shape, output[k].dtype) for k in seeds]

    def backward_fn(ctx: Any, *grads: Any) -> tuple[Any, ...]:
        kept = list(ctx.saved_tensors)
        inputs, values = kept[:len(tensors)], kept[len(tensors):]
        args: list[Any] = []
        given = iter(inputs)
        for k, p in enumerate(params):
            args.append(next(given) if p.kind == "input" else ctx.scalars[k])
        args += values
        for k, (shape, dtype) in zip(seeds, ctx.seed_shapes):
            g = grads[k]
            args.append(torch.zeros(shape, dtype=dtype) if g is None else g.contiguous())
        result = gradient_op(*args)
        result = result if isinstance(result, tuple) else (result,)
        return tuple(result[gradient_of[p.name]] if p.name in gradient_of else None
                     for p in params)

    forward_op.register_autograd(backward_fn, setup_context=setup_context)


# ---------------------------------------------------------------- conversions

def _cpu(value: Any, p: P.Tensor) -> None:
    if not isinstance(value, torch.Tensor):
        raise ArgumentError(f"{p.name} must be a torch tensor, got {type(value).__name__}",
                            p.loc)
    if value.device.type not in ("cpu", "meta"):
        raise UnsupportedError(f"{p.name} is a {value.device.type} tensor, and polytile has "
                               "no backend for that device yet", p.loc, "move it with .cpu()")


def _tensor(array: np.ndarray) -> torch.Tensor:
    """A tensor on the array's memory (no copy)."""
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def _torch_dtype(t: P.Tensor) -> torch.dtype:
    from polytile.interop.adapters import torch_dtype
    return torch_dtype(t.dtype.numpy)
