"""The loops of a block that runs on a lane-dot instruction (schedule `tensorize(I, lane,
reduction, rows, chains)`, set by pass `tensorize`): UNIT's rewriter for vpdpbusd-like instructions,
whose accumulator has L lanes and whose two operands hold G values per lane.

    block s0 [m:M, n:N, k:K] schedule(tensorize(vpdpbusd_512, n, k, 6, 4)) (
      out C[m, n]:add   in A[m, k] uint8 (broadcast)   in B[k, n] int8 (packed) )

->  Bp = the packed operand in strips of W = chains x L lanes, each strip's groups one
         after another: Bp[((s * K/G + g) * W + l) * G + t] = B[G*g + t, W*s + l], zeros
         past K and N (allocated and filled once per call), so that a tile streams
         through one contiguous strip;
    for panels of about 32 rows of m (threads, if the schedule says so, the panels a
        multiple of 4 of whole tiles, as equal as can be; else one panel):
     for blocks of 64 lanes of n (a block of Bp stays in L2 while the panel's rows pass):
      for 6 rows of the panel at a time (the schedule's rows; the rows left over after
                                         the last whole tile follow as one narrower tile,
                                         or one row per thread if they are all there is):
        for 4 chunks of 16 lanes at a time (the schedule's chains; then single chunks,
                                            then a masked tail):
          acc[i][j] = C[m_i, n0_j : n0_j + 16]   (0 where pass fold folded the init:
                                                  schedule `first()`)
          for g < K / G:  b_j = Bp[s, g, 16 j : 16 j + 16, :] (one load for the 6 rows);
                          a_i = the G bytes A[m_i, G*g : G*g + G] in every lane (one
                          word broadcast for the 4 chunks); acc[i][j] = I(acc[i][j], a_i, b_j)
          a last, partial group reads only the bytes of A that exist (the rest are 0,
          and so are Bp's)
          C[m_i, n0_j : ...] = acc[i][j]

An instruction without an accumulator operand (vpmaddwd: `d(l) +=! ...`) computes only
the group sums; its result joins the accumulator with the description's aggregation,
`acc[i][j] = acc[i][j] + I(a_i, b_j)` (a vector add). An operand narrower than the
instruction's (a u8 or s8 matrix on vpmaddwd's s16 pairs: the inspector proved the
widening exact) is converted when it is packed: Bp holds the instruction's dtype, and a
widened broadcast operand is packed too, Ap[(row * groups + g) * G + t] = A[row, G*g + t]
(zeros past K), so that a row's group is still one word broadcast.

The rows x chains accumulators (chosen by pass `tensorize` from the target's vector
registers) hide the instruction's latency. Other output loops are looped outside. The
block (COLUMNS) is a constant of this lowering, not yet a schedule field. The interpreter runs the instruction's
TC description, so the loops are checked like any others.

A convolution (UNIT §IV-B, Fig. 5) is the same nest with three more things:

    block s0 [n, k, h, o, c, r, s] schedule(tensorize(vpmaddwd_256, k, c, 3, 4)) (
      out y[n, k, h, o]:add   in x[n, c, h + r, o + s] uint8   in w[k, c, r, s] int8 )

->  Wp[(((s * windows + w) * groups + g) * W + l) * G + t] = w[W*s + l, G*g + t, r, s_]
         (kept between calls when the schedule says `kept`: see `kept` below)
         at window position w = (r, s_) row-major: KCRS -> K/W, RS, C/G, W, G (the
         other reductions, the window, are outer to the groups in each strip);
    Xp[(((n * groups + g) * H + h) * W + o) * G + t] = x[n, G*g + t, h, o]: the broadcast
         operand by its own dimensions, the groups in the channels' place and a group's
         values innermost, NCHW -> N[C/G]HW[G]c, zeros past C (packed when widened or its
         groups are not contiguous);
         a row reads Xp at its own subscripts (h + r, 2*o + s for a stride 2, one more
         for a conv3d): no case is special;
    for n, h (outer output loops), tiles of rows along o and lanes along k as above:
      the tile's y elements copied into a stack buffer (y's lanes are K apart: NKHW),
      for r, s: for g: the same step; then copied back.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from polytile.errors import IRError
from polytile.ir.nodes import Affine, Block
from polytile.loops import nodes as L
from polytile.loops.views import Scope, View, child_view, fixed_indices, resolve, safe

if TYPE_CHECKING:
    from polytile.dtypes import DType
    from polytile.loops.lower import Lowering

# Lanes per block of the packed operand: K x 64 x 2 bytes for bf16 (512 KiB at K = 4096)
# stays in L2 while a panel's rows pass; 256 lanes (2 MiB there) did not: bf16
# 128x4096x4096 10.3 -> 9.0 ms, 1024x4096x1024 9.6 -> 9.0 ms, the 1024^3 and
# 128x1024x1024 matmuls, int8 and the UNIT convolutions unchanged (AMD EPYC Zen 5).
COLUMNS = 64
PANEL = 32          # rows per panel, at most (rounded down to whole tiles)
# Panels come in a multiple of this many, of whole tiles as equal as can be, so that one,
# two or four threads share them evenly: OpenMP deals a parallel loop's iterations out in
# contiguous runs, and 126 rows in panels of 30 gave one thread 90 and the other 36 (bf16
# 128x1024x1024 on AMD EPYC Zen 5, two threads: 401 -> 308 us balanced).
PANEL_MULTIPLE = 4


def lower_block(low: Lowering, blk: Block, outer: Scope) -> list[L.Stmt]:
    from polytile.isa import description
    from polytile.isa.inspect import mappings, output, uses
    t = blk.schedule.tensorize
    assert t is not None
    d = description(t.instruction)
    mapping = next((m for m in mappings(blk, d.name, d.reduction)
                    if [p for _, p in m.loops] == [t.lane, t.reduction]), None)
    if mapping is None:
        raise IRError(f"block {blk.name} cannot run on {t.instruction} along "
                      f"{t.lane} and {t.reduction}")
    (acc_t,), (a_t, b_t) = d.definition.outputs, d.operand_types
    lanes, group = acc_t.lanes, a_t.lanes // acc_t.lanes
    views = dict(mapping.operands)
    x_ref, y_ref = (blk.ref(views[v]) for v in d.operands)
    out_ref = output(blk)
    assert out_ref is not None             # the inspector mapped a store
    loops = {i.name: i.range for i in blk.idxs if i.affine is None and i.range > 1}
    n_lane, n_red = loops[t.lane], loops[t.reduction]
    written = uses(out_ref)
    par = [n for n in loops if n in written and n != t.lane]
    red = [n for n in loops if n not in written and n != t.reduction]
    idx = fixed_indices(blk, outer.idx)
    groups = -(-n_red // group)
    # The other reductions (a convolution's window) loop around the groups; the packed
    # operand holds, per strip, every (window, group) pair in loop order: `total` groups.
    windows = math.prod(loops[n] for n in red)
    total = windows * groups

    def window(at: dict[str, Affine]) -> Affine:
        """The position of the other reductions' values `at`, row-major."""
        w = Affine.constant(0)
        for n in red:
            w = w.scale(loops[n]) + at[n]
        return w
    # The packed operand in strips of a register tile's lanes, each strip's groups one
    # after the other: a tile streams through its strip contiguously. (With the groups of
    # all lanes in one row, a 1024-lane row is 4 KiB: every step of the reduction fell
    # into the same sets of L1 and L2, and a strip reused by the next rows came from L3.)
    strip = t.chains * lanes
    strips = -(-n_lane // strip)

    def view(ref, at):  # type: ignore[no-untyped-def]
        return child_view(ref, outer.views[ref.from_], {**idx, **at})

    def element(ref, at: dict[str, Affine], dtype) -> tuple[list[L.Stmt], str]:  # type: ignore[no-untyped-def]
        """`ref` at `at` as one value of `dtype` (converted where the instruction's
        operand is wider: the inspector proved the widening exact), and its name."""
        v = view(ref, at)
        return converted(L.Read(v.ptr, v.offset), v.dtype, dtype)

    def converted(read: L.Read, have, dtype) -> tuple[list[L.Stmt], str]:  # type: ignore[no-untyped-def]
        """The element `read` (of dtype `have`) as a value of `dtype`, and its name."""
        value = low.fresh("s")
        stmts: list[L.Stmt] = [L.Let(value, L.VType(have), read)]
        if have == dtype:
            return stmts, value
        wide = low.fresh("s")
        return stmts + [L.Let(wide, L.VType(dtype), L.Op("cast", (value,), dtype))], wide

    def in_group(g: str) -> L.IExpr:
        """The values in group `g`: G, fewer in a last partial group."""
        return L.IMin((Affine.constant(group), Affine.constant(n_red)
                       - Affine.index(g).scale(group)))

    # The packed operand: groups of G values of each lane, zero past the extents;
    # Bp[(((s * windows + w) * groups + g) * W + l) * G + t] = B[G*g + t, W*s + l] at
    # window position w, for strips s of W lanes.
    packed = low.fresh("l")
    g, ps, pl, e = low.fresh("i"), low.fresh("i"), low.fresh("i"), low.fresh("i")
    red_vars = {n: low.fresh("i") for n in red}
    red_at = {n: Affine.index(v) for n, v in red_vars.items()}
    put, value = element(y_ref, {t.lane: Affine.index(ps).scale(strip) + Affine.index(pl),
                                 t.reduction: Affine.index(g).scale(group) + Affine.index(e),
                                 **red_at}, b_t.dtype)
    fill: L.Stmt = L.Loop(g, Affine.constant(0), Affine.constant(groups), (
        L.Loop(pl, Affine.constant(0), L.IMin((Affine.constant(strip), Affine.constant(
                n_lane) - Affine.index(ps).scale(strip))), (
            L.Loop(e, Affine.constant(0), in_group(g), (
                *put, L.Store(packed, (((Affine.index(ps).scale(windows) + window(red_at))
                                        .scale(groups) + Affine.index(g)).scale(strip)
                                       + Affine.index(pl)).scale(group)
                              + Affine.index(e), value))),)),))
    for n in reversed(red):
        fill = L.Loop(red_vars[n], Affine.constant(0), Affine.constant(loops[n]), (fill,))
    pack: list[L.Stmt] = [L.Loop(ps, Affine.constant(0), Affine.constant(strips), (fill,))]
    size = strips * total * strip * group
    label = f"{safe(y_ref.into)} packed for {t.instruction}"
    buffers: list[L.Buffer] = []
    # the block runs in threads (its schedule's parallel loop, not inside another one)
    threaded = low.options.threads and blk.schedule.parallel is not None \
        and not outer.parallel
    if t.kept:
        # The comparison reads the weights and their copy: in threads where the block
        # runs in them and the weights are over a chunk (one thread read 64 MiB a call
        # for a 4096^2 bf16 weight; below a chunk a parallel region costs more than it
        # saves).
        source = outer.views[y_ref.from_]
        big = math.prod(d.size for d in source.dims) * source.dtype.numpy.itemsize \
            > L.KEPT_CHUNK
        pack = [kept(low, packed, size, b_t.dtype, source, pack, label, threaded and big)]
    else:
        buffers.append(L.Buffer(packed, b_t.dtype, size, "heap", "global", "zero", label=label))

    def packed_at(gv: Affine, base: Affine, start: Affine) -> Affine:
        """Where lane `start` of group `gv` (counted over every window position) lies, in
        the strip that begins at lane `base`."""
        return (base.scale(total - 1) + gv.scale(strip) + start).scale(group)

    # The broadcast operand, packed where it is widened or its groups are not contiguous
    # (a convolution's NCHW input): converted once, its own dimensions in their order but
    # the groups in the place of the reduction's and the G values of a group innermost, so
    # that a group is one word again: NCHW -> N[C/G]HW[G]c, NHWC -> NHW[C/G][G]c. The
    # packing then reads G rows of the source at a time, each contiguous, and writes one
    # contiguous run (a vectorizable interleave: with the groups innermost, NHW[G]c, it
    # read a byte from a different cache line for every value, a fifth of a 1x1 layer's
    # time); a row of the instruction steps from group to group by the plane between them.
    x_packed = None
    x_view = outer.views[x_ref.from_]
    x_dim = next(k for k, a in enumerate(x_ref.access) if t.reduction in a.names)
    x_keep = [k for k in range(len(x_ref.access)) if k != x_dim]

    def x_word(coords: dict[int, Affine], gv: Affine) -> Affine:
        """Where group `gv` of the broadcast operand at coordinates `coords` (by dimension,
        but the reduction's) lies in its packed copy."""
        at = Affine.constant(0)
        for k in range(len(x_ref.access)):
            at = at.scale(groups) + gv if k == x_dim else \
                at.scale(x_view.dims[k].size) + coords[k]
        return at.scale(group)

    def x_at(at: dict[str, Affine], gv: Affine) -> Affine:
        return x_word({k: resolve(x_ref.access[k], {**idx, **at}, f"refinement {x_ref.into!r}")
                       for k in x_keep}, gv)

    if x_ref.shape.dtype != a_t.dtype or x_view.dims[x_dim].stride != 1:
        x_packed = low.fresh("l")
        how = "widened" if x_ref.shape.dtype != a_t.dtype else "packed"

        def widen(first: int, last: int, present: int) -> L.Stmt:
            """The packing of groups [first, last), `present` values of each. Neighbouring
            dimensions that are one run in the source as well loop as one (a plane of H x W
            is one loop GCC vectorizes; a 14-wide row was too short)."""
            sizes = [groups if k == x_dim else x_view.dims[k].size
                     for k in range(len(x_ref.access))]
            into = [math.prod(sizes[k + 1:]) * group for k in range(len(sizes))]
            runs: list[list[int]] = []            # dimensions that loop as one
            for k in range(len(sizes)):
                if runs and k != x_dim and runs[-1][-1] != x_dim and \
                        x_view.dims[runs[-1][-1]].stride == sizes[k] * x_view.dims[k].stride:
                    runs[-1].append(k)
                else:
                    runs.append([k])
            g, e = low.fresh("i"), low.fresh("i")
            loops_of = [(g, first, last) if run == [x_dim] else
                        (low.fresh("i"), 0, math.prod(sizes[k] for k in run)) for run in runs]
            source = x_view.offset + (Affine.index(g).scale(group) + Affine.index(e)).scale(
                x_view.dims[x_dim].stride)
            place = Affine.index(g).scale(into[x_dim]) + Affine.index(e)
            for run, (var, _, _) in zip(runs, loops_of):
                if run != [x_dim]:
                    source = source + Affine.index(var).scale(x_view.dims[run[-1]].stride)
                    place = place + Affine.index(var).scale(into[run[-1]])
            put, value = converted(L.Read(x_view.ptr, source), x_view.dtype, a_t.dtype)
            nest: L.Stmt = L.Loop(e, Affine.constant(0), Affine.constant(present), (
                *put, L.Store(x_packed, place, value)))
            for var, lo, hi in reversed(loops_of):
                nest = L.Loop(var, Affine.constant(lo), Affine.constant(hi), (nest,))
            return nest

        whole = n_red // group
        if whole:
            pack.append(widen(0, whole, group))
        if n_red % group:          # a last, partial group: the rest of it stays zero
            pack.append(widen(whole, whole + 1, n_red % group))
        buffers.append(L.Buffer(x_packed, a_t.dtype,
                                math.prod(x_view.dims[k].size for k in x_keep) * groups * group,
                                "heap", "global", "zero",
                                label=f"{safe(x_ref.into)} {how} for {t.instruction}"))

    # An output whose lanes are not contiguous (a convolution's NKHW: k runs the lanes)
    # is staged per tile: the tile's elements copied into a small buffer on the stack
    # (not where the init is folded: the sums start at 0), accumulated there as whole
    # vectors and copied back (a few copies per element against the reduction's C*R*S
    # steps).
    folded = blk.schedule.first is not None
    staged = out_ref.shape.dims[next(k for k, a in enumerate(out_ref.access)
                                     if t.lane in a.names)].stride != 1

    def tile(rows: list[dict[str, Affine]], starts: list[tuple[Affine, int | None]],
             base: Affine) -> list[L.Stmt]:
        """Accumulate a tile: `rows` (indices of the output loops) by chunks of lanes
        starting at `starts` (each with its lane count, None for all), all in the strip
        of the packed operand that begins at lane `base`, over every group (and window
        position); a chunk's packed operand is loaded once for all rows, a row's
        broadcast once for all chunks."""
        accs = [[low.fresh("acc") for _ in starts] for _ in rows]
        if staged:
            stage = low.fresh("l")
            outs = [[(stage, Affine.constant((i * len(starts) + j) * lanes))
                     for j in range(len(starts))] for i in range(len(rows))]
        else:
            outs = [[(o.ptr, o.offset) for o in (view(out_ref, {**row, t.lane: s})
                                                 for s, _ in starts)] for row in rows]
        # folded (pass fold: the init of 0 runs nowhere): the tile's sums start at 0
        pre = [L.Var(a, acc_t, L.Lit(0) if folded else L.Read(ptr, off, lanes, _count(n)))
               for row_accs, row_outs in zip(accs, outs)
               for a, (ptr, off), (_, n) in zip(row_accs, row_outs, starts)]

        def step(gv: Affine, present: int | None, at: dict[str, Affine]) -> list[L.Stmt]:
            """Group `gv` at window position `at`."""
            body: list[L.Stmt] = []
            chunk = []
            for start, _ in starts:
                b = low.fresh("v")
                body.append(L.Let(b, b_t, L.Read(packed, packed_at(
                    window(at).scale(groups) + gv, base, start), b_t.lanes)))
                chunk.append(b)
            for row, row_accs in zip(rows, accs):
                few, a = low.fresh("v"), low.fresh("v")
                if x_packed is None:
                    x = view(x_ref, {**row, **at, t.reduction: gv.scale(group)})
                    read = L.Read(x.ptr, x.offset, group, _count(present))
                else:     # zeros past the extent: the last group reads them
                    read = L.Read(x_packed, x_at({**row, **at}, gv), group)
                body += [L.Let(few, L.VType(a_t.dtype, group), read),
                         L.Let(a, a_t, L.Shuffle(few, few, tuple(range(group)) * lanes))]
                for acc, b in zip(row_accs, chunk):
                    r = low.fresh("v")
                    if d.accumulates:
                        body += [L.Instruction(d.name, (r,), (acc, a, b)),
                                 L.Assign(acc, L.Name(r))]
                    else:
                        body += [L.Instruction(d.name, (r,), (a, b)),
                                 L.Assign(acc, L.Combine(d.aggregation, acc, r))]
            return body

        at_window = {n: Affine.index(low.fresh("i")) for n in red}
        gvar = low.fresh("i")
        inner: list[L.Stmt] = []
        # A packed broadcast operand has zeros past the extent, as Bp does: its last
        # partial group is an ordinary one.
        whole = groups if x_packed is not None else n_red // group
        if whole:
            inner.append(L.Loop(gvar, Affine.constant(0), Affine.constant(whole),
                                tuple(step(Affine.index(gvar), None, at_window))))
        if whole < groups:
            inner += step(Affine.constant(whole), n_red % group, at_window)
        for n in reversed(red):      # the window's loops around the groups
            inner = [L.Loop(at_window[n].names[0], Affine.constant(0),
                            Affine.constant(loops[n]), tuple(inner))]
        post = [L.Store(ptr, off, a, "assign", _count(n))
                for row_accs, row_outs in zip(accs, outs)
                for a, (ptr, off), (_, n) in zip(row_accs, row_outs, starts)]
        if not staged:
            return pre + inner + post
        return [L.Alloc((L.Buffer(stage, acc_t.dtype, len(rows) * len(starts) * lanes,
                                  "stack", label="a tile of the output"),),
                        (*([] if folded else staged_copy(rows, starts, stage, True)),
                         *pre, *inner, *post,
                         *staged_copy(rows, starts, stage, False)))]

    def staged_copy(rows: list[dict[str, Affine]], starts: list[tuple[Affine, int | None]],
                    stage: str, into: bool) -> list[L.Stmt]:
        """Copy a tile of the output into its staging buffer (`into`) or back."""
        copies: list[L.Stmt] = []
        for j, (start, n) in enumerate(starts):
            lane = low.fresh("i")
            body: list[L.Stmt] = []
            for i, row in enumerate(rows):
                o = view(out_ref, {**row, t.lane: start + Affine.index(lane)})
                here = Affine.constant((i * len(starts) + j) * lanes) + Affine.index(lane)
                src, dst = ((o.ptr, o.offset), (stage, here)) if into else \
                    ((stage, here), (o.ptr, o.offset))
                value = low.fresh("s")
                body += [L.Let(value, L.VType(acc_t.dtype), L.Read(*src)),
                         L.Store(dst[0], dst[1], value)]
            copies.append(L.Loop(lane, Affine.constant(0), Affine.constant(
                lanes if n is None else n), tuple(body)))
        return copies

    def lanes_of(rows: list[dict[str, Affine]], start: Affine, count: int) -> list[L.Stmt]:
        """The tiles of lanes [start, start + count): t.chains chunks at a time (one
        strip each), then single chunks, then a masked tail (in the last strip; `start`
        begins a strip)."""
        full, tail = count // lanes, count % lanes
        quads = full - full % t.chains
        body: list[L.Stmt] = []
        c = low.fresh("i")
        if quads:
            base = start + Affine.index(c)
            body.append(L.Loop(c, Affine.constant(0), Affine.constant(quads * lanes), tuple(
                tile(rows, [(base + j * lanes, None) for j in range(t.chains)], base)),
                step=strip))
        c = low.fresh("i")
        last = start + quads * lanes
        if full % t.chains:
            body.append(L.Loop(c, Affine.constant(quads * lanes),
                               Affine.constant(full * lanes),
                               tuple(tile(rows, [(start + Affine.index(c), None)], last)),
                               step=lanes))
        if tail:
            body += tile(rows, [(start + full * lanes, tail)], last)
        return body

    # Output loops: all but the last are looped outside; the last one's rows are taken
    # t.rows at a time (then one at a time), inside blocks of COLUMNS lanes, so that a block
    # of the packed operand stays in cache while every row streams past it. If the rows
    # run in threads, they are dealt out in panels of about PANEL rows (a multiple of
    # PANEL_MULTIPLE of them, equal to a tile), each thread taking its panels through every
    # column block: one parallel region per call, not one per block (each join waits for
    # the slowest thread, which on a shared host is often preempted).
    outer_vars = {name: low.fresh("i") for name in par[:-1]}
    at = {name: Affine.index(v) for name, v in outer_vars.items()}
    columns = min(COLUMNS, n_lane)
    blocks = n_lane // columns * columns

    def over_columns(body: Callable[[Affine, int], list[L.Stmt]],
                     kind: str = "serial") -> list[L.Stmt]:
        """`body(start, count)` for each block of lanes (in threads with kind
        "parallel"), then the lanes left over."""
        nb = low.fresh("i")
        out: list[L.Stmt] = [L.Loop(nb, Affine.constant(0), Affine.constant(blocks),
                                    tuple(body(Affine.index(nb), columns)), kind,
                                    step=columns)]
        return out + (body(Affine.constant(blocks), n_lane - blocks) if n_lane - blocks
                      else [])

    def rows_of(lo: L.IExpr, hi: L.IExpr, step: int, kind: str, scale: int = 1
                ) -> Callable[[Affine, int], list[L.Stmt]]:
        """Tiles of `step` rows (of the last output loop) in [lo, hi), over given lanes;
        with `scale`, [lo, hi) counts tiles of `scale` rows (step 1) instead of rows."""
        def body(start: Affine, count: int) -> list[L.Stmt]:
            v = low.fresh("i")
            row = Affine.index(v).scale(scale)
            return [L.Loop(v, lo, hi, tuple(lanes_of(
                [{**at, par[-1]: row + k} for k in range(step)], start, count)),
                kind, step=1 if scale > 1 else step)]
        return body

    if not par:
        nest = over_columns(lambda start, count: lanes_of([at], start, count))
    else:
        last = par[-1]
        threads = blk.schedule.parallel == last
        # pass tensorize gives a matmul of few rows threads over its blocks of lanes
        columns_kind = "parallel" if threaded and blk.schedule.parallel == t.lane \
            else "serial"
        many = loops[last] - loops[last] % t.rows
        nest = []
        if many and threads:
            tiles = many // t.rows
            panels = min(tiles, -(-tiles // max(1, PANEL // t.rows) // PANEL_MULTIPLE)
                         * PANEL_MULTIPLE)
            pv = low.fresh("i")
            p = Affine.index(pv)
            # panel p: tiles [p * tiles / panels, (p + 1) * tiles / panels), rounded down
            nest.append(L.Loop(pv, Affine.constant(0), Affine.constant(panels),
                               tuple(over_columns(rows_of(
                                   L.IDiv(p.scale(tiles), panels),
                                   L.IDiv((p + 1).scale(tiles), panels),
                                   t.rows, "serial", scale=t.rows))), "parallel"))
        elif many:
            nest += over_columns(rows_of(Affine.constant(0), Affine.constant(many), t.rows,
                                         "serial"), columns_kind)
        left = loops[last] % t.rows
        if left:
            # the rows left over: one narrower tile (a convolution's 14-wide rows are
            # 4 tiles of 3 and one of 2), but in threads, one row each, if they are all
            # there is
            alone = threads and not many
            nest += over_columns(rows_of(Affine.constant(many), Affine.constant(loops[last]),
                                         1 if alone else left,
                                         "parallel" if alone else "serial"), columns_kind)
    for name in reversed(par[:-1]):
        kind = "parallel" if blk.schedule.parallel == name else "serial"
        nest = [L.Loop(outer_vars[name], Affine.constant(0), Affine.constant(loops[name]),
                       tuple(nest), kind)]
    return [L.Comment(f"block {safe(blk.name)}: {t.instruction}, lanes along {t.lane}, "
                      f"groups along {t.reduction}"),
            L.Alloc(tuple(buffers), (*pack, *nest))]


def kept(low: Lowering, packed: str, size: int, dtype: DType, source: View,
         fill: list[L.Stmt], label: str, threads: bool = False) -> L.Stmt:
    """The packed operand as a top-level local kept between calls (pass tensorize decided
    so: `Tensorized.kept`, for a read-only parameter dense in memory): zeroed and filled
    by `fill` only when the parameter's values differ from the ones it was filled from."""
    count = math.prod(d.size for d in source.dims)
    if source.param < 0 or source.writable or count != 1 + sum(
            (d.size - 1) * d.stride for d in source.dims):
        raise IRError(f"the packed operand {label!r} is kept between calls, but its source "
                      "is not a read-only parameter dense in memory")
    state = L.kept_state(source.dtype, count, dtype)
    low.kept.append(L.Buffer(packed, dtype, size + state, "pool", "global", "",
                             label=f"{label}, kept between calls"))
    z, zero = low.fresh("i"), low.fresh("s")
    clear = L.Loop(z, Affine.constant(0), Affine.constant(size), (
        L.Let(zero, L.VType(dtype), L.Lit(0)), L.Store(packed, Affine.index(z), zero)))
    return L.Kept(packed, size, source.ptr, source.offset, count, (clear, *fill), threads)


def _count(n: int | None) -> L.IExpr | None:
    return None if n is None else Affine.constant(n)

