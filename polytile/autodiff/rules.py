"""The derivative of every scalar operation, as typed expressions (reverse mode).

`adjoints(e, g)` gives, for an operation `e` and the adjoint `g` of its value, the
adjoint contribution of each floating-point operand: `[(k, expr)]`. Integer and
boolean operands (indices, comparisons, casts from integers) carry no gradient.

Non-smooth points follow PyTorch: `abs`/`relu` have gradient 0 at 0 (relu's is 0
there, abs's is sign(0) = 0); `fmax`/`fmin` split the gradient in half between equal
operands (torch.maximum); `floor`, `ceil`, `round`, `trunc` have gradient 0; the
gradient of `pow(a, b)` in `b` is 0 where a == 0 and b >= 0.
"""
from __future__ import annotations

import math
from collections.abc import Callable

from polytile import dtypes
from polytile.dtypes import DType
from polytile.errors import UnsupportedError
from polytile.sema import program as P

BOOL = dtypes.BOOL


def const(value: float, dtype: DType) -> P.Const:
    return P.Const(float(value) if dtype.is_float else value, dtype)


def op(name: str, *args: P.TExpr) -> P.Op:
    """An operation on operands of one float dtype (comparisons give bool)."""
    if name in ("eq", "ne", "lt", "le", "gt", "ge", "and", "or", "not"):
        return P.Op(name, args, BOOL)
    return P.Op(name, args, args[0].dtype)


def add(a: P.TExpr, b: P.TExpr) -> P.TExpr:
    return op("add", a, b)


def mul(a: P.TExpr, b: P.TExpr) -> P.TExpr:
    """a * b, leaving out factors of 1."""
    if isinstance(a, P.Const) and a.value == 1:
        return b
    if isinstance(b, P.Const) and b.value == 1:
        return a
    return op("mul", a, b)


def div(a: P.TExpr, b: P.TExpr) -> P.TExpr:
    return op("div", a, b)


def neg(a: P.TExpr) -> P.TExpr:
    return op("neg", a)


def select(cond: P.TExpr, a: P.TExpr, b: P.TExpr) -> P.TExpr:
    return P.Op("select", (cond, a, b), a.dtype)


def zero_like(e: P.TExpr) -> P.Const:
    return const(0, e.dtype)


def _sq(a: P.TExpr) -> P.TExpr:
    return op("mul", a, a)


def _one(a: P.TExpr) -> P.Const:
    return const(1, a.dtype)


Rule = Callable[[P.Op, P.TExpr], list[tuple[int, P.TExpr]]]


def _unary(factor: Callable[[P.TExpr, P.Op], P.TExpr]) -> Rule:
    """d e / d a = factor(a, e); the contribution is g * factor."""
    return lambda e, g: [(0, mul(g, factor(e.args[0], e)))]


def _zero(e: P.Op, g: P.TExpr) -> list[tuple[int, P.TExpr]]:
    return []


def _erf_factor(a: P.TExpr, e: P.Op) -> P.TExpr:
    return mul(const(2 / math.sqrt(math.pi), a.dtype), op("exp", neg(_sq(a))))


def _pick(larger: bool) -> Rule:
    """fmax/fmin: the selected operand takes g (a NaN operand is never selected, as C's
    fmax ignores it); equal operands take g/2 each."""
    def rule(e: P.Op, g: P.TExpr) -> list[tuple[int, P.TExpr]]:
        a, b = e.args
        half = mul(g, const(0.5, g.dtype))
        wins = "gt" if larger else "lt"

        def chosen(x: P.TExpr, y: P.TExpr) -> P.TExpr:
            if isinstance(y, P.Const):          # a number is never NaN here
                return op(wins, x, y)
            return op("or", op(wins, x, y), op("ne", y, y))
        return [(0, select(chosen(a, b), g, select(op("eq", a, b), half, zero_like(g)))),
                (1, select(chosen(b, a), g, select(op("eq", a, b), half, zero_like(g))))]
    return rule


def _pow(e: P.Op, g: P.TExpr) -> list[tuple[int, P.TExpr]]:
    a, b = e.args
    da = mul(g, mul(b, op("pow", a, op("sub", b, _one(b)))))
    flat = op("and", op("eq", a, zero_like(a)), op("ge", b, zero_like(b)))
    db = select(flat, zero_like(g), mul(g, mul(e, op("log", a))))
    return [(0, da), (1, db)]


def _sign(a: P.TExpr) -> P.TExpr:
    return select(op("gt", a, zero_like(a)), _one(a),
                  select(op("lt", a, zero_like(a)), const(-1, a.dtype), zero_like(a)))


RULES: dict[str, Rule] = {
    "add": lambda e, g: [(0, g), (1, g)],
    "sub": lambda e, g: [(0, g), (1, neg(g))],
    "mul": lambda e, g: [(0, mul(g, e.args[1])), (1, mul(g, e.args[0]))],
    "div": lambda e, g: [(0, div(g, e.args[1])), (1, neg(div(mul(g, e), e.args[1])))],
    "neg": lambda e, g: [(0, neg(g))],
    "ident": lambda e, g: [(0, g)],
    "select": lambda e, g: [(1, select(e.args[0], g, zero_like(g))),
                            (2, select(e.args[0], zero_like(g), g))],
    "fma": lambda e, g: [(0, mul(g, e.args[1])), (1, mul(g, e.args[0])), (2, g)],
    "exp": _unary(lambda a, e: e),
    "exp2": _unary(lambda a, e: mul(e, const(math.log(2), a.dtype))),
    "expm1": _unary(lambda a, e: add(e, _one(a))),
    "log": _unary(lambda a, e: div(_one(a), a)),
    "log2": _unary(lambda a, e: div(_one(a), mul(a, const(math.log(2), a.dtype)))),
    "log10": _unary(lambda a, e: div(_one(a), mul(a, const(math.log(10), a.dtype)))),
    "log1p": _unary(lambda a, e: div(_one(a), add(a, _one(a)))),
    "sqrt": _unary(lambda a, e: div(const(0.5, a.dtype), e)),
    "rsqrt": _unary(lambda a, e: mul(const(-0.5, a.dtype), div(e, a))),
    "cbrt": _unary(lambda a, e: div(_one(a), mul(const(3, a.dtype), _sq(e)))),
    "sin": _unary(lambda a, e: op("cos", a)),
    "cos": _unary(lambda a, e: neg(op("sin", a))),
    "tan": _unary(lambda a, e: add(_one(a), _sq(e))),
    "asin": _unary(lambda a, e: op("rsqrt", op("sub", _one(a), _sq(a)))),
    "acos": _unary(lambda a, e: neg(op("rsqrt", op("sub", _one(a), _sq(a))))),
    "atan": _unary(lambda a, e: div(_one(a), add(_one(a), _sq(a)))),
    "sinh": _unary(lambda a, e: op("cosh", a)),
    "cosh": _unary(lambda a, e: op("sinh", a)),
    "tanh": _unary(lambda a, e: op("sub", _one(a), _sq(e))),
    "asinh": _unary(lambda a, e: op("rsqrt", add(_sq(a), _one(a)))),
    "acosh": _unary(lambda a, e: op("rsqrt", op("sub", _sq(a), _one(a)))),
    "atanh": _unary(lambda a, e: div(_one(a), op("sub", _one(a), _sq(a)))),
    "erf": _unary(_erf_factor),
    "erfc": _unary(lambda a, e: neg(_erf_factor(a, e))),
    "sigmoid": _unary(lambda a, e: mul(e, op("sub", _one(a), e))),
    "floor": _zero, "ceil": _zero, "round": _zero, "trunc": _zero,
    "fabs": _unary(lambda a, e: _sign(a)),
    "abs": _unary(lambda a, e: _sign(a)),
    "relu": lambda e, g: [(0, select(op("gt", e.args[0], zero_like(e.args[0])), g,
                                     zero_like(g)))],
    "fmax": _pick(larger=True),
    "fmin": _pick(larger=False),
    "pow": _pow,
    "atan2": lambda e, g: [
        (0, div(mul(g, e.args[1]), add(_sq(e.args[0]), _sq(e.args[1])))),
        (1, neg(div(mul(g, e.args[0]), add(_sq(e.args[0]), _sq(e.args[1])))))],
    "hypot": lambda e, g: [(0, div(mul(g, e.args[0]), e)), (1, div(mul(g, e.args[1]), e))],
    "fmod": lambda e, g: [(0, g), (1, neg(mul(g, op("trunc", div(e.args[0], e.args[1])))))],
    "mod": lambda e, g: [(0, g), (1, neg(mul(g, op("trunc", div(e.args[0], e.args[1])))))],
    "copysign": lambda e, g: [(0, mul(g, mul(op("copysign", _one(e), e.args[0]),
                                            op("copysign", _one(e), e.args[1]))))],
}

# Operations whose result carries no gradient whatever the operand types.
NO_GRADIENT = frozenset({"eq", "ne", "lt", "le", "gt", "ge", "and", "or", "not"})


def adjoints(e: P.Op, g: P.TExpr) -> list[tuple[int, P.TExpr]]:
    """The adjoint contribution of each float operand of `e` given the adjoint `g`."""
    if not e.dtype.is_float or e.op in NO_GRADIENT:
        return []
    if e.op == "cast":
        source = e.args[0].dtype
        return [(0, P.Op("cast", (g,), source))] if source.is_float else []
    rule = RULES.get(e.op)
    if rule is None:
        raise UnsupportedError(f"polytile cannot differentiate {e.op} yet", e.loc,
                               "write the layer without it, or its gradient by hand")
    return [(k, c) for k, c in rule(e, g) if e.args[k].dtype.is_float]
