"""gathercopy: a gathered operand that is reused across a parallel index it does not
use is copied once into a dense buffer, and the contraction reads the copy with plain
affine subscripts.

A shift convolution (extended tensor contractions, Wu et al.'s shift layer) reads
`I(n, c, h + 1 + SH(c), w + 1 + SW(c))`: the shifts depend only on the reduction
index c, so pass ptrinc reads it through a per-c table of pointer steps. But every
element is read again for each of the K output channels, and each read of the
kernel is an unaligned row of a bordered image, cut where the row ends. Copied once
into G(n, c, h, w) = I(n, c, h + 1 + SH(c), w + 1 + SW(c)), the contraction is a
plain GEMM over dense rows `Out(n, k, h, w) += G(n, c, h, w) * W(c, k)` (and its
(h, w) are contiguous, so a collapse of that pair applies). The copy itself is
built with ptrinc's machinery, stepping over c: the shifts are checked once per
channel at the corners of (h, w), before anything is copied, with the same error
as the gather they replace, and each copied row is a plain (vector) row copy from
the channel's shifted origin.

    block s0 [n:2, k:3, h:5, w:4, c:5] #contraction    none in0_gathered float32(2:100, 5:20, 5:4, 4:1)
      out out[n, k, h, w]:add                          none s0_in0_steps int64(5:1)
      in sh[c]  in sw[c]                               block s0_copy_bounds [c:5, h:2, w:2] #bounds ...
      in in0[n, c, 0, 0] (1, 1, 7, 6)          ->      block s0_copy_steps [c:5] #ptrinc ...
      in in1[c, k]                                     block s0_copy [n:2, c:5, h:5, w:4] #kernel #gather (
    ) { ... $in0 = load(in0[_, _, $y, $x])               out in0_gathered[n, c, h, w]
        $in1 = load(in1) ... }                           in in0 <- in0[n, 0, h, w] (1, 5, 3, 3)
                                                         in s0_in0_steps[c] ) {
                                                         $in0_step = load(s0_in0_steps)
                                                         $in0 = load(in0 + $in0_step)
                                                         in0_gathered = store($in0) }
                                                       block s0 [n:2, k:3, h:5, w:4, c:5] #contraction (
                                                         out out[n, k, h, w]:add
                                                         in in0 <- in0_gathered[n, c, h, w]
                                                         in in1[c, k] ) { plain loads }

The copy is made when the operand is read at least `min_reuse` times per element
(the product of the ranges of the kernel's indices it does not use): it costs a read
and a write per element, and a buffer as large as the operand's used part. Where
reuse is lower (a depthwise-like kernel), or the gather's subscripts would make the
copy larger than what it reads (an index used only through data, as in a sparse
filter's taps, or a static window like `h + kh`: an im2col), the kernel is left as it
is and ptrinc reads it through pointer increments.

The pass runs after fuse (a fused row gets its own copy of its slice) and before pack
and ptrinc: pack and autotile then see a plain contraction.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from polytile.analysis.deps import scalar_indices
from polytile.ir import nodes as N
from polytile.ir.lower import contiguous
from polytile.passes import ptrinc
from polytile.passes.pipeline import count, flag, register
from polytile.targets.target import Target

# Reads per element of the operand below which the copy does not pay: the copy costs a
# load and a store per element and the contraction then reads memory ptrinc's in-place
# rows did not. The shift convolution (n=8, c=256, 30x30 image, shifts in [-1, 1]) with
# K output channels, one thread, CPU time, AMD EPYC Zen 3, medians of 30 alternating
# calls, ptrinc in place -> copy: K=16 3.18 -> 3.60 ms, K=32 5.12 -> 4.95, K=48 6.49 ->
# 6.05, K=64 8.01 -> 6.88, K=128 12.6 -> 10.5, K=256 29.2 -> 19.3.
MIN_REUSE = 32


@dataclass(frozen=True)
class _Gather:
    """One gathered load of a kernel that is worth a dense copy."""

    load: N.Load
    ref: N.Refinement
    indices: tuple[str, ...]        # the copy's dims: one kernel index per dimension read
    steps_over: tuple[str, ...]     # the indices the data-dependent subscripts come from


def _gather(block: N.Block, load: N.Load, ranges: dict[str, int], red: set[str],
            min_reuse: int) -> _Gather | None:
    """The copy plan of `load`, or None where its subscripts are not `index + f(data of
    reduction indices)` one index per dimension, or the operand is not reused enough."""
    ref = block.ref(load.ref)
    if ref.dir != "in" or load.offset is not None or not any(load.dynamic):
        return None
    if sum(1 for s in block.stmts if isinstance(s, N.Load) and s.ref == ref.into) != 1:
        return None
    parallel = set(ranges) - red
    parts = ptrinc.parallel_parts(block, parallel)
    deps = scalar_indices(block)
    indices: list[str] = []
    through_data: set[str] = set()
    for access, sub in zip(ref.access, load.dynamic or (None,) * len(ref.access)):
        looped = [n for n in access.names if n in ranges]
        if sub is None:
            if not looped:
                continue                    # a dimension the view fixes
            if len(looped) > 1 or access.coeff(looped[0]) != 1:
                return None                 # a window (h + kh): the copy would be im2col
            indices.append(looped[0])
            continue
        part = parts.get(sub)
        if looped or part is None or any(c != 1 for _, c in part.terms) or len(part.terms) > 1:
            return None
        indices += list(part.names)
        through_data |= deps[sub] - set(part.names)
    if len(set(indices)) != len(indices) or not through_data <= red \
            or not through_data <= set(indices):
        return None
    used = set(indices) | through_data
    if math.prod(r for n, r in ranges.items() if n not in used) < min_reuse:
        return None
    steps_over = tuple(n for n in ranges if n in through_data)
    return _Gather(load, ref, tuple(indices), steps_over)


def _copy_block(block: N.Block, g: _Gather, buffer: N.Refinement) -> N.Block:
    """The natural copy: buffer[indices] = the gathered load, its subscripts computed as
    the kernel computes them."""
    ranges = {i.name: i.range for i in block.idxs if i.affine is None}
    stmts = ptrinc.chain(block, [g.load.into])
    used = {s.ref for s in stmts if isinstance(s, N.Load)}
    refs = [r for r in block.refs if r.into in used]
    out = N.Refinement("out", buffer.into, buffer.into,
                       tuple(N.Affine.index(n) for n in g.indices), buffer.shape.element)
    idxs = tuple(N.Index(n, ranges[n]) for n in g.indices) + ptrinc.passed_indices(block)
    return N.Block(f"{block.name}_copy", idxs, (), (out, *refs),
                   (*stmts, N.Store(buffer.into, g.load.into)),
                   frozenset({"kernel", "gather"}),
                   f"{g.ref.into} of {block.name} gathered once into {buffer.into}")


def _reading_copy(block: N.Block, g: _Gather, buffer: N.Refinement) -> N.Block:
    """`block` with its gathered view moved onto the dense copy, read at its indices."""
    view = replace(g.ref, from_=buffer.into, access=tuple(N.Affine.index(n) for n in g.indices),
                   shape=buffer.shape.element)
    stmts = ptrinc.live([N.Load(s.into, s.ref) if s == g.load else s for s in block.stmts])
    used = {s.ref for s in stmts if isinstance(s, (N.Load, N.Store))}
    refs = tuple(view if r.into == g.ref.into else r for r in block.refs
                 if r.dir != "in" or r.into in used)
    return replace(block, refs=refs, stmts=tuple(stmts))


def _rewrite(block: N.Block, settings: ptrinc.Settings, min_reuse: int, taken: set[str]
             ) -> tuple[list[N.Statement], list[N.Refinement]] | None:
    """The statements that replace kernel `block` and the buffers they need, or None."""
    if (block.constraints or "contraction" not in block.tags or "kernel" not in block.tags
            or block.schedule.micro
            or any(isinstance(s, (N.Block, N.Special)) for s in block.stmts)):
        return None
    red = set(ptrinc.reduction_indices(block))
    ranges = {i.name: i.range for i in block.idxs if i.affine is None}
    if not red or any(r < 1 for r in ranges.values()):
        return None
    names = ptrinc.Names(taken | {r.into for r in block.refs})
    stmts: list[N.Statement] = []
    buffers: list[N.Refinement] = []
    for load in [s for s in block.stmts if isinstance(s, N.Load)]:
        g = _gather(block, load, ranges, red, min_reuse)
        if g is None:
            continue
        name = names.fresh(f"{g.ref.from_ or g.ref.into}_gathered")
        shape = contiguous(g.ref.shape.dtype, tuple(ranges[n] for n in g.indices))
        buffer = N.Refinement("none", "", name, tuple(N.Affine() for _ in g.indices), shape)
        copy = ptrinc.rewrite_kernel(_copy_block(block, g, buffer), settings,
                                     names.taken, list(g.steps_over))
        if copy is None:
            continue                        # no table for it: ptrinc reads it in place
        names.taken |= {t.into for t in copy.tables}
        buffers += [buffer, *copy.tables]
        stmts += [*copy.before, copy.kernel]
        block = _reading_copy(block, g, buffer)
    if not buffers:
        return None
    return [*stmts, block], buffers


def gathercopy(fn: N.Function, target: Target, params: dict[str, Any]) -> N.Function:
    """Copy reused gathered operands into dense buffers. Parameters: `enabled`,
    `min_reuse` (reads per copied element below which the copy is not made; default
    MIN_REUSE)."""
    if not params.get("enabled", True):
        return fn
    settings = ptrinc.Settings.of(target, {})
    min_reuse = int(params.get("min_reuse", MIN_REUSE))
    body = ptrinc.rewrite_kernels(
        fn.body, lambda kernel, taken: _rewrite(kernel, settings, min_reuse, taken))
    return fn if body is fn.body else replace(fn, body=body)


register("gathercopy", gathercopy, enabled=flag, min_reuse=count)
