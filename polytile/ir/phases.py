"""How the phases of a stitched block share one team of threads (FusionStitching §5 on a
CPU): which phase's iterations are shared out, and where the threads must wait.

    block stitched_0 #stitched schedule(stitch(single barrier, for barrier, single, single)) {
      block s4_init [i0:D] ( out gw[i0] )                     # one thread clears gw
      block fused_0_1 [r:N] schedule(parallel(r), combine(gw, gb)) ( inout gw:add ... )
      block s6 [i0:D] ( in gw[i0]  out w2[i0] )               # reads every thread's gw
      block s7 () ( in gb  out b2 )                           # independent of s6: no wait
    }

A phase is shared out (`for`) when its schedule runs its first loop in threads and
nothing guards it (so it lowers to that one loop); else one thread runs it (`single`).
The threads wait after a phase when a later phase, before the next wait, touches a
buffer one of them writes (read after write, write after read or after write): the
phases may run on different threads, so only a barrier orders them. Except where both
phases are shared out over loops of the same range and no element that iteration r of
one touches is touched by an iteration r' != r of the other (isl, over the phases'
whole nests, one of the two accesses a write): OpenMP's static schedule gives a thread
the same iterations of both loops, so the thread that needs an element made it itself
(`same_rows`).
"""
from __future__ import annotations

from collections.abc import Sequence

from polytile.ir import nodes as N
from polytile.ir.polyhedra import (
    READ,
    READ_DIRS,
    WRITE,
    WRITE_DIRS,
    Scope,
    distinct,
    parent_footprint,
    to_set,
)


def shareable(phase: N.Block) -> bool:
    """Whether the phase lowers to one loop whose iterations threads can share: its
    parallel index is its first loop, and no constraint guards the block."""
    loops = [i for i in phase.idxs if i.affine is None and i.range > 1]
    return (phase.schedule.parallel is not None and not phase.constraints
            and bool(loops) and loops[0].name == phase.schedule.parallel)


def _touched(phase: N.Block) -> tuple[set[str], set[str]]:
    """(buffers read, buffers written) of the stitched block, by a phase."""
    reads = {r.from_ for r in phase.refs if r.from_ and r.dir in READ_DIRS}
    writes = {r.from_ for r in phase.refs if r.from_ and r.dir in WRITE_DIRS}
    return reads, writes


def depends(earlier: N.Block, later: N.Block) -> bool:
    """Whether `later` touches a buffer that `earlier` writes, or writes one it reads."""
    r0, w0 = _touched(earlier)
    r1, w1 = _touched(later)
    return bool(w0 & (r1 | w1) or r0 & w1)


def same_rows(earlier: N.Block, later: N.Block) -> bool:
    """Whether both phases are shared out over loops of the same range and their
    iterations r and r' != r never touch one element, one of them writing: then the
    thread that runs iteration r of both needs nothing from another thread."""
    if not (shareable(earlier) and shareable(later)):
        return False
    assert earlier.schedule.parallel is not None and later.schedule.parallel is not None
    return same_iterations(earlier, earlier.schedule.parallel, later, later.schedule.parallel)


def same_iterations(earlier: N.Block, first: str, later: N.Block, second: str) -> bool:
    """Whether loops `first` of `earlier` and `second` of `later` have the same range
    and iterations r of one and r' != r of the other never touch one element, one of
    them writing (a thread or work-item given the same iterations of both then needs
    nothing another one made)."""
    a, b = Scope.detached(earlier), Scope.detached(later)
    ia, ib = earlier.index(first), later.index(second)
    if ia.range != ib.range:
        return False
    mine = a.own[earlier.idxs.index(ia)]
    theirs = {v: f"{v}_b" for v in b.variables}
    for ra in earlier.refs:
        for rb in later.refs:
            if not ra.from_ or ra.from_ != rb.from_:
                continue
            for ma, mb in ((WRITE, READ), (READ, WRITE), (WRITE, WRITE)):
                if ra.dir not in _DIRS[ma] or rb.dir not in _DIRS[mb]:
                    continue
                coords, fa = parent_footprint(a, ra.into, ma)
                _, fb = parent_footprint(b, rb.into, mb)
                fb = tuple(c.rename({**theirs, **{h: f"{h}_b" for h in c.hidden}})
                           for c in fb)
                free = a.variables + tuple(theirs.values()) + coords
                if fa and fb and not to_set(free, [fa, fb, distinct(
                        [(mine, theirs[b.own[later.idxs.index(ib)]])])]).is_empty():
                    return False
    return True


_DIRS = {READ: READ_DIRS, WRITE: WRITE_DIRS}


def required_barriers(phases: Sequence[N.Block]) -> tuple[bool, ...]:
    """Per phase, whether the threads must wait after it: the fewest barriers that order
    every dependent pair of phases that other threads may run (one after the last phase
    is the region's end)."""
    barriers = [False] * len(phases)
    since: list[N.Block] = []       # phases since the last barrier
    for k, phase in enumerate(phases):
        if k and any(depends(p, phase) and not same_rows(p, phase) for p in since):
            barriers[k - 1] = True
            since = []
        since.append(phase)
    return tuple(barriers)


def stitch_schedule(block: N.Block) -> N.Stitched:
    """The phases of a stitched block, from its phases' own schedules."""
    phases = [s for s in block.stmts if isinstance(s, N.Block)]
    return N.Stitched(tuple(N.Phase(shareable(p), b)
                            for p, b in zip(phases, required_barriers(phases))))
