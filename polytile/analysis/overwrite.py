"""Which top-level buffers are completely written before anything reads them.

A local buffer starts as NaN (floats) or 0 (other types), so that a read before any
write shows, as in the interpreter (`polytile.ir.interp`), and an output the caller does
not pass starts as zeros. Making that so costs a pass over the buffer per call; the code
generator skips it for the locals found here, and the call allocates such outputs
without clearing them:

    block main (
      in X[0] float32(64:1)
      none T[0] float32(64:1)
    ) {
      block fused [i:64] (                <- the first statement that touches T; in each
        out T <- T[i] float32(1:1)           of its iterations,
      ) {
        block init (                      <- its first toucher writes T[i] with `assign`
          out T <- T[0] float32(1:1)         and reads none of it, and
        ) { ... T = store($z) }
        block acc [k:8] (                 <- what the later statements touch was written
          out T <- T[0] float32(1:1):add     by it
        ) { ... }

A buffer needs no fill when

* the first touch of every element, in every execution of every block, is a write with
  `assign`: recursively, a block either reaches the buffer only by such writes, or the
  first of its statements that touches the buffer has this property and, in the same
  iteration, writes everything that the later statements touch (exact footprints, isl);
* and, for an output, the top-level block writes every element of it (an element of a
  local that nothing writes is never touched at all: the tail of a packed panel beyond
  the operand's edge, which the micro-kernel's bounds never read).

Anything else keeps the fill: the answer is conservative. The IR is assumed verified
(`polytile.ir.verify`), so views keep their parent's strides and lie inside it, and
every read lies inside the buffer's dimensions.
"""
from __future__ import annotations

from dataclasses import replace

from polytile.ir.nodes import Block, Load, Special, Statement, Store
from polytile.ir.polyhedra import (READ, WRITE, Conj, Scope, between, element_vars, footprint,
                                   to_set)


def overwritten_first(body: Block, dirs: tuple[str, ...] = ("none",),
                      nested: bool = False) -> frozenset[str]:
    """The top-level buffers of `body` with a direction in `dirs` (locals are "none",
    outputs "out" or "inout") whose every element is first touched by a write with `assign`.
    `nested`: `body` is a block inside the function (a fused row loop) and the buffers
    are its private locals, allocated anew in each of its iterations; then the answer
    holds in every iteration, whatever the indices passed in from outside."""
    names = [r.into for r in body.refs if not r.from_ and r.dir in dirs]
    root = Scope.detached(body) if nested else Scope.root(body)
    return frozenset(name for name in names if _overwritten_first(root, name))


def _overwritten_first(root: Scope, name: str) -> bool:
    body = root.block
    if not _written_first(root, name):
        return False
    if body.ref(name).dir == "none":
        return True
    dims = body.ref(name).shape.dims
    elems = element_vars(0, len(dims))
    box = Conj(ineqs=tuple(ineq for e, d in zip(elems, dims) for ineq in between(e, 0, d.size - 1)))
    written = footprint(root, name, WRITE)
    return bool(to_set(elems, [(box,)]).is_subset(to_set(elems, [written])))


def _written_first(scope: Scope, view: str) -> bool:
    """Whether, in every execution of scope's block, the first touch of each element of
    `view` that the block touches is a write with `assign`."""
    block = scope.block
    if _writes_only(block, {view}):
        return True
    k = next((k for k, st in enumerate(block.stmts) if touches(st, view)), None)
    if k is None:
        return True
    first = block.stmts[k]
    if isinstance(first, Block):
        child = scope.child(first)
        if not all(_written_first(child, r.into) for r in first.refs if r.from_ == view):
            return False
    else:
        ref = block.ref(view)
        if not (isinstance(first, Store) and ref.dir == "out" and ref.agg == "assign"):
            return False
    head, rest = _part(scope, block.stmts[k:k + 1]), _part(scope, block.stmts[k + 1:])
    free = scope.variables + element_vars(scope.depth, len(block.ref(view).shape.dims))
    later = footprint(rest, view, READ) + footprint(rest, view, WRITE)
    if not later:
        return True
    return bool(to_set(free, [later]).is_subset(to_set(free, [footprint(head, view, WRITE)])))


def _part(scope: Scope, stmts: tuple[Statement, ...]) -> Scope:
    """`scope` with only some of its block's statements."""
    return replace(scope, block=replace(scope.block, stmts=tuple(stmts)))


def touches(st: Statement, name: str) -> bool:
    """Whether statement `st` of a block reads or writes the block's buffer `name`."""
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
