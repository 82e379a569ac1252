"""merge: consecutive elementwise members of a row loop become one block.

Pass fuse keeps each TC statement a member of its row loop. A chain of elementwise
statements (layernorm -> GELU -> residual: H, then G from H, then Y from G and R) then
runs as one loop per statement, each storing its row into a local buffer and the next
reading it back; the last one, the only member that reads R and writes Y, meets memory
with nothing left to compute while it waits. Merged, one loop computes H, G and Y per
element, the row buffers are gone, and the loads of R overlap the GELU's arithmetic:

    block s5 [n = r, d:40] (out G <- G[0, d]            block s5 [n = r, d:40] (
        in H <- H[0, d]) {                                  in H <- H[0, d]
      $H = load(H) ... G = store($mul_2) }        ->        in R <- R[n, d]
    block s6 [n = r, d:40] (out Y <- Y[n, d]                out Y <- Y[n, d]) {
        in G <- G[0, d] in R <- R[n, d]) {                $H = load(H) ... $mul_2 = ...
      $G = load(G) $R = load(R)                           $R = load(R)
      $add = add($G, $R) Y = store($add) }                $add = add($mul_2, $R)
                                                          Y = store($add) }

Two consecutive members A, B of a fused row block merge when both are leaf blocks with
the same indices and constraints, no schedule, only plain loads and assigning stores
(no gather, scatter, aggregation or whole-buffer operation), and in one iteration B
reads what A writes only at that iteration's element: every buffer A writes and B reads
is viewed by both through the same access, B writes nothing A reads or writes. B's
statements follow A's; its loads of what A stored take the stored value; views of one
buffer through one access are shared and other names made fresh. A local buffer of the
row loop that no other member touches then loses its store and its view.

The merged block keeps A's name. Runs after fuse, on CPU targets; `merge.enabled: false`
turns it off.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from polytile.ir import nodes as N
from polytile.passes.names import fresh_name
from polytile.passes.pipeline import flag, register
from polytile.targets.target import Target


def merge(fn: N.Function, target: Target, params: dict[str, Any]) -> N.Function:
    if not params.get("enabled", True):
        return fn
    stmts = tuple(_merged_members(s) if isinstance(s, N.Block) and "fused" in s.tags else s
                  for s in fn.body.stmts)
    return replace(fn, body=replace(fn.body, stmts=stmts))


def _merged_members(row: N.Block) -> N.Block:
    members = list(row.stmts)
    gone: set[str] = set()
    k = 0
    while k + 1 < len(members):
        a, b = members[k], members[k + 1]
        passed = _passed(row, members, k)
        if passed is not None:
            assert isinstance(a, N.Block) and isinstance(b, N.Block)
            members[k:k + 2] = [merged(a, b)]
            gone |= passed
        else:
            k += 1
    return replace(row, refs=tuple(r for r in row.refs if r.into not in gone),
                   stmts=tuple(members))


def _elementwise_leaf(b: N.Block) -> bool:
    if b.schedule != N.BlockSchedule() or any(isinstance(s, (N.Block, N.Special))
                                               for s in b.stmts):
        return False
    if any(isinstance(s, (N.Load, N.Store)) and any(d is not None for d in s.dynamic)
           or isinstance(s, N.Load) and s.offset is not None for s in b.stmts):
        return False
    return all(r.dir in ("in", "out") and r.agg == "assign" for r in b.refs)


def _passed(row: N.Block, members: list[N.Statement], k: int) -> set[str] | None:
    """The local buffers of the row through which member k passes values to member k+1
    alone, when the two merge (else None): every buffer k writes is such a buffer."""
    a, b = members[k], members[k + 1]
    if not (isinstance(a, N.Block) and isinstance(b, N.Block)):
        return None
    if a.idxs != b.idxs or a.constraints != b.constraints:
        return None
    if not (_elementwise_leaf(a) and _elementwise_leaf(b)):
        return None
    local = {r.into for r in row.refs if r.dir == "none"}
    others = {v.from_ for m in members[:k] + members[k + 2:] if isinstance(m, N.Block)
              for v in m.refs}
    loops = {i.name for i in a.idxs if i.affine is None and i.range > 1}
    written_a = [r for r in a.refs if r.dir == "out"]
    for w in written_a:
        reads = [r for r in b.refs if r.dir == "in" and r.from_ == w.from_]
        # Each element written at one iteration only (no index reduced by assignment),
        # read by B at that iteration only.
        if (w.from_ not in local or w.from_ in others or not reads
                or not loops <= {n for a in w.access for n in a.names}
                or any((r.access, r.shape) != (w.access, w.shape) for r in reads)):
            return None
    touched_a = {r.from_ for r in a.refs}
    if any(r.dir == "out" and r.from_ in touched_a for r in b.refs):
        return None
    return {w.from_ for w in written_a}


def merged(a: N.Block, b: N.Block) -> N.Block:
    """B's statements after A's in A's block, the values A stores taken by B's loads of
    them in place of A's stores (`_passed` holds; or pass epilogue's in-place blocks: B
    updates, through the same view, what A updated, and stores it in A's view)."""
    stored = {s.ref: s.value for s in a.stmts if isinstance(s, N.Store)}
    by_buffer = {r.from_: r.into for r in a.refs if r.dir in ("out", "inout")}
    forwarded = {r.into: stored[by_buffer[r.from_]] for r in b.refs
                 if r.dir in ("in", "inout") and r.from_ in by_buffer}
    # B's views: one already in A (same buffer, direction and access) is shared; any
    # other keeps its name unless A uses it.
    refs = [r for r in a.refs if r.dir != "out"]
    view: dict[str, str] = {}
    for r in b.refs:
        if r.into in forwarded:
            if r.dir == "inout":
                view[r.into] = by_buffer[r.from_]
            continue
        same = next((x for x in refs if (x.dir, x.from_, x.access, x.shape, x.location)
                     == (r.dir, r.from_, r.access, r.shape, r.location)), None)
        if same is not None:
            view[r.into] = same.into
            continue
        name = fresh_name(r.into, {x.into for x in refs})
        view[r.into] = name
        refs.append(replace(r, into=name))
    stmts: list[N.Statement] = [s for s in a.stmts if not isinstance(s, N.Store)]
    taken = {s.into for s in stmts if isinstance(s, (N.Load, N.LoadIndex, N.Constant,
                                                       N.Intrinsic))}
    scalar: dict[str, str] = {}
    for s in b.stmts:
        if isinstance(s, N.Load) and s.ref in forwarded:
            scalar[s.into] = forwarded[s.ref]
            continue
        if isinstance(s, N.Store):
            stmts.append(replace(s, ref=view[s.ref], value=scalar.get(s.value, s.value)))
            continue
        assert isinstance(s, (N.Load, N.LoadIndex, N.Constant, N.Intrinsic))
        name = fresh_name(s.into, taken)
        taken.add(name)
        scalar[s.into] = name
        if isinstance(s, N.Load):
            stmts.append(replace(s, ref=view[s.ref], into=name))
        elif isinstance(s, N.Intrinsic):
            stmts.append(replace(s, into=name,
                                 inputs=tuple(scalar.get(x, x) for x in s.inputs)))
        else:
            stmts.append(replace(s, into=name))
    comment = "; ".join(c for c in (a.comment, b.comment) if c)
    return replace(a, refs=tuple(refs), stmts=tuple(stmts), tags=a.tags | b.tags,
                   comment=comment)


register("merge", merge, enabled=flag)
