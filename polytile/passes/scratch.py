"""scratch: local buffers whose lifetimes do not overlap share one buffer
(FusionStitching §5.3, Alg. 4: scratch reuse by dominance).

The paper walks the dominance tree of a kernel's phases and lets a buffer take the
space of one whose last use dominates its definition. Here a block's statements run
in order (a fused row loop's members, the function's kernels), so the dominance tree
is a chain and the rule becomes: a local may take the buffer of an earlier local of
the same shape when every statement that touches the earlier one comes before every
statement that touches it, and it writes each element it reads before reading it
(`analysis.overwrite`, in the statements where it lives), so no read sees what the
earlier occupant left:

    block fused [r:128] (                          block fused [r:128] (
      none A[0, 0] float32(1:64, 64:1)               none A[0, 0] float32(1:64, 64:1)
      none Z[0, 0] float32(1:64, 64:1)               none Z[0, 0] float32(1:64, 64:1)
      none N[0, 0] float32(1:64, 64:1)    ->       ) {
    ) {                                              block s0 ( out A <- A ... )
      block s0 ( out A <- A ... )                    block s1 ( in A <- A  out Z <- Z ... )
      block s1 ( in A <- A  out Z <- Z ... )         block s2 ( in Z <- Z  out N <- A ... )
      block s2 ( in Z <- Z  out N <- N ... )         block s3 ( in N <- A ... )
      block s3 ( in N <- N ... )

Runs on the function's body and on every fused row loop and stitched kernel in it; a
stitched kernel is one statement of the body, so its phases' shared buffers never
trade places while its threads run. Only equal shapes share (a view of another
shape would need a reinterpreting refinement the IR does not have).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from polytile.analysis.overwrite import overwritten_first, touches
from polytile.ir import nodes as N
from polytile.passes.pipeline import flag, register
from polytile.targets.target import Target


def scratch(fn: N.Function, target: Target, params: dict[str, Any]) -> N.Function:
    if not params.get("enabled", True):
        return fn
    return replace(fn, body=_share(fn.body, nested=False))


def _share(block: N.Block, nested: bool) -> N.Block:
    """`block` with its own locals shared where they may be, after those of its fused
    row loops (a stitched kernel's row loops included)."""
    stmts = tuple(_share(s, nested=True) if isinstance(s, N.Block) and "fused" in s.tags
                  else _inside(s) if isinstance(s, N.Block) and "stitched" in s.tags
                  else s for s in block.stmts)
    block = replace(block, stmts=stmts)
    locals_ = [r for r in block.refs if r.dir == "none" and not r.from_]
    spans = {r.into: _span(block, r.into) for r in locals_}
    slots: list[tuple[N.Refinement, int]] = []        # (occupant's declaration, last use)
    renamed: dict[str, str] = {}
    for ref in sorted((r for r in locals_ if spans[r.into]), key=lambda r: spans[r.into][0]):
        first, last = spans[ref.into]
        k = next((k for k, (slot, end) in enumerate(slots)
                  if slot.shape == ref.shape and end < first
                  and _written_first(block, ref.into, first, last, nested)), None)
        if k is None:
            slots.append((ref, last))
            continue
        slot = slots[k][0]
        renamed[ref.into] = slot.into
        slots[k] = (slot, last)
    if not renamed:
        return block
    refs = tuple(r for r in block.refs if r.into not in renamed)
    return replace(block, refs=refs, stmts=tuple(_rename(s, renamed) for s in block.stmts))


def _inside(stitched: N.Block) -> N.Block:
    """A stitched kernel with its row loops' locals shared. Its own locals stay apart:
    its phases run on all threads at once, and a phase's threads may still read one
    occupant while another phase's write the next."""
    return replace(stitched, stmts=tuple(
        _share(s, nested=True) if isinstance(s, N.Block) and "fused" in s.tags else s
        for s in stitched.stmts))


def _span(block: N.Block, name: str) -> tuple[int, int] | None:
    """(first, last) position among `block`'s statements of those that touch `name`."""
    touching = [k for k, s in enumerate(block.stmts) if touches(s, name)]
    return (touching[0], touching[-1]) if touching else None


def _written_first(block: N.Block, name: str, first: int, last: int, nested: bool) -> bool:
    """Whether, in statements first..last (where `name` lives), every element of `name`
    is written before it is read."""
    part = replace(block, stmts=block.stmts[first:last + 1])
    return name in overwritten_first(part, nested=nested)


def _rename(s: N.Statement, renamed: dict[str, str]) -> N.Statement:
    """`s` with the buffers named in `renamed` replaced, as its parent sees them."""
    if isinstance(s, N.Block):
        return replace(s, refs=tuple(replace(r, from_=renamed.get(r.from_, r.from_))
                                     for r in s.refs))
    if isinstance(s, (N.Load, N.Store)):
        return replace(s, ref=renamed.get(s.ref, s.ref))
    if isinstance(s, N.Special):
        return replace(s, inputs=tuple(renamed.get(n, n) for n in s.inputs),
                       outputs=tuple(renamed.get(n, n) for n in s.outputs))
    return s


register("scratch", scratch, enabled=flag)
