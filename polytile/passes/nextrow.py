"""nextrow: a row loop's later reader of a row prefetches the next row from memory.

A fused row block (pass fuse, strategy `rows`: softmax, layernorm) reads each row of an
input in several members. The first waits on memory; the later ones read the row from
the caches, and meanwhile the memory is idle, since the hardware prefetcher follows the
addresses the loads ask for and they stay within the row. The second reader of the row,
a vector micro-kernel, therefore also prefetches the same elements of the next row
(`BlockSchedule.next_row`), so that the next row's first reader finds it in the caches:

    block fused_0 [r:4096] #fused schedule(parallel(r)) (     (softmax, one row 16 KiB)
      in p0 <- p0[0, 0] float32(4096:4096, 4096:1) ...)
      block s0 [i0 = r, i1:4096] ... (in p0 <- p0[i0, i1])        the row's maximum
      block s1 [i1_r:512, i0 = r] ... (in p0 <- p0[i0, 8*i1_r])
        block s1_tile [i1:8, ...] schedule(micro, vector(i1, float32, 8))
          ->  schedule(micro, vector(i1, float32, 8), next_row(p0, i0, 4096, 4096))

The lowering puts a prefetch of `address + stride` beside each of that view's vector
loads, guarded by the row index (the last row prefetches nothing). One thread, CPU time,
Zen 3 EPYC under load, benchmarks/kernel_ab.py, medians: softmax 4096^2 20.8 -> 18.0 ms,
layernorm 4096x1024 2.97 -> 2.51 ms, layernorm -> GELU -> residual 9.67 -> 8.97 ms.

Rows shorter than `MIN_ROW_BYTES` are the hardware prefetcher's (it runs ahead of the
first reader across row boundaries); rows longer than half of L2 reach the later
reader from L3 or memory themselves (groupnorm's 784 KiB rows); an input smaller than
L2 is read from the caches anyway. Runs after autotile and stream (it marks the micro-kernels they
scheduled), on CPU targets.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from polytile.ir import nodes as N
from polytile.passes.pipeline import flag, register
from polytile.targets.target import Target

MIN_ROW_BYTES = 4096


def nextrow(fn: N.Function, target: Target, params: dict[str, Any]) -> N.Function:
    if not params.get("enabled", True):
        return fn
    inputs = {r.into for r in fn.body.refs if r.dir == "in" and r.into in fn.params
              and r.shape.nbytes > target.cache_size("L2")}
    cached = target.cache_size("L2") // 2
    stmts = tuple(_rows(s, inputs, cached) if isinstance(s, N.Block) and "fused" in s.tags
                  else s for s in fn.body.stmts)
    return replace(fn, body=replace(fn.body, stmts=stmts))


def _rows(block: N.Block, inputs: set[str], cached: int) -> N.Block:
    """The row block with its second reader of each big input's row prefetching, where
    a row takes `cached` bytes at most (the later reader finds it in the caches)."""
    loops = [i for i in block.idxs if i.affine is None]
    if len(loops) != 1 or loops[0].range < 2:
        return block
    row = loops[0]
    members = list(block.stmts)
    for view in block.refs:
        if view.dir != "in" or view.from_ not in inputs:
            continue
        readers = [k for k, m in enumerate(members) if isinstance(m, N.Block)
                   and any(r.from_ == view.into and r.dir == "in" for r in m.refs)]
        if len(readers) < 2:
            continue
        k = readers[1]
        marked = _mark(members[k], view.into, row.name, view, row.range, cached)
        if marked is not None:
            members[k] = marked
    return replace(block, stmts=tuple(members))


def _mark(member: N.Block, name: str, row: str, top: N.Refinement, rows: int,
          cached: int) -> N.Block | None:
    """`member` (or its one nested leaf) marked to prefetch the next row of `name`, which
    it reads with the row index alone in one dimension; None where it does not qualify."""
    (ref,) = [r for r in member.refs if r.from_ == name]
    passed = [i.name for i in member.idxs if i.affine == N.Affine.index(row)]
    dims = [d for d, a in enumerate(ref.access) if a.names and set(a.names) & set(passed)]
    if len(passed) != 1 or len(dims) != 1 or ref.access[dims[0]] != N.Affine.index(passed[0]):
        return None
    stride = top.shape.dims[dims[0]].stride
    elem = max(1, top.shape.dtype.bits // 8)
    if not MIN_ROW_BYTES <= stride * elem <= cached:
        return None
    inner = [s for s in member.stmts if isinstance(s, N.Block)]
    if not inner:
        return _marked_leaf(member, ref.into, passed[0], rows, stride)
    if len(inner) != 1 or any(isinstance(s, N.Block) for s in inner[0].stmts):
        return None
    leaf = inner[0]
    views = [r for r in leaf.refs if r.from_ == ref.into]
    index = [i.name for i in leaf.idxs if i.affine == N.Affine.index(passed[0])]
    if len(views) != 1 or len(index) != 1:
        return None
    marked = _marked_leaf(leaf, views[0].into, index[0], rows, stride)
    if marked is None:
        return None
    return replace(member, stmts=tuple(marked if s is leaf else s for s in member.stmts))


def _marked_leaf(leaf: N.Block, view: str, index: str, rows: int, stride: int
                 ) -> N.Block | None:
    s = leaf.schedule
    if not s.micro or s.vector is None:
        return None
    ahead = N.NextRow(view, index, rows, stride)
    return replace(leaf, schedule=replace(s, next_row=s.next_row + (ahead,)))


register("nextrow", nextrow, enabled=flag)
