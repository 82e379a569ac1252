"""Typed expressions and ranges printed back as TC source.

The derived programs go through the front end again, so what is printed must parse
and type to the same expression: literals print in a form that TC types weakly (they
take the type of the tensor they meet), casts as the type called on the value.
"""
from __future__ import annotations

from polytile.ir import intrinsics
from polytile.sema import program as P
from polytile.sema.sizes import Atom, Div, SizeExpr, Sym

_SYMBOL = {v: k for k, v in intrinsics.BINARY_SYMBOLS.items()}
_PRECEDENCE = {"or": 1, "and": 2, "eq": 3, "ne": 3, "lt": 4, "le": 4, "gt": 4, "ge": 4,
               "add": 5, "sub": 5, "mul": 6, "div": 6, "mod": 6}
_UNARY = 7


def expr(e: P.TExpr, context: int = 0) -> str:
    """TC text; parentheses only where precedence needs them."""
    if isinstance(e, P.Const):
        if isinstance(e.value, bool):
            return "(0 == 0)" if e.value else "(0 != 0)"
        text = repr(e.value)
        return f"({text})" if text.startswith("-") and context >= _UNARY else text
    if isinstance(e, (P.IndexVar, P.ScalarArg)):
        return e.name
    if isinstance(e, P.SizeVal):
        return size(e.expr, paren=True)
    if isinstance(e, P.Read):
        return f"{e.tensor}({', '.join(expr(i) for i in e.indices)})"
    if e.op in _SYMBOL:
        prec = _PRECEDENCE[e.op]
        text = f"{expr(e.args[0], prec)} {_SYMBOL[e.op]} {expr(e.args[1], prec + 1)}"
        return f"({text})" if prec < context else text
    if e.op in ("neg", "not"):
        return ("-" if e.op == "neg" else "!") + expr(e.args[0], _UNARY + 1)
    if e.op == "select":
        text = f"{expr(e.args[0], 1)} ? {expr(e.args[1])} : {expr(e.args[2])}"
        return f"({text})" if context > 0 else text
    if e.op == "ident":
        return expr(e.args[0], context)
    name = str(e.dtype) if e.op == "cast" else e.op
    return f"{name}({', '.join(expr(a) for a in e.args)})"


def size(s: SizeExpr, paren: bool = False) -> str:
    """A size expression as a TC range bound (`/` of sizes rounds down there)."""
    parts: list[str] = []
    for mono, c in s.terms:
        body = "*".join(_atom(a) for a in mono)
        text = body if abs(c) == 1 else f"{abs(c)}*{body}"
        parts.append(text if not parts and c > 0 else f"-{text}" if not parts
                     else f"{'-' if c < 0 else '+'} {text}")
    if s.const or not parts:
        parts.append(str(s.const) if not parts
                     else f"{'-' if s.const < 0 else '+'} {abs(s.const)}")
    text = " ".join(parts)
    return f"({text})" if paren and len(parts) > 1 else text


def _atom(a: Atom) -> str:
    if isinstance(a, Sym):
        return a.name
    if isinstance(a, Div):
        if a.ceil:      # ceil(n / d) = floor((n + d - 1) / d)
            return f"(({size(a.num + a.den - 1)}) / {size(a.den, paren=True)})"
        return f"({size(a.num, paren=True)} / {size(a.den, paren=True)})"
    return f"{'max' if a.is_max else 'min'}({', '.join(size(x) for x in a.args)})"
