"""Aten operators as TC statements: one rule per operator, next to its support check.

A region of an FX graph (`polytile.interop.fx`) becomes one TC `def`. Every node's value
is a `Value`: a tensor of the def seen through an index map, so views (transpose,
permute, unsqueeze, expand, splitting reshapes, slices) cost nothing and computing nodes
become statements:

    addmm(b, x, t(w))      ->   t0(i0, i1) +=! x(i0, k0) * w(i1, k0) where ..., k0 in 0:7
                                t0(i0, i1) = t0(i0, i1) + b(i1) where i0 in 0:3, i1 in 0:13
    relu(t0)               ->   t1(i0, i1) = relu(t0(i0, i1)) where ...

Shapes are the ones the graph was traced with (static), so every index gets an explicit
`where` range. Composite operators (softmax, log_softmax, layer norm) are helper defs of
the same module, called from the region (`(y, m, r) = layer_norm_1(x0, x1, x2)`), which
semantics inlines (docs/language.md, "Functions calling functions").
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


def _args(node: Node) -> tuple[Any, ...]:
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
        return isinstance(_args(node)[0], Node) and supported(_args(node)[0])
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


def _scalar_args(*positions: int) -> Callable[[Node], bool]:
    """The arguments at `positions` are tensors or numbers TC can spell."""
    def check(node: Node) -> bool:
        return all(isinstance(_args(node)[p], Node) or literal(_args(node)[p]) is not None
                   for p in positions if p < len(node.args))
    return check


def _no_kwargs(*allowed: str) -> Callable[[Node], bool]:
    def check(node: Node) -> bool:
        return set(node.kwargs) <= set(allowed) and _scalar_args(0, 1, 2)(node)
    return check


_ATOM = re.compile(r"[A-Za-z_]\w*(\([^()]*\))?|\d+(\.\d*)?(e[-+]?\d+)?")


def paren(x: str) -> str:
    """`x` as an operand: an access, name or number as it is, anything else in parentheses."""
    return x if _ATOM.fullmatch(x) else f"({x})"


def _binary(symbol: str) -> Rule:
    return _elementwise(lambda a, b: f"{paren(a)} {symbol} {paren(b)}")


def _alpha(node: Node) -> bool:
    return set(node.kwargs) <= {"alpha"} and literal(node.kwargs.get("alpha", 1)) is not None \
        and _scalar_args(0, 1)(node)


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
    dims: Any = _args(node)[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if dims is None or dims == []:
        return tuple(range(rank))
    dims = [dims] if isinstance(dims, int) else dims
    return tuple(sorted(d % rank if rank else 0 for d in dims))


def _keepdim(node: Node) -> bool:
    return bool(_args(node)[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False))


def _reduction_check(node: Node) -> bool:
    return set(node.kwargs) <= {"dim", "keepdim", "dtype"} and node.kwargs.get(
        "dtype") in (None, dtype_of(node)) and isinstance(_args(node)[0], Node)


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
      check=lambda n: len(n.args) == 2 and not n.kwargs and dtype_of(_args(n)[1]) in (
          torch.int64, torch.int32))
def _embedding(region: Region, node: Node, args: list[Any]) -> Value:
    weight, indices = args
    shape, dtype = shape_of(node), dtype_of(node)
    assert shape is not None and dtype is not None
    return region.emit(shape, dtype, lambda idx: weight.at(
        (indices.at(idx[:-1]), idx[-1])))


# ---------------------------------------------------------------- views

def _view_rule(index_of: Callable[[Node, Value], Callable[[Index], Index]]) -> Rule:
    def apply(region: Region, node: Node, args: list[Any]) -> Value:
        shape = shape_of(node)
        assert shape is not None
        index = index_of(node, args[0])
        names = tuple(f"i{d}" for d in range(len(shape)))
        if shape == args[0].shape and index(names) == names:
            return args[0]           # the same elements in the same places (clone, view)
        return args[0].view(shape, index)
    return apply


def _permutation(node: Node, x: Value) -> list[int]:
    rank = len(x.shape)
    if node.target is aten.t.default:
        return [1, 0] if rank == 2 else list(range(rank))
    if node.target is aten.transpose.int:
        d0, d1 = (d % rank for d in _args(node)[1:3])
        order = list(range(rank))
        order[d0], order[d1] = order[d1], order[d0]
        return order
    return [d % rank for d in _args(node)[1]]


def _permute(node: Node, x: Value) -> Callable[[Index], Index]:
    order = _permutation(node, x)
    inverse = [order.index(d) for d in range(len(order))]
    return lambda idx: tuple(idx[inverse[d]] for d in range(len(order)))


rule(aten.t.default, aten.transpose.int, aten.permute.default)(_view_rule(_permute))


def _drop_ones(node: Node, x: Value) -> Callable[[Index], Index]:
    """unsqueeze / squeeze / identity views: only size-1 dimensions change, so the
    value's indices at the other dimensions are the tensor's, in order."""
    out = shape_of(node)
    assert out is not None
    kept = [d for d, n in enumerate(out) if n != 1]

    def index(idx: Index) -> Index:
        inner = iter(idx[d] for d in kept)
        return tuple("0" if n == 1 else next(inner) for n in x.shape)
    return index


rule(aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default,
     aten.clone.default, aten.alias.default, aten.detach.default,
     check=lambda n: set(n.kwargs) <= {"memory_format"})(_view_rule(_drop_ones))


def _expand(node: Node, x: Value) -> Callable[[Index], Index]:
    out = shape_of(node)
    assert out is not None
    lead = len(out) - len(x.shape)
    return lambda idx: tuple("0" if n == 1 else idx[lead + d] for d, n in enumerate(x.shape))


rule(aten.expand.default, check=lambda n: set(n.kwargs) <= {"implicit"})(_view_rule(_expand))


def reshape_groups(src: Sequence[int], dst: Sequence[int]) -> list[tuple[int, list[int]]] | None:
    """For each source dimension larger than 1, the destination dimensions (larger than
    1, consecutive) it splits into; None when the reshape merges dimensions (the source
    index would need a division: left to torch)."""
    wanted = [d for d, n in enumerate(dst) if n > 1]
    groups, k = [], 0
    for d, n in enumerate(src):
        if n == 1:
            continue
        group, product = [], 1
        while product < n and k < len(wanted):
            group.append(wanted[k])
            product *= dst[wanted[k]]
            k += 1
        if product != n:
            return None
        groups.append((d, group))
    return groups if k == len(wanted) else None


def _reshape_check(node: Node) -> bool:
    x, out = shape_of(_args(node)[0]), shape_of(node)
    if x is None or out is None:
        return False
    if not (static(x) and static(out)):      # symbolic: only ones added or removed
        return [d for d in x if d != 1] == [d for d in out if d != 1]
    return reshape_groups(x, out) is not None  # type: ignore[arg-type]


def _reshape(node: Node, x: Value) -> Callable[[Index], Index]:
    out = shape_of(node)
    assert out is not None
    if static(x.shape) and static(out):
        groups = reshape_groups(x.shape, out)  # type: ignore[arg-type]
    else:
        groups = list(zip([d for d, n in enumerate(x.shape) if n != 1],
                          [[d] for d, n in enumerate(out) if n != 1]))
    assert groups is not None

    def index(idx: Index) -> Index:
        subs = ["0"] * len(x.shape)
        for d, group in groups:
            terms: list[str] = []
            stride: Any = 1               # symbolic shapes: one dimension per group
            for o in reversed(group):
                terms.append(idx[o] if stride == 1 else f"{stride} * {idx[o]}")
                stride *= out[o]
            subs[d] = " + ".join(reversed(terms))
        return tuple(subs)
    return index


rule(aten.view.default, aten._unsafe_view.default, aten.reshape.default,
     check=_reshape_check)(_view_rule(_reshape))


def _slice_check(node: Node) -> bool:
    x = shape_of(_args(node)[0])
    args = list(_args(node)[1:]) + [None] * (5 - len(node.args))
    step = args[3] if args[3] is not None else 1
    return (x is not None and static(x) and not node.kwargs and isinstance(step, int)
            and step > 0)


def _slice(node: Node, x: Value) -> Callable[[Index], Index]:
    rank = len(x.shape)
    args = list(_args(node)[1:]) + [None] * (5 - len(node.args))
    dim = (args[0] or 0) % rank
    start = args[1] or 0
    extent = int(x.shape[dim])               # static: see _slice_check
    start = max(0, start + extent if start < 0 else min(start, extent))
    step = args[3] or 1

    def index(idx: Index) -> Index:
        sub = idx[dim] if step == 1 else f"{step} * {idx[dim]}"
        return idx[:dim] + ((f"{sub} + {start}" if start else sub),) + idx[dim + 1:]
    return index


rule(aten.slice.Tensor, check=_slice_check)(_view_rule(_slice))


def _select(node: Node, x: Value) -> Callable[[Index], Index]:
    dim = _args(node)[1] % len(x.shape)
    at = _args(node)[2] % x.shape[dim]
    return lambda idx: idx[:dim] + (str(at),) + idx[dim:]


rule(aten.select.int, check=lambda n: not n.kwargs and static(shape_of(_args(n)[0]) or ("?",))
     )(_view_rule(_select))


# ---------------------------------------------------------------- composite operators

def _signature(name: str, dtype: torch.dtype, dims: Sequence[str], label: str = "x") -> str:
    return f"{TC_TYPES[dtype]}({', '.join(dims)}) {label}"


def _softmax_def(rank: int, dim: int, dtype: torch.dtype, log: bool) -> Callable[[str], str]:
    def make(name: str) -> str:
        sizes = [f"D{d}" for d in range(rank)]
        a = [f"a{d}" for d in range(rank)]
        full = f"({', '.join(a)})"
        rest = [x for d, x in enumerate(a) if d != dim]
        red = f"({', '.join(rest)})" if rest else ""
        result = (f"y{full} = x{full} - m{red} - log(s{red})" if log
                  else f"y{full} = e{full} / s{red}")
        return (f"def {name}({_signature(name, dtype, sizes)}) -> (y) {{\n"
                f"  m{red} max=! x{full}\n  e{full} = exp(x{full} - m{red})\n"
                f"  s{red} +=! e{full}\n  {result}\n}}\n")
    return make


def _softmax_check(node: Node) -> bool:
    return not node.kwargs and _args(node)[2] is False


def _softmax(region: Region, node: Node, args: list[Any], log: bool) -> Value:
    x = region.plain(args[0])
    rank = len(x.shape)
    dim = _args(node)[1] % rank if rank else 0
    helper = region.helpers.get(("log_softmax" if log else "softmax", rank, dim, x.dtype),
                                _softmax_def(rank, dim, x.dtype, log))
    y = region.fresh()
    region.statements.append(f"{y} = {helper}({x.tensor})")
    return Value(y, x.shape, x.dtype)


rule(aten._softmax.default, check=_softmax_check)(
    lambda region, node, args: _softmax(region, node, args, log=False))
rule(aten._log_softmax.default, check=_softmax_check)(
    lambda region, node, args: _softmax(region, node, args, log=True))


def _layer_norm_def(rank: int, normalized: int, dtype: torch.dtype, weight: bool, bias: bool,
                    eps: str) -> Callable[[str], str]:
    def make(name: str) -> str:
        sizes = [f"D{d}" for d in range(rank)]
        a = [f"a{d}" for d in range(rank)]
        outer, inner = rank - normalized, sizes[rank - normalized:]
        full = f"({', '.join(a)})"
        row = f"({', '.join(a[:outer])})" if outer else ""
        params = [_signature(name, dtype, sizes)]
        scaled = f"d{full} * rstd{row}"
        if weight:
            params.append(_signature(name, dtype, inner, "w"))
            scaled += f" * w({', '.join(a[outer:])})"
        if bias:
            params.append(_signature(name, dtype, inner, "b"))
            scaled += f" + b({', '.join(a[outer:])})"
        count = f"{TC_TYPES[dtype]}({' * '.join(inner)})"
        return (f"def {name}({', '.join(params)}) -> (y, mean, rstd) {{\n"
                f"  s{row} +=! x{full}\n  mean{row} = s{row} / {count}\n"
                f"  d{full} = x{full} - mean{row}\n  q{row} +=! d{full} * d{full}\n"
                f"  rstd{row} = rsqrt(q{row} / {count} + {eps})\n  y{full} = {scaled}\n}}\n")
    return make


def _layer_norm_check(node: Node) -> bool:
    return not node.kwargs and literal(_args(node)[4]) is not None and all(
        isinstance(a, Node) or a is None for a in _args(node)[2:4])


@rule(aten.native_layer_norm.default, check=_layer_norm_check)
def _layer_norm(region: Region, node: Node, args: list[Any]) -> tuple[Value, ...]:
    x = region.plain(args[0])
    rank, normalized = len(x.shape), len(_args(node)[1])
    weight, bias = (region.plain(a) if isinstance(a, Value) else None for a in args[2:4])
    eps = literal(_args(node)[4])
    assert eps is not None
    helper = region.helpers.get(
        ("layer_norm", rank, normalized, x.dtype, weight is not None, bias is not None, eps),
        _layer_norm_def(rank, normalized, x.dtype, weight is not None, bias is not None, eps))
    y, mean, rstd = region.fresh(), region.fresh(), region.fresh()
    operands = [x.tensor] + [v.tensor for v in (weight, bias) if v is not None]
    region.statements.append(f"({y}, {mean}, {rstd}) = {helper}({', '.join(operands)})")
    outer = rank - normalized
    stats_shape = x.shape[:outer] + (1,) * normalized
    stats = [Value(t, x.shape[:outer], x.dtype).view(stats_shape, lambda idx: idx[:outer])
             for t in (mean, rstd)]
    return (Value(y, x.shape, x.dtype), *stats)


@rule(operator.getitem)
def _getitem(region: Region, node: Node, args: list[Any]) -> Value:
    return args[0][args[1]]
