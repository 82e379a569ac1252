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

(with `+=!` the first statement goes: the temporary starts at the identity). A scatter
(`O(i, i) += ...`, `dX(h + r) += ...`), which may add into any element, copies the whole
tensor in and out. Not rewritten: `min=`/`max=` (exact in any type), a statement without
reduction indices (one rounding either way), and a statement that reads its own tensor.
"""
from __future__ import annotations

from dataclasses import replace

from polytile import dtypes
from polytile.dtypes import DType
from polytile.sema import program as P
from polytile.sema import typing as T
from polytile.sema.sizes import SizeExpr
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
        if st.scatter:          # any element: all of them, over indices of their own
            over = tuple((f"w{k}", P.Range(SizeExpr.const_(0), size))
                         for k, size in enumerate(tensor.shape))
            bound_over = tuple((f"w{k}", 0, n) for k, n in enumerate(spec.shape(st.tensor)))
        else:
            over = tuple((n, r) for n, r in st.ranges if n in st.indices)
            bound_over = tuple(r for r in bound if r[0] in st.indices)
        if not st.init:
            statements.append(_copy(over, st, wide, st.tensor, tensor.dtype, dtypes.FLOAT32))
            ranges.append(bound_over)
        statements.append(replace(st, tensor=wide))
        ranges.append(bound)
        statements.append(_copy(over, st, st.tensor, wide, dtypes.FLOAT32, tensor.dtype))
        ranges.append(bound_over)
    widened = replace(fn, temps=tuple(temps), statements=tuple(statements))
    return replace(spec, fn=widened, shapes=tuple(shapes.items()), ranges=tuple(ranges))


def _copy(over: tuple[tuple[str, P.Range], ...], st: P.Statement, into: str, source: str,
          source_type: DType, to: DType) -> P.Statement:
    """`into(i...) = to(source(i...))` for the indices and ranges `over` (of `st`'s
    left-hand side, or of the whole tensor)."""
    names = tuple(n for n, _ in over)
    at = tuple(P.IndexVar(n, T.INDEX) for n in names)
    value = P.Op("cast", (P.Read(source, at, source_type, st.loc),), to, st.loc)
    return P.Statement(into, names, "=", False, value, over, st.loc)


def _narrow_reduction(fn: P.Function, st: P.Statement) -> bool:
    return (st.op in ("+=", "*=") and bool(st.reduction_indices)
            and fn.tensor(st.tensor).dtype in NARROW
            and all(r.tensor != st.tensor for r in T.reads(st.rhs)))


def _fresh(base: str, taken: set[str]) -> str:
    name, n = base, 1
    while name in taken:
        name, n = f"{base}_{n}", n + 1
    taken.add(name)
    return name
