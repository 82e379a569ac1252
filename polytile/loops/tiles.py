"""The loops of a block that runs on a CPU's matrix instruction on tiles (schedule
`tiles(I, rows, cols, k)`, set by pass `tensorize`; AMX's tdpbf16ps, tdpbusd, tdpbssd).

The instruction (its description in polytile/isa) computes D (M x N) = ACC + A . B over
groups g of T values (tdpbf16ps: M = N = 16, 16 groups of T = 2 bfloat16; tdpbusd: 16
groups of 4 bytes); the inspector mapped M and N onto the block's `rows` and `cols` and
both reduction loops onto `k`, split: k = T * g + t. Each operand is packed per call
into the instruction's tiles, laid out as its description flattens it, zero past the
ends of M, N and K (a zero adds nothing, so every size is computed and the instruction
never reads past an operand):

    block s0 [m:M, n:N, k:K] schedule(parallel(m), tiles(tdpbf16ps_amx, m, n, k)) (
      out C[m, n]:add   in A[m, k] bfloat16   in B[k, n] bfloat16 )

->  Bp[(nb * KB + kb) * 512 + pos_b(g, n, t)] = B[32 kb + 2 g + t, 16 nb + n]
      (before the batch loops where B reads none of them; else inside them, as Ap)
    for the other output loops (a batch), serial:
      Ap[(mb * KB + kb) * 512 + pos_a(m, g, t)] = A[16 mb + m, 32 kb + 2 g + t]
      for mb < ceil(M / 16) (in threads where the schedule says parallel(m); or the
                             batch loop the schedule names runs in threads):
        the instruction's setup (AMX: the tile configuration, once per thread and panel)
        for nb < ceil(N / 16):
          stage (16 x 16, on the stack, zero) = the tile of C that exists
          acc = stage
          for kb < KB: acc = I(acc, Ap tile (mb, kb), Bp tile (nb, kb))
          stage = acc; the tile of C that exists = stage
        the instruction's finish (AMX: the tiles released)

Other reductions (a convolution's window r, s) loop around the steps of K: each operand
is packed per window position, tile ((p, window), kb), the input as im2col would; an
operand that reads no batch loop (the weights) is packed once before the batch loops.

pos_x is where the description's operand holds an element (its TC parameter flattened
row-major): tdpbf16ps's a(m, g, t) and b(g, n, t), so that B's tile holds the T values
of each group side by side, as AMX reads it. The interpreter runs the instruction's TC
description, so the loops are checked like any others; the C form runs on AMX, or in the
tests on a software AMX (tests/isa/amx_emulation.h).

With `kept` (pass tensorize: the second operand is a read-only parameter dense in
memory that no batch loop changes), the second operand's tiles are a top-level local
kept between calls, packed again only when the parameter's values differ from the ones
they were packed from (polytile.loops.tensorize.kept): a weight packed once.

Not built (docs/instructions.md, limits): a register tile of several accumulators (AMX
has 8 tiles; each instruction here loads its accumulator, both operands and stores the
result), and packing in threads. Where the schedule runs a batch loop in threads (pass
tensorize: too few row tiles to share), the operands packed per batch have a buffer per
batch, allocated (zeroed) inside it: each thread its own.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from polytile.errors import IRError
from polytile.ir.nodes import Affine, Block, Refinement
from polytile.loops import nodes as L
from polytile.loops.tensorize import kept
from polytile.loops.views import Scope, child_view, fixed_indices, resolve, safe

if TYPE_CHECKING:
    from polytile.loops.lower import Lowering


def lower_block(low: Lowering, blk: Block, outer: Scope) -> list[L.Stmt]:
    from polytile.isa import description
    from polytile.isa.inspect import kinds, output, tile_mapping, uses
    w = blk.schedule.tiles
    assert w is not None
    d = description(w.instruction)
    mapping = tile_mapping(blk, d.name, d.reduction, w.rows, w.cols, w.reduction)
    if mapping is None:
        raise IRError(f"block {blk.name} cannot run on {w.instruction}'s tiles along "
                      f"{w.rows}, {w.cols} and {w.reduction}")
    (dm, _), (dn, _), (dg, _), (dt, _) = mapping.loops
    extent = {i.name: i.range for i in d.reduction.idxs}
    tm, tn, groups, values = extent[dm], extent[dn], extent[dg], extent[dt]
    step = groups * values                     # the reduction's values per instruction
    loops = {i.name: i.range for i in blk.idxs if i.affine is None}
    size_m, size_n, size_k = loops[w.rows], loops[w.cols], loops[w.reduction]
    mb_count, nb_count, kb_count = (-(-size_m // tm), -(-size_n // tn), -(-size_k // step))
    groups_k = -(-size_k // values)            # groups of the whole reduction
    (acc_t,), operand_types = d.definition.outputs, d.operand_types
    d_out, out_ref = output(d.reduction), output(blk)
    assert d_out is not None and out_ref is not None
    if d.definition.inputs[0] != acc_t:
        raise IRError(f"{w.instruction}'s accumulator is not of its result's type")
    idx = fixed_indices(blk, outer.idx)
    batch = [n for n in kinds(blk)[0] if n not in (w.rows, w.cols)]
    batch_vars = {n: low.fresh("i") for n in batch}
    at_batch = {n: Affine.index(v) for n, v in batch_vars.items()}
    # The other reductions (a convolution's window) loop around the reduction's steps;
    # each operand is packed per position of them, row-major: `windows` in all.
    window = [n for n in kinds(blk)[1] if n != w.reduction]
    windows = math.prod(loops[n] for n in window)

    def window_loops() -> tuple[dict[str, Affine], Affine,
                                Callable[[list[L.Stmt]], list[L.Stmt]]]:
        """Fresh loop variables over the window: their values by index, the window's
        position (row-major) and what puts a body into their loops."""
        names = {n: low.fresh("i") for n in window}
        place = Affine.constant(0)
        for n in window:
            place = place.scale(loops[n]) + Affine.index(names[n])

        def wrap(body: list[L.Stmt]) -> list[L.Stmt]:
            for n in reversed(window):
                body = [L.Loop(names[n], Affine.constant(0), Affine.constant(loops[n]),
                               tuple(body))]
            return body
        return {n: Affine.index(v) for n, v in names.items()}, place, wrap

    def view(ref: Refinement, at: dict[str, Affine]):  # type: ignore[no-untyped-def]
        return child_view(ref, outer.views[ref.from_], {**idx, **at_batch, **at})

    def position(d_ref: Refinement, at: dict[str, Affine]) -> Affine:
        """Where the description's operand `d_ref` holds its element at `at` (values of
        the description's loops), flattened as its TC parameter is."""
        where = f"instruction {w.instruction}"
        return sum((resolve(a, at, where).scale(dim.stride)
                    for a, dim in zip(d_ref.access, d_ref.shape.dims)), Affine.constant(0))

    def upto(count: int, done: Affine, total: int) -> L.IExpr:
        """min(count, total - done): what is left of `total` after `done`, at most
        `count`."""
        return L.IMin((Affine.constant(count), Affine.constant(total) - done))

    # Each operand packed into tiles: tile ((p, window position), kb) for its M or N
    # tile p; before the batch loops if it reads none of them (a convolution's weights),
    # else inside them, for each batch.
    packs: list[L.Stmt] = []
    hoisted: list[L.Stmt] = []
    buffers: list[L.Buffer] = []
    private: list[L.Buffer] = []      # packed for each batch in threads: each thread's own
    threads = low.options.threads and not outer.parallel
    in_batch = threads and blk.schedule.parallel in batch
    packed: dict[str, str] = {}
    for which, (d_name, t) in enumerate(zip(d.operands, operand_types)):
        d_ref, ref = d.reduction.ref(d_name), blk.ref(dict(mapping.operands)[d_name])
        own, loop, tiles_p, size_p, tile_p = (dm, w.rows, mb_count, size_m, tm) \
            if dm in uses(d_ref) else (dn, w.cols, nb_count, size_n, tn)
        name = low.fresh("l")
        packed[d_name] = name
        size = tiles_p * windows * kb_count * t.lanes
        label = f"{safe(ref.into)} in {w.instruction}'s tiles"
        keep = w.kept and which == 1
        outside = not uses(ref) & set(batch)
        if not keep:
            (private if in_batch and not outside else buffers).append(
                L.Buffer(name, t.dtype, size, "heap", "global", "zero", label=label))
        p, e, kb, g, v = (low.fresh("i") for _ in range(5))
        group = Affine.index(kb).scale(groups) + Affine.index(g)
        at_window, place, wrap = window_loops()
        src = view(ref, {loop: Affine.index(p).scale(tile_p) + Affine.index(e),
                         w.reduction: group.scale(values) + Affine.index(v), **at_window})
        value = low.fresh("s")
        put: list[L.Stmt] = [L.Let(value, L.VType(src.dtype), L.Read(src.ptr, src.offset))]
        if src.dtype != t.dtype:        # the inspector proved the widening exact
            wide = low.fresh("s")
            put.append(L.Let(wide, L.VType(t.dtype), L.Op("cast", (value,), t.dtype)))
            value = wide
        base = ((Affine.index(p).scale(windows) + place).scale(kb_count)
                + Affine.index(kb)).scale(t.lanes)
        put.append(L.Store(name, base + position(d_ref, {own: Affine.index(e),
                                                        dg: Affine.index(g),
                                                        dt: Affine.index(v)}), value))
        fill: L.Stmt = L.Loop(v, Affine.constant(0), upto(values, group.scale(values), size_k),
                              tuple(put))
        fill = L.Loop(g, Affine.constant(0), upto(groups, Affine.index(kb).scale(groups),
                                                  groups_k), (fill,))
        fill = L.Loop(kb, Affine.constant(0), Affine.constant(kb_count), (fill,))
        fill = L.Loop(e, Affine.constant(0), upto(tile_p, Affine.index(p).scale(tile_p),
                                                  size_p), tuple(wrap([fill])))
        fill = L.Loop(p, Affine.constant(0), Affine.constant(tiles_p), (fill,))
        if keep:          # zeroed and filled only when the values differ from the last
            if not outside:
                raise IRError(f"block {blk.name} keeps {w.instruction}'s tiles between calls "
                              f"but they change with {', '.join(uses(ref) & set(batch))}")
            fill = kept(low, name, size, t.dtype, outer.views[ref.from_], [fill], label)
        (hoisted if outside else packs).append(fill)

    mb, nb, kb = low.fresh("i"), low.fresh("i"), low.fresh("i")
    stage = low.fresh("l")
    row_start, col_start = Affine.index(mb).scale(tm), Affine.index(nb).scale(tn)

    def copy(into: bool) -> L.Stmt:
        """The tile of the output that exists, into the stage or back."""
        e, f, value = low.fresh("i"), low.fresh("i"), low.fresh("s")
        o = view(out_ref, {w.rows: row_start + Affine.index(e),
                           w.cols: col_start + Affine.index(f)})
        here = position(d_out, {dm: Affine.index(e), dn: Affine.index(f)})
        (src, src_at), (dst, dst_at) = ((o.ptr, o.offset), (stage, here)) if into else \
            ((stage, here), (o.ptr, o.offset))
        return L.Loop(e, Affine.constant(0), upto(tm, row_start, size_m), (
            L.Loop(f, Affine.constant(0), upto(tn, col_start, size_n), (
                L.Let(value, L.VType(acc_t.dtype), L.Read(src, src_at)),
                L.Store(dst, dst_at, value))),))

    acc, r = low.fresh("acc"), low.fresh("v")
    # The first operand's tiles go with mb (it reads M), the second's with nb.
    if dm not in uses(d.reduction.ref(d.operands[0])):
        raise IRError(f"{w.instruction}'s first operand does not read its M loop")
    operands = []
    steps: list[L.Stmt] = []
    _, place, wrap = window_loops()
    for d_name, t, number in zip(d.operands, operand_types, (mb, nb)):
        x = low.fresh("v")
        steps.append(L.Let(x, t, L.Read(packed[d_name], (
            (Affine.index(number).scale(windows) + place).scale(kb_count)
            + Affine.index(kb)).scale(t.lanes), t.lanes)))
        operands.append(x)
    steps += [L.Instruction(d.name, (r,), (acc, *operands)), L.Assign(acc, L.Name(r))]
    accumulate = L.Alloc((L.Buffer(stage, acc_t.dtype, acc_t.lanes, "stack", init="zero",
                                   label="a tile of the output"),), (
        copy(True),
        L.Var(acc, acc_t, L.Read(stage, Affine.constant(0), acc_t.lanes)),
        *wrap([L.Loop(kb, Affine.constant(0), Affine.constant(kb_count), tuple(steps))]),
        L.Store(stage, Affine.constant(0), acc),
        copy(False)))
    around = {step: [L.Instruction(name, (), ())] for step, name in d.steps().items()}
    nest: list[L.Stmt] = packs + [L.Loop(mb, Affine.constant(0), Affine.constant(mb_count), (
        *around.get("setup", []),
        L.Loop(nb, Affine.constant(0), Affine.constant(nb_count), (accumulate,)),
        *around.get("finish", [])),
        "parallel" if threads and blk.schedule.parallel == w.rows else "serial")]
    if private:         # zeroed per batch: the padding stays zero whatever the thread
        nest = [L.Alloc(tuple(private), tuple(nest))]
    for name in reversed(batch):
        nest = [L.Loop(batch_vars[name], Affine.constant(0), Affine.constant(loops[name]),
                       tuple(nest),
                       "parallel" if threads and blk.schedule.parallel == name else "serial")]
    return [L.Comment(f"block {safe(blk.name)}: {w.instruction}'s tiles, M along {w.rows}, "
                      f"N along {w.cols}, K along {w.reduction}"
                      + (f" in each position of {', '.join(window)}" if window else "")),
            *([L.Alloc(tuple(buffers), (*hoisted, *nest))] if buffers else [*hoisted, *nest])]
