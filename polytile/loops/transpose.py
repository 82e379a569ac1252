"""Vector loops for copy blocks that transpose (the pack pass's panels): L x L tiles
loaded along the source's unit-stride index, transposed in registers, stored along
the destination's.

    block pack_B_panels0 [o:2, a1:53, i:16] #pack schedule(micro, transpose(16)) (
      -i - 16*o + 28 >= 0
      in B <- B[i + 16*o, a1]               (a1 unit-stride in B)
      out P <- P[o, a1, i]                  (i unit-stride in P)
    ) { $x = load(B)  P = store($x) }

For each tile: L rows of the source (i0 + t, masked to the valid i) are vector loads
along a1 (masked at the tail of a1), log2(L) rounds of two-source shuffles swap the
off-diagonal blocks (block sizes 1, 2, 4, ... L/2), and L vector stores write rows
a1 = a0 + t of the destination. A scalar copy would touch one element per
instruction, with every store (or load) in a different cache line.

A copy may carry elementwise float32 work on the way (pass outlayout folds a bias after
a convolution into its copy): loads of other views that do not move along the
destination's unit-stride index i, constants and intrinsics, ending in the store. They
run on each transposed row before its store, the other views read once per row (a
scalar, broadcast), where that row is stored at all.

Used for float32 blocks whose constraints only bound the destination's index; anything
else returns None and is lowered as scalar loops.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from polytile import dtypes
from polytile.analysis.vectorizable import MASKED_LANES
from polytile.ir.nodes import Affine, Block, Constant, Intrinsic, Load, Refinement, Store
from polytile.loops import nodes as L
from polytile.loops.views import Scope, child_view, fixed_indices, resolve, safe

if TYPE_CHECKING:
    from polytile.loops.lower import Lowering

INT64 = L.VType(dtypes.INT64)


def _unit_index(ref: Refinement, loops: set[str]) -> str | None:
    """The loop index that moves `ref` by one element (the only loop index of a
    stride-1 dimension, with coefficient 1)."""
    for a, d in zip(ref.access, ref.shape.dims):
        own = [n for n in a.names if n in loops]
        if d.stride == 1 and len(own) == 1 and a.coeff(own[0]) == 1:
            return own[0]
    return None


def lower_block(low: Lowering, blk: Block, outer: Scope) -> list[L.Stmt] | None:
    lanes = low.vector_lanes or blk.schedule.transpose          # the function's vector width
    if lanes not in MASKED_LANES:
        return None
    if len(blk.stmts) < 2 or not isinstance(blk.stmts[0], Load) \
            or not isinstance(blk.stmts[-1], Store) or blk.stmts[0].dynamic:
        return None
    load, store, work = blk.stmts[0], blk.stmts[-1], blk.stmts[1:-1]
    src, dst = blk.ref(load.ref), blk.ref(store.ref)
    if (store.value != load.into and not work) or dst.agg != "assign" or any(
            r.shape.dtype != dtypes.FLOAT32 for r in (src, dst)):
        return None
    ranges = {i.name: i.range for i in blk.idxs if i.affine is None}
    i, a = _unit_index(dst, set(ranges)), _unit_index(src, set(ranges))
    if i is None or a is None or i == a or any(x.coeff(a) for x in dst.access[-1:]) \
            or sum(1 for x in src.access if x.coeff(a)) != 1 or not _row_work(blk, work, i):
        return None
    idx = fixed_indices(blk, outer.idx)
    # Constraints may only bound i or a from above: x <= bound (over other indices).
    bounds: dict[str, list[Affine]] = {i: [], a: []}
    for c in blk.constraints:
        x = next((x for x in (i, a) if c.coeff(x) == -1 and not c.coeff(i if x == a else a)),
                 None)
        if x is None:
            return None
        bounds[x].append(Affine.of({n: k for n, k in c.terms if n != x}, c.const))
    low.vector_lanes = lanes
    vtype = L.VType(dtypes.FLOAT32, lanes)
    outer_loops = [n for n in ranges if n not in (i, a) and ranges[n] > 1]
    for n in outer_loops:
        idx[n] = Affine.index(low.fresh("i"))

    def count(x: str) -> L.IExpr:
        limits = [resolve(b, idx, "a constraint") + 1 for b in bounds[x]]
        return L.IMin((Affine.constant(ranges[x]), *limits)) if limits \
            else Affine.constant(ranges[x])

    ni, nai, nr, na, i0, a0 = (low.fresh(x) for x in ("ni", "na", "nr", "na", "i", "i"))
    idx[i], idx[a] = Affine.index(i0), Affine.index(a0)
    src_view = child_view(src, outer.views[src.from_], idx)
    dst_view = child_view(dst, outer.views[dst.from_], idx)
    si = sum(x.coeff(i) * d.stride for x, d in zip(src.access, outer.views[src.from_].dims))
    da = sum(x.coeff(a) * d.stride for x, d in zip(dst.access, outer.views[dst.from_].dims))
    rows = [low.fresh("r") for _ in range(lanes)]

    def left(n: str, t: int) -> Affine:       # n - t - 1 >= 0: row t is in range
        return Affine.index(n) - (t + 1)

    # A whole tile moves with plain loads and stores; only the edges are masked (a
    # masked store is microcoded on AMD's Zen: the panels of a 50-row operand, packed per
    # row of a batched product, took longer than the product).
    whole: list[L.Stmt] = [L.Var(r, vtype, L.Read(src_view.ptr, src_view.offset + t * si,
                                                  lanes)) for t, r in enumerate(rows)]
    whole += _transpose(low, rows, vtype)

    def row(t: int, r: str, count: Affine | None) -> list[L.Stmt]:
        """Row t's elementwise work on its transposed vector `r`, then its store."""
        at = dict(idx)
        at[a] = Affine.index(a0) + t
        out: list[L.Stmt] = []
        value = _row_value(low, blk, outer, work, load.into, r, store.value, at, vtype, out)
        return out + [L.Store(dst_view.ptr, dst_view.offset + t * da, value, count=count)]

    for t, r in enumerate(rows):
        whole += row(t, r, None)
    edge: list[L.Stmt] = []
    for t, r in enumerate(rows):
        edge += [L.Var(r, vtype, L.Lit(0.0)),
                 L.If((left(nr, t),), (L.Assign(r, L.Read(
                     src_view.ptr, src_view.offset + t * si, lanes, Affine.index(na))),))]
    edge += _transpose(low, rows, vtype)
    for t, r in enumerate(rows):
        edge.append(L.If((left(na, t),), tuple(row(t, r, Affine.index(nr)))))
    tile: list[L.Stmt] = [
        L.Let(nr, INT64, L.IntValue(L.IMin((
            Affine.constant(lanes), Affine.index(ni) - Affine.index(i0))))),
        L.If((Affine.index(nr) - lanes, Affine.index(na) - lanes), tuple(whole), tuple(edge))]
    body: list[L.Stmt] = [
        L.Let(ni, INT64, L.IntValue(count(i))), L.Let(nai, INT64, L.IntValue(count(a))),
        L.Loop(a0, Affine.constant(0), Affine.index(nai), (
            L.Let(na, INT64, L.IntValue(L.IMin((Affine.constant(lanes),
                                                Affine.index(nai) - Affine.index(a0))))),
            L.Loop(i0, Affine.constant(0), Affine.index(ni), tuple(tile), step=lanes),
        ), step=lanes)]
    for n in reversed(outer_loops):
        (var,) = idx[n].names
        body = [L.Loop(var, Affine.constant(0), Affine.constant(ranges[n]), tuple(body))]
    return [L.Comment(f"block {safe(blk.name)}: {lanes}x{lanes} transposes"), *body]


def _row_work(blk: Block, work: tuple[object, ...], i: str) -> bool:
    """Whether `work` is elementwise float32 work that stays the same along i: loads of
    other views (not moving with i, no data-dependent subscript), constants, intrinsics."""
    for st in work:
        if isinstance(st, Load):
            ref = blk.ref(st.ref)
            if st.dynamic or st.offset is not None or ref.shape.dtype != dtypes.FLOAT32 \
                    or any(x.coeff(i) for x in ref.access):
                return False
        elif isinstance(st, Intrinsic):
            if st.dtype != dtypes.FLOAT32:
                return False
        elif not isinstance(st, Constant):
            return False
    return True


def _row_value(low: Lowering, blk: Block, outer: Scope, work: tuple[object, ...], x: str,
               row: str, result: str, at: dict[str, Affine], vtype: L.VType,
               out: list[L.Stmt]) -> str:
    """The loop IR name of `result` for one destination row, where IR scalar `x` is the
    row's vector `row` and the other loads are read at `at` (scalars, broadcast where a
    vector op needs them)."""
    names: dict[str, tuple[str, bool]] = {x: (row, True)}
    scalar_type = L.VType(dtypes.FLOAT32)
    for st in work:
        if isinstance(st, Load):
            ref = blk.ref(st.ref)
            view = child_view(ref, outer.views[ref.from_], at)
            name = low.fresh("s")
            out.append(L.Let(name, scalar_type, L.Read(view.ptr, view.offset)))
            names[st.into] = (name, False)
        elif isinstance(st, Constant):
            name = low.fresh("s")
            out.append(L.Let(name, scalar_type, L.Lit(float(st.value))))
            names[st.into] = (name, False)
        else:
            assert isinstance(st, Intrinsic)
            args = [names[n] for n in st.inputs]
            if not any(v for _, v in args):
                name = low.fresh("s")
                out.append(L.Let(name, scalar_type, L.Op(st.op, tuple(n for n, _ in args),
                                                         dtypes.FLOAT32)))
                names[st.into] = (name, False)
                continue
            vectors = []
            for n, is_vector in args:
                if not is_vector:
                    b = low.fresh("v")
                    out.append(L.Let(b, vtype, L.Broadcast(n)))
                    n = b
                vectors.append(n)
            name = low.fresh("v")
            out.append(L.Let(name, vtype, L.Op(st.op, tuple(vectors), dtypes.FLOAT32)))
            names[st.into] = (name, True)
    value, is_vector = names[result]
    if not is_vector:
        b = low.fresh("v")
        out.append(L.Let(b, vtype, L.Broadcast(value)))
        return b
    return value


def _transpose(low: Lowering, rows: list[str], vtype: L.VType) -> list[L.Stmt]:
    """Transpose the L x L matrix whose rows are the vectors `rows`, in place: for each
    block size b, swap the off-diagonal b x b blocks of every 2b x 2b block."""
    lanes = vtype.lanes
    out: list[L.Stmt] = []
    b = 1
    while b < lanes:
        lo = tuple(k if not k & b else lanes + k - b for k in range(lanes))
        hi = tuple(k + b if not k & b else lanes + k for k in range(lanes))
        for r in range(lanes):
            if r & b:
                continue
            x, y, t = rows[r], rows[r + b], low.fresh("t")
            out += [L.Let(t, vtype, L.Shuffle(x, y, lo)), L.Assign(y, L.Shuffle(x, y, hi)),
                    L.Assign(x, L.Name(t))]
        b *= 2
    return out
