"""The NumPy reference interpreter: TC semantics, the oracle for every test.

Statements run in order. A statement evaluates its right-hand side over the whole
iteration domain before writing anything (TC §3), converts it to the written
tensor's dtype, reduces over the reduction indices with the statement's operator
(the `!` forms start from the operator's identity; `max=`/`min=` propagate NaN
like NumPy's max/min) and combines it with the current content for the non-`!`
reductions. Large domains are evaluated in slices of the first left-hand index
so memory stays bounded; pure sums of products go through `np.einsum`.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from polytile import dtypes
from polytile.errors import OutOfBoundsError, SourceLoc
from polytile.ir import intrinsics
from polytile.sema import program as P
from polytile.sema import ranges as R
from polytile.sema.specialize import Specialized

_CHUNK_ELEMENTS = 1 << 22
_REDUCE = {"+=": np.sum, "*=": np.prod, "max=": np.max, "min=": np.min}
_COMBINE = {"+=": np.add, "*=": np.multiply, "max=": np.maximum, "min=": np.minimum}


def run(spec: Specialized, inputs: Mapping[str, np.ndarray | int | float],
        outputs: Mapping[str, np.ndarray]) -> None:
    """Execute spec.fn; `outputs` (and temporaries allocated here) are written in place.

    `inputs` maps every parameter name to an array of its declared dtype (scalars to
    Python or NumPy scalars); `outputs` maps every output to an array of its shape,
    already holding the initial value of in/out outputs.
    """
    fn = spec.fn
    env = spec.sizes
    tensors: dict[str, np.ndarray] = {}
    for p in fn.params:
        value = inputs[p.name]
        tensors[p.name] = np.asarray(value, dtype=p.dtype.numpy)
    tensors.update(outputs)
    for t in fn.temps:
        # As the compiled code: an element no statement writes reads as NaN (floats),
        # where a read of it shows, or 0 (docs/language.md, "Temporaries").
        fill = np.nan if t.dtype.is_float else 0
        tensors[t.name] = np.full(spec.shape(t.name), fill, dtype=t.dtype.numpy)
    for st, ranges in zip(fn.statements, spec.ranges):
        _run_statement(st, ranges, tensors, env)


def _run_statement(st: P.Statement, ranges: tuple[tuple[str, int, int], ...],
                   tensors: dict[str, np.ndarray], env: dict[str, int]) -> None:
    if st.scatter:
        _run_scatter(st, ranges, tensors, env)
        return
    target = tensors[st.tensor]
    n_lhs = len(st.indices)
    extents = [hi - lo for _, lo, hi in ranges]
    if 0 in extents:        # no iterations; a `!` reduction still starts at its identity
        if st.init and 0 not in extents[:n_lhs]:
            region = tuple(slice(lo, hi) for _, lo, hi in ranges[:n_lhs])
            target[region] = P.identity(st.op, dtypes.from_numpy(target.dtype))
        return
    per_row = int(np.prod(extents[1:])) if len(extents) > 1 else 1
    if n_lhs and per_row * extents[0] > _CHUNK_ELEMENTS:
        step = max(1, _CHUNK_ELEMENTS // max(per_row, 1))
    else:
        step = extents[0] if extents else 1
    name0, lo0, hi0 = ranges[0] if n_lhs else ("", 0, 1)
    # Evaluate every slice before writing any: the right-hand side may read the target.
    results = []
    for start in range(lo0, hi0, step):
        sliced = list(ranges)
        if n_lhs:
            sliced[0] = (name0, start, min(start + step, hi0))
        results.append((sliced, _evaluate_statement(st, tuple(sliced), tensors, env)))
    for sliced, value in results:
        region = tuple(slice(lo, hi) for _, lo, hi in sliced[:n_lhs])
        if st.op == "=" or st.init:
            target[region] = value
        else:
            target[region] = _combine(st.op, target[region], value, target.dtype)


def _run_scatter(st: P.Statement, ranges: tuple[tuple[str, int, int], ...],
                 tensors: dict[str, np.ndarray], env: dict[str, int]) -> None:
    """`T(f(i)) += e(i)`: every iteration adds into the element its subscripts name
    (np.add.at adds repeated elements once per iteration)."""
    if any(hi == lo for _, lo, hi in ranges):
        return
    shape = tuple(hi - lo for _, lo, hi in ranges)
    grid = _grid(ranges)
    target = tensors[st.tensor]
    wide = np.float32 if target.dtype.itemsize == 2 and target.dtype.kind not in "iu" \
        else target.dtype
    value = _cast(np.broadcast_to(np.asarray(_eval(st.rhs, grid, tensors, env)), shape),
                  np.dtype(wide))
    subs = tuple(np.broadcast_to(_subscript(x, d, target.shape[d], st.tensor, grid, tensors,
                                            env, st.loc), shape)
                 for d, x in enumerate(st.scatter))
    total = target.astype(wide)
    with np.errstate(all="ignore"):
        np.add.at(total, subs, value)
    target[...] = _cast(total, target.dtype)


def _combine(op: str, old: np.ndarray, new: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if dtype.itemsize == 2 and dtype.kind not in "iu":   # float16 / bfloat16
        with np.errstate(all="ignore"):
            return _COMBINE[op](old.astype(np.float32), new.astype(np.float32)).astype(dtype)
    with np.errstate(all="ignore"):
        return _COMBINE[op](old, new).astype(dtype)


def _evaluate_statement(st: P.Statement, ranges: tuple[tuple[str, int, int], ...],
                        tensors: dict[str, np.ndarray], env: dict[str, int]) -> np.ndarray:
    dtype = tensors[st.tensor].dtype
    n_lhs = len(st.indices)
    fast = _einsum(st, ranges, tensors, dtype)
    if fast is not None:
        return fast
    shape = tuple(hi - lo for _, lo, hi in ranges)
    grid = _grid(ranges)
    value = _eval(st.rhs, grid, tensors, env)
    value = np.broadcast_to(np.asarray(value), shape)
    wide = np.float32 if dtype.itemsize == 2 and dtype.kind not in "iu" else dtype
    value = _cast(value, np.dtype(wide))
    if len(ranges) > n_lhs:
        reduce_axes = tuple(range(n_lhs, len(ranges)))
        with np.errstate(all="ignore"):
            value = _REDUCE[st.op](value, axis=reduce_axes).astype(wide)
    return _cast(value, dtype)


def _grid(ranges: tuple[tuple[str, int, int], ...]) -> dict[str, np.ndarray]:
    """Each index's values, shaped to broadcast along its own axis of the iteration box."""
    return {name: np.arange(lo, hi, dtype=np.int64).reshape(
        [-1 if k == axis else 1 for k in range(len(ranges))])
        for axis, (name, lo, hi) in enumerate(ranges)}


def _cast(value: np.ndarray, dtype: np.dtype) -> np.ndarray:
    with np.errstate(all="ignore"):
        return value.astype(dtype)


def _einsum(st: P.Statement, ranges: tuple[tuple[str, int, int], ...],
            tensors: dict[str, np.ndarray], dtype: np.dtype) -> np.ndarray | None:
    """Sums of products of plainly indexed reads (matmul-like) via np.einsum."""
    if st.op != "+=" or not st.reduction_indices or dtype.kind != "f" or dtype.itemsize < 4:
        return None
    factors: list[P.TExpr] = []
    stack = [st.rhs]
    while stack:
        e = stack.pop()
        if isinstance(e, P.Op) and e.op == "mul":
            stack.extend(e.args)
        else:
            factors.append(e)
    letters = {name: chr(ord("a") + k) for k, (name, _, _) in enumerate(ranges)}
    bounds = {name: (lo, hi) for name, lo, hi in ranges}
    operands, subs = [], []
    for f in factors:
        if not isinstance(f, P.Read) or f.dtype.numpy != dtype:
            return None
        names = [x.name for x in f.indices if isinstance(x, P.IndexVar)]
        if len(names) != len(f.indices) or len(set(names)) != len(names):
            return None
        view = tensors[f.tensor][tuple(slice(*bounds[n]) for n in names)]
        operands.append(view)
        subs.append("".join(letters[n] for n in names))
    used = set("".join(subs))
    if any(letters[n] not in used for n, _, _ in ranges):
        return None
    out = "".join(letters[n] for n in st.indices)
    return np.einsum(",".join(subs) + "->" + out, *operands, optimize=True).astype(dtype)


def _subscript(x: P.TExpr, d: int, size: int, tensor: str, grid: dict[str, np.ndarray],
               tensors: dict[str, np.ndarray], env: dict[str, int],
               loc: SourceLoc | None = None) -> np.ndarray:
    """The values of subscript `x` of dimension `d`; one read from data is checked."""
    sub = _cast(np.asarray(_eval(x, grid, tensors, env)), np.dtype(np.int64))
    if R.linearize(x) is None and sub.size:
        bad = sub[(sub < 0) | (sub >= size)]
        if bad.size:
            raise OutOfBoundsError(
                f"{tensor} is indexed at {int(bad.flat[0])} in dimension {d}, outside 0:{size} "
                "(the index comes from data)", loc,
                "check the values of the index tensor")
    return sub


def _eval(e: P.TExpr, grid: dict[str, np.ndarray], tensors: dict[str, np.ndarray],
          env: dict[str, int]) -> np.ndarray:
    if isinstance(e, P.Const):
        return np.asarray(e.value, dtype=e.dtype.numpy)
    if isinstance(e, P.IndexVar):
        return grid[e.name]
    if isinstance(e, P.SizeVal):
        return np.asarray(e.expr.evaluate(env), dtype=np.int64)
    if isinstance(e, P.ScalarArg):
        return tensors[e.name]
    if isinstance(e, P.Read):
        array = tensors[e.tensor]
        subs = [_subscript(x, d, array.shape[d], e.tensor, grid, tensors, env, e.loc)
                for d, x in enumerate(e.indices)]
        return array[tuple(subs)] if subs else array[()]
    assert isinstance(e, P.Op)
    args = [_eval(a, grid, tensors, env) for a in e.args]
    if e.op == "cast":
        return _cast(np.asarray(args[0]), e.dtype.numpy)
    return intrinsics.evaluate(e.op, e.dtype, *args)
