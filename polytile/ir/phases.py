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
phases may run on different threads, so only a barrier orders them. Where both phases
are shared out over the same rows and each row touches only its own elements, the same
thread would run both (a static schedule); that case still waits (not built).
"""
from __future__ import annotations

from collections.abc import Sequence

from polytile.ir import nodes as N

WRITES = ("out", "inout")


def shareable(phase: N.Block) -> bool:
    """Whether the phase lowers to one loop whose iterations threads can share: its
    parallel index is its first loop, and no constraint guards the block."""
    loops = [i for i in phase.idxs if i.affine is None and i.range > 1]
    return (phase.schedule.parallel is not None and not phase.constraints
            and bool(loops) and loops[0].name == phase.schedule.parallel)


def _touched(phase: N.Block) -> tuple[set[str], set[str]]:
    """(buffers read, buffers written) of the stitched block, by a phase."""
    reads = {r.from_ for r in phase.refs if r.from_ and r.dir in ("in", "inout")}
    writes = {r.from_ for r in phase.refs if r.from_ and r.dir in WRITES}
    return reads, writes


def depends(earlier: N.Block, later: N.Block) -> bool:
    """Whether `later` touches a buffer that `earlier` writes, or writes one it reads."""
    r0, w0 = _touched(earlier)
    r1, w1 = _touched(later)
    return bool(w0 & (r1 | w1) or r0 & w1)


def required_barriers(phases: Sequence[N.Block]) -> tuple[bool, ...]:
    """Per phase, whether the threads must wait after it: the fewest barriers that order
    every dependent pair of phases (one after the last phase is the region's end)."""
    barriers = [False] * len(phases)
    since: list[N.Block] = []       # phases since the last barrier
    for k, phase in enumerate(phases):
        if k and any(depends(p, phase) for p in since):
            barriers[k - 1] = True
            since = []
        since.append(phase)
    return tuple(barriers)


def stitch_schedule(block: N.Block) -> N.Stitched:
    """The phases of a stitched block, from its phases' own schedules."""
    phases = [s for s in block.stmts if isinstance(s, N.Block)]
    return N.Stitched(tuple(N.Phase(shareable(p), b)
                            for p, b in zip(phases, required_barriers(phases))))
