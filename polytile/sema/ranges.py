"""Range inference, exactly as TC §3.1.

For one statement: explicit `where i in lo:hi` ranges come first. Then, in rounds,
every affine subscript that holds a single unresolved index yields the maximal
interval for that index that keeps the subscript inside the tensor's extent *for
all values* of the already resolved indices (universal quantification), and
intervals found for the same index in the same round are intersected. Indices
start at 0 unless a `where` says otherwise. Arithmetic is exact: floor and ceil
divisions of symbolic sizes, never floats.

Across the function (§3.1: "across all the affine array accesses in a TC
function"), a left-hand index that nothing on its right constrains takes its
range from the shape of the tensor it writes, as fixed by another statement
(`C(i) = 0` in mv).
"""
from __future__ import annotations

from dataclasses import dataclass

from polytile.errors import RangeInferenceError, SourceLoc
from polytile.sema import program as P
from polytile.sema.sizes import SizeExpr, extent, extreme

ZERO = SizeExpr.const_(0)


@dataclass(frozen=True)
class Linear:
    """sum(coeff[i] * i) + const; coefficients and constant are symbolic sizes."""

    coeffs: tuple[tuple[str, SizeExpr], ...]
    const: SizeExpr

    def coeff(self, name: str) -> SizeExpr | None:
        return dict(self.coeffs).get(name)

    @property
    def indices(self) -> frozenset[str]:
        return frozenset(n for n, _ in self.coeffs)


def linearize(e: P.TExpr) -> Linear | None:
    """The affine form of an integer expression, or None when it is not affine
    (reads a tensor, divides, ...)."""
    if isinstance(e, P.Const) and isinstance(e.value, int) and not isinstance(e.value, bool):
        return Linear((), SizeExpr.const_(e.value))
    if isinstance(e, P.IndexVar):
        return Linear(((e.name, SizeExpr.const_(1)),), ZERO)
    if isinstance(e, P.SizeVal):
        return Linear((), e.expr)
    if isinstance(e, P.ScalarArg) and e.dtype.is_integral:
        return Linear((), SizeExpr.sym(e.name))
    if not isinstance(e, P.Op):
        return None
    if e.op == "cast" and e.dtype.is_integral:
        inner = e.args[0]
        return linearize(inner) if inner.dtype.is_integral else None
    parts = [linearize(a) for a in e.args]
    if any(p is None for p in parts):
        return None
    if e.op == "neg":
        return _scale(parts[0], SizeExpr.const_(-1))  # type: ignore[arg-type]
    if e.op in ("add", "sub"):
        a, b = parts
        return _add(a, _scale(b, SizeExpr.const_(-1)) if e.op == "sub" else b)  # type: ignore
    if e.op == "mul":
        a, b = parts
        if not a.coeffs:  # type: ignore[union-attr]
            return _scale(b, a.const)  # type: ignore[union-attr,arg-type]
        if not b.coeffs:  # type: ignore[union-attr]
            return _scale(a, b.const)  # type: ignore[union-attr,arg-type]
    return None


def bound(e: P.TExpr) -> SizeExpr | None:
    """A range bound: an expression of sizes, constants and integer arguments, with
    `/` (rounding down; the divisor must be positive) and `min`/`max` besides sums
    and products; None otherwise."""
    lin = linearize(e)
    if lin is not None:
        return None if lin.coeffs else lin.const
    ops = ("add", "sub", "mul", "neg", "div", "fmin", "fmax")
    if not isinstance(e, P.Op) or e.op not in ops or not e.dtype.is_integral:
        return None
    parts = [bound(a) for a in e.args]
    if any(p is None for p in parts):
        return None
    if e.op == "neg":
        return -parts[0]                              # type: ignore[operator]
    a, b = parts
    assert a is not None and b is not None
    if e.op == "div":     # a divisor that is not positive is refused when evaluated
        return None if b.is_const and b.const <= 0 else a.floordiv(b)
    if e.op in ("fmin", "fmax"):
        return extreme([a, b], is_max=e.op == "fmax")
    return a + b if e.op == "add" else a - b if e.op == "sub" else a * b


def _scale(x: Linear, factor: SizeExpr) -> Linear:
    coeffs = tuple((n, c * factor) for n, c in x.coeffs)
    return Linear(tuple((n, c) for n, c in coeffs if c != ZERO), x.const * factor)


def _add(a: Linear, b: Linear) -> Linear:
    merged = dict(a.coeffs)
    for n, c in b.coeffs:
        merged[n] = merged[n] + c if n in merged else c
    return Linear(tuple(sorted((n, c) for n, c in merged.items() if c != ZERO)),
                  a.const + b.const)


def _positive(c: SizeExpr) -> bool:
    """Sign of a coefficient: constants are known; a symbolic one (a scalar argument
    such as a stride) is taken positive and checked when the call binds it."""
    return c.const > 0 if c.is_const else True


def _bounds(lin: Linear, ranges: dict[str, P.Range], skip: str) -> tuple[SizeExpr, SizeExpr]:
    """min and max of lin without the `skip` term, over the resolved ranges."""
    lo = hi = lin.const
    for name, c in lin.coeffs:
        if name == skip:
            continue
        r = ranges[name]
        first, last = r.lo, r.hi - 1
        if _positive(c):
            lo, hi = lo + c * first, hi + c * last
        else:
            lo, hi = lo + c * last, hi + c * first
    return lo, hi


def solve(lin: Linear, index: str, extent: SizeExpr,
          ranges: dict[str, P.Range]) -> P.Range:
    """Maximal [lo, hi) of `index` with 0 <= lin < extent for all values of the others."""
    a = lin.coeff(index)
    assert a is not None
    rest_lo, rest_hi = _bounds(lin, ranges, index)
    if _positive(a):
        lo = (-rest_lo).ceildiv(a)
        hi_incl = (extent - 1 - rest_hi).floordiv(a)
    else:
        b = -a
        lo = (rest_hi - extent + 1).ceildiv(b)
        hi_incl = rest_lo.floordiv(b)
    return P.Range(extreme([ZERO, lo], is_max=True), exclusive(hi_incl))


def exclusive(hi_incl: SizeExpr) -> SizeExpr:
    """hi + 1, written ceil(X/c) when hi = floor((X - 1)/c)."""
    return extent(ZERO, hi_incl)


def intersect(a: P.Range, b: P.Range) -> P.Range:
    return P.Range(extreme([a.lo, b.lo], is_max=True), extreme([a.hi, b.hi], is_max=False))


@dataclass(frozen=True)
class Access:
    tensor: str
    subscripts: tuple[P.TExpr, ...]
    loc: SourceLoc


@dataclass(frozen=True)
class StatementInfo:
    """What range inference needs from one statement."""

    lhs_tensor: str
    lhs_indices: tuple[str, ...]
    indices: tuple[str, ...]                  # all, in order of first appearance
    accesses: tuple[Access, ...]              # right-hand side reads and `exists` clauses
    where: tuple[tuple[str, P.Range], ...]
    index_locs: tuple[tuple[str, SourceLoc], ...]
    loc: SourceLoc


def infer_statement(info: StatementInfo, shapes: dict[str, tuple[SizeExpr, ...]]
                    ) -> tuple[dict[str, P.Range], set[str]]:
    """Run the rounds; returns the resolved ranges and the still unresolved indices."""
    ranges: dict[str, P.Range] = dict(info.where)
    unresolved = {i for i in info.indices if i not in ranges}
    accesses = [a for a in info.accesses if a.tensor in shapes]
    lhs_shape = shapes.get(info.lhs_tensor)
    while unresolved:
        found = _round(accesses, shapes, ranges, unresolved)
        if not found and lhs_shape is not None:
            # Whole-function inference: the written tensor's shape bounds its indices.
            found = {i: P.Range(ZERO, lhs_shape[d]) for d, i in enumerate(info.lhs_indices)
                     if i in unresolved}
        if not found:
            break
        ranges.update(found)
        unresolved -= set(found)
    return ranges, unresolved


def _round(accesses: list[Access], shapes: dict[str, tuple[SizeExpr, ...]],
           ranges: dict[str, P.Range], unresolved: set[str]) -> dict[str, P.Range]:
    found: dict[str, P.Range] = {}
    for access in accesses:
        shape = shapes[access.tensor]
        for sub, size in zip(access.subscripts, shape):
            lin = linearize(sub)
            if lin is None:
                continue
            open_ = lin.indices & unresolved
            if len(open_) != 1:
                continue
            (index,) = open_
            r = solve(lin, index, size, ranges)
            found[index] = intersect(found[index], r) if index in found else r
    return found


def explain_unresolved(info: StatementInfo, unresolved: set[str],
                       shapes: dict[str, tuple[SizeExpr, ...]]) -> RangeInferenceError:
    """The error for the first index inference could not resolve."""
    locs = dict(info.index_locs)
    index = next(i for i in info.indices if i in unresolved)
    loc = locs.get(index, info.loc)
    hint = f"add a where clause, e.g. `where {index} in 0:N`"
    for access in info.accesses:
        for sub in access.subscripts:
            lin = linearize(sub)
            if lin is not None and index in lin.indices and len(lin.indices & unresolved) > 1:
                others = ", ".join(sorted(lin.indices & unresolved - {index}))
                return RangeInferenceError(
                    f"range of {index} is ambiguous: it is only used together with "
                    f"{others} in {access.tensor}(...)", loc, hint)
    if index in info.lhs_indices and info.lhs_tensor not in shapes:
        return RangeInferenceError(
            f"range of {index} cannot be inferred: nothing on the right-hand side bounds it "
            f"and no other statement fixes the shape of {info.lhs_tensor}", loc, hint)
    return RangeInferenceError(f"range of {index} is unconstrained: no affine subscript of a "
                               "tensor with a known shape bounds it", loc, hint)
