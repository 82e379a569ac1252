"""Aten operators as TC statements: one rule per operator, next to its support check.

A region of an FX graph (`polytile.interop.fx`) becomes one TC `def`. Every node's value
is a `Value`: a tensor of the def seen through an index map, so views (transpose,
permute, unsqueeze, expand, splitting reshapes, slices) cost nothing and computing nodes
become statements:

    addmm(b, x, t(w))      ->   t0(i0, i1) +=! x(i0, k0) * w(i1, k0) where ..., k0 in 0:7
                                t0(i0, i1) = t0(i0, i1) + b(i1) where i0 in 0:3, i1 in 0:13
    relu(t0)               ->   t1(i0, i1) = relu(t0(i0, i1)) where ...

Shapes are the ones the graph was traced with (numbers, or size names for dynamic
shapes), so every index gets an explicit `where` range. Views are in `fx_views.py`;
composite operators (softmax, log_softmax, layer norm), helper defs of the same module
called from the region, in `fx_composite.py`.
"""
from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import Node

aten = torch.ops.aten

TC_TYPES = {torch.float32: "float", torch.float64: "double", torch.int64: "int64",
            torch.int32: "int32", torch.bool: "bool"}
COMPUTE_TYPES = (torch.float32, torch.float64)

Index = tuple[str, ...]
Dim = int | str          # an extent: a number, or a size name (a symbolic dimension)
Shape = tuple[Dim, ...]


@dataclass(frozen=True)
class Value:
    """`tensor` (a TC tensor of the def) seen with shape `shape`: element `idx` of the
    value is `tensor(index(idx))`."""

    tensor: str
    shape: Shape
    dtype: torch.dtype
    index: Callable[[Index], Index] = field(default=lambda idx: idx, compare=False)
    plain: bool = True           # the tensor itself, not a view of it

    def at(self, idx: Sequence[str]) -> str:
        subs = self.index(tuple(idx))
        return f"{self.tensor}({', '.join(subs)})" if subs else self.tensor

    def view(self, shape: Sequence[Dim], index: Callable[[Index], Index]) -> Value:
        return Value(self.tensor, tuple(shape), self.dtype,
                     lambda idx: self.index(index(idx)), plain=False)


def args_of(node: Node) -> tuple[Any, ...]:
    """A node's positional arguments (typed loosely: each rule checks what it reads)."""
    return tuple(node.args)


def dim_of(d: Any) -> Dim | None:
    """A traced extent: an int, or the name of a symbolic size (torch.compile's dynamic
    shapes: `s77`), which becomes a TC size name; None for an expression of sizes."""
    if isinstance(d, int):
        return int(d)
    expr = getattr(getattr(d, "node", None), "expr", None)
    if expr is not None and getattr(expr, "is_Symbol", False):
        return str(expr)
    if expr is not None and getattr(expr, "is_Integer", False):
        return int(expr)
    return None


def static(shape: Shape) -> bool:
    return all(isinstance(d, int) for d in shape)


def shape_of(node: Any) -> Shape | None:
    """The shape of a node's (first) tensor value (numbers and size names), or None."""
    val = node.meta.get("val") if isinstance(node, Node) else None
    if isinstance(val, (tuple, list)):
        val = val[0]
    if not isinstance(val, torch.Tensor):
        return None
    dims = tuple(dim_of(d) for d in val.shape)
    return None if any(d is None for d in dims) else dims    # type: ignore[return-value]


def dtype_of(node: Any) -> torch.dtype | None:
    val = node.meta.get("val") if isinstance(node, Node) else None
    if isinstance(val, (tuple, list)):
        val = val[0]
    return val.dtype if isinstance(val, torch.Tensor) else None


def literal(x: Any) -> str | None:
    """A Python number as TC text, or None when TC cannot spell it."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return repr(x) if isinstance(x, float) else str(x)


# ---------------------------------------------------------------- the def being written

class Region:
    """The statements of one def under construction."""

    def __init__(self, helpers: Helpers):
        self.helpers = helpers
        self.statements: list[str] = []
        self.temps = 0

    def fresh(self) -> str:
        self.temps += 1
        return f"t{self.temps}"

    def emit(self, shape: Sequence[Dim], dtype: torch.dtype, body: Callable[[Index], str],
             op: str = "=", reduce: Sequence[Dim] = (), name: str | None = None,
             lets: Sequence[tuple[str, str]] = ()) -> Value:
        """`name(i...) op body(i..., k...)` over the shape (and the reduced extents)."""
        name = name or self.fresh()
        idx = tuple(f"i{d}" for d in range(len(shape)))
        red = tuple(f"k{d}" for d in range(len(reduce)))
        rhs = body(idx + red)
        used = " ".join([rhs] + [e for _, e in lets])
        # A reduced dimension the value does not depend on (a broadcast one): a sum counts
        # it, max and min ignore it; TC has no loop over an index nothing reads.
        unused = [(k, n) for k, n in zip(red, reduce) if not re.search(rf"\b{k}\b", used)]
        if unused and op == "+=!":
            rhs = f"({rhs}) * " + " * ".join(
                str(n) if isinstance(n, int) else f"{TC_TYPES[dtype]}({n})" for _, n in unused)
        kept = [(k, n) for k, n in zip(red, reduce) if (k, n) not in unused]
        if red and not kept:
            op = "="
        ranges = [f"{i} in 0:{n}" for i, n in list(zip(idx, shape)) + kept]
        lhs = f"{name}({', '.join(idx)})" if idx else name
        where = ranges + [f"{v} = {e}" for v, e in lets]
        text = f"{lhs} {op} {rhs}"
        self.statements.append(text + (f" where {', '.join(where)}" if where else ""))
        return Value(name, tuple(shape), dtype)

    def plain(self, v: Value) -> Value:
        """`v` as a tensor of its own (a copy when it is a view)."""
        if v.plain:
            return v
        return self.emit(v.shape, v.dtype, lambda idx: v.at(idx))


class Helpers:
    """Helper defs shared by the module's regions, one per variant."""

    def __init__(self) -> None:
        self.defs: dict[tuple[Any, ...], tuple[str, str]] = {}

    def get(self, key: tuple[Any, ...], make: Callable[[str], str]) -> str:
        if key not in self.defs:
            name = f"{key[0]}_{len(self.defs) + 1}"
            self.defs[key] = (name, make(name))
        return self.defs[key][0]

    @property
    def source(self) -> str:
        return "\n".join(text for _, text in self.defs.values())


# ---------------------------------------------------------------- rules

Rule = Callable[[Region, Node, list[Any]], Any]
RULES: dict[Any, Rule] = {}
CHECKS: dict[Any, Callable[[Node], bool]] = {}


def rule(*targets: Any, check: Callable[[Node], bool] | None = None
         ) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        for t in targets:
            RULES[t] = fn
            if check is not None:
                CHECKS[t] = check
        return fn
    return register


def supported(node: Node) -> bool:
    """Whether `node` becomes TC: a known operator on static float shapes (integer
    indices for embedding), with arguments TC can spell."""
    if node.op != "call_function" or node.target not in RULES:
        return False
    if node.target is operator.getitem:
        return isinstance(args_of(node)[0], Node) and supported(args_of(node)[0])
    if shape_of(node) is None or dtype_of(node) not in COMPUTE_TYPES + (torch.bool,):
        return False
    for a in list(node.args) + list(node.kwargs.values()):
        if isinstance(a, Node) and (shape_of(a) is None or dtype_of(a) not in TC_TYPES):
            return False
        if isinstance(a, (list, tuple)) and any(isinstance(x, Node) for x in a):
            return False             # symbolic sizes or lists of tensors (cat, stack)
    check = CHECKS.get(node.target)
    return check is None or check(node)


def broadcast(v: Value | str, out: Sequence[Dim], idx: Index) -> str:
    """Element `idx` of `v` broadcast to shape `out` (numpy rules), or a literal."""
    if isinstance(v, str):
        return v
    lead = len(out) - len(v.shape)
    return v.at(tuple(idx[lead + d] if n != 1 else "0" for d, n in enumerate(v.shape)))


def _elementwise(fmt: Callable[..., str], lets: bool = False) -> Rule:
    """A rule for an elementwise operator; with `lets`, operands are bound to `where`
    names first (an operand used several times is read once)."""
    def apply(region: Region, node: Node, args: list[Any]) -> Value:
        shape, dtype = shape_of(node), dtype_of(node)
        assert shape is not None and dtype is not None
        operands: list[Value | str] = [a if isinstance(a, Value) else str(literal(a))
                                       for a in args]
        if not lets:
            return region.emit(shape, dtype, lambda idx: fmt(
                *[broadcast(o, shape, idx) for o in operands]))
        names = [f"v{k}" for k in range(len(operands))]
        bound = [(n, broadcast(o, shape, tuple(f"i{d}" for d in range(len(shape)))))
                 for n, o in zip(names, operands)]
        return region.emit(shape, dtype, lambda idx: fmt(*names), lets=bound)
    return apply


def _scalarargs_of(*positions: int) -> Callable[[Node], bool]:
    """The arguments at `positions` are tensors or numbers TC can spell."""
    def check(node: Node) -> bool:
        return all(isinstance(args_of(node)[p], Node) or literal(args_of(node)[p]) is not None
                   for p in positions if p < len(node.args))
    return check


def _no_kwargs(*allowed: str) -> Callable[[Node], bool]:
    def check(node: Node) -> bool:
        return set(node.kwargs) <= set(allowed) and _scalarargs_of(0, 1, 2)(node)
    return check


_ATOM = re.compile(r"[A-Za-z_]\w*(\([^()]*\))?|\d+(\.\d*)?(e[-+]?\d+)?")


def paren(x: str) -> str:
    """`x` as an operand: an access, name or number as it is, anything else in parentheses."""
    return x if _ATOM.fullmatch(x) else f"({x})"


def _binary(symbol: str) -> Rule:
    return _elementwise(lambda a, b: f"{paren(a)} {symbol} {paren(b)}")


def _alpha(node: Node) -> bool:
    return set(node.kwargs) <= {"alpha"} and literal(node.kwargs.get("alpha", 1)) is not None \
        and _scalarargs_of(0, 1)(node)


@rule(aten.add.Tensor, aten.add.Scalar, check=_alpha)
def _add(region: Region, node: Node, args: list[Any]) -> Value:
    alpha = literal(node.kwargs.get("alpha", 1))
    scaled = "" if alpha == "1" else f" * {alpha}"
    return _elementwise(lambda a, b: f"{paren(a)} + {paren(b)}{scaled}")(region, node, args)


@rule(aten.sub.Tensor, aten.sub.Scalar, check=_alpha)
def _sub(region: Region, node: Node, args: list[Any]) -> Value:
    alpha = literal(node.kwargs.get("alpha", 1))
    scaled = "" if alpha == "1" else f" * {alpha}"
    return _elementwise(lambda a, b: f"{paren(a)} - {paren(b)}{scaled}")(region, node, args)


for _target, _symbol in [(aten.mul.Tensor, "*"), (aten.mul.Scalar, "*"),
                         (aten.div.Tensor, "/"), (aten.div.Scalar, "/"),
                         (aten.gt.Tensor, ">"), (aten.gt.Scalar, ">"),
                         (aten.lt.Tensor, "<"), (aten.lt.Scalar, "<"),
                         (aten.ge.Tensor, ">="), (aten.ge.Scalar, ">="),
                         (aten.le.Tensor, "<="), (aten.le.Scalar, "<="),
                         (aten.eq.Tensor, "=="), (aten.eq.Scalar, "=="),
                         (aten.ne.Tensor, "!="), (aten.ne.Scalar, "!=")]:
    rule(_target, check=_no_kwargs())(_binary(_symbol))

rule(aten.maximum.default, check=_no_kwargs())(_elementwise(lambda a, b: f"fmax({a}, {b})"))
rule(aten.minimum.default, check=_no_kwargs())(_elementwise(lambda a, b: f"fmin({a}, {b})"))
rule(aten.where.self, check=_no_kwargs())(
    _elementwise(lambda c, a, b: f"{paren(c)} ? {paren(a)} : {paren(b)}"))
rule(aten.rsub.Scalar, check=_no_kwargs())(
    _elementwise(lambda a, b: f"{paren(b)} - {paren(a)}"))

rule(aten.neg.default, check=_no_kwargs())(_elementwise(lambda a: f"-{paren(a)}"))
for _target, _fn in [(aten.exp.default, "exp"),
                    (aten.log.default, "log"), (aten.tanh.default, "tanh"),
                    (aten.sigmoid.default, "sigmoid"), (aten.relu.default, "relu"),
                    (aten.sqrt.default, "sqrt"), (aten.rsqrt.default, "rsqrt"),
                    (aten.abs.default, "fabs"), (aten.erf.default, "erf")]:
    rule(_target, check=_no_kwargs())(_elementwise(lambda a, f=_fn: f"{f}({a})"))

_GELU = {
    "none": "0.5 * v0 * (1 + erf(v0 * 0.7071067811865476))",
    "tanh": "0.5 * v0 * (1 + tanh(0.7978845608028654 * (v0 + 0.044715 * v0 * v0 * v0)))",
}


@rule(aten.gelu.default,
      check=lambda n: n.kwargs.get("approximate", "none") in _GELU and len(n.args) == 1)
def _gelu(region: Region, node: Node, args: list[Any]) -> Value:
    text = _GELU[str(node.kwargs.get("approximate", "none"))]
    return _elementwise(lambda v0: text, lets=True)(region, node, args)


@rule(aten.pow.Tensor_Scalar, check=_no_kwargs())
def _pow(region: Region, node: Node, args: list[Any]) -> Value:
    p = args[1]
    if p == 2:
        return _elementwise(lambda v0, v1: "v0 * v0", lets=True)(region, node, args)
    if p == 0.5:
        return _elementwise(lambda a, b: f"sqrt({a})")(region, node, args)
    return _elementwise(lambda a, b: f"pow({a}, {b})")(region, node, args)


# ---------------------------------------------------------------- reductions

def _dims(node: Node, rank: int) -> tuple[int, ...]:
    dims: Any = args_of(node)[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if dims is None or dims == []:
        return tuple(range(rank))
    dims = [dims] if isinstance(dims, int) else dims
    return tuple(sorted(d % rank if rank else 0 for d in dims))


def _keepdim(node: Node) -> bool:
    return bool(args_of(node)[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False))


def _reduction_check(node: Node) -> bool:
    return set(node.kwargs) <= {"dim", "keepdim", "dtype"} and node.kwargs.get(
        "dtype") in (None, dtype_of(node)) and isinstance(args_of(node)[0], Node)


def _reduce(region: Region, node: Node, args: list[Any], op: str) -> Value:
    x: Value = args[0]
    shape, dtype = shape_of(node), dtype_of(node)
    assert shape is not None and dtype is not None
    dims, keep = _dims(node, len(x.shape)), _keepdim(node)
    extents = [x.shape[d] for d in dims]

    def body(idx: Index) -> str:
        out, red = idx[:len(shape)], idx[len(shape):]
        subs, o, r = [], 0, 0
        for d in range(len(x.shape)):
            if d in dims:
                subs.append(red[r])
                r += 1
                o += keep
            else:
                subs.append(out[o])
                o += 1
        return x.at(subs)
    return region.emit(shape, dtype, body, op=op, reduce=extents)


rule(aten.sum.dim_IntList, aten.sum.default, check=_reduction_check)(
    lambda region, node, args: _reduce(region, node, args, "+=!"))
rule(aten.amax.default, check=_reduction_check)(
    lambda region, node, args: _reduce(region, node, args, "max=!"))
rule(aten.amin.default, check=_reduction_check)(
    lambda region, node, args: _reduce(region, node, args, "min=!"))


@rule(aten.mean.dim, aten.mean.default, check=_reduction_check)
def _mean(region: Region, node: Node, args: list[Any]) -> Value:
    total = _reduce(region, node, args, "+=!")
    extents = [str(args[0].shape[d]) for d in _dims(node, len(args[0].shape))]
    count = f"{TC_TYPES[total.dtype]}({' * '.join(extents) or '1'})"
    return region.emit(total.shape, total.dtype, lambda idx: f"{total.at(idx)} / {count}")


# ---------------------------------------------------------------- contractions

def _matmul_check(node: Node) -> bool:
    return not node.kwargs or set(node.kwargs) <= {"beta", "alpha"} and all(
        literal(v) is not None for v in node.kwargs.values())


@rule(aten.mm.default, aten.bmm.default, check=_matmul_check)
def _mm(region: Region, node: Node, args: list[Any]) -> Value:
    a, b = args
    shape, dtype = shape_of(node), dtype_of(node)
    assert shape is not None and dtype is not None
    batch = len(shape) - 2
    return region.emit(shape, dtype, lambda idx: (
        f"{a.at(idx[:batch] + (idx[batch], idx[-1]))} * "
        f"{b.at(idx[:batch] + (idx[-1], idx[batch + 1]))}"), op="+=!", reduce=[a.shape[-1]])


@rule(aten.addmm.default, check=_matmul_check)
def _addmm(region: Region, node: Node, args: list[Any]) -> Value:
    """The product as a `+=!` reduction, then the bias added in place: the contraction
    alone in its statement is what the passes tile and vectorize as a matrix product."""
    bias, a, b = args
    shape, dtype = shape_of(node), dtype_of(node)
    assert shape is not None and dtype is not None
    beta, alpha = (literal(node.kwargs.get(k, 1)) for k in ("beta", "alpha"))
    product = region.emit(shape, dtype, lambda idx: (
        f"{a.at((idx[0], idx[2]))} * {b.at((idx[2], idx[1]))}"), op="+=!",
        reduce=[a.shape[1]])
    return region.emit(shape, dtype, lambda idx: (
        product.at(idx) + ("" if alpha == "1" else f" * {alpha}") + " + "
        + broadcast(bias, shape, idx) + ("" if beta == "1" else f" * {beta}")),
        name=product.tensor)


@rule(aten.embedding.default,
      check=lambda n: len(n.args) == 2 and not n.kwargs and dtype_of(args_of(n)[1]) in (
          torch.int64, torch.int32))
def _embedding(region: Region, node: Node, args: list[Any]) -> Value:
    weight, indices = args
    shape, dtype = shape_of(node), dtype_of(node)
    assert shape is not None and dtype is not None
    return region.emit(shape, dtype, lambda idx: weight.at(
        (indices.at(idx[:-1]), idx[-1])))


@rule(operator.getitem)
def _getitem(region: Region, node: Node, args: list[Any]) -> Value:
    return args[0][args[1]]
