"""The C backend's form of every arithmetic and math op of polytile.ir.intrinsics, one row
per op: on floating-point scalars, on integer scalars, and on float32 vectors. A new op
is a row here (and its meaning in intrinsics.py); nothing else in the backend lists ops.

Template fields: `{0}`, `{1}`, `{2}` the operands and `{s0}`, `{s1}` the same without
enclosing parentheses (for call arguments); `{f}` the libm suffix ("f" below double),
`{one}`, `{zero}` literals of the type; `{t}` the integer type and `{w}` its wide
unsigned type (wrapping arithmetic, as NumPy); `{helper}` the integer division helper's
suffix (cexpr.Needs.divmod). Comparisons, logic, select and conversions are not rows:
their scalar forms follow from the operand types (cexpr); their vector forms, on masks,
are MASK_OPS.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Lanewise:
    """A vector form computed one lane at a time with a scalar C expression (`{}`)."""

    template: str


@dataclass(frozen=True)
class COp:
    float: str | None = None                # scalar float16/bfloat16/float32/float64
    int: str | None = None                  # scalar signed integer (and bool, as uint8)
    uint: str | None = None                 # unsigned integer, when it differs from int
    vector: str | Lanewise | None = None    # float32 vectors (pt_vf, polytile.codegen.vector)

    def unsigned(self) -> str | None:
        return self.uint if self.uint is not None else self.int


def _wrapping(symbol: str) -> COp:
    return COp(f"({{0}} {symbol} {{1}})", f"({{t}})(({{w}}){{0}} {symbol} ({{w}}){{1}})",
               vector=f"{{0}} {symbol} {{1}}")


def _math(name: str, vector: str | Lanewise | None = None) -> COp:
    return COp(f"{name}{{f}}({{0}})", vector=vector)


def _math2(name: str) -> COp:
    return COp(f"{name}{{f}}({{0}}, {{1}})")


_ABS_INT = "({t})({0} < 0 ? 0u - ({w}){0} : ({w}){0})"

C_OPS: dict[str, COp] = {
    "add": _wrapping("+"),
    "sub": _wrapping("-"),
    "mul": _wrapping("*"),
    "div": COp("({0} / {1})", "pt_div_{helper}({s0}, {s1})", vector="{0} / {1}"),
    "mod": COp("fmod{f}({0}, {1})", "pt_mod_{helper}({s0}, {s1})"),
    "neg": COp("(-{0})", "({t})(0u - ({w}){0})", vector="-{0}"),
    "abs": COp("fabs{f}({0})", _ABS_INT, "{0}", Lanewise("fabsf({})")),
    "fabs": COp("fabs{f}({0})", _ABS_INT, "{0}", Lanewise("fabsf({})")),
    "relu": COp("({0} > {zero} ? {0} : {zero})", "({t})({0} > 0 ? {0} : 0)", "{0}",
                "pt_vfmax({0}, pt_vsplat(0.0f))"),
    "fmax": COp("fmax{f}({0}, {1})", "({t})({0} > {1} ? {0} : {1})",
                vector="pt_vfmax({0}, {1})"),
    "fmin": COp("fmin{f}({0}, {1})", "({t})({0} < {1} ? {0} : {1})",
                vector="pt_vfmin({0}, {1})"),
    "rsqrt": COp("({one} / sqrt{f}({0}))", vector=Lanewise("1.0f / sqrtf({})")),
    "sigmoid": COp("({one} / ({one} + exp{f}(-{0})))", vector="pt_vsigmoid({0})"),
    "fma": COp("fma{f}({0}, {1}, {2})"),
    "exp": _math("exp", "pt_vexp({0})"),
    "log": _math("log", "pt_vlog({0})"),
    "tanh": _math("tanh", "pt_vtanh({0})"),
    "erf": _math("erf", "pt_verf({0})"),
    "sqrt": _math("sqrt", Lanewise("sqrtf({})")),
    "floor": _math("floor", Lanewise("floorf({})")),
    "ceil": _math("ceil", Lanewise("ceilf({})")),
    "trunc": _math("trunc", Lanewise("truncf({})")),
    "round": _math("round", Lanewise("roundf({})")),
    **{name: _math(name) for name in (
        "exp2", "expm1", "log2", "log10", "log1p", "cbrt", "sin", "cos", "tan", "asin",
        "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "erfc")},
    **{name: _math2(name) for name in ("atan2", "pow", "fmod", "hypot", "copysign")},
}

# Ops whose vector form is the operand itself (float32 to float32; a cast of a mask to
# float32 is a select of 1 and 0, polytile.loops.vector).
VECTOR_IDENTITIES = frozenset({"ident", "cast"})

# Comparisons of float32 vectors give masks (`pt_vi`: a lane all ones where true, zero
# where false: GCC's vector comparison), logic combines masks, select picks float32 lanes
# by a mask. The ordered comparisons are false, and != true, where a lane is NaN, as in
# scalar C and NumPy.
MASK_OPS: dict[str, tuple[tuple[str, ...], str]] = {   # op: (operand kinds, vector form)
    **{op: (("float", "float"), f"({{0}} {symbol} {{1}})") for op, symbol in (
        ("eq", "=="), ("ne", "!="), ("lt", "<"), ("le", "<="), ("gt", ">"), ("ge", ">="))},
    "and": (("mask", "mask"), "({0} & {1})"),
    "or": (("mask", "mask"), "({0} | {1})"),
    "not": (("mask",), "(~{0})"),
    "select": (("mask", "float", "float"), "pt_vsel({0}, {1}, {2})"),
}
VECTOR_OPS = (frozenset(n for n, op in C_OPS.items() if op.vector is not None)
              | VECTOR_IDENTITIES | frozenset(MASK_OPS))
