"""Specialize a Function to the sizes of one call (TC's JIT size specialization).

    spec = specialize(fn, shapes={"A": (128, 64), ...}, scalars={"sh": 2})

binds every size name, checks that sizes agree across arguments, evaluates every
range and shape exactly, rejects empty ranges and proves every affine access in
bounds over the (rectangular) iteration domain. Subscripts that are not affine
(gathers, divisions) are left to the run-time checks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from polytile.errors import ArgumentError, OutOfBoundsError, RangeInferenceError, SourceLoc
from polytile.sema import program as P
from polytile.sema import ranges as R
from polytile.sema import typing as T


@dataclass(frozen=True)
class Specialized:
    fn: P.Function
    env: tuple[tuple[str, int], ...]                           # sizes and integer scalars
    shapes: tuple[tuple[str, tuple[int, ...]], ...]            # every tensor
    ranges: tuple[tuple[tuple[str, int, int], ...], ...]       # per statement: (index, lo, hi)

    def shape(self, tensor: str) -> tuple[int, ...]:
        return dict(self.shapes)[tensor]

    @property
    def sizes(self) -> dict[str, int]:
        return dict(self.env)


def bind_sizes(fn: P.Function, shapes: Mapping[str, tuple[int, ...]],
               scalars: Mapping[str, int | float]) -> dict[str, int]:
    env: dict[str, int] = {}
    origin: dict[str, str] = {}
    for p in fn.params:
        if p.kind != "input":
            continue
        actual = tuple(shapes[p.name])
        if len(actual) != len(p.shape):
            raise ArgumentError(f"{p.name} must have {len(p.shape)} dimensions, got "
                                f"{len(actual)} (shape {actual})", p.loc)
        for d, (expr, size) in enumerate(zip(p.shape, actual)):
            if expr.is_const:
                if expr.const != size:
                    raise ArgumentError(f"dimension {d} of {p.name} must be {expr.const}, "
                                        f"got {size}", p.loc)
                continue
            name = str(expr)
            if name in env and env[name] != size:
                raise ArgumentError(f"size {name} is {env[name]} from {origin[name]} but "
                                    f"{size} from {p.name}", p.loc,
                                    "arguments that share a size name must agree")
            env.setdefault(name, size)
            origin.setdefault(name, p.name)
    for p in fn.params:
        if p.kind == "scalar" and p.dtype.is_integral:
            if p.name not in scalars:
                raise ArgumentError(f"integer argument {p.name} of {fn.name} is not given",
                                    p.loc, "sizes and ranges may depend on it")
            env[p.name] = int(scalars[p.name])
    return env


def specialize(fn: P.Function, shapes: Mapping[str, tuple[int, ...]],
               scalars: Mapping[str, int | float]) -> Specialized:
    env = bind_sizes(fn, shapes, scalars)
    # Ranges first: an empty range explains a negative output shape better than the shape.
    all_ranges: list[tuple[tuple[str, int, int], ...]] = []
    for st in fn.statements:
        ranges: list[tuple[str, int, int]] = []
        for name, r in st.ranges:
            lo, hi = _evaluate(r.lo, env, name, st.loc), _evaluate(r.hi, env, name, st.loc)
            # An empty range (a size of 0) means no iterations, as in NumPy; a negative
            # one means the tensors are too small for the access pattern.
            if hi < lo:
                raise RangeInferenceError(
                    f"range of {name} is empty ({lo}:{hi} ends before it starts) for sizes "
                    f"{_show_env(env)}",
                    st.loc,
                    "the tensors are too small for this access pattern; check the sizes, or "
                    f"give the range with a where clause, e.g. `where {name} in lo:hi`")
            ranges.append((name, lo, hi))
        all_ranges.append(tuple(ranges))
    tensor_shapes: dict[str, tuple[int, ...]] = {}
    for t in fn.params + fn.outputs + fn.temps:
        tensor_shapes[t.name] = tuple(_evaluate(e, env, t.name, t.loc) for e in t.shape)
        if any(s < 0 for s in tensor_shapes[t.name]):
            raise RangeInferenceError(f"{t.name} would have shape {tensor_shapes[t.name]} for "
                                      f"sizes {_show_env(env)}", t.loc)
    for st, bounds in zip(fn.statements, all_ranges):
        _check_bounds(st, {n: (lo, hi) for n, lo, hi in bounds}, tensor_shapes, env)
    return Specialized(fn, tuple(env.items()), tuple(tensor_shapes.items()),
                       tuple(all_ranges))


def _evaluate(expr, env: dict[str, int], what: str,  # type: ignore[no-untyped-def]
              loc: SourceLoc) -> int:
    try:
        return expr.evaluate(env)
    except RangeInferenceError as err:
        raise RangeInferenceError(f"{what}: {err.message}", loc, err.hint) from None


def _show_env(env: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in env.items())


def _check_bounds(st: P.Statement, ranges: dict[str, tuple[int, int]],
                  shapes: dict[str, tuple[int, ...]], env: dict[str, int]) -> None:
    """Every affine subscript stays inside its tensor for every iteration (the domain is a
    box, so the extremes of an affine function are exact)."""
    empty = {name for name, (lo, hi) in ranges.items() if hi == lo}
    # Over an empty range nothing is read; the left side is still written (initialized)
    # when only reduction ranges are empty.
    if st.scatter:
        accesses = [] if empty else [(st.tensor, st.scatter, st.loc)]
    elif empty & set(st.indices):
        accesses = []
    else:
        accesses = [(st.tensor, tuple(P.IndexVar(i, T.INDEX) for i in st.indices), st.loc)]
    if not empty:
        # Reads in a scatter's own subscripts (`d_A(X(1)) += ...`) as well as the value's.
        accesses += [(r.tensor, r.indices, r.loc)
                     for e in (*st.scatter, st.rhs) for r in T.reads(e)]
    for tensor, subs, loc in accesses:
        shape = shapes[tensor]
        for d, sub in enumerate(subs):
            lin = R.linearize(sub)
            if lin is None:
                continue
            lo = hi = lin.const.evaluate(env)
            for name, c in lin.coeffs:
                coeff = c.evaluate(env)
                first, last = ranges[name][0], ranges[name][1] - 1
                lo += min(coeff * first, coeff * last)
                hi += max(coeff * first, coeff * last)
            if lo < 0 or hi >= shape[d]:
                bad = lo if lo < 0 else hi
                raise OutOfBoundsError(
                    f"{tensor} is accessed at {bad} in dimension {d}, outside 0:{shape[d]} "
                    f"(sizes {_show_env(env)})", loc,
                    "restrict the index with a where clause or fix the subscript")
