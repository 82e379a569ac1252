"""How the members of a fused row block share one work-group (FusionStitching's block
composition, §5, on a GPU): what each member is as a phase of the group, and where the
group must wait.

    block fused_0 [r:13] #fused schedule(grid(r), rows(r, 64, single barrier, across barrier,
                                           spread barrier, single barrier, across barrier, spread))
      block s0_init [n = r] ( out mx )                  # single: work-item 0
      block s0 [n = r, m:70] ( out mx:max  in X[n, m] ) # across: a tree over the group
      block s1 [n = r, m:70] ( out e[0, m] ... )        # spread: m = t, t + 64, ...
      ...

A member with no loop (over more than one value) is `single`; one with one loop is
`spread` when iterations that differ in it write different elements, else `across` when
it is a reduction along that loop (one store aggregating into an output that does not
depend on it). Anything else (two loops, nested blocks, data-dependent subscripts: a
failed check would end a work-item between barriers; the member's own local buffers)
has no phase kind, and the row block is not a row group.

A barrier follows a member when a later member, before the next barrier, touches a
buffer it writes or writes one it reads (`phases.depends`): work-item t writes the
elements t, t + T, ... of a spread phase and may read any element in a later one.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from polytile.ir import nodes as N
from polytile.ir.phases import depends
from polytile.ir.polyhedra import WRITE_DIRS, writes_disjoint

ACROSS_AGGS = ("add", "mul", "max", "min")


def member_loops(member: N.Block) -> list[N.Index]:
    """The loops of a member that take more than one value."""
    return [i for i in member.idxs if i.affine is None and i.range > 1]


def plain_leaf(block: N.Block) -> bool:
    """A block of loads, stores and arithmetic only, without data-dependent subscripts
    (a failed check would end a work-item between barriers)."""
    return all(isinstance(st, (N.Load, N.Store, N.Intrinsic, N.Constant, N.LoadIndex))
               for st in block.stmts) and not any(
        isinstance(st, N.Load) and (st.offset is not None or any(st.dynamic))
        for st in block.stmts)


def phase_kind(member: N.Statement) -> str | None:
    """`single`, `spread` or `across` for a member of a row block, or None where the
    member cannot be a phase of a work-group (see the module docstring)."""
    if not isinstance(member, N.Block) or not plain_leaf(member):
        return None
    if any(not r.from_ for r in member.refs) or member.schedule != N.BlockSchedule():
        return None
    loops = member_loops(member)
    if not loops:
        return "single"
    if len(loops) > 1:
        return None
    (loop,) = loops
    first = replace(member, idxs=(loop, *(i for i in member.idxs if i is not loop)))
    if writes_disjoint(first, loop.name):
        return "spread"
    stores = [st for st in member.stmts if isinstance(st, N.Store)]
    if len(stores) == 1:
        out = member.ref(stores[0].ref)
        if out.agg in ACROSS_AGGS and not any(loop.name in a.names for a in out.access):
            return "across"
    return None


def required_barriers(members: Sequence[N.Block]) -> list[bool]:
    """Per member, whether the group waits after it: the member before any member that
    depends on one since the last barrier."""
    needed = [False] * len(members)
    since: list[N.Block] = []
    for k, member in enumerate(members):
        if any(depends(p, member) for p in since):
            needed[k - 1] = True
            since = []
        since.append(member)
    return needed


def global_handoffs(block: N.Block) -> set[str]:
    """The buffers of a row block in global memory (not its local buffers) that one
    member writes and another touches. A work-group barrier orders only local memory on
    OpenCL (CLK_LOCAL_MEM_FENCE), so such a block is not made a row group."""
    local = {r.into for r in block.refs if not r.from_}
    members = [m for m in block.stmts if isinstance(m, N.Block)]
    found: set[str] = set()
    for k, member in enumerate(members):
        written = {r.from_ for r in member.refs if r.dir in WRITE_DIRS and r.from_}
        for other in members[:k] + members[k + 1:]:
            found |= written & {r.from_ for r in other.refs if r.from_}
    return found - local
