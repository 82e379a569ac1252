"""The scalar operations shared by the Program, the IR, both interpreters and codegen.

Semantics follow C (what the generated code computes), and the NumPy versions
here reproduce them exactly:

* integer `/` and `%` truncate toward zero (C), float `%` is `fmod`;
  integer division by zero yields 0 rather than trapping;
* `fmax`/`fmin` (and `max`/`min`) ignore a NaN operand, like C's fmaxf;
  the `max=`/`min=` *reductions* propagate NaN, like NumPy's max/min;
* `round` rounds half away from zero (C), not half to even;
* comparisons and logic produce bool.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy import special as _special

from polytile import dtypes
from polytile.dtypes import DType

# How the result type follows from the (promoted) operand type.
SAME, FLOAT, BOOL = "same", "float", "bool"


@dataclass(frozen=True)
class OpInfo:
    name: str
    arity: int
    result: str            # SAME | FLOAT | BOOL
    impl: Callable[..., np.ndarray]


def _c_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    dtype = np.result_type(a, b)
    if np.issubdtype(dtype, np.integer):
        a, b = np.asarray(a).astype(dtype), np.asarray(b).astype(dtype)
        safe = np.where(b == 0, 1, b).astype(dtype)
        with np.errstate(all="ignore"):
            q = a // safe                      # floor; exact, no abs() of INT_MIN
            r = a - q * safe
            # C truncates toward zero: step back up when the floor went below
            q = q + ((r != 0) & ((a < 0) != (safe < 0))).astype(dtype)
        return np.where(b == 0, 0, q).astype(dtype)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.true_divide(a, b)


def _c_mod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    dtype = np.result_type(a, b)
    if np.issubdtype(dtype, np.integer):
        a, b = np.asarray(a).astype(dtype), np.asarray(b).astype(dtype)
        safe = np.where(b == 0, 1, b).astype(dtype)
        with np.errstate(all="ignore"):
            r = a - _c_div(a, safe) * safe
        return np.where(b == 0, 0, r).astype(dtype)
    with np.errstate(invalid="ignore"):
        return np.fmod(a, b)


def _round(x: np.ndarray) -> np.ndarray:
    return np.copysign(np.floor(np.abs(x) + 0.5), x)


def _minmax(pick: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    return lambda a, b: pick(a, b)


def _rsqrt(x: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return 1.0 / np.sqrt(x)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def _relu(x: np.ndarray) -> np.ndarray:
    return np.where(x > 0, x, np.zeros_like(x))


def _quiet(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    def run(*args: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return fn(*args)
    return run


_TABLE: list[tuple[str, int, str, Callable[..., np.ndarray]]] = [
    ("add", 2, SAME, np.add), ("sub", 2, SAME, np.subtract), ("mul", 2, SAME, np.multiply),
    ("div", 2, SAME, _c_div), ("mod", 2, SAME, _c_mod), ("neg", 1, SAME, np.negative),
    ("eq", 2, BOOL, np.equal), ("ne", 2, BOOL, np.not_equal), ("lt", 2, BOOL, np.less),
    ("le", 2, BOOL, np.less_equal), ("gt", 2, BOOL, np.greater),
    ("ge", 2, BOOL, np.greater_equal),
    ("and", 2, BOOL, np.logical_and), ("or", 2, BOOL, np.logical_or),
    ("not", 1, BOOL, np.logical_not),
    ("select", 3, SAME, lambda c, a, b: np.where(c, a, b)),
    ("ident", 1, SAME, lambda x: x),
    ("cast", 1, SAME, lambda x: x),       # to the op's dtype; float -> int truncates
    # math (floating point; integer operands are promoted to float32)
    ("exp", 1, FLOAT, np.exp), ("exp2", 1, FLOAT, np.exp2), ("expm1", 1, FLOAT, np.expm1),
    ("log", 1, FLOAT, np.log), ("log2", 1, FLOAT, np.log2), ("log10", 1, FLOAT, np.log10),
    ("log1p", 1, FLOAT, np.log1p), ("sqrt", 1, FLOAT, np.sqrt), ("rsqrt", 1, FLOAT, _rsqrt),
    ("cbrt", 1, FLOAT, np.cbrt), ("sin", 1, FLOAT, np.sin), ("cos", 1, FLOAT, np.cos),
    ("tan", 1, FLOAT, np.tan), ("asin", 1, FLOAT, np.arcsin), ("acos", 1, FLOAT, np.arccos),
    ("atan", 1, FLOAT, np.arctan), ("sinh", 1, FLOAT, np.sinh), ("cosh", 1, FLOAT, np.cosh),
    ("tanh", 1, FLOAT, np.tanh), ("asinh", 1, FLOAT, np.arcsinh),
    ("acosh", 1, FLOAT, np.arccosh), ("atanh", 1, FLOAT, np.arctanh),
    ("erf", 1, FLOAT, _special.erf), ("erfc", 1, FLOAT, _special.erfc),
    ("floor", 1, FLOAT, np.floor), ("ceil", 1, FLOAT, np.ceil), ("round", 1, FLOAT, _round),
    ("trunc", 1, FLOAT, np.trunc), ("fabs", 1, FLOAT, np.fabs),
    ("sigmoid", 1, FLOAT, _sigmoid),
    ("atan2", 2, FLOAT, np.arctan2), ("pow", 2, FLOAT, np.power), ("fmod", 2, FLOAT, np.fmod),
    ("hypot", 2, FLOAT, np.hypot), ("copysign", 2, FLOAT, np.copysign),
    ("fma", 3, FLOAT, lambda a, b, c: a * b + c),
    # type-preserving
    ("abs", 1, SAME, np.abs), ("relu", 1, SAME, _relu),
    ("fmax", 2, SAME, _minmax(np.fmax)), ("fmin", 2, SAME, _minmax(np.fmin)),
]

OPS: dict[str, OpInfo] = {name: OpInfo(name, arity, result, _quiet(impl))
                          for name, arity, result, impl in _TABLE}

# Spellings accepted in TC source for builtins, mapped to the op names above.
BUILTIN_ALIASES = {"fmaxf": "fmax", "fminf": "fmin", "max": "fmax", "min": "fmin",
                   "expf": "exp", "logf": "log", "tanhf": "tanh", "sqrtf": "sqrt",
                   "fabsf": "fabs", "powf": "pow", "exp2f": "exp2", "expf2": "exp2"}
BUILTINS = frozenset(n for n in OPS if n not in
                     ("add", "sub", "mul", "div", "mod", "neg", "eq", "ne", "lt", "le", "gt",
                      "ge", "and", "or", "not", "select", "ident", "cast")) | frozenset(BUILTIN_ALIASES)

BINARY_SYMBOLS = {"+": "add", "-": "sub", "*": "mul", "/": "div", "%": "mod", "==": "eq",
                  "!=": "ne", "<": "lt", "<=": "le", ">": "gt", ">=": "ge", "&&": "and",
                  "||": "or"}


def result_dtype(op: str, operand: DType) -> DType:
    """The dtype of `op` applied to operands already promoted to `operand`."""
    kind = OPS[op].result
    if kind == BOOL:
        return dtypes.BOOL
    if kind == FLOAT and not operand.is_float:
        return dtypes.FLOAT32
    return operand


def evaluate(op: str, dtype: DType, *args: np.ndarray) -> np.ndarray:
    """Apply `op` to NumPy operands and return the result as `dtype` (the op's result type).

    float16/bfloat16 are computed in float32 and rounded once, as the C code does.
    """
    info = OPS[op]
    if info.result != BOOL and dtype.is_float and dtype.bits == 16:
        args = tuple(np.asarray(a).astype(np.float32) for a in args)
    elif info.result == SAME:
        args = tuple(np.asarray(a).astype(dtype.numpy) for a in args)
    out = info.impl(*args)
    return np.asarray(out).astype(dtype.numpy)
