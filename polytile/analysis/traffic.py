"""Memory traffic of each kernel of an optimized function: bytes moved against the
kernel's compulsory bytes (issue 17's target: moved <= 1.2x inputs + outputs).

    for k in kernel_traffic(compiler.ir(spec)):
        print(k.name, k.moved, k.compulsory, k.ratio)

A kernel is a top-level statement of the function's body (a fused row loop, a stitched
block, a single statement's block, a hoisted initialization): what `bench --fusion`
counts as "kernels". The model, exact over the IR and blind to caches:

* **Memory buffers** are the function's inputs, outputs and top-level locals (pool or
  stack temporaries shared by kernels). A local a kernel declares itself (a row buffer
  that pass fuse's localize made private to a row or a thread) is not memory traffic.
* **A pass** over memory is the whole kernel, or, for a stitched kernel, each phase on
  its own. Per pass and memory buffer, the bytes moved are the exact read footprint
  (elements loaded over the pass's whole iteration space, from isl) plus the exact
  write footprint, times the element size: a sub-view or a strided access counts the
  elements it touches, not their bounding box; an element read by two members of one
  row loop counts once (the row stays in cache between members, the premise of fusion).
* **The model's rule on caches:** passes do not share caches. A buffer that two phases
  of a stitched kernel read counts twice even when it stays in L2, and a buffer one
  kernel writes and the next reads counts in both.
* **Compulsory** bytes of a kernel: the read footprint of its inputs (buffers the
  function receives, or that an earlier kernel writes) plus the write footprint of its
  outputs (buffers the function returns, or that a later kernel reads), over the whole
  kernel. The ratio is moved / compulsory.

Not counted: the read half of an aggregating store (`+=` updates an element without a
load in the IR; a reduction's accumulator is counted as written); data-dependent
subscripts (gathers, pointer increments) and whole-buffer specials count the whole view
they may touch, an upper bound; the stack, code and the tables of packed operands'
addresses. What a kernel reads again from cache (a panel of a tiled contraction)
counts once: a footprint is a set.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import islpy as isl

from polytile.ir.nodes import Block, Function, Statement
from polytile.ir.polyhedra import READ, WRITE, Scope, parent_footprint, to_set


@dataclass(frozen=True)
class KernelTraffic:
    name: str                               # the kernel's block name ("fused_0", "s3")
    moved: int                              # bytes, summed over its passes and buffers
    compulsory: int                         # bytes of its inputs (read) + outputs (written)
    buffers: tuple[tuple[str, int], ...]    # (memory buffer, bytes moved), in ref order

    @property
    def ratio(self) -> float:
        return self.moved / self.compulsory if self.compulsory else 1.0


@dataclass(frozen=True)
class _Footprints:
    """Elements of each memory buffer one kernel (or one pass of it) reads and writes."""

    reads: dict[str, isl.Set]
    writes: dict[str, isl.Set]


def kernel_traffic(fn: Function) -> tuple[KernelTraffic, ...]:
    """The traffic of every kernel of `fn` (its body's statements), in order."""
    body = fn.body
    root = Scope.root(body)
    memory = {r.into: r.shape.dtype.bits // 8 or 1 for r in body.refs}
    kernels = [st for st in body.stmts if isinstance(st, Block)]
    whole = [_footprints(root.child(k), k.stmts, memory) for k in kernels]
    inputs = {r.into for r in body.refs if r.dir == "in"}
    outputs = {name for name in fn.params if body.ref(name).dir in ("out", "inout")}
    result = []
    for n, kernel in enumerate(kernels):
        written_before = {b for f in whole[:n] for b in f.writes}
        read_after = {b for f in whole[n + 1:] for b in f.reads}
        live_in = inputs | written_before
        live_out = outputs | read_after
        compulsory = (sum(_bytes(s, memory[b]) for b, s in whole[n].reads.items() if b in live_in)
                      + sum(_bytes(s, memory[b]) for b, s in whole[n].writes.items()
                            if b in live_out))
        moved: dict[str, int] = {}
        for part in _passes(kernel):
            f = _footprints(root.child(kernel), part, memory)
            for sets in (f.reads, f.writes):
                for b, s in sets.items():
                    moved[b] = moved.get(b, 0) + _bytes(s, memory[b])
        result.append(KernelTraffic(kernel.name, sum(moved.values()), compulsory,
                                    tuple(moved.items())))
    return tuple(result)


def _passes(kernel: Block) -> list[tuple[Statement, ...]]:
    """The statements of each pass over memory: a stitched kernel's phases one by one,
    any other kernel's statements all together."""
    if kernel.schedule.stitch is not None or "stitched" in kernel.tags:
        return [(st,) for st in kernel.stmts]
    return [kernel.stmts]


def _footprints(scope: Scope, stmts: Sequence[Statement],
                memory: dict[str, int]) -> _Footprints:
    """The footprints, in the coordinates of the function's buffers, of `stmts` run in
    every iteration of scope's block (a kernel)."""
    part = replace(scope, block=replace(scope.block, stmts=tuple(stmts)))
    found: dict[str, dict[str, isl.Set]] = {READ: {}, WRITE: {}}
    for ref in scope.block.refs:
        if ref.from_ not in memory:
            continue
        for mode, sets in found.items():
            coords, pieces = parent_footprint(part, ref.into, mode)
            if not pieces:
                continue
            points = to_set(part.variables + coords, [pieces]).project_out(
                isl.dim_type.set, 0, len(part.variables))
            earlier = sets.get(ref.from_)
            sets[ref.from_] = points if earlier is None else earlier.union(points)
    return _Footprints(found[READ], found[WRITE])


def _bytes(points: isl.Set, width: int) -> int:
    return int(points.count_val().to_python()) * width


def format_traffic(traffic: Sequence[KernelTraffic]) -> str:
    """What `polytile show --stage plan` prints under the plan: per kernel of the IR
    built with the plan, bytes moved against its inputs + outputs."""
    lines = ["  traffic (optimized IR; bytes moved / inputs + outputs, polytile.analysis.traffic):"]
    for k in traffic:
        lines.append(f"    {k.name:<16} {k.moved} / {k.compulsory} B = {k.ratio:.2f}x")
    return "\n".join(lines) + "\n"


def largest(traffic: Sequence[KernelTraffic]) -> KernelTraffic | None:
    """The kernel with the largest ratio (the first of equals), None without kernels."""
    return max(traffic, key=lambda k: k.ratio, default=None)
