"""Lowering of a row group (`BlockSchedule.rows`, decided by pass `gpu`,
polytile.passes.gpu_rows): a fused row block whose row runs on one work-group.

    grid r:                                         (a work-group per row)
      __local the row's intermediates, a partial-results array per reduction
      thread t in 0..T:                             (every work-item of the group)
        [fill the intermediates that must start as NaN or 0; barrier]
        single:     if t == 0: member
        spread(m):  for m = t; m < M; m += T: for the member's other loops: member
        across(m):  for each value k of the member's other loops (unrolled):
                      acc = identity; for m = t; m < M; m += T: acc (+)= term(k, m)
                      part_k[t] = acc; barrier; tree (T/2, ..., 1), barrier after each
                      step; if t == 0: out(k) (+)= part_k[0]
                    (with warps, `RowGroup.warp`: shuffles instead of the tree, as
                    polytile.loops.gpu_tile.lower_across does)
        barrier                                     (where the phase says so)

Every barrier is at the top level of the thread loop or in the trees' unrolled steps, so
every work-item of a group reaches every barrier; only the work done between them
depends on the work-item. Where members pass a buffer in global memory between them
(`polytile.ir.rows.global_handoffs`), the barriers between members order global
memory too (`Barrier("group")`).
"""
from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from polytile.errors import IRError
from polytile.ir.nodes import Affine, Block
from polytile.ir.rows import global_handoffs, member_loops
from polytile.loops import nodes as L
from polytile.loops.gpu_tile import across_steps
from polytile.loops.space import iteration_space
from polytile.loops.views import Scope, child_view, fixed_indices, resolve, safe

if TYPE_CHECKING:
    from polytile.loops.lower import Lowering

SHARED = "shared"
# Begins the comment above every row group's code: polytile.runtime.opencl builds
# programs with one unoptimized on PoCL, whose optimizer miscompiled a row group.
ROW_GROUP_MARK = "a row per work-group"


def lower_block(low: Lowering, blk: Block, outer: Scope) -> list[L.Stmt]:
    spec = blk.schedule.rows
    assert spec is not None
    title = L.Comment(f"block {safe(blk.name)}: {ROW_GROUP_MARK} of {spec.threads} "
                      "work-items")
    space = iteration_space(blk, outer.idx, lambda: low.fresh("i"))
    if isinstance(space, str):
        return [title, L.Comment(f"empty: {space}")]
    if len(space.loops) > 1:
        raise IRError(f"row group {blk.name!r} needs one loop over its rows, not "
                      f"{len(space.loops)}")
    views, private = low.views(blk, outer, space.idx, False)
    if any(r.location != SHARED for r in private):
        raise IRError(f"row group {blk.name!r} has an intermediate outside local memory")
    made = low.locals(private, views, owner=blk)
    # Local memory has no initializer: where the lowering wants a buffer to start as NaN
    # (a float read before it is written shows) or 0, the group fills it first.
    buffers = [L.Buffer(b.name, b.dtype, b.size, b.placement, SHARED, "", label=b.label)
               for b in made]
    scope = Scope(space.idx, views, dict(outer.scalars), True)
    t = low.fresh("i")
    me = Affine.index(t)
    work: list[L.Stmt] = []
    for b in made:
        if b.init:
            e, v = low.fresh("i"), low.fresh("s")
            value = L.Lit(float("nan") if b.init == "nan" else 0)
            work.append(L.Loop(e, me, Affine.constant(b.size),
                               (L.Let(v, L.VType(b.dtype), value),
                                L.Store(b.name, Affine.index(e), v)), step=spec.threads))
    if any(b.init for b in made):
        work.append(L.Barrier("shared"))
    parts: list[L.Buffer] = []
    members = [st for st in blk.stmts if isinstance(st, Block)]
    if len(members) != len(blk.stmts) or len(members) != len(spec.phases):
        raise IRError(f"row group {blk.name!r} has {len(blk.stmts)} statements for "
                      f"{len(spec.phases)} phases")
    fence = "group" if global_handoffs(blk) else "shared"
    for member, phase in zip(members, spec.phases):
        work.append(L.Comment(f"block {safe(member.name)}: {phase.kind}"
                              + (f" over {safe(phase.loop)}" if phase.loop else "")))
        if phase.kind == "across":
            steps, part = _across(low, member, scope, phase.loop, me, spec.threads, spec.warp)
            work += steps
            parts += part
        else:
            work += _member(low, member, scope, phase.kind, phase.loop, me, spec.threads)
        if phase.barrier:
            work.append(L.Barrier(fence))
    group = L.Loop(t, Affine.constant(0), Affine.constant(spec.threads), tuple(work), "thread")
    stmts: list[L.Stmt] = [L.Alloc((*buffers, *parts), (group,))]
    if space.loops:             # (one row, a size of 1: one work-group, no grid loop)
        var = space.loops[0]
        lo, hi = space.bounds.range_of(var)
        stmts = [L.Loop(var, lo, hi, tuple(stmts), "grid")]
    if space.guards:
        stmts = [L.If(tuple(space.guards), tuple(stmts))]
    return [title, *stmts]


def _across(low: Lowering, member: Block, outer: Scope, loop: str, me: Affine, threads: int,
            warp: int) -> tuple[list[L.Stmt], list[L.Buffer]]:
    """An `across` member: the group's reduction along `loop` once for each value of the
    member's other loops (each of which the output depends on), unrolled, each with
    partial results of its own, so that its barriers stay at the top of the thread loop
    as every other barrier of a row group does (PoCL 3.1, optimizing, ran them in a loop
    wrongly: sums of 0, a corrupted heap)."""
    others = [i for i in member_loops(member) if i.name != loop]
    steps: list[L.Stmt] = []
    parts: list[L.Buffer] = []
    for values in itertools.product(*(range(i.range) for i in others)):
        fixed = {i.name: Affine.constant(v) for i, v in zip(others, values)}
        work, part = across_steps(low, member, outer, loop, me, threads, warp, fixed)
        steps += work
        parts += part
    return steps, parts


def _member(low: Lowering, member: Block, outer: Scope, kind: str, loop: str, me: Affine,
            threads: int) -> list[L.Stmt]:
    """A `single` member on work-item 0, or a `spread` one over `loop`, every
    `threads`-th iteration from work-item `me`'s, with the member's other loops inside."""
    at = fixed_indices(member, outer.idx)
    loops = {i.name: low.fresh("i") for i in member_loops(member)}
    at.update({name: Affine.index(var) for name, var in loops.items()})
    views = {ref.into: child_view(ref, outer.views[ref.from_], at) for ref in member.refs}
    scope = Scope(at, views, dict(outer.scalars), True)
    body: list[L.Stmt] = []
    for st in member.stmts:
        body += low.stmt(st, scope)
    conds = [resolve(c, at, "a constraint") for c in member.constraints]
    if conds:
        body = [L.If(tuple(conds), tuple(body))]
    if kind == "single":
        return [L.If((me.scale(-1),), tuple(body))]
    for i in reversed(member_loops(member)):
        if i.name != loop:
            body = [L.Loop(loops[i.name], Affine.constant(0), Affine.constant(i.range),
                           tuple(body))]
    return [L.Loop(loops[loop], me, Affine.constant(member.index(loop).range), tuple(body),
                   step=threads)]
