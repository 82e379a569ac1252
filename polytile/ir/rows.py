"""How the members of a fused row block share one work-group (FusionStitching's block
composition, §5, on a GPU): what each member is as a phase of the group, and where the
group must wait.

    block fused_0 [r:13] #fused schedule(grid(r), rows(r, 64, single barrier,
        across(m) barrier, spread(m) barrier, single barrier, across(m) barrier, spread(m)))
      block s0_init [n = r] ( out mx )                  # single: work-item 0
      block s0 [n = r, m:70] ( out mx:max  in X[n, m] ) # across: a tree over the group
      block s1 [n = r, m:70] ( out e[0, m] ... )        # spread: m = t, t + 64, ...
      ...

A member with no loop (over more than one value) is `single`. A member with loops deals
one of them out to the work-items: `spread(m)` where iterations that differ in m write
different elements (each work-item then runs the member's other loops in full for its
own m: an elementwise member, or a small contraction whose other loops are its
reductions, the paper's thread composition); `across(m)` where m is a reduction of the
member's one aggregating store and every other loop is one the output depends on (the
group combines the terms along m once for each value of the others: at most
ACROSS_REPEATS, unrolled). Members of one group may deal out loops of different ranges:
the multi-interests motif's `S(k,l) += C(k,d) * X(l,d)` spreads l, its row maxima
`mx(k) max= S(k,l)` share l across the group for each k, and `O(k,d) += W(k,l) *
X(l,d)` spreads d. Anything else (nested blocks, data-dependent subscripts: a failed
check would end a work-item between barriers; the member's own local buffers) is no
phase, and the row block is not a row group. Which of a member's possible phases it
takes is pass `gpu`'s choice (`phase_of`); `valid_phase` is what the verifier checks.

A barrier follows a member when a later member, before the next barrier, touches a
buffer it writes or writes one it reads (`phases.depends`): work-item t writes the
elements t, t + T, ... of a spread phase and may read any element in a later one.
Except where both spread loops of one range and an element iteration l of one touches
is touched by no other iteration of the other (one of them writing): work-item t runs
the same iterations l of both (softmax's exp then its division need none).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from polytile.ir import nodes as N
from polytile.ir.phases import depends, same_iterations
from polytile.ir.polyhedra import WRITE_DIRS, writes_disjoint

ACROSS_AGGS = ("add", "mul", "max", "min")
# At most, reductions one across member runs (one per value of its other loops): the
# lowering unrolls them, each with its own partial results in local memory.
ACROSS_REPEATS = 8


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


def phase_of(member: N.Statement, group: int) -> tuple[str, str] | None:
    """The phase (kind, loop) a member takes in a group of `group` work-items, or None
    where it can be none: `single` without loops; else `spread` along its longest loop
    that writes disjoint elements (the later of equal ones: consecutive work-items then
    touch neighbouring elements), unless that keeps fewer than half of the group busy
    and an `across` loop is longer (a row maximum over 50 columns for each of 4 rows
    shares the 50 columns, rather than leaving 60 of 64 work-items idle)."""
    if not _plain_member(member):
        return None
    assert isinstance(member, N.Block)
    loops = member_loops(member)
    if not loops:
        return ("single", "")
    spread = _longest([i for i in loops if _disjoint(member, i)])
    across = _longest([i for i in loops if _shared(member, i)])
    if spread is not None and (across is None or spread.range >= min(across.range, group / 2)):
        return ("spread", spread.name)
    if across is not None:
        return ("across", across.name)
    return None


def valid_phase(member: N.Statement, kind: str, loop: str) -> bool:
    """Whether `member` may run as phase `kind` dealing out `loop` (see the module
    docstring)."""
    if not _plain_member(member):
        return False
    assert isinstance(member, N.Block)
    loops = {i.name: i for i in member_loops(member)}
    if kind == "single":
        return not loops and not loop
    if loop not in loops:
        return False
    return _disjoint(member, loops[loop]) if kind == "spread" else \
        kind == "across" and _shared(member, loops[loop])


def _plain_member(member: N.Statement) -> bool:
    return isinstance(member, N.Block) and plain_leaf(member) and \
        all(r.from_ for r in member.refs) and member.schedule == N.BlockSchedule()


def _longest(loops: list[N.Index]) -> N.Index | None:
    best = None
    for i in loops:
        if best is None or i.range >= best.range:
            best = i
    return best


def _disjoint(member: N.Block, loop: N.Index) -> bool:
    """Whether iterations that differ in `loop` write different elements."""
    first = replace(member, idxs=(loop, *(i for i in member.idxs if i is not loop)))
    return writes_disjoint(first, loop.name)


def _shared(member: N.Block, loop: N.Index) -> bool:
    """Whether `loop` is a reduction of the member's one aggregating store that the group
    can share: the output does not depend on it and depends on every other loop, which
    take at most ACROSS_REPEATS values together."""
    stores = [st for st in member.stmts if isinstance(st, N.Store)]
    if len(stores) != 1:
        return False
    out = member.ref(stores[0].ref)
    used = {n for a in out.access for n in a.names}
    return out.agg in ACROSS_AGGS and loop.name not in used and \
        all(i.name in used for i in member_loops(member) if i is not loop) and \
        across_repeats(member, loop.name) <= ACROSS_REPEATS


def across_repeats(member: N.Block, loop: str) -> int:
    """How many reductions along `loop` an across member runs: one per value of its
    other loops."""
    return math.prod(i.range for i in member_loops(member) if i.name != loop)


def required_barriers(members: Sequence[N.Block], phases: Sequence[tuple[str, str]]
                      ) -> list[bool]:
    """Per member, whether the group waits after it: the member before any member that
    depends on one since the last barrier, unless both spread loops of one range whose
    iterations r and r' != r touch no element in common, one writing (work-item t runs
    the same iterations of both, so it reads only what it wrote)."""
    needed = [False] * len(members)
    since: list[tuple[N.Block, tuple[str, str]]] = []
    for k, (member, phase) in enumerate(zip(members, phases)):
        if any(depends(p, member) and not _same_work_item(p, q, member, phase)
               for p, q in since):
            needed[k - 1] = True
            since = []
        since.append((member, phase))
    return needed


def _same_work_item(earlier: N.Block, first: tuple[str, str], later: N.Block,
                    second: tuple[str, str]) -> bool:
    return first[0] == second[0] == "spread" and \
        same_iterations(earlier, first[1], later, second[1])


def global_handoffs(block: N.Block) -> set[str]:
    """The buffers of a row block in global memory (not its local buffers) that one
    member writes and another touches. The group's barriers then order global memory
    too (OpenCL's CLK_GLOBAL_MEM_FENCE; CUDA's __syncthreads orders both)."""
    local = {r.into for r in block.refs if not r.from_}
    members = [m for m in block.stmts if isinstance(m, N.Block)]
    found: set[str] = set()
    for k, member in enumerate(members):
        written = {r.from_ for r in member.refs if r.dir in WRITE_DIRS and r.from_}
        for other in members[:k] + members[k + 1:]:
            found |= written & {r.from_ for r in other.refs if r.from_}
    return found - local
