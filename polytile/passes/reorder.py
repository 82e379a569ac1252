"""reorder: loop order of the kernels that run scalar code, by memory layout.

A Stripe block's iterations are independent (they meet only through aggregation), so
its loop order is free; the C generator emits loops in index order. For each leaf
kernel block that the vector generator does not take (no vector in its schedule: integer code,
gathers, copies, targets without vectors), the loops are sorted by the stride each
index has in the block's views, largest first, so that the innermost loop walks
memory with stride one. Of equal strides, a parallel index goes inside a reduction
index: consecutive iterations then update different elements, not one accumulator.

    block s [i:64, j:32] (                           block s [j:32, i:64] (
      out B <- B[j, i] float32(1:64, 1:1)     ->        ... same refs ...
      in A <- A[i, j] float32(1:32, 1:1) )            )

Passed-in indices keep their place (after the loops; they are not loops).
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from polytile.ir import nodes as N
from polytile.passes.pipeline import flag, register
from polytile.passes.schedule import _is_parallel
from polytile.targets.target import Target


def _strides(block: N.Block, index: str) -> tuple[int, int]:
    """(largest stride of `index` in the written views, largest in all views)."""
    def stride(refs: list[N.Refinement]) -> int:
        return max((abs(a.coeff(index)) * d.stride for r in refs
                    for a, d in zip(r.access, r.shape.dims)), default=0)
    written = [r for r in block.refs if r.dir in ("out", "inout")]
    return stride(written), stride(list(block.refs))


def reorder_block(block: N.Block) -> N.Block:
    loops = [i for i in block.idxs if i.affine is None]
    if len(loops) < 2:
        return block

    def key(i: N.Index) -> tuple[int, int, bool]:
        written, any_view = _strides(block, i.name)
        return (-any_view, -written, _is_parallel(block, i.name))

    ordered = sorted(loops, key=key)
    if ordered == loops:
        return block
    return replace(block, idxs=tuple(ordered) + tuple(i for i in block.idxs
                                                      if i.affine is not None))


def vector_loop_order(block: N.Block) -> tuple[str, ...]:
    """The loop order of a vector micro-kernel's other loops (not the vector index, not
    the unrolled ones), outermost first: the order that streams the largest input in
    memory order (largest stride outermost). The code generator keeps accumulators in
    registers across the innermost run of reduction loops; a reduction loop placed
    outside a parallel one aggregates into memory after each of its iterations instead
    (batch norm's statistics: c inside n), which a register tile never does."""
    s = block.schedule
    assert s.vector is not None
    stores = [x for x in block.stmts if isinstance(x, N.Store)]
    loops = [i.name for i in block.idxs if i.affine is None and i.range > 1
             and i.name != s.vector.index and i.name not in s.unroll]
    if len(stores) != 1 or not loops:
        return ()        # the generator runs scalar code, or there is no loop to order
    written = {n for a in block.ref(stores[0].ref).access for n in a.names}
    # Parallel loops first, then reductions, each in the block's order: ties keep it.
    loops = [n for n in loops if n in written] + [n for n in loops if n not in written]
    inputs = [r for r in block.refs if r.dir == "in"]
    if not inputs or any(isinstance(x, N.Load) and x.offset is not None for x in block.stmts):
        # A pointer-incremented operand (pass ptrinc) moves along the reduction through a
        # table, invisible in its view's strides; the increments exist so that the
        # reduction runs innermost on register accumulators.
        return tuple(loops)
    ranges = {i.name: i.range for i in block.idxs if i.affine is None}

    def weight(r: N.Refinement) -> tuple[int, int]:
        # The block's footprint in the input first (its parent's view may be larger:
        # a whole dimension where a tile overflows); of equal sizes, the input that
        # depends on more of the loops.
        size = math.prod(1 + sum(abs(c) * (ranges.get(n, 1) - 1) for n, c in a.terms)
                         for a in r.access)
        return size, len(set(loops) & {n for a in r.access for n in a.names})

    big = max(inputs, key=weight)

    def stride(name: str) -> int:
        return sum(abs(a.coeff(name)) * d.stride for a, d in zip(big.access, big.shape.dims))

    if s.unroll:
        # A register tile (a multiply-accumulate reusing its loads) keeps its
        # accumulators in registers: a reduction loop outside a parallel one would load
        # and store the whole tile at every step of it.
        return (tuple(sorted((n for n in loops if n in written), key=lambda n: -stride(n)))
                + tuple(sorted((n for n in loops if n not in written),
                               key=lambda n: -stride(n))))
    return tuple(sorted(loops, key=lambda n: -stride(n)))


def _scalar_leaf(s: N.Block) -> bool:
    return (("kernel" in s.tags or s.schedule.micro)
            and not any(isinstance(x, N.Block) for x in s.stmts)
            and s.schedule.vector is None)


def _walk(block: N.Block) -> N.Block:
    stmts = []
    for s in block.stmts:
        if isinstance(s, N.Block):
            if _scalar_leaf(s):
                s = reorder_block(s)
            elif s.schedule.micro and s.schedule.vector is not None:
                s = replace(s, schedule=replace(s.schedule, order=vector_loop_order(s)))
            else:
                s = _walk(s)
        stmts.append(s)
    return replace(block, stmts=tuple(stmts))


def reorder(fn: N.Function, target: Target, params: dict[str, Any]) -> N.Function:
    if not params.get("enabled", True):
        return fn
    return replace(fn, body=_walk(fn.body))


register("reorder", reorder, enabled=flag)
