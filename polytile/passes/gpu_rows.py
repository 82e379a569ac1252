"""Pass `gpu`'s row groups: FusionStitching's block composition (§5) for the fused row
blocks of pass `fuse` (strategy `rows`: softmax, layernorm, a bias -> GELU -> residual ->
layernorm chain). One work-group runs one row; its work-items run each member in turn,
the elementwise ones with the row's elements dealt out (`spread`), the row reductions as
a tree in local memory (`across`), the reductions' initializations on one work-item
(`single`), with barriers between members where one reads what another wrote
(polytile.ir.rows). The row's intermediates live in the group's local memory:

    block fused_0 [r:13] #fused (               block fused_0 [r:13] #fused
      none e[0, 0] float32(1:70, 70:1) @local     schedule(grid(r), rows(r, 64, single barrier,
      ...                                ->         across(m) barrier, spread(m) barrier, ...)) (
    )                                             none e[0, 0] float32(1:70, 70:1) @shared

A member may have several loops; it deals out one of them (polytile.ir.rows.phase_of),
so the members of one group run with different parallel shapes, the paper's block
composition proper: the multi-interests motif per batch row spreads its small batched
GEMM over the 50 columns of S, shares the row maxima's 50 columns across the group for
each of the 4 interests, and spreads the second GEMM over the 64 columns of O.

Local memory, not registers: a work-item does keep the elements it writes in a spread
member (t, t + T, ...), but a later member may read any element of an intermediate (a
shifted or reversed access), every work-item needs the row's reduced values (a
broadcast through memory on any GPU), and a private array indexed by a loop variable is
kept in registers only when the compiler unrolls the loop completely, which rows of a
thousand elements defeat. Local memory costs a barrier per hand-off, which the
reductions' trees pay anyway.

A buffer in global memory that passes between members (an output a later member reads)
makes the group's barriers order global memory too (`global_handoffs`; the lowering's
`Barrier("group")`). Not a row group (and mapped a row per work-item by
`gpu.map_block`, as before) when a member can be no phase, or the intermediates and the
trees' partial results exceed `shared_bytes`.
"""
from __future__ import annotations

import math
from dataclasses import replace

from polytile.ir import nodes as N
from polytile.ir.polyhedra import writes_disjoint
from polytile.ir.rows import across_repeats, member_loops, phase_of, required_barriers

SHARED = "shared"       # the refinement location of the group's local memory


def warp_of(group: int, warp: int) -> int:
    """The warp a group of `group` work-items combines its partial results in: `warp`
    where the group is whole warps, at most `warp` of them; else 0 (a tree in local
    memory)."""
    return warp if 2 <= warp <= group <= warp * warp else 0


def group_size(members: list[N.Block], threads: int) -> int:
    """Work-items of the group: the largest power of two up to `threads` and the
    longest member loop (a row of 37 gets 32; 1000 gets `threads`)."""
    longest = max((i.range for m in members for i in member_loops(m)), default=1)
    size = 1
    while size * 2 <= min(threads, longest):
        size *= 2
    return size


def shared_bytes_of(block: N.Block, phases: list[tuple[str, str]], threads: int,
                    warp: int = 0) -> int:
    """Local memory the row group takes: its intermediates, and the partial results of
    each reduction (one element per work-item for a tree, per warp with shuffles) that
    its across members (kind, loop) run."""
    total = sum(math.prod(r.shape.sizes) * r.shape.dtype.numpy.itemsize
                for r in block.refs if not r.from_)
    parts = threads // warp if warp else threads
    for member, (kind, loop) in zip(block.stmts, phases):
        if kind == "across":
            assert isinstance(member, N.Block)
            (store,) = [st for st in member.stmts if isinstance(st, N.Store)]
            total += parts * across_repeats(member, loop) * \
                member.ref(store.ref).shape.dtype.numpy.itemsize
    return total


def row_group(block: N.Block, threads: int, shared_bytes: int, warp: int = 0
              ) -> N.Block | None:
    """`block` (a fused row block) as a row group, or None where it cannot be one."""
    loops = [i for i in block.idxs if i.affine is None]
    if "fused" not in block.tags or len(loops) != 1 or block.constraints \
            or block.schedule != N.BlockSchedule() or threads < 2:
        return None
    members = [st for st in block.stmts if isinstance(st, N.Block)]
    if not members or len(members) != len(block.stmts) \
            or not writes_disjoint(block, loops[0].name):   # rows summed into one output
        return None
    size = group_size(members, threads)
    warp = warp_of(size, warp)
    decided = [p for p in (phase_of(st, size) for st in members) if p is not None]
    if size < 2 or len(decided) != len(members) or \
            shared_bytes_of(block, decided, size, warp) > shared_bytes:
        return None
    phases = tuple(N.RowPhase(k, b, loop) for (k, loop), b
                   in zip(decided, required_barriers(members, decided)))
    refs = tuple(r if r.from_ else replace(r, location=SHARED) for r in block.refs)
    row = loops[0].name
    return replace(block, refs=refs, schedule=N.BlockSchedule(
        gpu=((row, "grid"),), rows=N.RowGroup(row, size, phases, warp)))
