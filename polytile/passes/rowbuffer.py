"""rowbuffer: a buffer that a fused row loop writes and then reads again within the row
lives in a one-row local until the row's last writer, which reads the local and writes
the buffer once.

Softmax stores exp(x - max) into Y, sums Y and divides Y in place: each row of Y goes
to memory, comes back and goes again. With the row's first writes in an L1-resident
local, Y is written exactly once per element, by the last statement, and that store
can bypass the caches (pass `stream`):

    block fused_0 [r:N] #fused (                block fused_0 [r:N] #fused (
      in X <- X[0, 0] ...                         in X <- X[0, 0] ...
      inout Y <- Y[0, 0] float32(N:D, D:1)        out Y <- Y[0, 0] float32(N:D, D:1)
      none s[0] float32(1:1) @local               none s[0] float32(1:1) @local
    ) {                                           none Y_row[0, 0] float32(1:D, D:1) @local
      block e [i0 = r, i1:D] (              ->  ) {
        out Y <- Y[i0, i1] ... )                  block e [i0 = r, i1:D] (
      block sum [i0 = r, i1:D] (                    out Y <- Y_row[0, i1] ... )
        in Y <- Y[i0, i1] ... )                   block sum [i0 = r, i1:D] (
      block div [i0 = r, i1:D] (                    in Y <- Y_row[0, i1] ... )
        inout Y <- Y[i0, i1] ...                  block div [i0 = r, i1:D] (
      ) { $y = load(Y) ... Y = store($q) }          in Y_row <- Y_row[0, i1] ...
                                                    out Y <- Y[i0, i1] ...
                                                  ) { $y = load(Y_row) ... Y = store($q) }

The rule is general, not softmax's: a view `inout` in a fused row loop (its members
write it and read it), indexed by every member with exactly the row
(`fuse.row_dim`), whose last toucher is a leaf that writes it with `assign` and writes,
in each row, every element the earlier members write (isl, exact footprints); after the
rewrite every element of the local must be written before it is read
(`analysis.overwrite`), so that nothing the caller left in the buffer is needed. The
row must fit in half of L2 (a row that does not stays in no cache, and the rewrite
would only move its traffic). Pass scratch, after this one, may then let the local
share space with other row locals.

A temporary of the function that no statement after the row loop touches needs no
write-back at all. The variational encoder's row loop reads the hidden layer h (a
contraction's result, another kernel's), rewrites it as relu(h + b) and reads it in
its heads: the row's first writer now reads h and writes a one-row local, the later
members read the local, and the loop never writes h (409,600 bytes a call fewer;
issue 17's traffic measure of that kernel 1.79x -> 1.00x of its inputs + outputs).
Same conditions: every member indexes h with exactly the row, the first writer is a
leaf writing with `assign`, every element of the local is written before it is read.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from polytile.analysis.overwrite import overwritten_first, touches
from polytile.ir import nodes as N
from polytile.ir.polyhedra import WRITE, Scope, element_vars, footprint, to_set
from polytile.passes.fuse import row_dim, shrink_to_row
from polytile.passes.names import fresh_name
from polytile.passes.pipeline import flag, register
from polytile.targets.target import Target


def rowbuffer(fn: N.Function, target: Target, params: dict[str, Any]) -> N.Function:
    if not params.get("enabled", True):
        return fn
    budget = target.cache_size("L2") // 2
    body = _walk(fn.body, budget)
    temps = {r.into for r in body.refs if r.dir == "none"}
    stmts = list(body.stmts)
    for k, s in enumerate(stmts):
        if isinstance(s, N.Block) and "fused" in s.tags:
            later = {r.from_ for t in stmts[k + 1:] if isinstance(t, N.Block) for r in t.refs}
            for name in sorted(temps - later):
                s = _unwritten(s, name, budget) or s
            stmts[k] = s
    return replace(fn, body=replace(body, stmts=tuple(stmts)))


def _walk(block: N.Block, budget: int) -> N.Block:
    """`block` with its fused row loops, and those of its stitched kernels, rewritten."""
    stmts = []
    for s in block.stmts:
        if isinstance(s, N.Block) and "fused" in s.tags:
            s = buffered(s, budget)
        elif isinstance(s, N.Block) and "stitched" in s.tags:
            s = _walk(s, budget)
        stmts.append(s)
    return replace(block, stmts=tuple(stmts))


def buffered(fused: N.Block, budget: int) -> N.Block:
    """The fused row loop with every view that qualifies (see the module) buffered."""
    for ref in fused.refs:
        if ref.dir == "inout" and ref.agg == "assign":
            fused = _buffer(fused, ref.into, budget) or fused
    return fused


def _buffer(fused: N.Block, name: str, budget: int) -> N.Block | None:
    """`fused` with view `name` buffered in a one-row local, or None where the rule does
    not hold."""
    dim = row_dim(fused, name)
    toucher = [k for k, s in enumerate(fused.stmts) if touches(s, name)]
    if dim is None or len(toucher) < 2:
        return None
    last = fused.stmts[toucher[-1]]
    assert isinstance(last, N.Block)
    views = [r for r in last.refs if r.from_ == name]
    if (len(views) != 1 or views[0].dir == "in" or views[0].agg != "assign"
            or any(isinstance(s, (N.Block, N.Special)) for s in last.stmts)):
        return None
    top = fused.ref(name)
    if _row_bytes(top, dim) > budget or not _last_covers(fused, name, toucher[-1]):
        return None
    local = _fresh(fused, f"{name}_row")
    earlier = tuple(_moved(s, name, local) if k < toucher[-1] else s
                    for k, s in enumerate(fused.stmts))
    stmts = earlier[:toucher[-1]] + (_split(last, views[0], local),) + earlier[toucher[-1] + 1:]
    return _with_local(fused, name, "out", local, dim, stmts)


def _unwritten(fused: N.Block, name: str, budget: int) -> N.Block | None:
    """`fused` with view `name` (a temporary dead after it) kept from its first writer on
    in a one-row local and never written back, or None where the rule does not hold."""
    dim = row_dim(fused, name)
    if dim is None or fused.ref(name).dir != "inout":
        return None
    first = next(k for k, s in enumerate(fused.stmts) if isinstance(s, N.Block)
                 and any(r.from_ == name and r.dir != "in" for r in s.refs))
    writer = fused.stmts[first]
    assert isinstance(writer, N.Block)
    views = [r for r in writer.refs if r.from_ == name]
    top = fused.ref(name)
    if (len(views) != 1 or views[0].agg != "assign" or _row_bytes(top, dim) > budget
            or any(isinstance(s, (N.Block, N.Special)) for s in writer.stmts)):
        return None
    local = _fresh(fused, f"{name}_row")
    stmts = tuple(_moved(s, name, local) if k > first else s
                  for k, s in enumerate(fused.stmts))
    stmts = stmts[:first] + (_split(writer, views[0], local, first=True),) + stmts[first + 1:]
    return _with_local(fused, name, "in", local, dim, stmts)


def _with_local(fused: N.Block, name: str, direction: str, local: str, dim: int,
                stmts: tuple[N.Statement, ...]) -> N.Block | None:
    """`fused` with members `stmts`, its view `name` now `direction`, and `local` a
    one-row local of the view's shape; None unless every element of the local is
    written before it is read (nothing the caller left in the buffer is needed)."""
    top = fused.ref(name)
    refs = tuple(replace(r, dir=direction) if r.into == name else r for r in fused.refs)
    whole = N.Refinement("none", "", local, top.access, top.shape, "assign", "local")
    result = shrink_to_row(replace(fused, refs=refs + (whole,), stmts=stmts), local, dim, whole)
    return result if local in overwritten_first(result, nested=True) else None


def _row_bytes(top: N.Refinement, dim: int) -> int:
    elems = 1
    for d, size in enumerate(top.shape.sizes):
        elems *= 1 if d == dim else size
    return elems * max(1, top.shape.dtype.bits // 8)


def _last_covers(fused: N.Block, name: str, last: int) -> bool:
    """Whether, in each row, statement `last` writes every element of view `name` that
    the statements before it write."""
    def written(stmts: tuple[N.Statement, ...]) -> tuple[Scope, Any]:
        scope = Scope.detached(replace(fused, stmts=stmts))
        return scope, footprint(scope, name, WRITE)
    scope, before = written(fused.stmts[:last])
    _, own = written(fused.stmts[last:last + 1])
    if not before:
        return True
    free = scope.variables + element_vars(scope.depth, len(fused.ref(name).shape.dims))
    return bool(to_set(free, [before]).is_subset(to_set(free, [own])))


def _fresh(block: N.Block, stem: str) -> str:
    """A view name free in `block` and in its child blocks."""
    return fresh_name(stem, {r.into for r in block.refs} | {
        r.into for s in block.stmts if isinstance(s, N.Block) for r in s.refs})


def _moved(s: N.Statement, name: str, local: str) -> N.Statement:
    """Member `s` with its views of `name` taken from `local` instead."""
    if not isinstance(s, N.Block):
        return s
    return replace(s, refs=tuple(replace(r, from_=local) if r.from_ == name else r
                                 for r in s.refs))


def _split(member: N.Block, view: N.Refinement, local: str, first: bool = False
           ) -> N.Block:
    """The last writer of a buffered view: where it reads its view, it reads the local
    (the row as the earlier members left it); it writes the buffer itself. With `first`,
    the first writer of a view never written back: it reads the buffer and writes the
    local."""
    source, target = (view.from_, local) if first else (local, view.from_)
    if view.dir == "out":
        return replace(member, refs=tuple(replace(r, from_=target) if r is view else r
                                          for r in member.refs))
    into = _fresh(member, local)
    loads = tuple(replace(s, ref=into) if isinstance(s, N.Load) and s.ref == view.into
                  else s for s in member.stmts)
    refs = []
    for r in member.refs:
        if r is view:
            refs += [replace(r, dir="in", from_=source, into=into),
                     replace(r, dir="out", from_=target)]
        else:
            refs.append(r)
    return replace(member, refs=tuple(refs), stmts=loads)


register("rowbuffer", rowbuffer, enabled=flag)
