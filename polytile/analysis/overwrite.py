"""Which top-level local buffers are completely written before anything reads them.

A local buffer starts as NaN (floats) or 0 (other types), so that a read before any
write shows, as in the interpreter (`polytile.ir.interp`). Making that so costs a pass
over the buffer per call; the code generator skips it for the locals found here:

    block main (
      in X[0] float32(64:1)
      none T[0] float32(64:1)
    ) {
      block init [i:64] (               <- the first statement that touches T: it writes
        out T <- T[i] float32(1:1)         all of T with `assign` and reads none of it,
      ) { ... T = store($z) }              so no element of T can be read before a write
      block acc [i:64, k:8] (
        out T <- T[i] float32(1:1):add     (a first writer like this one would read T)
        ...

The first top-level statement that touches the local must be a block that

* reads nothing of it: no `in|inout` view of it, load from it or special with it as an
  input anywhere inside;
* writes it only through `assign` views (another aggregation combines with what the
  buffer held); and
* writes every element of it, by its exact write footprint (isl), for every iteration
  of the top-level block.

Anything else keeps the fill: the answer is conservative. The IR is assumed verified
(`polytile.ir.verify`), so views keep their parent's strides and lie inside it, and
every read lies inside the buffer's dimensions.
"""
from __future__ import annotations

import islpy as isl

from polytile.ir.nodes import Block, Load, Special, Statement, Store
from polytile.ir.polyhedra import WRITE, Conj, Scope, between, parent_footprint, to_set


def overwritten_first(body: Block) -> frozenset[str]:
    """The local buffers (direction "none") of the top-level block `body` whose first
    toucher writes all of them without reading them: they need no initial fill."""
    locals_ = [r.into for r in body.refs if not r.from_ and r.dir == "none"]
    return frozenset(name for name in locals_ if _overwritten_first(body, name))


def _overwritten_first(body: Block, name: str) -> bool:
    first = next((st for st in body.stmts if _touches(st, name)), None)
    if not isinstance(first, Block):
        return False
    views = [r for r in first.refs if r.from_ == name]
    if not _writes_only(first, {r.into for r in views}):
        return False
    root = Scope.root(body)
    scope = root.child(first)
    written: list[Conj] = []
    coords: tuple[str, ...] = ()
    for ref in views:
        coords, pieces = parent_footprint(scope, ref.into, WRITE)
        written += pieces
    if not written:
        return False
    dims = body.ref(name).shape.dims
    box = Conj(ineqs=tuple(ineq for x, d in zip(coords, dims)
                           for ineq in between(x, 0, d.size - 1)))
    covered = to_set(scope.variables + coords, [tuple(written)])
    covered = covered.project_out(isl.dim_type.set, len(root.variables), len(scope.own))
    needed = to_set(root.variables + coords, [(root.domain & box,)])
    return bool(needed.is_subset(covered))


def _touches(st: Statement, name: str) -> bool:
    if isinstance(st, Block):
        return any(r.from_ == name for r in st.refs)
    if isinstance(st, (Load, Store)):
        return st.ref == name
    if isinstance(st, Special):
        return name in st.inputs or name in st.outputs
    return False


def _writes_only(block: Block, names: set[str]) -> bool:
    """Whether `block` reaches the buffer (through its views `names`) only by writes
    with `assign`, in its own statements and all its descendants'."""
    for ref in block.refs:
        if ref.into in names and (ref.dir != "out" or ref.agg != "assign"):
            return False
    for st in block.stmts:
        if isinstance(st, Load) and st.ref in names:
            return False
        if isinstance(st, Special) and names.intersection(st.inputs):
            return False
        if isinstance(st, Block):
            inner = {r.into for r in st.refs if r.from_ in names}
            if inner and not _writes_only(st, inner):
                return False
    return True
