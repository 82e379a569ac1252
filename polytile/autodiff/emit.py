"""Size expressions printed back as TC range bounds (typed expressions print with
polytile.sema.printer.format_expr, which writes TC).

The derived programs go through the front end again, so a bound must parse to the
same size: `SizeExpr.__str__` writes `floor(a/b)`, which is not TC; here a division of
sizes is `/` (which rounds down in a range bound) and a ceiling becomes one.
"""
from __future__ import annotations

from polytile.sema.sizes import Atom, Div, SizeExpr, Sym


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
    # TC's min and max take two arguments: min(a, b, c) nests as min(a, min(b, c)).
    name = "max" if a.is_max else "min"
    text = size(a.args[-1])
    for x in reversed(a.args[:-1]):
        text = f"{name}({size(x)}, {text})"
    return text
