"""Memory traffic of each kernel of an optimized function: bytes moved against the
kernel's compulsory bytes (issue 17's target: moved <= 1.2x inputs + outputs).

    for k in kernel_traffic(compiler.ir(spec)):
        print(k.name, k.moved, k.compulsory, k.ratio)

A kernel is a top-level block of the function's body (a fused row loop, a stitched
block, a single statement's block, a hoisted initialization), but an init that pass fold
made a contraction's first writes (it runs nowhere): what `bench --fusion` counts as
"kernels" (`kernels`). The model, exact over the IR and blind to caches:

* **Memory buffers** are the function's inputs, outputs and top-level locals (pool or
  stack temporaries shared by kernels). A local a kernel declares itself (a row buffer
  that pass fuse's localize made private to a row or a thread) is not memory traffic.
* **A pass** over memory is the whole kernel, or, for a stitched kernel, each phase on
  its own. Per pass and memory buffer, the bytes moved are the exact read footprint
  plus the exact write footprint (sets of elements over the pass's whole iteration
  space, from isl), times the element size: a sub-view or a strided access counts the
  elements it touches, not their bounding box. Reads are the exposed ones: the pass's
  statements run in order in each of its iterations (each row of a row loop), and an
  element a statement reads that an earlier statement wrote in the same iteration is
  not read from memory; an element two statements of one row read counts once. Both
  are fusion's premise: the row stays in cache between its members.
* **The model's rule on caches:** passes do not share caches. A buffer that two phases
  of a stitched kernel read counts twice even when it stays in L2, and a buffer one
  kernel writes and the next reads counts in both.
* **Compulsory** bytes of a kernel: the (exposed) read footprint of its inputs
  (buffers the function receives, or that an earlier kernel writes) plus the write
  footprint of its outputs (buffers the function returns, or that a later kernel
  reads), over the whole kernel. The ratio is moved / compulsory.

Not counted: the read half of an aggregating store (`+=` updates an element without a
load in the IR; a reduction's accumulator counts as written), write-backs of lines a
store only partly fills, and top-level statements that are not blocks. Data-dependent
subscripts (gathers, pointer increments) and whole-buffer specials count the whole view
they may touch, an upper bound. What a kernel reads again from cache (a panel of a
tiled contraction) counts once: a footprint is a set.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import islpy as isl

from polytile.ir.nodes import Affine, Block, Function
from polytile.ir.polyhedra import READ, WRITE, Conj, Scope, parent_footprint, to_set


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


def kernels(fn: Function) -> list[Block]:
    """The kernels of `fn`, in order (see the module docstring)."""
    return [st for st in fn.body.stmts if isinstance(st, Block) and st.schedule.folded is None]


def kernel_traffic(fn: Function) -> tuple[KernelTraffic, ...]:
    """The traffic of every kernel of `fn`, in order."""
    body = fn.body
    root = Scope.root(body)
    width = {r.into: r.shape.dtype.bits // 8 or 1 for r in body.refs}
    top = {name: _View(name, (0,) * len(body.ref(name).shape.dims)) for name in width}
    blocks = kernels(fn)
    whole = [_footprints(root.child(k), top) for k in blocks]
    inputs = {r.into for r in body.refs if r.dir == "in"}
    outputs = {name for name in fn.params if body.ref(name).dir in ("out", "inout")}
    result = []
    for n, kernel in enumerate(blocks):
        live_in = inputs | {b for f in whole[:n] for b in f.writes}
        live_out = outputs | {b for f in whole[n + 1:] for b in f.reads}
        compulsory = (sum(_bytes(s, width[b]) for b, s in whole[n].reads.items() if b in live_in)
                      + sum(_bytes(s, width[b]) for b, s in whole[n].writes.items()
                            if b in live_out))
        moved: dict[str, int] = {}
        for f in _passes(root.child(kernel), top, whole[n]):
            for sets in (f.reads, f.writes):
                for b, s in sets.items():
                    moved[b] = moved.get(b, 0) + _bytes(s, width[b])
        result.append(KernelTraffic(kernel.name, sum(moved.values()), compulsory,
                                    tuple(moved.items())))
    return tuple(result)


@dataclass(frozen=True)
class _View:
    """A refinement's buffer among the function's and the constant origin of its view."""

    buffer: str
    origin: tuple[int, ...]


def _passes(kernel: Scope, top: dict[str, _View], whole: _Footprints) -> list[_Footprints]:
    """The footprints of each pass over memory: a stitched kernel's phases one by one,
    any other kernel whole (`whole`, its footprints, already found)."""
    block = kernel.block
    if block.schedule.stitch is None and "stitched" not in block.tags:
        return [whole]
    # A stitched block has no indices: its views of the function's buffers start at
    # constant origins.
    views = {r.into: _View(r.from_, tuple(a.const for a in r.access))
             for r in block.refs if r.from_ in top}
    return [_footprints(kernel.child(phase), views) if isinstance(phase, Block)
            else _footprints(replace(kernel, block=replace(block, stmts=(phase,))), top)
            for phase in block.stmts]


def _footprints(scope: Scope, views: dict[str, _View]) -> _Footprints:
    """The footprints, in the coordinates of the function's buffers, of scope's block
    (a kernel or a phase), whose statements run in order in each of its iterations.
    `views`: the buffers of its parent that are the function's. Reads are the exposed
    ones: an element that an earlier statement wrote in the same iteration (a row of a
    row loop) is not read from memory."""
    found: dict[str, dict[str, isl.Set]] = {READ: {}, WRITE: {}}
    for ref in scope.block.refs:
        view = views.get(ref.from_)
        if view is None:
            continue
        written: isl.Set | None = None
        for st in scope.block.stmts:
            part = replace(scope, block=replace(scope.block, stmts=(st,)))
            reads, writes = (_points(part, ref.into, mode, view.origin) for mode in (READ, WRITE))
            if reads is not None and written is not None:
                reads = reads.subtract(written)
            _add(found[READ], view.buffer, reads)
            _add(found[WRITE], view.buffer, writes)
            if writes is not None:
                written = writes if written is None else written.union(writes)
    n = len(scope.variables)
    return _Footprints(*({b: points.project_out(isl.dim_type.set, 0, n)
                          for b, points in found[mode].items()} for mode in (READ, WRITE)))


def _points(part: Scope, ref: str, mode: str, origin: tuple[int, ...]) -> isl.Set | None:
    """(iteration, element of the function's buffer) pairs that `part` reads or writes,
    or None; the parent's view of the buffer starts at `origin`."""
    coords, pieces = parent_footprint(part, ref, mode)
    if not pieces:
        return None
    outer = tuple(f"y{d}" for d in range(len(coords)))
    links = tuple(Affine.index(y) - Affine.index(x) - c
                  for y, x, c in zip(outer, coords, origin))
    shifted = tuple(Conj(p.hidden + coords, p.eqs + links, p.ineqs) for p in pieces)
    return to_set(part.variables + outer, [shifted])


def _add(sets: dict[str, isl.Set], buffer: str, points: isl.Set | None) -> None:
    if points is not None and not points.is_empty():
        earlier = sets.get(buffer)
        sets[buffer] = points if earlier is None else earlier.union(points)


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
