"""Name resolution and typing of one statement's expressions: ast.Expr -> TExpr.

Literals are *weakly* typed (as in JAX): `x * 2` keeps x's float16, `i + 1`
stays an index, and only an expression made of literals alone falls back to
int32 / float32.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import math

import numpy as np

from polytile import dtypes
from polytile.dtypes import DType
from polytile.errors import (NameResolutionError, SourceLoc, TypeCheckError, UnsupportedError,
                             abbreviate)
from polytile.ir import intrinsics
from polytile.lang import ast
from polytile.sema import program as P
from polytile.sema.sizes import SizeExpr

INDEX = dtypes.INT64


@dataclass
class Scope:
    """What names mean inside one function."""

    tensors: dict[str, P.Tensor]              # inputs, outputs and temps known so far
    scalars: dict[str, DType]
    sizes: frozenset[str]
    shapes: dict[str, tuple[SizeExpr, ...]]   # shapes known so far (for A.0)
    functions: frozenset[str] = frozenset()
    lets: dict[str, tuple[P.TExpr, bool]] = field(default_factory=dict)
    index_locs: dict[str, SourceLoc] = field(default_factory=dict)
    later: frozenset[str] = frozenset()       # temporaries first written by a later statement


@dataclass(frozen=True)
class Typed:
    expr: P.TExpr
    weak: bool = False       # an untyped literal (or made only of literals)

    @property
    def dtype(self) -> DType:
        return self.expr.dtype


def resolve(e: ast.Expr, scope: Scope) -> Typed:
    if isinstance(e, ast.Number):
        _check_literal(e)
        if isinstance(e.value, int):   # like C: a literal too big for int is a long
            dtype = dtypes.INT32 if e.value <= np.iinfo(np.int32).max else dtypes.INT64
        else:
            dtype = dtypes.FLOAT32
        return Typed(P.Const(e.value, dtype), weak=True)
    if isinstance(e, ast.Name):
        return _name(e, scope)
    if isinstance(e, ast.DimOf):
        shape = scope.shapes.get(e.tensor)
        if shape is None:
            raise NameResolutionError(f"{e.tensor}.{e.dim}: {e.tensor} is not a tensor with a "
                                      "known shape", e.loc)
        if not 0 <= e.dim < len(shape):
            raise TypeCheckError(f"{e.tensor} has {len(shape)} dimensions; "
                                 f"{e.tensor}.{e.dim} does not exist", e.loc)
        return Typed(P.SizeVal(shape[e.dim], INDEX))
    if isinstance(e, ast.Call):
        return _call(e, scope)
    if isinstance(e, ast.Unary):
        x = resolve(e.operand, scope)
        if e.op == "+":
            return x
        if e.op == "-":
            return _apply("neg", (x,), e.loc)
        return _apply("not", (x,), e.loc)
    if isinstance(e, ast.Binary):
        return _apply(intrinsics.BINARY_SYMBOLS[e.op],
                      (resolve(e.lhs, scope), resolve(e.rhs, scope)), e.loc)
    cond, then, other = (resolve(x, scope) for x in (e.cond, e.then, e.other))
    return _apply("select", (cond, then, other), e.loc)


def _name(e: ast.Name, scope: Scope) -> Typed:
    name = e.name
    if name in scope.lets:
        expr, weak = scope.lets[name]
        return Typed(expr, weak)
    if name in scope.scalars:
        return Typed(P.ScalarArg(name, scope.scalars[name]))
    if name in scope.sizes:
        return Typed(P.SizeVal(SizeExpr.sym(name), INDEX))
    if name in scope.tensors:
        tensor = scope.tensors[name]
        rank = len(scope.shapes.get(name, tensor.shape))
        if rank != 0:
            raise TypeCheckError(f"{name} has {rank} dimensions but is used without subscripts",
                                 e.loc, f"write {name}(...) with {rank} subscripts")
        return Typed(P.Read(name, (), tensor.dtype, e.loc))
    if name in scope.later:
        raise NameResolutionError(f"temporary {name} is read before it is written", e.loc,
                                  "move the statement that computes it before this one")
    scope.index_locs.setdefault(name, e.loc)
    return Typed(P.IndexVar(name, INDEX))


def _call(e: ast.Call, scope: Scope) -> Typed:
    args = tuple(resolve(a, scope) for a in e.args)
    if e.name in scope.tensors:
        tensor = scope.tensors[e.name]
        rank = len(scope.shapes.get(e.name, tensor.shape))
        if rank != len(args):
            raise TypeCheckError(f"{e.name} has {rank} dimensions but is indexed with "
                                 f"{len(args)} subscripts", e.loc)
        for a, node in zip(args, e.args):
            if not a.dtype.is_integral or a.dtype == dtypes.BOOL:
                raise TypeCheckError(f"subscript of {e.name} has type {a.dtype}; subscripts "
                                     "must be integers", getattr(node, "loc", e.loc),
                                     "cast it, e.g. int32(x)")
        return Typed(P.Read(e.name, tuple(a.expr for a in args), tensor.dtype, e.loc))
    cast = dtypes.lookup(e.name)
    if cast is not None:
        if len(args) != 1:
            raise TypeCheckError(f"the cast {e.name}(x) takes one argument, got {len(args)}",
                                 e.loc)
        return Typed(P.Op("cast", (args[0].expr,), cast, e.loc))
    op = intrinsics.BUILTIN_ALIASES.get(e.name, e.name)
    if op in intrinsics.BUILTINS:
        return _apply(op, args, e.loc, name=e.name)
    if e.name in scope.later:
        raise NameResolutionError(f"temporary {e.name} is read before it is written", e.loc,
                                  "move the statement that computes it before this one")
    if e.name in scope.functions:
        raise UnsupportedError(f"calling the TC function {e.name} inside an expression is not "
                               "supported", e.loc, "call it as a statement: (X) = f(A, B)")
    raise NameResolutionError(f"unknown tensor or function '{e.name}'", e.loc,
                              "tensors are the function's arguments and the tensors its "
                              "statements define; see the builtins in docs/language.md")


def _apply(op: str, args: tuple[Typed, ...], loc: SourceLoc, name: str | None = None) -> Typed:
    info = intrinsics.OPS[op]
    if len(args) != info.arity:
        raise TypeCheckError(f"{name or op} takes {info.arity} argument"
                             f"{'s' if info.arity != 1 else ''}, got {len(args)}", loc)
    operands = args[1:] if op == "select" else args
    dtype, weak = operands[0].dtype, operands[0].weak
    for a in operands[1:]:
        dtype, weak = promote(dtype, weak, a.dtype, a.weak)
    if op in ("and", "or", "not"):
        dtype = dtypes.BOOL
    elif info.result == intrinsics.FLOAT and not dtype.is_float:
        # Math functions of integers compute in float32 (C's float overloads): make the
        # conversion explicit so that every evaluator computes in floating point.
        dtype = dtypes.FLOAT32
        operands = tuple(a if a.weak else _cast(a, dtype, loc) for a in operands)
    elif info.result == intrinsics.BOOL and dtype != dtypes.BOOL:
        # A comparison of mixed types compares in their common type (int64 with
        # bfloat16: in bfloat16, as C converts): explicit, so that every evaluator
        # rounds the operands alike (NumPy would compare int64 and bfloat16 exactly).
        operands = tuple(a if a.weak or a.dtype == dtype else _cast(a, dtype, loc)
                         for a in operands)
    elif op in _ARITHMETIC and dtype == dtypes.BOOL:
        # C's integer promotion: true + true == 2, -true == -1.
        dtype = dtypes.INT32
        operands = tuple(a if a.weak else _cast(a, dtype, loc) for a in operands)
    result = intrinsics.result_dtype(op, dtype)
    if op in ("and", "or", "not"):   # the truth value of each operand in its own type
        exprs = tuple(finalize(a, loc) for a in operands)
    else:
        exprs = tuple(retype(a.expr, dtype, loc) if a.weak else a.expr for a in operands)
    if op == "select":   # any nonzero condition selects the first branch, as in C
        cond = finalize(args[0], loc)
        if cond.dtype != dtypes.BOOL:
            cond = P.Op("cast", (cond,), dtypes.BOOL, loc)
        exprs = (cond,) + exprs
    return Typed(P.Op(op, exprs, result, loc), weak and result.kind != "b")


_ARITHMETIC = frozenset({"add", "sub", "mul", "div", "mod", "neg"})


def _cast(a: Typed, dtype: DType, loc: SourceLoc) -> Typed:
    return Typed(P.Op("cast", (a.expr,), dtype, loc))


def promote(a: DType, a_weak: bool, b: DType, b_weak: bool) -> tuple[DType, bool]:
    if a_weak and b_weak:
        return dtypes.promote(a, b), True
    if a_weak or b_weak:
        strong, weak = (b, a) if a_weak else (a, b)
        if weak.is_float and not strong.is_float:
            return dtypes.FLOAT32, False
        if strong == dtypes.BOOL and weak != dtypes.BOOL:   # `p ? 1 : -1` is an int
            return dtypes.INT32, False
        return strong, False
    return dtypes.promote(a, b), False


def retype(e: P.TExpr, dtype: DType, loc: SourceLoc | None = None) -> P.TExpr:
    """Give a weakly typed literal expression its final dtype; an integer literal that
    the dtype cannot hold is an error (`int8 + 300`), not a silent wrap-around."""
    if isinstance(e, P.Const):
        if dtype.is_float:
            return P.Const(float(e.value), dtype)
        if dtype == dtypes.BOOL:
            return P.Const(bool(e.value), dtype)
        limits = np.iinfo(dtype.numpy)
        if not limits.min <= int(e.value) <= limits.max:
            raise TypeCheckError(f"the literal {e.value} does not fit in {dtype} "
                                 f"({limits.min}..{limits.max})", loc,
                                 "cast the other operand to a wider type, e.g. "
                                 "int32(...), or use a smaller literal")
        return P.Const(int(e.value), dtype)
    if isinstance(e, P.Op) and e.op != "cast":
        info = intrinsics.OPS[e.op]
        if info.result == intrinsics.BOOL:
            return e
        args = tuple(retype(a, dtype, loc) if i > 0 or e.op != "select" else a
                     for i, a in enumerate(e.args))
        return replace(e, args=args, dtype=intrinsics.result_dtype(e.op, dtype))
    return e


def lets_scope(where: tuple[ast.WhereClause, ...], scope: Scope) -> None:
    """Resolve `where foo = expr` bindings in order into scope.lets."""
    for w in where:
        if isinstance(w, ast.Let):
            if w.name in scope.tensors or w.name in scope.scalars or w.name in scope.sizes:
                raise NameResolutionError(f"where {w.name} = ... shadows an argument or size",
                                          w.loc, "pick another name")
            typed = resolve(w.value, scope)
            scope.lets[w.name] = (typed.expr, typed.weak)


def finalize(typed: Typed, loc: SourceLoc | None = None) -> P.TExpr:
    """Fix the dtype of an expression made only of literals (int32 / float32)."""
    return retype(typed.expr, typed.dtype, loc) if typed.weak else typed.expr


def reads(e: P.TExpr) -> list[P.Read]:
    """Every tensor read in e, outermost first (subscript reads included)."""
    out: list[P.Read] = []
    stack: list[P.TExpr] = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, P.Read):
            out.append(x)
            stack.extend(reversed(x.indices))
        elif isinstance(x, P.Op):
            stack.extend(reversed(x.args))
    return out


def _check_literal(e: ast.Number) -> None:
    """A literal beyond its widest type would wrap or become infinity without a word."""
    shown = abbreviate(e.text)
    if isinstance(e.value, int) and e.value > np.iinfo(np.int64).max:
        raise TypeCheckError(f"integer literal {shown} does not fit in int64, the widest "
                             "integer type", e.loc, "write a float literal (with a decimal "
                             "point) for a real number")
    if isinstance(e.value, float) and not math.isfinite(e.value):
        raise TypeCheckError(f"literal {shown} is out of range for float64 (at most about "
                             "1.8e308)", e.loc)


def index_names(e: P.TExpr) -> set[str]:
    if isinstance(e, P.IndexVar):
        return {e.name}
    if isinstance(e, P.Read):
        return set().union(*(index_names(i) for i in e.indices)) if e.indices else set()
    if isinstance(e, P.Op):
        return set().union(*(index_names(a) for a in e.args))
    return set()


def check_assignable(value: DType, target: DType, tensor: str, loc: SourceLoc) -> None:
    if target.is_integral and value.is_float:
        raise TypeCheckError(f"assigning a {value} value to {tensor}, which is {target}",
                             loc, f"cast explicitly, e.g. {target.name}(...)")
