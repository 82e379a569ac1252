"""Print a Program: each function's signature with shapes, and each statement with
the inferred range of every index (symbolic, or concrete once specialized)."""
from __future__ import annotations

from polytile.ir import intrinsics
from polytile.sema import program as P
from polytile.sema.sizes import tc_text
from polytile.sema.specialize import Specialized

_SYMBOL = {v: k for k, v in intrinsics.BINARY_SYMBOLS.items()}


_PRECEDENCE = {"or": 1, "and": 2, "eq": 3, "ne": 3, "lt": 4, "le": 4, "gt": 4, "ge": 4,
               "add": 5, "sub": 5, "mul": 6, "div": 6, "mod": 6}


def format_expr(e: P.TExpr, context: int = 0) -> str:
    """TC-like text; parentheses only where precedence needs them."""
    if isinstance(e, P.Const):
        return repr(e.value) if isinstance(e.value, float) else str(e.value)
    if isinstance(e, (P.IndexVar, P.ScalarArg)):
        return e.name
    if isinstance(e, P.SizeVal):       # TC, which the derived programs are parsed from
        text = tc_text(e.expr, paren=True)
        return f"({text})" if text.startswith("-") and context else text
    if isinstance(e, P.Read):
        return f"{e.tensor}({', '.join(format_expr(i) for i in e.indices)})"
    if e.op in _SYMBOL:
        prec = _PRECEDENCE[e.op]
        text = (f"{format_expr(e.args[0], prec)} {_SYMBOL[e.op]} "
                f"{format_expr(e.args[1], prec + 1)}")
        return f"({text})" if prec < context else text
    if e.op in ("neg", "not"):
        return ("-" if e.op == "neg" else "!") + format_expr(e.args[0], 7)
    if e.op == "select":
        text = " ".join((format_expr(e.args[0], 1), "?", format_expr(e.args[1]), ":",
                         format_expr(e.args[2])))
        return f"({text})" if context > 0 else text
    name = str(e.dtype) if e.op == "cast" else e.op
    return f"{name}({', '.join(format_expr(a) for a in e.args)})"


def _shape(t: P.Tensor, concrete: tuple[int, ...] | None) -> str:
    dims = concrete if concrete is not None else tuple(str(s) for s in t.shape)
    return f"{t.dtype}({', '.join(str(d) for d in dims)})" if t.shape else str(t.dtype)


def format_function(fn: P.Function, spec: Specialized | None = None) -> str:
    def shape(t: P.Tensor) -> str:
        return _shape(t, spec.shape(t.name) if spec else None)

    params = ", ".join(f"{shape(p)} {p.name}" for p in fn.params)
    outs = ", ".join(f"{shape(o)} {o.name}" for o in fn.outputs)
    lines = [f"def {fn.name}({params}) -> ({outs})"]
    if spec is not None:
        lines.append("  sizes: " + ", ".join(f"{k}={v}" for k, v in spec.env))
    for t in fn.temps:
        lines.append(f"  temporary {shape(t)} {t.name}")
    if fn.inout:
        lines.append("  in/out (pass with out=): " + ", ".join(sorted(fn.inout)))
    for k, st in enumerate(fn.statements):
        op = st.op + ("!" if st.init else "")
        subscripts = [format_expr(x) for x in st.scatter] or list(st.indices)
        text = f"{st.tensor}({', '.join(subscripts)}) {op} {format_expr(st.rhs)}"
        if spec is not None:
            ranges = ", ".join(f"{n} in {lo}:{hi}" for n, lo, hi in spec.ranges[k])
        else:
            ranges = ", ".join(f"{n} in {r}" for n, r in st.ranges)
        reduce = ""
        if st.reduction_indices:
            reduce = f"; reduce over {', '.join(st.reduction_indices)}"
        lines.append(f"  {text}\n      where {ranges}{reduce}")
    return "\n".join(lines) + "\n"


def format_program(program: P.Program) -> str:
    return "\n".join(format_function(f) for f in program.functions)
