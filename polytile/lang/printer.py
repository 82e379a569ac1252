"""Print a syntax tree back as TC; print(parse(print(t))) == print(t)."""
from __future__ import annotations

from polytile.lang import ast

_PRECEDENCE = {"||": 1, "&&": 2, "==": 3, "!=": 3, "<": 4, "<=": 4, ">": 4, ">=": 4,
               "+": 5, "-": 5, "*": 6, "/": 6, "%": 6}
_TERNARY, _UNARY, _ATOM = 0, 7, 8


def format_module(module: ast.Module) -> str:
    return "\n".join(format_def(d) for d in module.defs)


def format_def(d: ast.Def) -> str:
    args = ", ".join(_arg(a) for a in d.args)
    outs = ", ".join(_output(o) for o in d.outputs)
    body = "".join(f"  {format_stmt(s)}\n" for s in d.body)
    return f"def {d.name}({args}) -> ({outs}) {{\n{body}}}\n"


def _dims(dims: tuple[str | int, ...]) -> str:
    return "(" + ", ".join(str(x) for x in dims) + ")"


def _arg(a: ast.Arg) -> str:
    if isinstance(a, ast.ScalarArg):
        return f"{a.dtype} {a.name}"
    return f"{a.dtype}{_dims(a.dims)} {a.name}"


def _output(o: ast.Output) -> str:
    if o.dtype is None:
        return o.name
    return f"{o.dtype}{_dims(o.dims or ())} {o.name}"


def format_stmt(s: ast.Stmt) -> str:
    if isinstance(s, ast.CallDef):
        outs = ", ".join(n.name for n in s.outputs)
        args = ", ".join(n.name for n in s.args)
        return f"({outs}) = {s.func}({args})"
    subscripts = s.scatter or s.indices
    lhs = f"{s.tensor}({', '.join(format_expr(i) for i in subscripts)})"
    text = f"{lhs} {s.op}{'!' if s.init else ''} {format_expr(s.rhs)}"
    if s.where:
        text += " where " + ", ".join(_where(w) for w in s.where)
    return text


def _where(w: ast.WhereClause) -> str:
    if isinstance(w, ast.RangeConstraint):
        return f"{w.index} in {format_expr(w.lo)}:{format_expr(w.hi)}"
    if isinstance(w, ast.Exists):
        return f"exists {format_expr(w.access)}"
    return f"{w.name} = {format_expr(w.value)}"


def format_expr(e: ast.Expr) -> str:
    return _expr(e, _TERNARY)


def _expr(e: ast.Expr, context: int) -> str:
    """`context` is the precedence the surrounding position requires."""
    if isinstance(e, ast.Number):
        return e.text
    if isinstance(e, ast.Name):
        return e.name
    if isinstance(e, ast.DimOf):
        return f"{e.tensor}.{e.dim}"
    if isinstance(e, ast.Call):
        return f"{e.name}({', '.join(_expr(a, _TERNARY) for a in e.args)})"
    if isinstance(e, ast.Unary):
        text, prec = f"{e.op}{_expr(e.operand, _UNARY)}", _UNARY
        if e.op in "-+" and text[1:2] == e.op:   # keep "- -x" from printing as "--x"
            text = f"{e.op}({_expr(e.operand, _TERNARY)})"
    elif isinstance(e, ast.Binary):
        prec = _PRECEDENCE[e.op]
        # Left-associative: the right operand needs strictly higher precedence.
        text = f"{_expr(e.lhs, prec)} {e.op} {_expr(e.rhs, prec + 1)}"
    else:
        prec = _TERNARY
        text = (f"{_expr(e.cond, _TERNARY + 1)} ? {_expr(e.then, _TERNARY)}"
                f" : {_expr(e.other, _TERNARY)}")
    return f"({text})" if prec < context else text
