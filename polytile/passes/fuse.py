"""fuse (TC §5 fusion, Stripe "Fusion"): consecutive kernels that share an outer
parallel index become one loop nest over that index, and temporaries used only
inside it shrink to one row (localize).

    block s0 [i0:N, i1:M] ( out t[i0, i1] )          block fused_0 [r:N] #fused (
    block s1 [i0:N, i1:M] ( in t[i0, i1] ...)   ->      none t[0, 0] float32(1:M, M:1) @local
                                                        block s0 [i1:M, i0 = r] ( out t <- t[0, i1] )
                                                        block s1 [i1:M, i0 = r] ( in t <- t[0, i1] ) )

Legality comes from exact dependences: for every pair of accesses to one buffer
(at least one a write) by two members, isl proves that rows r != r' never touch the
same element, so the fused rows are independent and can run in parallel.
Strategies (TC §6.2 names max, preserve-parallelism and min):

    rows  a member must also not reuse a large input across rows: a contraction whose
          weights, shared by every row, exceed half of L1 keeps its own tiled loop nest;
          nor be a column reduction (its row index walks an input's unit-stride
          dimension while it reduces over another): fused, every row would read a
          strided column; alone, the row index is its vector index. An init whose
          contraction does not join stays beside it (pass fold makes it its first writes)
    max   every kernel whose rows are independent fuses, such a contraction included
          (it gives up its cache tiles for the row loop)
    none  no fusion

A column reduction whose result is small (at most a quarter of L1) joins a row loop
over the rows it reduces: `d_beta(d) +=! d_Y(n, d)` after a loop over n reads each row
of d_Y while it is in cache instead of in a pass of its own. Its index n becomes the
fused row, the fused block adds into the result (aggregation add), and pass autotile
runs the rows in threads that add into private copies of it (`BlockSchedule.combine`).
The statement that clears the result moves in front of the row loop.

    block s0 [i0:N, i1:D] (out o0[i0, i1])       block s1_init [i0:D] (out o1[i0])
    block s1_init [i0:D] (out o1[i0])       ->   block fused_0 [r:N] #fused (inout o1:add)
    block s1 [i0:D, i1:N] (out o1[i0]:add)          block s0 [i0 = r, i1:D]
                                                    block s1 [i1 = r, i0:D] (out o1[i0]:add)

An elementwise statement whose later index runs over the loop's rows joins it over that
index (a side member), where it reads what the loop touches, each row of it takes at
most half of L2 and is runs of elements (the index steps no view along its unit stride
that also moves along another): batchnorm's normalization Y(n, c, h, w) joins the loop
over channels that computes their mean and scale, reading each channel's images a third
time from the caches instead of memory (64x256x28x28, two threads, Xeon: with autotile's
sweep of its rows, 8.3 -> 6.7-7.3 ms).

Both "rows" and "max" keep the fused loop parallel; fusing across a dependence between
rows (which would serialize it) is not built.

With a fusion plan's groups (`fuse.groups`, polytile.graph's decision), a group that is
not one row loop becomes one stitched block (FusionStitching §5): its row loops and
statements are the phases of one parallel region, scheduled by autotile
(`BlockSchedule.stitch`, polytile.ir.phases) and lowered by polytile.loops.region.

    block s0 [i0:N, i1:D] (out A[i0, i1])       block stitched_0 #stitched (
    block s1 [i0:D, i1:N] (in A[i1, i0] ...)  ->   block s0 [i0:N, i1:D] ...     (phase 0)
                                                   block s1 [i0:D, i1:N] ... )   (phase 1)
"""
from __future__ import annotations

import functools
import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import islpy as isl

from polytile.errors import ArgumentError
from polytile.ir import nodes as N
from polytile.passes.epilogue import EPILOGUE
from polytile.passes.pipeline import one_of, register
from polytile.targets.target import Target

ROW = "r"
STRATEGIES = ("rows", "max", "none", "plan")


def _row_index(block: N.Block) -> N.Index | None:
    """The block's first index, when every view it writes depends on it."""
    if not block.idxs or block.idxs[0].affine is not None:
        return None
    first = block.idxs[0]
    outs = [r for r in block.refs if r.dir in ("out", "inout")]
    if not outs or not all(any(a.coeff(first.name) for a in r.access) for r in outs):
        return None
    return first


def _column_member(block: N.Block, rows: int, budget: float) -> N.Block | None:
    """`block` with its first index a reduced index of `rows` iterations, when it is a
    column reduction that can join a row loop over that index: every write adds, at
    a place independent of it, into a small float buffer; else None."""
    if "kernel" not in block.tags or any(isinstance(s, N.Block) for s in block.stmts):
        return None
    outs = [r for r in block.refs if r.dir in ("out", "inout")]
    if not outs or any(r.agg != "add" or r.dir != "out" or r.shape.dtype not in N.COMBINABLE
                       for r in outs):
        return None
    if sum(_view_bytes(r, block) for r in outs) > budget or (
            {r.from_ for r in outs} & {r.from_ for r in block.refs if r.dir == "in"}):
        return None
    for idx in block.idxs:
        if (idx.affine is None and idx.range == rows
                and not any(a.coeff(idx.name) for r in outs for a in r.access)
                and any(a.coeff(idx.name) for r in block.refs if r.dir == "in"
                        for a in r.access)):
            return replace(block, idxs=(idx, *(i for i in block.idxs if i is not idx)))
    return None


def _fusible(block: N.Block, budget: float) -> bool:
    if "kernel" not in block.tags or any(isinstance(s, N.Block) for s in block.stmts):
        return False
    row = _row_index(block)
    if row is None or _column_reduction(block, row.name):
        return False
    shared = 0
    for ref in block.refs:
        if ref.dir == "in" and not any(a.coeff(row.name) for a in ref.access):
            shared += _view_bytes(ref, block)
    return shared <= budget


def _column_reduction(block: N.Block, row: str) -> bool:
    written = {n for r in block.refs if r.dir in ("out", "inout") for a in r.access
               for n in a.names}
    reduced = {i.name for i in block.idxs} - written
    for ref in block.refs:
        if ref.dir != "in":
            continue
        unit = [a for a, d in zip(ref.access, ref.shape.dims) if d.stride == 1]
        strided = [a for a, d in zip(ref.access, ref.shape.dims) if d.stride != 1]
        if any(a.coeff(row) for a in unit) and any(a.coeff(n) for a in strided
                                                  for n in reduced):
            return True
    return False


def _view_bytes(ref: N.Refinement, block: N.Block) -> int:
    ranges = {i.name: i.range for i in block.idxs}
    elems = 1
    for a, d in zip(ref.access, ref.shape.dims):
        elems *= d.size + sum(abs(c) * (ranges.get(n, 1) - 1) for n, c in a.terms)
    return elems * max(1, ref.shape.dtype.bits // 8)


def _domain(block: N.Block, tag: str) -> tuple[list[str], list[str]]:
    """isl variable names and constraints of a block's iteration space; the row index
    is named `tag_row`."""
    names, cons = [], []
    row = block.idxs[0].name
    for idx in block.idxs:
        v = f"{tag}_{idx.name}"
        names.append(v)
        cons.append(f"0 <= {v} < {idx.range}")
    for c in block.constraints:
        cons.append(f"{_isl(c, tag)} >= 0")
    assert row
    return names, cons


def _isl(a: N.Affine, tag: str) -> str:
    text = str(a.const)
    for n, c in a.terms:
        text += f" {'-' if c < 0 else '+'} {abs(c)}*{tag}_{n}"
    return text


@functools.lru_cache(maxsize=4096)    # a fusion plan asks about the same pairs many times
def _conflict_free(a: N.Block, b: N.Block) -> bool:
    """No element is touched by row r of `a` and row r' != r of `b` (one of them writing)."""
    na, ca = _domain(a, "a")
    nb, cb = _domain(b, "b")
    for ra in a.refs:
        for rb in b.refs:
            if ra.from_ != rb.from_ or (ra.dir == "in" and rb.dir == "in"):
                continue
            same = [f"{_isl(x, 'a')} = {_isl(y, 'b')}" for x, y in zip(ra.access, rb.access)]
            rows = f"a_{a.idxs[0].name} != b_{b.idxs[0].name}"
            text = (f"{{ [{', '.join(na + nb)}] : {' and '.join(ca + cb + same + [rows])} }}")
            if not isl.Set(text).is_empty():
                return False
    return True


def fuse(fn: N.Function, target: Target, params: dict[str, Any]) -> N.Function:
    strategy = params.get("strategy", "rows")
    if strategy not in STRATEGIES:
        raise ArgumentError(f"fuse.strategy must be one of {', '.join(STRATEGIES)}, "
                            f"got {strategy!r}")
    if params.get("groups") is not None:
        return _assemble(fn, planned_groups(fn, target, params["groups"]))
    if strategy == "plan":
        raise ArgumentError("fuse.strategy plan needs the plan's groups (fuse.groups)",
                            hint="compile through polytile.compile.Compiler, which asks "
                                 "polytile.graph for the plan, or pass fuse.groups")
    if strategy == "none":
        return fn
    budget = math.inf if strategy == "max" else target.cache_size("L1") // 2
    # "max" fuses what it can, epilogues with anything (a choice the tuner keeps).
    return _assemble(fn, row_groups(list(fn.body.stmts), target, budget,
                                    epilogues=strategy == "max"))


def row_groups(body: list[N.Statement], target: Target, budget: float,
               epilogues: bool = True) -> list[list[N.Statement]]:
    """Consecutive statements grouped into row loops; a hoisted init is a group of its
    own, in front of the loop it was taken out of. Without `epilogues`, a contraction's
    epilogue (pass epilogue) joins only the row loop of its contraction, and a matrix
    product with an epilogue stays out of row loops with its epilogue and its init:
    autotile tiles it as a GEMM and runs the epilogue in its register tiles (MLP3's last
    layer, whose 32 x 64 weights fit the row loop's budget: 128x128x64x32x2 33.9 and
    35.3 us against 35.2 and 37.8 us as a row loop, 128x256x128x64x32 88.0 and 91.4
    against 91.1 and 92.6 us; Intel Xeon, two threads, `benchmarks/kernel_ab.py`, two
    runs)."""
    before = {id(b): a for a, b in itertools.pairwise(body)}
    solo = set() if epilogues else _solo(body)

    def alone(s: N.Statement) -> bool:
        return not epilogues and isinstance(s, N.Block) and EPILOGUE in s.tags

    groups: list[list[N.Statement]] = []
    body = list(body)
    while body:
        s = body.pop(0)
        last = groups[-1] if groups else None
        rows = (_row_index(last[0]).range  # type: ignore[union-attr]
                if last and isinstance(last[0], N.Block) and _fusible(last[0], budget)
                and not alone(last[0]) and id(last[0]) not in solo else None)
        if id(s) in solo or alone(s) and not (last and any(m is before.get(id(s))
                                                           for m in last)):
            rows = None
        if rows is None:
            groups.append([s])
            continue
        assert last is not None
        if isinstance(s, N.Block) and _joins(s, last, rows, budget):
            writer = _cleared_for(s, body)
            if writer is None:
                last.append(s)
                continue
            # An init joins together with the statement it clears for, or not at all:
            # left in the row loop alone, it would keep pass fold from making it that
            # contraction's first writes (a gradient's d_I(b, m) +=! d_O(b, n) * W(n, m)
            # after an elementwise row loop: 1 MB zeroed, then read back).
            if _joins(writer, [*last, s], rows, budget):
                last += [s, body.pop(0)]
                continue
        column = _joining_column(s, body, last, rows, target.cache_size("L1") // 4)
        if column is not None:
            init, member = column
            if init is not None:
                body.pop(0)
                groups.insert(len(groups) - 1, [init])
            last.append(member)
            continue
        side = _side_member(s, last, rows, budget, target.cache_size("L2") // 2)
        if side is not None:
            last.append(side)
            continue
        groups.append([s])
    return groups


def _solo(body: list[N.Statement]) -> set[int]:
    """(ids of) each matrix product with an epilogue after it, that epilogue, and the init
    right before the contraction that clears its output."""
    solo: set[int] = set()
    for k in range(1, len(body)):
        c, e = body[k - 1], body[k]
        if not (isinstance(e, N.Block) and EPILOGUE in e.tags and isinstance(c, N.Block)
                and "contraction" in c.tags):
            continue
        written = [r for r in c.refs if r.dir != "in"]
        if not _outer_product(c, written):
            continue
        solo |= {id(c), id(e)}
        init = body[k - 2] if k >= 2 else None
        if isinstance(init, N.Block) and "init" in init.tags and \
                {r.from_ for r in init.refs} & {r.from_ for r in written}:
            solo.add(id(init))
    return solo


def _outer_product(c: N.Block, written: list[N.Refinement]) -> bool:
    """Whether contraction `c` is a matrix product, not batched: one output, and for each
    of its indices an input that does not depend on it (what a register tile broadcasts
    and what it loads as vectors). Batched products of small matrices stay in row loops
    (the multi-interests motif's 4 x 50 products: 2.1x the time as kernels)."""
    if len(written) != 1:
        return False
    out = {n for a in written[0].access for n in a.names}
    inputs = [{n for a in r.access for n in a.names} for r in c.refs if r.dir == "in"]
    return len(out) >= 2 and len(inputs) >= 2 and \
        all(any(n not in names for names in inputs) for n in out)


def _joins(s: N.Block, group: list[N.Statement], rows: int, budget: float) -> bool:
    """Whether `s` may join the row loop `group` of `rows` rows."""
    return (_fusible(s, budget) and _row_index(s).range == rows  # type: ignore[union-attr]
            and all(_conflict_free(m, s) for m in group))  # type: ignore[arg-type]


def _cleared_for(s: N.Block, rest: list[N.Statement]) -> N.Block | None:
    """The statement after `s` when `s` is an init that clears what it writes."""
    if "init" not in s.tags or not rest or not isinstance(rest[0], N.Block):
        return None
    after = rest[0]
    cleared = {r.from_ for r in s.refs}
    return after if cleared & {r.from_ for r in after.refs if r.dir != "in"} else None


def _assemble(fn: N.Function, groups: list[list[N.Statement]]) -> N.Function:
    stmts: list[N.Statement] = []
    temps = {r.into for r in fn.body.refs if r.dir == "none"}
    for k, group in enumerate(groups):
        if len(group) == 1:
            stmts.append(group[0])
            continue
        stmts.append(_fused(f"fused_{k}", group, fn.body))  # type: ignore[arg-type]
    body = replace(fn.body, stmts=tuple(stmts))
    return replace(fn, body=_localize(body, temps))


def _side_member(s: N.Statement, group: list[N.Statement], rows: int, budget: float,
                 cached: int) -> N.Block | None:
    """`s` with a later index first, when it is an elementwise statement that joins the
    row loop `group` over that index: batchnorm's normalization Y(n, c, h, w) after the
    loop over channels c that computes their statistics, each channel's rows of X
    (N*H*W elements) read a third time from the caches instead of from memory. It reads
    what the loop touches, it is no init (pass fold makes an init its contraction's
    first writes), the index steps no view along its unit-stride dimension (a row is
    runs of elements, not a column), and each row's views (one value of the index) take
    at most `cached` bytes; else None."""
    if not isinstance(s, N.Block) or "kernel" not in s.tags or "init" in s.tags:
        return None
    outs = [r for r in s.refs if r.dir in ("out", "inout")]
    if not outs or any(r.agg != "assign" for r in outs):
        return None
    touched = {r.from_ for m in group if isinstance(m, N.Block) for r in m.refs}
    if not touched & {r.from_ for r in s.refs if r.dir == "in"}:
        return None
    for idx in s.idxs[1:]:
        if idx.affine is not None or idx.range != rows or not all(
                any(a.coeff(idx.name) for a in r.access) for r in outs):
            continue
        # A row must read and write runs of elements, not a column (a transpose): no
        # view that moves along other indices too steps along its unit stride with it.
        if any(any(a.coeff(idx.name) and d.stride == 1 for a, d in zip(r.access, r.shape.dims))
               and any(n != idx.name for a in r.access for n in a.names) for r in s.refs):
            continue
        one_row = replace(s, idxs=tuple(replace(i, range=1) if i is idx else i
                                        for i in s.idxs))
        if sum(_view_bytes(r, one_row) for r in s.refs) > cached:
            continue
        moved = replace(s, idxs=(idx, *(i for i in s.idxs if i is not idx)))
        if _fusible(moved, budget) and all(_conflict_free(m, moved) for m in group):  # type: ignore[arg-type]
            return moved
    return None


def _joining_column(s: N.Statement, rest: list[N.Statement], group: list[N.Statement],
                    rows: int, budget: float) -> tuple[N.Block | None, N.Block] | None:
    """How a column reduction joins `group`, a row loop of `rows` rows: the statement
    that clears its result, if `s` is that statement and the reduction follows it, moves
    in front of the loop, and the reduction (with its row first) becomes a member."""
    init = None
    if isinstance(s, N.Block) and "init" in s.tags and rest:
        init, s = s, rest[0]
    if not isinstance(s, N.Block):
        return None
    member = _column_member(s, rows, budget)
    if member is None or not all(_conflict_free(m, member) for m in group):  # type: ignore[arg-type]
        return None
    if init is not None:
        cleared = {r.from_ for r in init.refs}
        written = {r.from_ for r in member.refs if r.dir != "in"}
        touched = {r.from_ for m in group if isinstance(m, N.Block) for r in m.refs}
        if cleared != written or cleared & touched:
            return None
    return init, member


def _fused(name: str, members: list[N.Block], parent: N.Block) -> N.Block:
    rows = members[0].idxs[0].range
    added: set[str] = set()
    for m in members:
        for r in m.refs:
            # A column member's result: every row adds into it (not with one row, where a
            # member may also assign it: the seed 104 find, sizes of 1 under "max").
            if rows > 1 and r.dir != "in" and not any(a.coeff(m.idxs[0].name)
                                                      for a in r.access):
                added.add(r.from_)
    inner = []
    for m in members:
        row = m.idxs[0]
        idxs = (N.Index(row.name, 1, N.Affine.index(ROW)),) + m.idxs[1:]
        inner.append(replace(m, idxs=idxs))
    return N.Block(name, (N.Index(ROW, rows),), (), _outer_refs(members, parent, added),
                   tuple(inner), frozenset({"fused"}))


def _outer_refs(members: Sequence[N.Block], parent: N.Block,
                added: set[str]) -> tuple[N.Refinement, ...]:
    """Whole views of the parent's buffers the members touch, each in the direction of
    all their uses; the `added` ones aggregate by add."""
    used: dict[str, set[str]] = {}
    for m in members:
        for r in m.refs:
            used.setdefault(r.from_, set()).add(r.dir)
    refs = []
    for p in parent.refs:
        if p.into not in used:
            continue
        dirs = used[p.into]
        direction = "in" if dirs == {"in"} else ("out" if "in" not in dirs and
                                                 "inout" not in dirs else "inout")
        refs.append(N.Refinement(direction, p.into, p.into, tuple(N.Affine() for _ in p.access),
                                 p.shape, "add" if p.into in added else "assign"))
    return tuple(refs)


def _localize(body: N.Block, temps: set[str]) -> N.Block:
    """A temporary used by one fused block only, always at its row, becomes a one-row
    buffer allocated inside that block (each row, and so each thread, has its own). In
    a stitched block, the same holds of its phases: a temporary only one of its row
    loops uses is that loop's; one that phases pass each other stays a whole buffer of
    the function, shared by the threads (allocated once per call)."""
    users: dict[str, list[int]] = {}
    for k, s in enumerate(body.stmts):
        if isinstance(s, N.Block):
            for r in s.refs:
                users.setdefault(r.from_, []).append(k)
    stmts = list(body.stmts)
    moved: set[str] = set()
    for name in (r.into for r in body.refs if r.into in temps):   # deterministic order
        ks = set(users.get(name, []))
        if len(ks) != 1:
            continue
        k = ks.pop()
        block = stmts[k]
        assert isinstance(block, N.Block)
        if "stitched" in block.tags:
            inner = _localize(block, {name})
            if all(r.into != name for r in inner.refs):
                stmts[k] = inner
                moved.add(name)
            continue
        if "fused" not in block.tags:
            continue
        dim = row_dim(block, name)
        if dim is None:
            continue
        stmts[k] = shrink_to_row(block, name, dim, body.ref(name))
        moved.add(name)
    refs = tuple(r for r in body.refs if r.into not in moved)
    return replace(body, refs=refs, stmts=tuple(stmts))


def row_dim(block: N.Block, buffer: str) -> int | None:
    """The dimension every member indexes with exactly the fused row."""
    dims: set[int] = set()
    for m in block.stmts:
        if not isinstance(m, N.Block):
            return None
        row = m.idxs[0].name
        for r in m.refs:
            if r.from_ != buffer:
                continue
            found = [d for d, a in enumerate(r.access) if a == N.Affine.index(row)]
            others = [d for d, a in enumerate(r.access) if row in a.names and d not in found]
            if len(found) != 1 or others:
                return None
            dims.add(found[0])
    return dims.pop() if len(dims) == 1 else None


def shrink_to_row(block: N.Block, buffer: str, dim: int, top: N.Refinement) -> N.Block:
    """`block` (a fused row loop) with its view `buffer` of shape `top` replaced by a
    one-row local of its own: dimension `dim`, which every member indexes with exactly
    the row, shrinks to 1 and the members' views move onto the local."""
    dims = list(top.shape.dims)
    dims[dim] = N.Dim(1, dims[dim].stride)
    # Recompute contiguous strides for the one-row buffer.
    sizes = [d.size for d in dims]
    strides, step = [], 1
    for size in reversed(sizes):
        strides.append(step)
        step *= max(size, 1)
    shape = N.TensorShape(top.shape.dtype,
                          tuple(N.Dim(s, st) for s, st in zip(sizes, reversed(strides))))
    local = N.Refinement("none", "", buffer, tuple(N.Affine() for _ in dims), shape,
                         "assign", "local")
    members = []
    for m in block.stmts:
        assert isinstance(m, N.Block)
        refs = []
        for r in m.refs:
            if r.from_ == buffer:
                access = list(r.access)
                access[dim] = N.Affine()
                rdims = tuple(N.Dim(d.size, st.stride) for d, st in zip(r.shape.dims,
                                                                         shape.dims))
                r = replace(r, access=tuple(access), shape=N.TensorShape(r.shape.dtype, rdims))
            refs.append(r)
        members.append(replace(m, refs=tuple(refs)))
    refs = tuple(r for r in block.refs if r.into != buffer) + (local,)
    return replace(block, refs=refs, stmts=tuple(members))


# ------------------------------------------------------------------ a fusion plan's groups
# polytile.graph decides which statements form one kernel (FusionStitching's ILP plan);
# this pass only builds those groups, in the plan's order, and refuses one it cannot
# build as one row loop (a plan made elsewhere is checked before it is obeyed).

def statement_of(block: N.Statement) -> int | None:
    """The TC statement a top-level block comes from (`s3`, `s3_init`), by its name."""
    if not isinstance(block, N.Block):
        return None
    found = _STATEMENT.fullmatch(block.name)
    return int(found.group(1)) if found else None


def planned_groups(fn: N.Function, target: Target,
                   plan: Sequence[Sequence[int]]) -> list[list[N.Statement]]:
    """The plan's groups of statement numbers as groups of blocks, in the plan's order;
    within a group the statements keep their order. A group fuses into one row loop
    (with the inits of its column sums hoisted in front) where it can; otherwise, on a
    target whose code runs in OpenMP threads, it becomes one stitched block whose
    phases are its row loops and statements (`stitched`)."""
    owner: dict[int, list[N.Statement]] = {}
    for s in fn.body.stmts:
        k = statement_of(s)
        if k is None:
            raise ArgumentError(f"fuse.groups: top-level statement {getattr(s, 'name', s)!r} "
                                "comes from no TC statement", hint="run fuse before passes "
                                "that rename top-level blocks")
        owner.setdefault(k, []).append(s)
    planned = [k for g in plan for k in g]
    # A statement over an empty range has no block (ir.lower): the plan may name it.
    if len(planned) != len(set(planned)) or not set(owner) <= set(planned):
        raise ArgumentError(f"fuse.groups {_plan_text(plan)} must name every statement "
                            f"{sorted(owner)} once")
    groups: list[list[N.Statement]] = []
    for n, g in enumerate(plan):
        present = sorted(k for k in g if k in owner)
        blocks = [b for k in present for b in owner[k]]
        made = (row_groups(blocks, target, math.inf) if len(present) > 1
                else [[b] for b in blocks])
        if len(present) > 1 and _loops(made) != 1:
            if not stitches(target):
                raise ArgumentError(f"fuse.groups: statements {sorted(g)} do not fuse into one "
                                    f"row loop, and target {target.name} runs no OpenMP "
                                    "region to stitch them in", hint="each group's statements "
                                    "must share their first index's range and write rows "
                                    "independently (see docs/fusion.md)")
            groups.append([stitched(f"stitched_{n}", made, fn.body)])
            continue
        groups.extend(made)
    return groups


def stitches(target: Target) -> bool:
    """Whether the target's code can stitch phases into one parallel region: a C
    backend with OpenMP (the GPU compositions are not built)."""
    return target.openmp and target.backend.startswith("c-")


def stitched(name: str, made: list[list[N.Statement]], parent: N.Block) -> N.Block:
    """One block whose statements are the phases of a stitched kernel: each group of
    `made` (a row loop, or one statement) is a phase. Its refinements are every buffer
    a phase touches, whole; pass autotile schedules the phases and records how they
    share the threads (`BlockSchedule.stitch`)."""
    phases: list[N.Block] = []
    for j, group in enumerate(made):
        if len(group) == 1:
            phases.append(group[0])  # type: ignore[arg-type]
        else:
            phases.append(_fused(f"{name}_rows{j}", group, parent))  # type: ignore[arg-type]
    return N.Block(name, (), (), _outer_refs(phases, parent, set()), tuple(phases),
                   frozenset({"stitched"}))


def row_loop(fn: N.Function, target: Target, group: Sequence[int]) -> bool:
    """Whether these statements fuse into one row loop."""
    blocks = [s for s in fn.body.stmts if statement_of(s) in group]
    return _loops(row_groups(blocks, target, math.inf)) == 1


def fusible_group(fn: N.Function, target: Target, group: Sequence[int]) -> bool:
    """Whether `planned_groups` builds these statements as one kernel: one row loop, or
    phases stitched into one parallel region where the target has one."""
    return stitches(target) or row_loop(fn, target, group)


def _loops(groups: list[list[N.Statement]]) -> int:
    """Groups that are not a hoisted init on its own."""
    return sum(1 for m in groups
               if not (len(m) == 1 and isinstance(m[0], N.Block) and "init" in m[0].tags))


def _plan_text(plan: Sequence[Sequence[int]]) -> str:
    return " ".join("{" + ",".join(str(k) for k in g) + "}" for g in plan)


def _check_groups(value: Any) -> str | None:
    ok = isinstance(value, (list, tuple)) and all(
        isinstance(g, (list, tuple)) and g and all(
            isinstance(k, int) and not isinstance(k, bool) and k >= 0 for k in g)
        for g in value)
    return None if ok else f"must be a list of non-empty lists of statement numbers, got {value!r}"


_STATEMENT = re.compile(r"s(\d+)(?:_init)?")

register("fuse", fuse, strategy=one_of(*STRATEGIES), groups=_check_groups)
