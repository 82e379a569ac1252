"""The checked, typed Program that semantic analysis produces.

Names are resolved, `where` lets are substituted, every expression has a dtype,
every index has a symbolic half-open range and every tensor a symbolic shape.
`specialize` binds the sizes of one call and gives the same objects with
integer ranges (`Bound*`), which the reference interpreter and lowering use.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

import numpy as np

from polytile import dtypes
from polytile.dtypes import DType
from polytile.errors import SourceLoc
from polytile.sema.sizes import SizeExpr

_NOLOC = SourceLoc(0, 0)


def _loc() -> SourceLoc:
    return field(default=_NOLOC, compare=False, repr=False)  # type: ignore[return-value]


# ---------------------------------------------------------------- typed expressions

@dataclass(frozen=True)
class Const:
    value: int | float | bool
    dtype: DType


@dataclass(frozen=True)
class IndexVar:
    """The value of an iteration index (int64)."""

    name: str
    dtype: DType


@dataclass(frozen=True)
class SizeVal:
    """A size (`N`, `A.0`) or an expression of sizes, as a value (int64)."""

    expr: SizeExpr
    dtype: DType


@dataclass(frozen=True)
class ScalarArg:
    name: str
    dtype: DType


@dataclass(frozen=True)
class Read:
    """Tensor element read; an index expression that is not affine in the indices
    (it reads a tensor, divides, ...) is bounds-checked at run time."""

    tensor: str
    indices: tuple["TExpr", ...]
    dtype: DType
    loc: SourceLoc = _loc()


@dataclass(frozen=True)
class Op:
    """An operation of `polytile.ir.intrinsics.OPS` ("add", "exp", "select", ...),
    or "cast" to `dtype`."""

    op: str
    args: tuple["TExpr", ...]
    dtype: DType
    loc: SourceLoc = _loc()


TExpr = Union[Const, IndexVar, SizeVal, ScalarArg, Read, Op]


# ---------------------------------------------------------------- statements and tensors

@dataclass(frozen=True)
class Range:
    """Half-open [lo, hi)."""

    lo: SizeExpr
    hi: SizeExpr

    def __str__(self) -> str:
        return f"{self.lo}:{self.hi}"


@dataclass(frozen=True)
class Statement:
    tensor: str
    indices: tuple[str, ...]          # left-hand side
    op: str                           # "=", "+=", "*=", "min=", "max="
    init: bool                        # the "!" form
    rhs: TExpr
    ranges: tuple[tuple[str, Range], ...]   # left-hand indices first, then reduction indices
    loc: SourceLoc = _loc()
    # A scatter (`dX(h + r) += e`): the left-hand side's affine subscripts; `indices` is
    # then empty and every index is iterated and combined with `+=`.
    scatter: tuple["TExpr", ...] = ()

    @property
    def reduction_indices(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.ranges if n not in self.indices)

    def range_of(self, index: str) -> Range:
        return dict(self.ranges)[index]


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: DType
    shape: tuple[SizeExpr, ...]
    kind: str                         # "input", "scalar", "output", "temp"
    loc: SourceLoc = _loc()


@dataclass(frozen=True)
class Function:
    name: str
    params: tuple[Tensor, ...]        # inputs and scalars, in argument order
    outputs: tuple[Tensor, ...]       # in declared order
    temps: tuple[Tensor, ...]
    statements: tuple[Statement, ...]
    sizes: tuple[str, ...]            # size names bound by the arguments
    inout: frozenset[str] = frozenset()   # outputs read before written: passed in by `out=`
    loc: SourceLoc = _loc()

    def tensor(self, name: str) -> Tensor:
        for t in self.params + self.outputs + self.temps:
            if t.name == name:
                return t
        raise KeyError(name)


@dataclass(frozen=True)
class Program:
    functions: tuple[Function, ...]

    def get(self, name: str) -> Function:
        for f in self.functions:
            if f.name == name:
                return f
        raise KeyError(name)


def depth(e: TExpr) -> int:
    """Levels of a typed expression tree, computed without recursion (see polytile.deep)."""
    deepest = 0
    stack = [(e, 1)]
    while stack:
        node, level = stack.pop()
        deepest = max(deepest, level)
        inner = node.indices if isinstance(node, Read) else (
            node.args if isinstance(node, Op) else ())
        stack.extend((c, level + 1) for c in inner)
    return deepest


def identity(op: str, dtype: DType) -> int | float:
    """The value a `!` reduction starts from (and keeps over an empty range: 0 for
    +=!, 1 for *=!, as NumPy's sum and prod of nothing; -inf / +inf, or the type's
    least / greatest value, for max=! / min=!)."""
    if op == "+=":
        return 0
    if op == "*=":
        return 1
    if dtype.is_float:
        return float("-inf") if op == "max=" else float("inf")
    info = np.iinfo(dtype.numpy) if dtype != dtypes.BOOL else None
    if info is None:
        return 0 if op == "max=" else 1
    return int(info.min) if op == "max=" else int(info.max)


def expanded_size(e: TExpr) -> int:
    """Nodes of `e` once shared subtrees are copied into each use, as every later stage
    walks it: a `where` binding used twice is a subtree shared twice, so a chain of
    bindings that each use the previous one twice doubles the size per binding. Counted
    on the shared form (one visit per distinct node), so it is cheap even then."""
    sizes: dict[int, int] = {}
    stack: list[tuple[TExpr, bool]] = [(e, False)]
    while stack:
        node, expanded = stack.pop()
        if id(node) in sizes:
            continue
        inner = node.indices if isinstance(node, Read) else (
            node.args if isinstance(node, Op) else ())
        if expanded:
            sizes[id(node)] = 1 + sum(sizes[id(c)] for c in inner)
        else:
            stack.append((node, True))
            stack.extend((c, False) for c in inner if id(c) not in sizes)
    return sizes[id(e)]
