"""Exact symbolic integer expressions over size names and integer scalar arguments.

Range inference (TC §3.1) produces extents such as `M - N + 1`, `ceil(N/123)` or
`floor((H - KH)/2) + 1`; they are kept symbolic so `polytile check` can print
them, and evaluated exactly (integer floor/ceil, no float math) once the sizes of
a call are known. A `SizeExpr` is a polynomial with integer coefficients whose
atoms are symbols and floor/ceil divisions, min and max of other SizeExprs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Union

from polytile.errors import RangeInferenceError


@dataclass(frozen=True, order=True)
class Sym:
    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Div:
    """floor(num/den) or ceil(num/den); den must evaluate to a positive integer."""

    num: "SizeExpr"
    den: "SizeExpr"
    ceil: bool

    def __str__(self) -> str:
        return f"{'ceil' if self.ceil else 'floor'}({self.num.paren()}/{self.den.paren()})"


@dataclass(frozen=True)
class Extreme:
    """min(args) or max(args)."""

    args: tuple["SizeExpr", ...]
    is_max: bool

    def __str__(self) -> str:
        return f"{'max' if self.is_max else 'min'}({', '.join(str(a) for a in self.args)})"


Atom = Union[Sym, Div, Extreme]
Monomial = tuple[Atom, ...]          # sorted by str; () is the constant term


def _key(atom: Atom) -> str:
    return str(atom)


@dataclass(frozen=True)
class SizeExpr:
    terms: tuple[tuple[Monomial, int], ...]  # no zero coefficients, constant term excluded
    const: int = 0

    # ------------------------------------------------------------ construction
    @staticmethod
    def const_(value: int) -> "SizeExpr":
        return SizeExpr((), int(value))

    @staticmethod
    def sym(name: str) -> "SizeExpr":
        return SizeExpr((((Sym(name),), 1),), 0)

    @staticmethod
    def _atom(atom: Atom) -> "SizeExpr":
        return SizeExpr((((atom,), 1),), 0)

    @staticmethod
    def _from(terms: Mapping[Monomial, int], const: int) -> "SizeExpr":
        items = [(m, c) for m, c in terms.items() if c != 0]
        items.sort(key=lambda mc: (mc[1] < 0, [_key(a) for a in mc[0]]))
        return SizeExpr(tuple(items), const)

    # ------------------------------------------------------------ queries
    @property
    def is_const(self) -> bool:
        return not self.terms

    @property
    def symbols(self) -> frozenset[str]:
        out: set[str] = set()
        for mono, _ in self.terms:
            for atom in mono:
                if isinstance(atom, Sym):
                    out.add(atom.name)
                elif isinstance(atom, Div):
                    out |= atom.num.symbols | atom.den.symbols
                else:
                    for a in atom.args:
                        out |= a.symbols
        return frozenset(out)

    # ------------------------------------------------------------ arithmetic
    def __add__(self, other: "SizeExpr | int") -> "SizeExpr":
        other = _lift(other)
        merged = dict(self.terms)
        for m, c in other.terms:
            merged[m] = merged.get(m, 0) + c
        return SizeExpr._from(merged, self.const + other.const)

    __radd__ = __add__

    def __neg__(self) -> "SizeExpr":
        return SizeExpr._from({m: -c for m, c in self.terms}, -self.const)

    def __sub__(self, other: "SizeExpr | int") -> "SizeExpr":
        return self + (-_lift(other))

    def __rsub__(self, other: int) -> "SizeExpr":
        return _lift(other) - self

    def __mul__(self, other: "SizeExpr | int") -> "SizeExpr":
        other = _lift(other)
        merged: dict[Monomial, int] = {}
        const = self.const * other.const
        lhs = list(self.terms) + [((), self.const)]
        rhs = list(other.terms) + [((), other.const)]
        for m1, c1 in lhs:
            for m2, c2 in rhs:
                mono = tuple(sorted(m1 + m2, key=_key))
                if mono:
                    merged[mono] = merged.get(mono, 0) + c1 * c2
        return SizeExpr._from(merged, const)

    __rmul__ = __mul__

    def floordiv(self, den: "SizeExpr | int") -> "SizeExpr":
        return _divide(self, _lift(den), ceil=False)

    def ceildiv(self, den: "SizeExpr | int") -> "SizeExpr":
        return _divide(self, _lift(den), ceil=True)

    # ------------------------------------------------------------ evaluation
    def evaluate(self, env: Mapping[str, int]) -> int:
        total = self.const
        for mono, c in self.terms:
            value = c
            for atom in mono:
                value *= _eval_atom(atom, env)
            total += value
        return total

    def substitute(self, env: Mapping[str, "SizeExpr"]) -> "SizeExpr":
        total = SizeExpr.const_(self.const)
        for mono, c in self.terms:
            value = SizeExpr.const_(c)
            for atom in mono:
                value = value * _subst_atom(atom, env)
            total = total + value
        return total

    # ------------------------------------------------------------ printing
    def __str__(self) -> str:
        parts: list[str] = []
        for mono, c in self.terms:
            body = "*".join(str(a) for a in mono)
            mag = abs(c)
            text = body if mag == 1 else f"{mag}*{body}"
            if parts:
                parts.append(("- " if c < 0 else "+ ") + text)
            else:
                parts.append(("-" if c < 0 else "") + text)
        if self.const or not parts:
            if parts:
                parts.append(("- " if self.const < 0 else "+ ") + str(abs(self.const)))
            else:
                parts.append(str(self.const))
        return " ".join(parts)

    def paren(self) -> str:
        """The text, parenthesized unless it is a single atom or number."""
        text = str(self)
        simple = self.is_const and self.const >= 0 or (
            len(self.terms) == 1 and self.const == 0 and self.terms[0][1] == 1
            and len(self.terms[0][0]) == 1)
        return text if simple else f"({text})"


def _lift(value: "SizeExpr | int") -> SizeExpr:
    return value if isinstance(value, SizeExpr) else SizeExpr.const_(value)


def _divide(num: SizeExpr, den: SizeExpr, ceil: bool) -> SizeExpr:
    if den.is_const:
        d = den.const
        if d <= 0:
            raise ValueError("division of a size by a non-positive constant")
        if d == 1 or num == SizeExpr.const_(0):
            return num
        if num.is_const:
            return SizeExpr.const_(-(-num.const // d) if ceil else num.const // d)
        if all(c % d == 0 for _, c in num.terms):
            # (d*X + c)/d = X + (c/d rounded)
            quotient = SizeExpr._from({m: c // d for m, c in num.terms}, 0)
            return quotient + (-(-num.const // d) if ceil else num.const // d)
    if num == den:
        return SizeExpr.const_(1)
    if num == SizeExpr.const_(0):
        return num
    return SizeExpr._atom(Div(num, den, ceil))


def extreme(args: list[SizeExpr], is_max: bool) -> SizeExpr:
    """min/max, flattening nested ones and dropping arguments that provably lose."""
    flat: list[SizeExpr] = []
    for a in args:
        if (len(a.terms) == 1 and a.const == 0 and a.terms[0][1] == 1
                and len(a.terms[0][0]) == 1 and isinstance(a.terms[0][0][0], Extreme)
                and a.terms[0][0][0].is_max == is_max):
            flat.extend(a.terms[0][0][0].args)
        else:
            flat.append(a)
    kept: list[SizeExpr] = []
    for a in flat:
        dominated = False
        for i, b in enumerate(kept):
            diff = a - b
            if diff.is_const:
                if (diff.const > 0) == is_max and diff.const != 0:
                    kept[i] = a
                dominated = True
                break
        if not dominated:
            kept.append(a)
    if len(kept) == 1:
        return kept[0]
    kept.sort(key=str)
    return SizeExpr._atom(Extreme(tuple(kept), is_max))


def extent(lo: SizeExpr, hi_inclusive: SizeExpr) -> SizeExpr:
    """hi - lo + 1, written `ceil(X/c)` when it has the form floor((X - 1)/c) + 1."""
    result = hi_inclusive - lo + 1
    if result.const == 1 and len(result.terms) == 1 and result.terms[0][1] == 1:
        (atom,) = result.terms[0][0] if len(result.terms[0][0]) == 1 else (None,)
        if isinstance(atom, Div) and not atom.ceil and atom.num.const == -1:
            return SizeExpr._atom(Div(atom.num + 1, atom.den, ceil=True))
    return result


def _eval_atom(atom: Atom, env: Mapping[str, int]) -> int:
    if isinstance(atom, Sym):
        if atom.name not in env:
            raise RangeInferenceError(f"size {atom.name} is not known")
        return int(env[atom.name])
    if isinstance(atom, Div):
        num, den = atom.num.evaluate(env), atom.den.evaluate(env)
        if den <= 0:
            raise RangeInferenceError(
                f"{atom.den} must be positive (it is {den}): it divides {atom.num} "
                "in a range computed from a subscript")
        return -(-num // den) if atom.ceil else num // den
    values = [a.evaluate(env) for a in atom.args]
    return max(values) if atom.is_max else min(values)


def _subst_atom(atom: Atom, env: Mapping[str, SizeExpr]) -> SizeExpr:
    if isinstance(atom, Sym):
        return env.get(atom.name, SizeExpr._atom(atom))
    if isinstance(atom, Div):
        return _divide(atom.num.substitute(env), atom.den.substitute(env), atom.ceil)
    return extreme([a.substitute(env) for a in atom.args], atom.is_max)


def tc_text(s: SizeExpr, paren: bool = False) -> str:
    """A size expression as TC source (`str` writes `floor(a/b)`, which is not TC): a
    division of sizes is `/` (which rounds down in a range bound), a ceiling becomes
    one, and min and max nest (TC's take two arguments). With `paren`, a sum is
    parenthesized."""
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
            return f"(({tc_text(a.num + a.den - 1)}) / {tc_text(a.den, paren=True)})"
        return f"({tc_text(a.num, paren=True)} / {tc_text(a.den, paren=True)})"
    # TC's min and max take two arguments: min(a, b, c) nests as min(a, min(b, c)).
    name = "max" if a.is_max else "min"
    text = tc_text(a.args[-1])
    for x in reversed(a.args[:-1]):
        text = f"{name}({tc_text(x)}, {text})"
    return text
