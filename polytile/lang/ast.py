"""The TC syntax tree (TC paper, Fig. 14). Every node carries its source location.

The tree is syntax only: `A(i, j)` is a `Call` whether `A` names a tensor or a
builtin; name resolution happens in `polytile.sema`. Locations do not take part
in equality, so two parses of the same text compare equal.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from polytile.errors import SourceLoc

_NOLOC = SourceLoc(0, 0)


def _loc() -> SourceLoc:
    return field(default=_NOLOC, compare=False, repr=False)  # type: ignore[return-value]


# ---------------------------------------------------------------- expressions

@dataclass(frozen=True)
class Number:
    text: str                     # as written, e.g. "1e-5", "0.5f", "3"
    value: int | float
    loc: SourceLoc = _loc()


@dataclass(frozen=True)
class Name:
    """An index variable, a size name, a scalar argument or a let-bound name."""

    name: str
    loc: SourceLoc = _loc()


@dataclass(frozen=True)
class Call:
    """`f(args)`: a tensor access, a builtin call or a cast (decided by sema)."""

    name: str
    args: tuple["Expr", ...]
    loc: SourceLoc = _loc()


@dataclass(frozen=True)
class DimOf:
    """`A.0`: the size of dimension `dim` of tensor `tensor`."""

    tensor: str
    dim: int
    loc: SourceLoc = _loc()


@dataclass(frozen=True)
class Unary:
    op: str                       # "-", "+", "!"
    operand: "Expr"
    loc: SourceLoc = _loc()


@dataclass(frozen=True)
class Binary:
    op: str                       # + - * / % == != < <= > >= && ||
    lhs: "Expr"
    rhs: "Expr"
    loc: SourceLoc = _loc()


@dataclass(frozen=True)
class Ternary:
    cond: "Expr"
    then: "Expr"
    other: "Expr"
    loc: SourceLoc = _loc()


Expr = Union[Number, Name, Call, DimOf, Unary, Binary, Ternary]


# ---------------------------------------------------------------- statements

@dataclass(frozen=True)
class RangeConstraint:
    """`where i in lo:hi` (half-open)."""

    index: str
    lo: Expr
    hi: Expr
    loc: SourceLoc = _loc()


@dataclass(frozen=True)
class Exists:
    """`where exists A(i)`: an access that only takes part in range inference."""

    access: Call
    loc: SourceLoc = _loc()


@dataclass(frozen=True)
class Let:
    """`where foo = expr`: a name bound for the statement's right-hand side."""

    name: str
    value: Expr
    loc: SourceLoc = _loc()


WhereClause = Union[RangeConstraint, Exists, Let]

ASSIGN_OPS = ("=", "+=", "*=", "min=", "max=")


@dataclass(frozen=True)
class Assign:
    """`T(i, j) op rhs [where ...]`; `op` is one of ASSIGN_OPS, `init` marks the `!` form.

    A left-hand side subscripted by anything but plain names (`dX(h + r) += ...`) is a
    scatter: `indices` is empty and `scatter` holds the subscripts (sema checks them)."""

    tensor: str
    indices: tuple[Name, ...]
    op: str
    init: bool
    rhs: Expr
    where: tuple[WhereClause, ...] = ()
    loc: SourceLoc = _loc()
    scatter: tuple[Expr, ...] = ()


@dataclass(frozen=True)
class CallDef:
    """`(A, B) = f(X, Y)`: a call of another TC function of the same source."""

    outputs: tuple[Name, ...]
    func: str
    args: tuple[Name, ...]
    loc: SourceLoc = _loc()


Stmt = Union[Assign, CallDef]


# ---------------------------------------------------------------- definitions

@dataclass(frozen=True)
class TensorArg:
    """`float(M, 256) A`; a dimension is a size name or an integer constant."""

    dtype: str
    dims: tuple[str | int, ...]
    name: str
    loc: SourceLoc = _loc()


@dataclass(frozen=True)
class ScalarArg:
    """`float eps`, `int sh`."""

    dtype: str
    name: str
    loc: SourceLoc = _loc()


Arg = Union[TensorArg, ScalarArg]


@dataclass(frozen=True)
class Output:
    """`C` (type and shape inferred) or `int32(M, N) C` (declared)."""

    name: str
    dtype: str | None = None
    dims: tuple[str | int, ...] | None = None
    loc: SourceLoc = _loc()


@dataclass(frozen=True)
class Def:
    name: str
    args: tuple[Arg, ...]
    outputs: tuple[Output, ...]
    body: tuple[Stmt, ...]
    loc: SourceLoc = _loc()


@dataclass(frozen=True)
class Module:
    defs: tuple[Def, ...]

    def get(self, name: str) -> Def | None:
        return next((d for d in self.defs if d.name == name), None)


def children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, Call):
        return e.args
    if isinstance(e, Unary):
        return (e.operand,)
    if isinstance(e, Binary):
        return (e.lhs, e.rhs)
    if isinstance(e, Ternary):
        return (e.cond, e.then, e.other)
    return ()


def depth(e: Expr) -> int:
    """Levels of the tree (a leaf is 1), computed without recursion: the trees this
    measures may be too deep to walk recursively."""
    deepest = 0
    stack = [(e, 1)]
    while stack:
        node, level = stack.pop()
        deepest = max(deepest, level)
        stack.extend((c, level + 1) for c in children(node))
    return deepest
