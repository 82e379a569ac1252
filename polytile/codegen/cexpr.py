"""C spellings of scalar values: types, literals, conversions, intrinsics, aggregation.

A scalar `$x` of dtype `t` lives in a C variable of type `scalar_type(t)`: the
storage type, except float16/bfloat16, which are held in a `float` whose value is
exactly representable in the 16-bit type (every operation rounds its result once).

Every function returns an expression that can be used as an operand without
further parentheses (a name, literal, call, cast, or a parenthesized expression)
and records the helpers it calls in `Needs`, so `cprelude` emits only those.
Integer arithmetic is done in unsigned types and converted back, so overflow wraps
like NumPy instead of being undefined behaviour in C.
"""
from __future__ import annotations

import math

import numpy as np

from polytile import dtypes
from polytile.codegen import cprelude
from polytile.codegen.cops import C_OPS
from polytile.dtypes import DType
from polytile.errors import IRError, UnsupportedError
from polytile.ir.intrinsics import BOOL, OPS

Typed = tuple[str, DType]    # a C expression and the dtype of the scalar it holds


class Needs:
    """The prelude helpers a kernel uses (collected while generating it)."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.int_types: dict[str, DType] = {}

    def use(self, name: str) -> None:
        self.names.add(name)

    def divmod(self, dt: DType) -> str:
        name = cprelude.div_helper(dt)
        self.int_types[name] = dt
        self.names.add(name)
        return cprelude.suffix(dt)

    def prelude(self) -> str:
        return cprelude.prelude(self.names, self.int_types)


def strip(expr: str) -> str:
    """`expr` without parentheses that enclose all of it."""
    while expr.startswith("(") and _closing(expr) == len(expr) - 1:
        expr = expr[1:-1]
    return expr


def _closing(expr: str) -> int:
    depth = 0
    for pos, ch in enumerate(expr):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0:
            return pos
    return -1


def _call(name: str, *args: str) -> str:
    return f"{name}({', '.join(strip(a) for a in args)})"


def _is16(dt: DType) -> bool:
    return dt.is_float and dt.bits == 16


def scalar_type(dt: DType) -> str:
    return "float" if _is16(dt) else dt.c_name


def _float_suffix(dt: DType) -> str:
    """'f' for math on float (float16/bfloat16/float32), '' for double."""
    return "" if dt.bits == 64 else "f"


def _wide_unsigned(dt: DType) -> str:
    return "uint64_t" if dt.bits == 64 else "uint32_t"


# ---------------------------------------------------------------- literals

def literal(value: float | bool, dt: DType) -> str:
    """`value` converted to `dt` (as NumPy would) and spelled as a C constant."""
    if dt.kind == "b":
        return "1" if value else "0"
    if dt.is_float:
        x = float(np.asarray(value).astype(dt.numpy).astype(np.float64))
        if math.isnan(x):
            return "NAN"
        if math.isinf(x):
            return "INFINITY" if x > 0 else "-INFINITY"
        if dt.bits == 64:
            return repr(x)
        # The shortest float32 spelling parses back to the same float32 in C.
        text = str(np.float32(x))
        return text + ("f" if any(c in text for c in ".e") else ".0f")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise IRError(f"constant {value} cannot be converted to {dt}")
        value = int(value)
    return _int_literal(int(value), dt)


def _int_literal(value: int, dt: DType) -> str:
    span = 1 << dt.bits
    value %= span
    if dt.kind == "i" and value >= span // 2:
        value -= span
    if dt.kind == "u":
        return f"UINT64_C({value})" if dt.bits == 64 else f"{value}u"
    if value == -(span // 2):          # the minimum has no literal of its own type
        return "INT64_MIN" if dt.bits == 64 else f"({value + 1} - 1)"
    if dt.bits == 64:
        return f"INT64_C({value})"
    return f"({value})" if value < 0 else str(value)


def nan_storage(dt: DType) -> str:
    """A quiet NaN as stored in a float buffer of type `dt`."""
    return {"float16": "0x7e00u", "bfloat16": "0x7fc0u"}.get(dt.name, "NAN")


# ---------------------------------------------------------------- conversions

def load(element: str, dt: DType, needs: Needs) -> str:
    """A stored element (an lvalue) as a scalar."""
    if dt.name == "float16":
        needs.use("f16")
        return _call("pt_f16_to_f32", element)
    if dt.name == "bfloat16":
        needs.use("bf16")
        return _call("pt_bf16_to_f32", element)
    return element


def store(value: str, dt: DType, needs: Needs) -> str:
    """A scalar as the value to store into an element (rounds 16-bit floats)."""
    if dt.name == "float16":
        needs.use("f16")
        return _call("pt_f32_to_f16", value)
    if dt.name == "bfloat16":
        needs.use("bf16")
        return _call("pt_f32_to_bf16", value)
    return value


def convert(expr: str, src: DType, dst: DType, needs: Needs) -> str:
    """The scalar `expr` of dtype `src` converted to `dst`, as NumPy's astype does."""
    if src == dst:
        return expr
    if dst.kind == "b":
        return f"(uint8_t)({expr} != 0)"
    if dst.is_float:
        return _to_float(expr, src, dst, needs)
    if src.is_float:
        needs.use("f2i")
        if dst.kind == "u" and dst.bits == 64:
            return _call("pt_f2u64", expr)
        if dst.bits == 64:
            return _call("pt_f2i64", expr)
        # NumPy converts to (u)int8/16 and int32 through a 32-bit conversion, uint32 through 64.
        wide = "pt_f2i64" if dst.kind == "u" and dst.bits == 32 else "pt_f2i32"
        return f"({dst.c_name}){_call(wide, expr)}"
    return f"({dst.c_name}){expr}"


def _to_float(expr: str, src: DType, dst: DType, needs: Needs) -> str:
    if dst.bits == 64:
        return f"(double){expr}"
    if dst.bits == 32:
        return expr if _is16(src) else f"(float){expr}"
    helper = "f16" if dst.name == "float16" else "bf16"
    rnd = f"pt_round_{helper}"
    # Through double with round-to-odd wherever going through float would round twice.
    if src.bits == 64 or (helper == "bf16" and src.is_integral and src.bits > 16):
        needs.use(f"f64_to_{helper}")
        return f"{rnd}_d((double){expr})"
    needs.use(helper)
    return _call(rnd, expr if src.is_float else f"(float){expr}")


def round_to(expr: str, dt: DType, needs: Needs) -> str:
    """A float computation result rounded to 16-bit `dt` (no-op for other types)."""
    if dt.name == "float16":
        needs.use("f16")
        return _call("pt_round_f16", expr)
    if dt.name == "bfloat16":
        needs.use("bf16")
        return _call("pt_round_bf16", expr)
    return expr


# ---------------------------------------------------------------- intrinsics

_COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def intrinsic(op: str, args: list[Typed], dtype: DType, needs: Needs) -> str:
    """`op(args)` with result dtype `dtype`, following polytile.ir.intrinsics."""
    info = OPS.get(op)
    if info is None:
        raise UnsupportedError(f"intrinsic {op!r} has no C implementation")
    if len(args) != info.arity:
        raise IRError(f"intrinsic {op!r} takes {info.arity} operands, got {len(args)}")
    if info.result == BOOL:
        return convert(_logic(op, args, needs), dtypes.BOOL, dtype, needs)
    if op in ("ident", "cast"):
        return convert(args[0][0], args[0][1], dtype, needs)
    if op == "select":
        a, b = (convert(e, t, dtype, needs) for e, t in args[1:])
        return f"({args[0][0]} ? {a} : {b})"
    # SAME ops compute in the result type; FLOAT ops (math) compute in float at least.
    compute = dtype if dtype.is_float or info.result != "float" else dtypes.FLOAT32
    xs = [convert(e, t, compute, needs) for e, t in args]
    if compute.is_float:
        result = round_to(_float_op(op, xs, compute), compute, needs)
    elif compute.kind == "b":
        # bool arithmetic as on uint8, then truthiness: + is or, * is and, max is or.
        result = f"(uint8_t)({_int_op(op, xs, dtypes.UINT8, needs)} != 0)"
    else:
        result = _int_op(op, xs, compute, needs)
    return convert(result, compute, dtype, needs)


def _logic(op: str, args: list[Typed], needs: Needs) -> str:
    if op == "not":
        return f"(uint8_t)!{args[0][0]}"
    if op in ("and", "or"):
        return f"(uint8_t)({args[0][0]} {'&&' if op == 'and' else '||'} {args[1][0]})"
    common = dtypes.promote(args[0][1], args[1][1])
    a, b = (convert(e, t, common, needs) for e, t in args)
    return f"(uint8_t)({a} {_COMPARE[op]} {b})"


def _float_op(op: str, xs: list[str], dt: DType) -> str:
    form = C_OPS[op].float if op in C_OPS else None
    if form is None:
        raise UnsupportedError(f"intrinsic {op!r} is not defined on {dt}")
    f = _float_suffix(dt)
    one, zero = ("1.0f", "0.0f") if f else ("1.0", "0.0")
    return form.format(*xs, **_stripped(xs), f=f, one=one, zero=zero)


def _int_op(op: str, xs: list[str], dt: DType, needs: Needs) -> str:
    row = C_OPS.get(op)
    form = None if row is None else row.int if dt.kind == "i" else row.unsigned()
    if form is None:
        raise UnsupportedError(f"intrinsic {op!r} is not defined on integer type {dt}")
    helper = needs.divmod(dt) if "{helper}" in form else ""
    return form.format(*xs, **_stripped(xs), t=dt.c_name, w=_wide_unsigned(dt), helper=helper)


def _stripped(xs: list[str]) -> dict[str, str]:
    return {f"s{k}": strip(x) for k, x in enumerate(xs)}


# ---------------------------------------------------------------- aggregation

def combine(agg: str, acc: str, value: str, dt: DType, needs: Needs) -> str:
    """The new content of an element holding `acc` after aggregating `value` (both dt).

    For 16-bit floats the result is a float that `store` rounds once.
    """
    if agg == "assign":
        return value
    if dt.kind == "b":
        return f"(uint8_t)({acc} {'|' if agg in ('add', 'max') else '&'} {value})"
    if dt.is_float:
        if agg in ("add", "mul"):
            return f"({acc} {'+' if agg == 'add' else '*'} {value})"
        needs.use("minmax_nan")    # NaN wins, as in NumPy's max/min reductions
        return _call(f"pt_{agg}_f{64 if dt.bits == 64 else 32}", acc, value)
    if agg in ("add", "mul"):
        return _int_op(agg, [acc, value], dt, needs)
    if agg in ("max", "min"):
        return _int_op("fmax" if agg == "max" else "fmin", [acc, value], dt, needs)
    raise IRError(f"unknown aggregation {agg!r}")
