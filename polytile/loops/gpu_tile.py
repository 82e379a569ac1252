"""Lowering of a GPU thread tile whose reduction is staged through local memory
(`BlockSchedule.stage`, decided by pass `gpu`; Tensor Comprehensions §5.5):

    __local A_s[box of A for one tile], B_s[...]          (one per work-group)
    thread i, thread j:                                   (every work-item of the group)
      for the output indices no thread runs (uniform loops):
        acc[register tile] = 0                            (registers: `unroll` indices)
        for kt in 0..K step T:                            (the same trip count for all)
            for e = my linear id; e < |A_s|; e += work-items:   A_s[e] = A[box origin + e]
            ...                                           (0 where the box leaves A)
            barrier
            if the point is in the iteration space:       (overflow, where-clauses)
                for k in kt..min(kt + T, K), other reductions, register tile:
                    acc[..] += f(A_s[..], B_s[..], ...)
            barrier
        for the register tile: if (i, j) is an element of the output: C[i, j] += acc[..]

Every work-item of a group runs the tile loop and reaches both barriers: the only
divergence is in the boundary tiles, around the arithmetic and the final store. A staged
input's box is the rectangular hull of what the group reads in one reduction tile (for
`A(i, k)` with i over the group's rows and k over the tile: rows x T); a work-item reads
the elements of the box whose position is its linear id modulo the group's size, so
neighbouring work-items read neighbouring elements. Inputs that are not staged are read
from global memory where the arithmetic needs them.

A thread loop containing a barrier runs its iterations as work-items in lock-step between
barriers, which only a GPU backend gives: the C printer and the loop IR interpreter refuse
barriers.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from polytile import dtypes
from polytile.errors import IRError, UnsupportedError
from polytile.ir.nodes import Affine, Block, Refinement, Store
from polytile.loops import nodes as L
from polytile.loops.views import Scope, View, child_view, fixed_indices, resolve, safe

if TYPE_CHECKING:
    from polytile.loops.lower import Lowering

INT64 = L.VType(dtypes.INT64)


def _box(ref: Refinement, ranges: dict[str, int]) -> tuple[list[int], list[int]]:
    """Per dimension of `ref`: the lowest offset from the origin point (all varying
    indices 0) and the extent, while the indices in `ranges` take that many values."""
    lows, extents = [], []
    for a in ref.access:
        varying = [(c, ranges[n]) for n, c in a.terms if n in ranges]
        lows.append(sum(c * (r - 1) for c, r in varying if c < 0))
        extents.append(1 + sum(abs(c) * (r - 1) for c, r in varying))
    return lows, extents


def lower_block(low: Lowering, blk: Block, outer: Scope) -> list[L.Stmt]:
    stage = blk.schedule.stage
    assert stage is not None
    threads = [n for n, kind in blk.schedule.gpu if kind == "thread"]
    idx = fixed_indices(blk, outer.idx)
    loops = [i for i in blk.idxs if i.affine is None and i.range > 1]
    var = {i.name: low.fresh("i") for i in loops}
    thread_loops = [i for i in loops if i.name in threads]
    (store,) = [st for st in blk.stmts if isinstance(st, Store)]
    out_ref = blk.ref(store.ref)
    written = {n for a in out_ref.access for n in a.names}
    # A work-item's register tile: every point of these output indices at once.
    reg_loops = [i for i in loops if i.name in blk.schedule.unroll]
    # Other output indices that no thread runs: uniform loops around the accumulators.
    outer_loops = [i for i in loops if i.name not in threads and i.name in written
                   and i not in reg_loops]
    reductions = [i for i in loops if i.name not in threads and i.name not in written]
    if stage.index not in var:
        raise IRError(f"block {blk.name} stages index {stage.index}, which is not one of its "
                      "loops")
    tile_start = low.fresh("i")
    at = {**idx, **{n: Affine.index(v) for n, v in var.items()}}
    origin_at = {**idx, **{n: Affine.constant(0) for n in var},
                 **{i.name: Affine.index(var[i.name]) for i in outer_loops},
                 stage.index: Affine.index(tile_start)}
    count = math.prod(i.range for i in thread_loops)
    linear, stride = Affine(), 1
    for i in reversed(thread_loops):      # the innermost thread index varies fastest
        linear = linear + Affine.index(var[i.name]).scale(stride)
        stride *= i.range
    ranges = {i.name: i.range for i in thread_loops + reg_loops + reductions}
    ranges[stage.index] = stage.tile

    buffers: list[L.Buffer] = []
    copies: list[L.Stmt] = []
    views: dict[str, View] = {}
    for name in stage.refs:
        ref = blk.ref(name)
        parent = outer.views[ref.from_]
        origin = child_view(ref, parent, origin_at)
        if origin.coords is None or origin.ptr not in low.sizes:
            raise UnsupportedError(f"staged input {safe(name)} is not a view of a top-level "
                                   "buffer of the same rank")
        lows, extents = _box(ref, ranges)
        pitches = _pitches(extents, stage.pad)
        shared = low.fresh("l")
        size = pitches[0] * extents[0]
        padding = f" (rows of {extents[-1] + stage.pad})" if stage.pad else ""
        buffers.append(L.Buffer(shared, ref.shape.dtype, size, "stack", "shared",
                                label=f"{safe(name)}: staged {'x'.join(map(str, extents))}"
                                      f"{padding}"))
        copies += _copy(low, origin, ref, shared, lows, extents, pitches, linear, count)
        offset = Affine()
        for d in range(len(ref.access)):
            moved = (resolve(ref.access[d], at, f"refinement {name!r}")
                     - resolve(ref.access[d], origin_at, f"refinement {name!r}"))
            offset = offset + (moved - lows[d]).scale(pitches[d])
        views[name] = View(shared, ref.shape.dtype, offset, ref.shape.dims, None, -1,
                           ref.agg, False, safe(name))

    reduced = {i.name for i in reductions}
    if stage.index not in reduced:
        raise IRError(f"block {blk.name} stages {stage.index}, which is not a reduction index")
    for ref in blk.refs:
        if ref.into not in views and ref.from_:
            views[ref.into] = child_view(ref, outer.views[ref.from_], at)
    out_view = views[out_ref.into]
    acc = low.fresh("l" if reg_loops else "s")
    point, pitch = Affine(), 1            # this point's accumulator in a register tile
    for i in reversed(reg_loops):
        point = point + Affine.index(var[i.name]).scale(pitch)
        pitch *= i.range
    scope = Scope(at, views, dict(outer.scalars), True)
    body: list[L.Stmt] = []
    for st in blk.stmts:
        if st is store:
            value = low.convert(*low.scalar(scope, st.value), out_view.dtype, "s", body)
            body.append(L.Store(acc, point, value, "add") if reg_loops
                        else L.Assign(acc, L.Combine("add", acc, value)))
        else:
            body += low.stmt(st, scope)
    conds = [resolve(c, at, "a constraint") for c in blk.constraints]
    if conds:
        body = [L.If(tuple(conds), tuple(body))]
    body = _loops(reg_loops, var, body)
    for i in reversed(reductions):
        v = var[i.name]
        if i.name == stage.index:
            hi = L.IMin((Affine.index(tile_start) + stage.tile, Affine.constant(i.range)))
            body = [L.Loop(v, Affine.index(tile_start), hi, tuple(body))]
        else:
            body = [L.Loop(v, Affine.constant(0), Affine.constant(i.range), tuple(body))]
    staged_range = next(i.range for i in loops if i.name == stage.index)
    tiles = L.Loop(tile_start, Affine.constant(0), Affine.constant(staged_range),
                   (*copies, L.Barrier("shared"), *body, L.Barrier("shared")), step=stage.tile)
    kept = [c for c in blk.constraints if not set(c.names) & reduced]
    t = L.VType(out_view.dtype)
    if reg_loops:
        total = low.fresh("s")
        final: list[L.Stmt] = [L.Let(total, t, L.Read(acc, point)),
                               L.Store(out_view.ptr, out_view.offset, total, out_view.agg)]
    else:
        final = [L.Store(out_view.ptr, out_view.offset, acc, out_view.agg)]
    if kept:
        final = [L.If(tuple(resolve(c, at, "a constraint") for c in kept), tuple(final))]
    final = _loops(reg_loops, var, final)
    work: list[L.Stmt]
    if reg_loops:
        registers = L.Buffer(acc, out_view.dtype, pitch, "stack", "private", "zero",
                             label="accumulators of the register tile")
        work = [L.Alloc((registers,), (tiles, *final))]
    else:
        work = [L.Var(acc, t, L.Lit(0)), tiles, *final]
    work = _loops(outer_loops, var, work)
    for i in reversed(thread_loops):
        work = [L.Loop(var[i.name], Affine.constant(0), Affine.constant(i.range), tuple(work),
                       "thread")]
    title = L.Comment(f"block {safe(blk.name)}: reduction {safe(stage.index)} in tiles of "
                      f"{stage.tile}, {', '.join(map(safe, stage.refs))} staged in local memory")
    return [title, L.Alloc(tuple(buffers), tuple(work))]


def identity(agg: str, dt: dtypes.DType) -> float | int | bool:
    """The value that aggregation `agg` leaves unchanged, in `dt`."""
    if agg in ("add", "mul"):
        return int(agg == "mul")
    if dt.kind == "b":
        return agg == "min"
    if dt.is_float:
        return -math.inf if agg == "max" else math.inf
    info = np.iinfo(dt.numpy)
    return int(info.min if agg == "max" else info.max)


def lower_across(low: Lowering, blk: Block, outer: Scope) -> list[L.Stmt]:
    """A reduction shared by a work-group (`BlockSchedule.across`):

        __local part[T]
        thread t:
            acc = identity;  for r = t; r < R; r += T: acc = acc (+) term(r)
            part[t] = acc;  barrier
            for s = T/2, T/4, ..., 1:  if t < s: part[t] = part[t] (+) part[t + s];  barrier
            if t == 0: out (+)= part[0]

    or, with warps of W work-items (`Across.warp`: FusionStitching's warp composition),
    the partial results combined in registers:

        __local part[T/W]
        thread t:
            acc = ... as above
            for s = W/2, ..., 1:  acc = acc (+) (acc of thread t xor s)     (warp shuffles)
            if t % W == 0: part[t / W] = acc;  barrier
            v = t % W < T/W ? part[t % W] : identity
            for s = T/W/2, ..., 1:  v = v (+) (v of thread t xor s)
            if t == 0: out (+)= v

    Every work-item reaches every barrier and shuffle (the steps are unrolled, uniform)."""
    spec = blk.schedule.across
    assert spec is not None
    t = low.fresh("i")
    work, buffers = across_steps(low, blk, outer, spec.index, Affine.index(t), spec.threads,
                                 spec.warp)
    title = L.Comment(f"block {safe(blk.name)}: reduction {safe(spec.index)} across "
                      f"{spec.threads} work-items")
    loop = L.Loop(t, Affine.constant(0), Affine.constant(spec.threads), tuple(work), "thread")
    return [title, L.Alloc(tuple(buffers), (loop,)) if buffers else loop]


def across_steps(low: Lowering, blk: Block, outer: Scope, index: str, me: Affine,
                 group: int, warp: int = 0, fixed: Mapping[str, Affine] | None = None
                 ) -> tuple[list[L.Stmt], list[L.Buffer]]:
    """What work-item `me` of `group` runs for a reduction along `index` shared by the
    group (see lower_across), and the shared buffer of the partial results it uses, if
    any. `fixed`: the values of the block's other loops (a row group's across member
    runs one reduction for each)."""
    (store,) = [st for st in blk.stmts if isinstance(st, Store)]
    out_ref = blk.ref(store.ref)
    agg = out_ref.agg
    reduction = blk.index(index)
    idx = {**fixed_indices(blk, outer.idx), **(fixed or {})}
    r = low.fresh("i")
    at = {**idx, index: Affine.index(r)}
    views = {ref.into: child_view(ref, outer.views[ref.from_], at)
             for ref in blk.refs if ref.from_}
    out_view = views[out_ref.into]
    vt = L.VType(out_view.dtype)
    scope = Scope(at, views, dict(outer.scalars), True)
    acc = low.fresh("s")
    body: list[L.Stmt] = []
    for st in blk.stmts:
        if st is store:
            value = low.convert(*low.scalar(scope, st.value), out_view.dtype, "s", body)
            body.append(L.Assign(acc, L.Combine(agg, acc, value)))
        else:
            body += low.stmt(st, scope)
    conds = [resolve(c, at, "a constraint") for c in blk.constraints]
    if conds:
        body = [L.If(tuple(conds), tuple(body))]
    part = low.fresh("l")
    work: list[L.Stmt] = [
        L.Var(acc, vt, L.Lit(identity(agg, out_view.dtype))),
        L.Loop(r, me, Affine.constant(reduction.range), tuple(body), step=group)]
    if warp:
        total, size = _warp_steps(low, agg, vt, acc, me, group, warp, part, work)
    else:
        total, size = _tree_steps(low, agg, vt, acc, me, group, part, work)
    work.append(L.If((me.scale(-1),), (L.Store(out_view.ptr, out_view.offset, total, agg),)))
    buffers = [L.Buffer(part, out_view.dtype, size, "stack", "shared",
                        label=f"partial results of {safe(index)}")] if size else []
    return work, buffers


def _tree_steps(low: Lowering, agg: str, vt: L.VType, acc: str, me: Affine, group: int,
                part: str, work: list[L.Stmt]) -> tuple[str, int]:
    """The partial results combined in a tree in local memory `part` (appended to
    `work`): the name work-item 0 then holds the total in, and part's size."""
    work += [L.Store(part, me, acc), L.Barrier("shared")]
    step = group // 2
    while step >= 1:
        a, b, c = low.fresh("s"), low.fresh("s"), low.fresh("s")
        work += [L.If((Affine.constant(step - 1) - me,),
                      (L.Let(a, vt, L.Read(part, me)), L.Let(b, vt, L.Read(part, me + step)),
                       L.Let(c, vt, L.Combine(agg, a, b)), L.Store(part, me, c))),
                 L.Barrier("shared")]
        step //= 2
    total = low.fresh("s")
    work.append(L.Let(total, vt, L.Read(part, Affine.constant(0))))
    return total, group


def _warp_steps(low: Lowering, agg: str, vt: L.VType, acc: str, me: Affine, group: int,
                warp: int, part: str, work: list[L.Stmt]) -> tuple[str, int]:
    """The partial results combined by warp shuffles (appended to `work`), one result
    per warp through local memory `part` when the group has several: the name work-item
    0 then holds the total in, and part's size (0: none)."""
    _shuffles(low, agg, vt, acc, me, warp, work)
    warps = group // warp
    if warps == 1:
        return acc, 0
    which, lane, mine = low.fresh("d"), low.fresh("d"), low.fresh("s")
    place = Affine.index(lane)
    work += [L.Let(which, INT64, L.IntValue(L.IDiv(me, warp))),
             L.Let(lane, INT64, L.IntValue(me - Affine.index(which).scale(warp))),
             L.If((place.scale(-1),), (L.Store(part, Affine.index(which), acc),)),
             L.Barrier("shared"),
             L.Var(mine, vt, L.Lit(identity(agg, vt.dtype))),
             L.If((Affine.constant(warps - 1) - place,), (L.Assign(mine, L.Read(part, place)),))]
    _shuffles(low, agg, vt, mine, me, warps, work)
    return mine, warps


def _shuffles(low: Lowering, agg: str, vt: L.VType, acc: str, me: Affine, width: int,
              work: list[L.Stmt]) -> None:
    """acc combined with the acc of every work-item of its `width` (a butterfly of
    shuffles: afterwards each of them holds the combination of all)."""
    step = width // 2
    while step >= 1:
        other = low.fresh("s")
        work += [L.WarpXor(other, vt, acc, step, me), L.Assign(acc, L.Combine(agg, acc, other))]
        step //= 2


def _loops(indices: list, var: dict[str, str], body: list[L.Stmt]) -> list[L.Stmt]:
    """`body` inside serial loops over `indices` (Index objects), outermost first."""
    for i in reversed(indices):
        body = [L.Loop(var[i.name], Affine.constant(0), Affine.constant(i.range), tuple(body))]
    return body


def _pitches(extents: list[int], pad: int) -> list[int]:
    """Elements between neighbours along each dimension of a staged box whose rows (the
    last dimension) are `pad` elements longer than the data."""
    pitches = [1] * len(extents)
    for d in reversed(range(len(extents) - 1)):
        pitches[d] = pitches[d + 1] * (extents[d + 1] + (pad if d + 1 == len(extents) - 1
                                                         else 0))
    return pitches


def _copy(low: Lowering, origin: View, ref: Refinement, shared: str, lows: list[int],
          extents: list[int], pitches: list[int], linear: Affine, count: int
          ) -> list[L.Stmt]:
    """The group's copy of one staged box: element e of the box (in row-major order of
    the data) by work-item e mod count, into its padded place; 0 where the box leaves
    the buffer (those elements are never used)."""
    e = low.fresh("i")
    body: list[L.Stmt] = []
    positions: list[Affine] = []
    pitch = 1
    quotients: list[str] = []
    for extent in reversed(extents):
        q = low.fresh("d")
        body.append(L.Let(q, INT64, L.IntValue(L.IDiv(Affine.index(e), pitch))))
        quotients.append(q)
        pitch *= extent
    quotients.reverse()           # quotients[d] = floor(e / pitch of dimension d)
    for d, extent in enumerate(extents):
        position = Affine.index(quotients[d])
        if d > 0:
            position = position - Affine.index(quotients[d - 1]).scale(extent)
        positions.append(position)
    sizes = low.sizes[origin.ptr]
    conds: list[L.IExpr] = []
    address = origin.offset
    assert origin.coords is not None
    for d, (coord, dim) in enumerate(zip(origin.coords, ref.shape.dims)):
        at = coord + lows[d] + positions[d]
        conds += [at, Affine.constant(sizes[d] - 1) - at]
        address = address + (positions[d] + lows[d]).scale(dim.stride)
    value, zero = low.fresh("s"), low.fresh("s")
    t = L.VType(origin.dtype)
    place = Affine()
    for position, pitch in zip(positions, pitches):
        place = place + position.scale(pitch)
    body.append(L.If(tuple(conds),
                     (L.Let(value, t, L.Read(origin.ptr, address)),
                      L.Store(shared, place, value)),
                     (L.Let(zero, t, L.Lit(0)), L.Store(shared, place, zero))))
    size = math.prod(extents)
    return [L.Loop(e, linear, Affine.constant(size), tuple(body), step=count)]

