"""A stitched block -> one parallel region of the loop IR (FusionStitching §5 on a CPU).

The block's schedule (`BlockSchedule.stitch`, decided by pass autotile from
`polytile.ir.phases`) says per phase whether its parallel loop is shared out among the
threads and whether they wait after it; this module only builds that:

    block stitched_0 #stitched                 for i0 in [0, 11): store gw[i0] = 0
      schedule(stitch(single barrier,          region:
                      for, for barrier,          workshare for i1 in [0, 37) adding into gw:
                      single))                     ...
      block s4_init [i0:D] ...            ->     workshare for i2 in [0, 37):   (same rows)
      block rows1 [r:N] schedule(parallel(r))      ...
      block rows2 [r:N] schedule(parallel(r))  for i3 in [0, 11): ...    (reads gw)
      block s6 [i0:D] ...

A shared phase lowers to exactly one loop (`ir.phases.shareable` ensures it), which
becomes a "workshare" loop; any other phase runs whole on one thread (`Single`), its
parallel loops serial. The region spans the first to the last shared phase: phases
before it run before the threads start, those after it once they have all finished
(each as a kernel of its own would, with its own threads if its schedule has them), so
the region's start and end order them and no barrier does (under load every barrier
waits for the thread that lost its core). Buffers the stitched block allocates itself
are allocated once per call, outside the region, so every thread sees them. Without
threads, inside another parallel loop, or when no phase is shared out (a region would
only cost its fork and join), the phases simply run one after another.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from polytile.errors import IRError
from polytile.ir.nodes import Block
from polytile.loops import nodes as L
from polytile.loops.views import Scope, safe

if TYPE_CHECKING:
    from polytile.loops.lower import Lowering


def lower_block(lowering: Lowering, blk: Block, outer: Scope) -> list[L.Stmt]:
    stitch = blk.schedule.stitch
    assert stitch is not None
    views, private = lowering.views(blk, outer, outer.idx, False)
    buffers = lowering.locals(private, views)
    title = L.Comment(f"block {safe(blk.name)}: stitched phases")
    phases = list(zip(blk.stmts, stitch.phases))
    shared = [k for k, (_, p) in enumerate(phases) if p.shared]
    threads = lowering.options.threads and not outer.parallel and bool(shared)
    first, last = (shared[0], shared[-1]) if threads else (len(phases), len(phases))
    before, after = [], []
    body: list[L.Stmt] = []
    for k, (phase, decided) in enumerate(phases):
        if not isinstance(phase, Block):
            raise IRError(f"stitched block {blk.name!r} holds a statement that is no block")
        # In the region, a phase that one thread runs gets no threads of its own (its
        # scope is "parallel"); before and after it, a phase runs as a kernel would.
        in_region = first <= k <= last
        scope = Scope(outer.idx, views, dict(outer.scalars),
                      outer.parallel or (in_region and not decided.shared))
        lowered = lowering.block(phase, scope)
        if not in_region:
            (before if k < first else after).extend(lowered)
            continue
        body += _shared(phase, lowered) if decided.shared else [L.Single(tuple(lowered))]
        if decided.barrier and k < last:
            body.append(L.Barrier("global"))
    stmts: list[L.Stmt] = [*before, *([L.Region(tuple(body))] if threads else []), *after]
    return [title, *([L.Alloc(buffers, tuple(stmts))] if buffers else stmts)]


def _shared(phase: Block, lowered: list[L.Stmt]) -> list[L.Stmt]:
    """The phase's one parallel loop as a workshare loop (its comments kept). An init
    that pass fold folded into a later phase (decided after the phases were) lowers to
    nothing: the contraction's first stores write its elements."""
    loops = [st for st in lowered if not isinstance(st, L.Comment)]
    if not loops and phase.schedule.folded is not None:
        return lowered
    if len(loops) != 1 or not isinstance(loops[0], L.Loop) or loops[0].kind != "parallel":
        raise IRError(f"phase {phase.name!r} is shared out among threads but does not lower "
                      "to one parallel loop")
    return [replace(st, kind="workshare") if st is loops[0] else st for st in lowered]
