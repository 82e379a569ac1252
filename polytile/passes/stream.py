"""stream: stores that bypass the caches, for an output written once and larger than
the last-level cache.

A plain store first reads the line it writes (read-for-ownership) and leaves it in the
caches; for an output bigger than the last-level cache nothing reads it from there, so
each byte costs a read and a write of memory. A non-temporal store writes the line
without reading it: softmax 4096^2 (64 MiB out) moves 128 MiB instead of 192. The pass
marks the vector micro-kernel's view (`BlockSchedule.stream`) when

* the buffer is an output of the function, larger than `llc_multiple` times the
  last-level cache (`Target.cache_size("L3")`, the host's where it tells it): a read
  of it would miss the cache anyway, while each plain store costs a memory read;
* one leaf block in the whole function touches it, through one view that assigns (no
  aggregation), and every block on the way down reaches it by assigning views only:
  each element is written once and never read in the kernel (pass `rowbuffer` makes
  that so for a row loop that re-reads its output);
* that leaf is a vector micro-kernel whose vector index steps along the view's
  unit-stride dimension (`verify.contiguous_along`), so its full vectors are whole
  consecutive pieces of the buffer.

    block s3_tile [i1:8, ...] schedule(micro, vector(i1, float32, 8))
      ->  block s3_tile [i1:8, ...] schedule(micro, vector(i1, float32, 8), stream(o0))

The lowering makes the stores `Store.stream` (masked tails stay plain) and ends each
parallel iteration and the kernel with a store fence; the C backend prints a streaming
store where the address is aligned for one (`pt_vstream`). Run after autotile, which
chooses the vector index.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from polytile import dtypes
from polytile.errors import ArgumentError
from polytile.ir import nodes as N
from polytile.ir.verify import contiguous_along
from polytile.passes.pipeline import flag, register
from polytile.targets.target import Target


@dataclass(frozen=True)
class _Use:
    path: tuple[int, ...]       # statement positions from the function's body
    view: N.Refinement          # the block's view of the buffer
    block: N.Block


def stream(fn: N.Function, target: Target, params: dict[str, Any]) -> N.Function:
    if not params.get("enabled", True):
        return fn
    multiple = params.get("llc_multiple", 1)
    problem = _positive(multiple)
    if problem:
        raise ArgumentError(f"stream.llc_multiple {problem}")
    threshold = multiple * target.cache_size("L3")
    chosen: dict[tuple[int, ...], list[str]] = {}
    for ref in fn.body.refs:
        if ref.into not in fn.params or ref.dir == "in" or ref.shape.nbytes <= threshold:
            continue
        leaf = _only_writer(fn.body, ref.into)
        if leaf is not None:
            chosen.setdefault(leaf.path, []).append(leaf.view.into)
    if not chosen:
        return fn
    return replace(fn, body=_marked(fn.body, (), chosen))


def _only_writer(body: N.Block, buffer: str) -> _Use | None:
    """The one leaf that touches `buffer`, when it qualifies (see the module)."""
    uses: list[_Use] = []
    if not _collect(body, {buffer}, (), uses):
        return None
    leaves = [u for u in uses if not any(isinstance(s, N.Block) for s in u.block.stmts)]
    if len(leaves) != 1 or any(u.view.dir == "in" or u.view.agg != "assign" for u in uses):
        return None
    leaf = leaves[0]
    s = leaf.block.schedule
    if (leaf.view.dir != "out" or not s.micro or s.vector is None
            or s.vector.dtype != dtypes.FLOAT32 or leaf.view.shape.dtype != dtypes.FLOAT32
            or sum(1 for u in uses if u.block is leaf.block) != 1
            or not contiguous_along(leaf.view, s.vector.index)):
        return None
    return leaf


def _collect(block: N.Block, names: set[str], path: tuple[int, ...], uses: list[_Use]) -> bool:
    """Every block's views of the buffer (whose names in `block` are `names`) into `uses`;
    False where a statement other than a leaf's own store reaches it (a load, a special,
    or a store in a block with nested blocks)."""
    nested = any(isinstance(s, N.Block) for s in block.stmts)
    for k, st in enumerate(block.stmts):
        if isinstance(st, N.Block):
            views = [r for r in st.refs if r.from_ in names]
            uses.extend(_Use(path + (k,), r, st) for r in views)
            if views and not _collect(st, {r.into for r in views}, path + (k,), uses):
                return False
        elif _reaches(st, names, nested):
            return False
    return True


def _reaches(st: N.Statement, names: set[str], nested: bool) -> bool:
    """Whether a statement that is not a block reaches the buffer otherwise than as a
    leaf's own plain store."""
    if isinstance(st, N.Load):
        return st.ref in names
    if isinstance(st, N.Special):
        return bool(names.intersection(st.inputs + st.outputs))
    if isinstance(st, N.Store):
        return st.ref in names and (nested or any(d is not None for d in st.dynamic))
    return False


def _marked(block: N.Block, path: tuple[int, ...],
            chosen: dict[tuple[int, ...], list[str]]) -> N.Block:
    stmts = tuple(_marked(s, path + (k,), chosen) if isinstance(s, N.Block) else s
                  for k, s in enumerate(block.stmts))
    block = replace(block, stmts=stmts)
    views = chosen.get(path)
    if views:
        block = replace(block, schedule=replace(block.schedule, stream=tuple(views)))
    return block


def _positive(value: Any) -> str | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
    return None if ok else f"must be a positive number, got {value!r}"


register("stream", stream, enabled=flag, llc_multiple=_positive)
