"""Reductions into float16 and bfloat16 tensors sum (or multiply) in float32.

That is the language's rule (docs/language.md, "Types and casts"): the reference
interpreter reduces a `+=` or `*=` over its reduction indices in float32 and rounds the
result once. The compiled code adds each term into the 16-bit element instead unless
told otherwise (a bfloat16 sum of 108 terms came out 46% off: found by the gradient
fuzzer, seed 99), so before lowering each such statement reduces into a float32
temporary of the tensor's shape, which is rounded into the tensor at the end:

    O(k) += A(k, j)                 O_f32(k) = float(O(k))
                            ->      O_f32(k) += A(k, j)
                                    O(k) = bfloat16(O_f32(k))

(with `+=!` the first statement goes: the temporary starts at the identity). Not
rewritten: `min=`/`max=` (exact in any type), a statement without reduction indices
(one rounding either way), a scatter, and a statement that reads its own tensor.
"""
from __future__ import annotations

from dataclasses import replace

from polytile import dtypes
from polytile.dtypes import DType
from polytile.sema import program as P
from polytile.sema import typing as T
from polytile.sema.specialize import Specialized

NARROW = (dtypes.FLOAT16, dtypes.BFLOAT16)


def widen_reductions(spec: Specialized) -> Specialized:
    """`spec` with every narrow-float reduction summed in a float32 temporary."""
    fn = spec.fn
    if not any(_narrow_reduction(fn, st) for st in fn.statements):
        return spec
    taken = {t.name for t in fn.params + fn.outputs + fn.temps}
    statements: list[P.Statement] = []
    ranges: list[tuple[tuple[str, int, int], ...]] = []
    temps, shapes = list(fn.temps), dict(spec.shapes)
    for st, bound in zip(fn.statements, spec.ranges):
        if not _narrow_reduction(fn, st):
            statements.append(st)
            ranges.append(bound)
            continue
        tensor = fn.tensor(st.tensor)
        wide = _fresh(f"{st.tensor}_f32", taken)
        temps.append(P.Tensor(wide, dtypes.FLOAT32, tensor.shape, "temp", tensor.loc))
        shapes[wide] = spec.shape(st.tensor)
        bound_lhs = bound[:len(st.indices)]        # the left-hand indices come first
        if not st.init:
            statements.append(_copy(st, wide, st.tensor, tensor.dtype, dtypes.FLOAT32))
            ranges.append(bound_lhs)
        statements.append(replace(st, tensor=wide))
        ranges.append(bound)
        statements.append(_copy(st, st.tensor, wide, dtypes.FLOAT32, tensor.dtype))
        ranges.append(bound_lhs)
    widened = replace(fn, temps=tuple(temps), statements=tuple(statements))
    return replace(spec, fn=widened, shapes=tuple(shapes.items()), ranges=tuple(ranges))


def _copy(st: P.Statement, into: str, source: str, source_type: DType,
          to: DType) -> P.Statement:
    """`into(lhs) = to(source(lhs))` over the left-hand indices of `st`."""
    lhs = tuple(P.IndexVar(i, T.INDEX) for i in st.indices)
    value = P.Op("cast", (P.Read(source, lhs, source_type, st.loc),), to, st.loc)
    return P.Statement(into, st.indices, "=", False, value, st.ranges[:len(st.indices)],
                       st.loc)


def _narrow_reduction(fn: P.Function, st: P.Statement) -> bool:
    return (st.op in ("+=", "*=") and bool(st.reduction_indices) and not st.scatter
            and fn.tensor(st.tensor).dtype in NARROW
            and all(r.tensor != st.tensor for r in T.reads(st.rhs)))


def _fresh(base: str, taken: set[str]) -> str:
    name, n = base, 1
    while name in taken:
        name, n = f"{base}_{n}", n + 1
    taken.add(name)
    return name
