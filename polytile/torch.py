"""PyTorch operators from TC functions, with gradients derived from the TC.

    import polytile as pt, polytile.torch
    mod = pt.define(TC_SOURCE)
    fcrelu = polytile.torch.op(mod.fcrelu)
    y = fcrelu(x, w, b)            # torch tensors in and out, zero-copy
    y.sum().backward()             # gradients from polytile.autodiff

Three ways through, one meaning:

* under `torch.compile`, the function is a `torch.library.custom_op` (schema from the
  TC signature, fake implementation from range inference), and so is its gradient,
  so the compiled graph traces through both with no break;
* in eager mode with gradients wanted, a `torch.autograd.Function` runs the same two
  kernels with less dispatch (custom ops cost tens of microseconds a call in eager);
* otherwise the plain function runs, with no autograd bookkeeping.

With gradients, the forward that runs is `polytile.autodiff.forward_saving`: it also
returns the intermediate values the derived gradient reads, which torch keeps for the
backward; the callable returns only the function's own outputs. In eager mode an input
that autograd asks no gradient of (`needs_input_grad`; a batch of data) costs nothing
where leaving it out drops a product: the backward then runs a gradient function derived
for the others alone (`backward(..., wrt=...)`), compiled once per such set (`_variant`).

Tensors reach the kernels as NumPy views of their memory and outputs are wrapped
without a copy; non-contiguous inputs (a transpose, channels-last) are copied by the
launcher first. CUDA tensors run when the module's target is a cuda one (cuda-sm80,
cuda-sm90): they are passed to the kernel by their device pointers (a non-contiguous
one is made contiguous by torch, on the device, first) and the outputs are torch CUDA
tensors on the same device (polytile.interop.device); with any other target they are
refused with an UnsupportedError.
"""
from __future__ import annotations

import itertools
import re
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.autograd.function import once_differentiable

from polytile import dtypes
from polytile.api import TCFunction, define_like
from polytile.autodiff import Backward, backward, forward_saving
from polytile.compile import CompiledFunction
from polytile.errors import ArgumentError, UnsupportedError
from polytile.interop.adapters import torch_dtype, torch_view
from polytile.interop.device import refused
from polytile.interop.fx import Backend, backend
from polytile.runtime.dispatch import use_torch
from polytile.sema import program as P
from polytile.sema.specialize import specialize
from polytile.sema.typing import reads

__all__ = ["Backend", "backend", "op"]

_SCALAR_SCHEMA = {"b": "bool", "i": "int", "u": "int", "f": "float"}
_count = itertools.count()
_ops: dict[int, tuple[TCFunction, _Op]] = {}


def op(fn: TCFunction) -> Callable[..., Any]:
    """A callable on torch tensors computing `fn`, differentiable in its float inputs
    when `fn` is differentiable (polytile.autodiff); one per function."""
    if not isinstance(fn, TCFunction):
        raise ArgumentError(f"polytile.torch.op takes a function of a defined module "
                            f"(mod.name), got {type(fn).__name__}")
    known = _ops.get(id(fn))
    if known is None or known[0] is not fn:
        known = _ops[id(fn)] = (fn, _Op(fn))
    return known[1]


class _Op:
    """The user's callable (see the module docstring for the three paths)."""

    def __init__(self, fn: TCFunction):
        self.fn = fn
        self.params = fn.fn.params
        self.outputs = len(fn.fn.outputs)
        base = f"polytile::tc_{re.sub(r'[^A-Za-z0-9_]', '_', fn.name)}_{next(_count)}"
        try:
            self.derived: Backward | None = backward(fn.fn, saved=True)
        except UnsupportedError:
            self.derived = None                 # not differentiable: a plain op
        if self.derived is None:
            self.custom = _custom(fn, base)
            return
        forward = forward_saving(fn.fn, self.derived.saved)
        self.forward = define_like(fn, forward, f"<{fn.name}, saving>")[fn.name]
        self.gradient = define_like(fn, self.derived.source, f"<{self.derived.name}>")[
            self.derived.name]
        names = [o.name for o in self.forward.fn.outputs]
        self.seeds = [names.index(o) for o, _ in self.derived.seeds]
        self.saved = [names.index(v) for v in self.derived.saved]
        self.tensors = [k for k, p in enumerate(self.params) if p.kind == "input"]
        computed = {name: k for k, (name, _) in enumerate(self.derived.gradients)}
        self.gradient_of = [computed.get(p.name) for p in self.params]
        self.variants: dict[frozenset[str],
                            tuple[TCFunction, list[int] | None, list[int | None]]] = {}
        self.custom = _custom(self.forward, base)
        custom_gradient = _custom(self.gradient, base + "_grad")
        self.custom.register_autograd(
            lambda ctx, *grads: self.backward(ctx, grads, custom_gradient),
            setup_context=lambda ctx, inputs, output: self.setup(ctx, inputs, output))

    def __call__(self, *args: Any) -> Any:
        if len(args) != len(self.params):
            raise ArgumentError(f"{self.fn.name} takes {len(self.params)} arguments "
                                f"({', '.join(p.name for p in self.params)}), got {len(args)}",
                                self.fn.fn.loc)
        for p, a in zip(self.params, args):
            if p.kind == "input":
                _check_tensor(a, p, self.fn)
        if torch.compiler.is_compiling():
            result = self.custom(*args)
        elif self.derived is not None and torch.is_grad_enabled() and any(
                isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            result = _Eager.apply(self, *args)
        else:
            result = _run(self.fn, args)
        result = result if isinstance(result, tuple) else (result,)
        return result[0] if self.outputs == 1 else tuple(result[:self.outputs])

    # ------------------------------------------------------------ autograd
    def setup(self, ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        output = output if isinstance(output, tuple) else (output,)
        ctx.save_for_backward(*[inputs[k] for k in self.tensors],
                              *[output[k] for k in self.saved])
        ctx.scalars = {k: inputs[k] for k, p in enumerate(self.params) if p.kind == "scalar"}
        ctx.seed_shapes = [(output[k].shape, output[k].dtype, output[k].device)
                           for k in self.seeds]

    def backward(self, ctx: Any, grads: tuple[Any, ...],
                 gradient: Callable[..., Any] | None = None,
                 needs: tuple[bool, ...] | None = None) -> tuple[Any, ...]:
        """The inputs' gradients (None for those without one) from the outputs'. With
        `needs` (autograd's needs_input_grad), only those inputs' gradients are computed:
        a gradient function derived for them alone, compiled once per such set."""
        tc: TCFunction = self.gradient
        picked: list[int] | None = None
        gradient_of = self.gradient_of
        if needs is not None:
            wanted = frozenset(p.name for k, p in enumerate(self.params)
                               if self.gradient_of[k] is not None and needs[k])
            if len(wanted) < len(self.derived.gradients):   # type: ignore[union-attr]
                if not wanted:
                    return (None,) * len(self.params)
                tc, picked, gradient_of = self._variant(wanted)
                if picked is not None:
                    gradient = None
        kept = list(ctx.saved_tensors)
        inputs = iter(kept[:len(self.tensors)])
        args = [next(inputs) if p.kind == "input" else ctx.scalars[k]
                for k, p in enumerate(self.params)]
        values = kept[len(self.tensors):]
        args += values if picked is None else [values[k] for k in picked]
        for k, (shape, dtype, device) in zip(self.seeds, ctx.seed_shapes):
            g = grads[k]
            args.append(torch.zeros(shape, dtype=dtype, device=device) if g is None else g)
        result = gradient(*args) if gradient is not None else _run(tc, args)
        result = result if isinstance(result, tuple) else (result,)
        return tuple(None if k is None else result[k] for k in gradient_of)

    def _variant(self, wanted: frozenset[str]
                 ) -> tuple[TCFunction, list[int] | None, list[int | None]]:
        """The gradient function of the inputs `wanted` only, the positions of the saved
        values it reads among the forward's, and where each input's gradient is in its
        outputs. It is the whole gradient (positions None) unless leaving the others out
        drops a product of two operands (the d_x = d_y w of a linear layer or a
        convolution): without one, what is dropped is a pass over memory, and the gradient
        without it can fuse worse (a layer norm's dgamma and dbeta alone are column sums
        of their own, 1.55x the time of the whole gradient's one row loop)."""
        found = self.variants.get(wanted)
        if found is None:
            assert self.derived is not None
            derived = backward(self.fn.fn, saved=True, wrt=wanted)
            tc = define_like(self.fn, derived.source,
                             f"<{derived.name} of {', '.join(sorted(wanted))}>")[derived.name]
            dropped = {st.tensor for st in self.gradient.fn.statements} - {
                st.tensor for st in tc.fn.statements}
            if not any(_is_product(st) for st in self.gradient.fn.statements
                       if st.tensor in dropped):
                found = (self.gradient, None, self.gradient_of)
            else:
                computed = {name: k for k, (name, _) in enumerate(derived.gradients)}
                found = (tc, [self.derived.saved.index(v) for v in derived.saved],
                         [computed.get(p.name) for p in self.params])
            self.variants[wanted] = found
        return found


def _is_product(st: P.Statement) -> bool:
    """A reduction that multiplies two tensors, each with an index the other lacks (a
    matrix product, a convolution): work that grows faster than the data it reads."""
    if not st.reduction_indices:
        return False
    used = [frozenset(n for x in r.indices for n in _index_names(x))
            for r in reads(st.rhs) if len(r.indices) >= 2]
    return any(a - b and b - a for a in used for b in used)


def _index_names(e: P.TExpr) -> list[str]:
    """The index variables of an index expression, not through a gather's read (unlike
    sema.typing.index_names: a gathered row is no product's operand index)."""
    if isinstance(e, P.IndexVar):
        return [e.name]
    if isinstance(e, P.Op):
        return [n for a in e.args for n in _index_names(a)]
    return []


class _Eager(torch.autograd.Function):
    """The eager path with gradients: the same forward and gradient kernels as the
    custom ops, without their dispatch."""

    @staticmethod
    def forward(ctx: Any, op: _Op, *args: Any) -> Any:   # type: ignore[override]
        output = _run(op.forward, args)
        op.setup(ctx, args, output)
        ctx.op = op
        ctx.mark_non_differentiable(*[output[k] for k in op.saved
                                      if k not in op.seeds])
        return output

    @staticmethod
    @once_differentiable          # no second derivatives: refused, never silently zero
    def backward(ctx: Any, *grads: Any) -> Any:        # type: ignore[override]
        return (None, *ctx.op.backward(ctx, grads, needs=ctx.needs_input_grad[1:]))


# ---------------------------------------------------------------- running

def _run(tc: TCFunction, args: tuple[Any, ...] | list[Any]) -> tuple[torch.Tensor, ...]:
    """`tc` on tensors, its outputs as tensors: the kernel compiled for these shapes on
    the tensors' data pointers, else through NumPy views of their memory."""
    if tc._dispatch is not None:                       # the native call path
        result = tc._dispatch.torch(tuple(args))
        if result is not NotImplemented:
            return result
    if any(isinstance(a, torch.Tensor) and a.device.type == "cuda" for a in args):
        # The device path (polytile.interop.device) reads the CUDA array interface, which
        # torch gives only for detached tensors, and takes C-contiguous memory.
        result = tc(*[a.detach().contiguous() if isinstance(a, torch.Tensor) else a
                      for a in args])
        return result if isinstance(result, tuple) else (result,)
    compiled = tc.compiled(args)
    if compiled is not None and compiled.takes_addresses:
        result = _run_addresses(compiled, args)
        if result is not None:
            return result
    # Runs twice a training step: no per-argument function call for the common dtypes.
    views = [a if not isinstance(a, torch.Tensor) else a.detach().numpy()
             if a.dtype is not torch.bfloat16 else torch_view(a.detach()) for a in args]
    result = tc(*views)
    return tuple(_tensor(o) for o in (result if isinstance(result, tuple) else (result,)))


def _param_types(compiled: CompiledFunction) -> tuple[torch.dtype | None, ...]:
    """A compiled kernel's parameter types in torch's terms (None: a scalar)."""
    return tuple(None if p.kind == "scalar" else torch_dtype(p.dtype.numpy)
                 for p in compiled.fn.params)


_PLAIN = (torch.Tensor, torch.nn.Parameter)    # subclasses may redefine data_ptr: not these
_TYPES: weakref.WeakKeyDictionary[CompiledFunction, tuple[torch.dtype | None, ...]] = \
    weakref.WeakKeyDictionary()


def _run_addresses(compiled: CompiledFunction, args: tuple[Any, ...] | list[Any]
                   ) -> tuple[torch.Tensor, ...] | None:
    """The call on data pointers (a third of the cost of NumPy views, which a training
    step pays for every tensor twice), or None when an argument needs the general path.
    `compiled` was found by these tensors' shapes; dtype, device and layout are checked
    here."""
    types = _TYPES.get(compiled)
    if types is None:
        types = _TYPES[compiled] = _param_types(compiled)
    addresses: list[Any] = []
    for a, dtype in zip(args, types):
        if dtype is None:
            addresses.append(a)
        elif (type(a) in _PLAIN and a.dtype is dtype and a.is_cpu and a.is_contiguous()):
            addresses.append(a.data_ptr())
        else:
            return None
    # As a NumPy call's: pooled memory (torch.empty's would be faulted in afresh by
    # every step that frees a few outputs of a MiB or more: polytile.runtime.pool).
    outputs = tuple(_tensor(o) for o in compiled.new_outputs())
    if not compiled.run_addresses(addresses, [o.data_ptr() for o in outputs]):
        return None
    return outputs


def _tensor(array: np.ndarray) -> torch.Tensor:
    """A tensor on the array's memory (no copy)."""
    if array.dtype.kind == "V":                  # bfloat16 (ml_dtypes), unknown to torch
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def _check_tensor(value: Any, p: P.Tensor, tc: TCFunction) -> None:
    if not isinstance(value, torch.Tensor):
        raise ArgumentError(f"{p.name} must be a torch tensor, got {type(value).__name__}",
                            p.loc)
    if value.is_cpu:                # every call checks every tensor: no device object
        return
    kind = value.device.type
    if kind in ("cpu", "meta"):
        return
    if kind == "cuda":
        runs = tc.host_runner()
        if runs is not None:
            raise refused(tc.name, p.name, str(value.device), runs, p.loc)
        return
    raise UnsupportedError(f"{p.name} is a {kind} tensor, and polytile has no backend for "
                           "that device yet", p.loc, "move it with .cpu()")


# ---------------------------------------------------------------- custom ops

def _schema(fn: P.Function) -> str:
    params = [f"{'Tensor' if p.kind == 'input' else _SCALAR_SCHEMA[p.dtype.kind]} a{k}"
              for k, p in enumerate(fn.params)]
    outs = ", ".join("Tensor" for _ in fn.outputs)
    return f"({', '.join(params)}) -> " + (outs if len(fn.outputs) == 1 else f"({outs})")


def _custom(tc: TCFunction, qualname: str) -> Any:
    """A torch custom op running `tc`, with a fake implementation from range inference."""
    fn = tc.fn

    def run(*args: Any) -> Any:
        outs = _run(tc, args)
        return outs[0] if len(outs) == 1 else outs

    custom = torch.library.custom_op(qualname, run, mutates_args=(), schema=_schema(fn))

    @custom.register_fake
    def _(*args: Any) -> Any:
        shapes = {p.name: tuple(int(d) for d in a.shape)
                  for p, a in zip(fn.params, args) if p.kind == "input"}
        scalars = {p.name: a for p, a in zip(fn.params, args) if p.kind == "scalar"}
        spec = specialize(fn, shapes, scalars)       # range inference (TC §3.1)
        device = next(a.device for p, a in zip(fn.params, args) if p.kind == "input")
        outs = tuple(torch.empty(spec.shape(o.name), dtype=torch_dtype(o.dtype.numpy),
                                 device=device) for o in fn.outputs)
        return outs[0] if len(outs) == 1 else outs

    return custom


def _torch_pairs() -> tuple[tuple[np.dtype, torch.dtype], ...]:
    """(NumPy dtype, torch dtype) of every polytile dtype torch has."""
    pairs = []
    for dt in dtypes.ALL:
        try:
            pairs.append((np.dtype(dt.numpy), torch_dtype(np.dtype(dt.numpy))))
        except (TypeError, ValueError):
            continue                                   # a dtype torch lacks (uint16, ...)
    return tuple(pairs)


# The native call path takes plain CPU tensors as _run_addresses does.
use_torch(_PLAIN, _tensor, _torch_pairs())
