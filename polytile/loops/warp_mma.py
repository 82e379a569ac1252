"""Lowering of a contraction on a warp-level matrix instruction (`BlockSchedule.mma`,
decided by pass `tensor_cores`): Tensor Cores' `mma.sync`, tiles_m x tiles_n output tiles per warp.

    grid gn over N / BN, gm over M / BM (, gb over the first other output index):
      __shared__ As[BM x K_t], Bs[BN x K_t], Cs[BM x BN]
      thread t of 32 * warps_m * warps_n:   warp w = t / 32, lane = t % 32,
                                            its place (wr, wc) = (w / warps_n, w % warps_n)
        (uniform loops over the other output indices)
        acc[i][j] = 0        (the warp's tiles_m x tiles_n accumulator fragments, M_t x N_t)
        for kt in 0..K step K_t:
            As[r, c] = A[BM*gm + r, kt + c], 0 past the ends of M and K   (the group copies,
            Bs[r, c] = B[BN*gn + r, kt + c], 0 past the ends of N and K    t, t + T, ...)
            barrier
            a[i] = fragment of As's tile row wr*tiles_m + i, b[j] of Bs's wc*tiles_n + j
            acc[i][j] = mma(acc[i][j], a[i], b[j])     (the whole warp: Instruction)
            barrier
        Cs[the warp's tiles] = acc;  barrier
        C[BM*gm + ..., BN*gn + ...] += Cs[...] where inside M and N    (the group copies)

The tiles of As and Bs a warp reads are consecutive (rows of K_t elements, no padding),
so a fragment is `Fragment(buffer, offset)`; each thread of the warp holds the elements
the description's layout gives it. The zeros staged past the ends of M, N and K add
nothing to the sums, and the output copy skips the points past M and N: every size is
computed exactly as the instruction computes it. Every thread runs the same loops and
reaches every barrier; only the copies diverge, at the edges.

The operands' global layout does not matter (transposed, batched, strided): the staging
copy reads each element through the program's view.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from polytile.dtypes import DType
from polytile.errors import IRError
from polytile.ir.nodes import Affine, Block, Load, Refinement, Store
from polytile.isa import WARP, description
from polytile.isa.inspect import uses
from polytile.loops import nodes as L
from polytile.loops.gpu_tile import INT64
from polytile.loops.views import Scope, View, child_view, fixed_indices, safe
from polytile.passes.tensor_cores import block_tile, extents

if TYPE_CHECKING:
    from polytile.loops.lower import Lowering


def lower_block(low: Lowering, blk: Block, outer: Scope) -> list[L.Stmt]:
    w = blk.schedule.mma
    assert w is not None
    d = description(w.instruction)
    instr = d.definition
    tm, tn, tk = extents(d)
    acc_t, a_t, b_t = instr.inputs
    (store,) = [st for st in blk.stmts if isinstance(st, Store)]
    out_ref = blk.ref(store.ref)
    a_ref, b_ref = _operands(blk, w.rows, w.cols)
    loops = {i.name: i.range for i in blk.idxs if i.affine is None}
    for name in (w.rows, w.cols, w.reduction):
        if name not in loops:
            raise IRError(f"block {blk.name} runs {w.instruction} over {name}, which is not "
                          "one of its loops")
    size_m, size_n, size_k = loops[w.rows], loops[w.cols], loops[w.reduction]
    others = [n for n in loops if n not in (w.rows, w.cols, w.reduction)]
    if any(n not in uses(out_ref) for n in others):
        raise IRError(f"block {blk.name} runs {w.instruction} with another reduction loop")
    block_m, block_n = block_tile(d, w)
    threads = WARP * w.warps_m * w.warps_n

    gm, gn, t = low.fresh("i"), low.fresh("i"), low.fresh("i")
    var = {n: low.fresh("i") for n in others}
    warp, lane, wr, wc = (low.fresh("d") for _ in range(4))
    at = {**fixed_indices(blk, outer.idx), **{n: Affine.index(v) for n, v in var.items()}}

    def view(ref: Refinement, m: Affine, n: Affine, k: Affine) -> View:
        place = {**at, w.rows: m, w.cols: n, w.reduction: k}
        return child_view(ref, outer.views[ref.from_], place)

    a_s, b_s, c_s = low.fresh("l"), low.fresh("l"), low.fresh("l")
    kt = low.fresh("i")
    ix, zero = Affine.index, Affine.constant(0)
    copy_a = _stage(low, a_s, a_t.dtype, block_m, tk, t, threads, size_m, size_k,
                    ix(gm).scale(block_m), ix(kt), lambda r, c: view(a_ref, r, zero, c))
    copy_b = _stage(low, b_s, b_t.dtype, block_n, tk, t, threads, size_n, size_k,
                    ix(gn).scale(block_n), ix(kt), lambda r, c: view(b_ref, zero, r, c))
    # The warp's tiles: (wr*tiles_m + i, wc*tiles_n + j) in the block's grid of tiles.
    tile_row = [ix(wr).scale(w.tiles_m) + i for i in range(w.tiles_m)]
    tile_col = [ix(wc).scale(w.tiles_n) + j for j in range(w.tiles_n)]
    accs = [[low.fresh("v") for _ in tile_col] for _ in tile_row]
    fa = [low.fresh("v") for _ in tile_row]
    fb = [low.fresh("v") for _ in tile_col]
    step: list[L.Stmt] = [*copy_a, *copy_b, L.Barrier("shared")]
    step += [L.Let(f, a_t, L.Fragment(instr.name, instr.names[1], lane, a_s,
                                      row.scale(tm * tk))) for f, row in zip(fa, tile_row)]
    step += [L.Let(f, b_t, L.Fragment(instr.name, instr.names[2], lane, b_s,
                                      col.scale(tn * tk))) for f, col in zip(fb, tile_col)]
    step += [L.Instruction(instr.name, (acc,), (acc, fa[i], fb[j]))
             for i, row in enumerate(accs) for j, acc in enumerate(row)]
    step.append(L.Barrier("shared"))
    across = block_n // tn              # tiles along N in the block (Cs holds them row-major)
    result = instr.names[len(instr.inputs)]
    work: list[L.Stmt] = [L.Var(acc, acc_t, L.Fragment(instr.name, instr.names[0], lane))
                          for row in accs for acc in row]
    work.append(L.Loop(kt, zero, Affine.constant(size_k), tuple(step), step=tk))
    work += [L.FragmentStore(c_s, (tile_row[i].scale(across) + tile_col[j]).scale(tm * tn),
                             acc, instr.name, result, lane)
             for i, row in enumerate(accs) for j, acc in enumerate(row)]
    work.append(L.Barrier("shared"))
    work += _unstage(low, c_s, acc_t.dtype, t, threads, (tm, tn), across, block_m * block_n,
                     (size_m, size_n), (ix(gm).scale(block_m), ix(gn).scale(block_n)),
                     lambda m, n: view(out_ref, m, n, zero))
    work.append(L.Barrier("shared"))    # Cs is written again by the next uniform iteration
    for n in reversed(others[1:]):
        work = [L.Loop(var[n], zero, Affine.constant(loops[n]), tuple(work))]
    work = [L.Let(warp, INT64, L.IntValue(L.IDiv(ix(t), WARP))),
            L.Let(lane, INT64, L.IntValue(ix(t) - ix(warp).scale(WARP))),
            L.Let(wr, INT64, L.IntValue(L.IDiv(ix(warp), w.warps_n))),
            L.Let(wc, INT64, L.IntValue(ix(warp) - ix(wr).scale(w.warps_n))),
            *work]
    buffers = (
        L.Buffer(a_s, a_t.dtype, block_m * tk, "stack", "shared",
                 label=f"{safe(a_ref.into)}: staged {block_m}x{tk}"),
        L.Buffer(b_s, b_t.dtype, block_n * tk, "stack", "shared",
                 label=f"{safe(b_ref.into)}: staged {block_n}x{tk}"),
        L.Buffer(c_s, acc_t.dtype, block_m * block_n, "stack", "shared",
                 label=f"{safe(out_ref.into)}: the warps' {tm}x{tn} tiles"))
    body: list[L.Stmt] = [L.Alloc(buffers, (L.Loop(t, zero, Affine.constant(threads),
                                                   tuple(work), "thread"),))]
    for n in others[:1]:
        body = [L.Loop(var[n], zero, Affine.constant(loops[n]), tuple(body), "grid")]
    body = [L.Loop(gn, zero, Affine.constant(-(-size_n // block_n)),
                   (L.Loop(gm, zero, Affine.constant(-(-size_m // block_m)), tuple(body),
                           "grid"),), "grid")]
    title = L.Comment(f"block {safe(blk.name)}: {w.instruction} on Tensor Cores, "
                      f"{w.warps_m}x{w.warps_n} warps of {w.tiles_m}x{w.tiles_n} {tm}x{tn} "
                      f"tiles per block, {safe(w.reduction)} in steps of {tk}")
    return [title, *body]


def _operands(blk: Block, rows: str, cols: str) -> tuple[Refinement, Refinement]:
    """The views bound to the instruction's a (read along its M loop) and b (along N)."""
    read = {st.ref for st in blk.stmts if isinstance(st, Load)}
    inputs = [r for r in blk.refs if r.dir == "in" and r.into in read]
    a = [r for r in inputs if rows in uses(r)]
    b = [r for r in inputs if cols in uses(r)]
    if len(a) != 1 or len(b) != 1 or a[0] is b[0]:
        raise IRError(f"block {blk.name}: the mma's operands are one view along {rows} and "
                      f"one along {cols}")
    return a[0], b[0]


def _stage(low: Lowering, shared: str, dtype: DType, rows: int, cols: int, t: str,
           threads: int, size_r: int, size_c: int, origin_r: Affine, origin_c: Affine,
           place: Callable[[Affine, Affine], View]) -> list[L.Stmt]:
    """The group's copy of a rows x cols box (row r, column c at r*cols + c) whose point
    (r, c) is the program's element place(origin_r + r, origin_c + c); 0 past size_r and
    size_c."""
    e, r, c = low.fresh("i"), low.fresh("d"), low.fresh("d")
    at_r, at_c = origin_r + Affine.index(r), origin_c + Affine.index(c)
    source = place(at_r, at_c)
    value, zero = low.fresh("s"), low.fresh("s")
    body: list[L.Stmt] = [
        L.Let(r, INT64, L.IntValue(L.IDiv(Affine.index(e), cols))),
        L.Let(c, INT64, L.IntValue(Affine.index(e) - Affine.index(r).scale(cols)))]
    loaded: list[L.Stmt] = [L.Let(value, L.VType(source.dtype), L.Read(source.ptr, source.offset))]
    stored = low.convert(value, source.dtype, dtype, "s", loaded)
    body.append(L.If((Affine.constant(size_r - 1) - at_r, Affine.constant(size_c - 1) - at_c),
                     (*loaded, L.Store(shared, Affine.index(e), stored)),
                     (L.Let(zero, L.VType(dtype), L.Lit(0)), L.Store(shared, Affine.index(e), zero))))
    return [L.Loop(e, Affine.index(t), Affine.constant(rows * cols), tuple(body), step=threads)]


def _unstage(low: Lowering, shared: str, dtype: DType, t: str, threads: int,
             tile: tuple[int, int], across: int, count: int, sizes: tuple[int, int],
             origins: tuple[Affine, Affine], place: Callable[[Affine, Affine], View]
             ) -> list[L.Stmt]:
    """The group's copy of the block's output tiles (tile (R, C) of `across` per row at
    (R*across + C) * tm*tn, each row-major) into the output, each element combined with
    the output's aggregation, where inside it."""
    tm, tn = tile
    e = low.fresh("i")
    q, p, r, c, tr, tc = (low.fresh("d") for _ in range(6))
    ix = Affine.index
    m = origins[0] + ix(tr).scale(tm) + ix(r)
    n = origins[1] + ix(tc).scale(tn) + ix(c)
    target = place(m, n)
    value = low.fresh("s")
    stored: list[L.Stmt] = [L.Let(value, L.VType(dtype), L.Read(shared, ix(e)))]
    out = low.convert(value, dtype, target.dtype, "s", stored)
    body: list[L.Stmt] = [
        L.Let(q, INT64, L.IntValue(L.IDiv(ix(e), tm * tn))),
        L.Let(p, INT64, L.IntValue(ix(e) - ix(q).scale(tm * tn))),
        L.Let(r, INT64, L.IntValue(L.IDiv(ix(p), tn))),
        L.Let(c, INT64, L.IntValue(ix(p) - ix(r).scale(tn))),
        L.Let(tr, INT64, L.IntValue(L.IDiv(ix(q), across))),
        L.Let(tc, INT64, L.IntValue(ix(q) - ix(tr).scale(across))),
        L.If((Affine.constant(sizes[0] - 1) - m, Affine.constant(sizes[1] - 1) - n),
             (*stored, L.Store(target.ptr, target.offset, out, target.agg)))]
    return [L.Loop(e, ix(t), Affine.constant(count), tuple(body), step=threads)]
