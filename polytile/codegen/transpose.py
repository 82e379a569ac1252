"""Vector code for copy blocks that transpose (the pack pass's panels): L x L tiles
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

Used for float32 blocks whose constraints only bound the destination's index; anything
else returns None and runs the scalar code.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from polytile import dtypes
from polytile.analysis.vectorizable import MASKED_LANES
from polytile.codegen.cscope import Scope, c_affine, child_view, fixed_indices, resolve, safe
from polytile.ir.nodes import Affine, Block, Load, Refinement, Store

if TYPE_CHECKING:
    from polytile.codegen.c import _FunctionWriter


def _unit_index(ref: Refinement, loops: set[str]) -> str | None:
    """The loop index that moves `ref` by one element (the only loop index of a
    stride-1 dimension, with coefficient 1)."""
    for a, d in zip(ref.access, ref.shape.dims):
        own = [n for n in a.names if n in loops]
        if d.stride == 1 and len(own) == 1 and a.coeff(own[0]) == 1:
            return own[0]
    return None


def emit(w: "_FunctionWriter", blk: Block, outer: Scope) -> list[str] | None:
    L = w.vector_lanes or blk.schedule.transpose          # the function's vector type
    if L not in MASKED_LANES:
        return None
    if len(blk.stmts) != 2 or not isinstance(blk.stmts[0], Load) \
            or not isinstance(blk.stmts[1], Store) or blk.stmts[0].dynamic:
        return None
    load, store = blk.stmts
    src, dst = blk.ref(load.ref), blk.ref(store.ref)
    if store.value != load.into or dst.agg != "assign" or any(
            r.shape.dtype != dtypes.FLOAT32 for r in (src, dst)):
        return None
    ranges = {i.name: i.range for i in blk.idxs if i.affine is None}
    i, a = _unit_index(dst, set(ranges)), _unit_index(src, set(ranges))
    if i is None or a is None or i == a or any(x.coeff(a) for x in dst.access[-1:]) \
            or sum(1 for x in src.access if x.coeff(a)) != 1:
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
    w.vector_lanes = L
    outer_loops = [n for n in ranges if n not in (i, a) and ranges[n] > 1]
    for n in outer_loops:
        idx[n] = Affine.index(w.fresh("i"))
    def count(x: str) -> str:
        text = str(ranges[x])
        for b in bounds[x]:
            text = f"pt_imin({text}, {c_affine(resolve(b, idx, 'a constraint'))} + 1)"
        return text

    ni, nai, nr, na, i0, a0 = (w.fresh(x) for x in ("ni", "na", "nr", "na", "i", "i"))
    idx[i], idx[a] = Affine.index(i0), Affine.index(a0)
    src_view = child_view(src, outer.views[src.from_], idx)
    dst_view = child_view(dst, outer.views[dst.from_], idx)
    si = sum(x.coeff(i) * d.stride for x, d in zip(src.access, outer.views[src.from_].dims))
    da = sum(x.coeff(a) * d.stride for x, d in zip(dst.access, outer.views[dst.from_].dims))
    rows = [w.fresh("r") for _ in range(L)]
    tile = [f"const int64_t {nr} = pt_imin({L}, {ni} - {i0});"]
    for t, r in enumerate(rows):
        at = w.element(src_view, src_view.offset + t * si)
        tile.append(f"pt_vf {r} = {t} < {nr} ? pt_vload_n(&{at}, {na}) : pt_vsplat(0.0f);")
    tile += _transpose(rows, L)
    for t, r in enumerate(rows):
        at = w.element(dst_view, dst_view.offset + t * da)
        tile.append(f"if ({t} < {na}) pt_vstore_n(&{at}, {r}, {nr});")
    body = [f"const int64_t {ni} = {count(i)};", f"const int64_t {nai} = {count(a)};",
            f"for (int64_t {a0} = 0; {a0} < {nai}; {a0} += {L}) {{",
            f"    const int64_t {na} = pt_imin({L}, {nai} - {a0});",
            f"    for (int64_t {i0} = 0; {i0} < {ni}; {i0} += {L}) {{",
            *["        " + x for x in tile], "    }", "}"]
    for n in reversed(outer_loops):
        var = c_affine(idx[n])
        body = [f"for (int64_t {var} = 0; {var} < {ranges[n]}; {var}++) {{",
                *["    " + x for x in body], "}"]
    return [f"/* block {safe(blk.name)}: {L}x{L} transposes */", "{",
            *["    " + x for x in body], "}"]


def _transpose(rows: list[str], lanes: int) -> list[str]:
    """Transpose the L x L matrix whose rows are the vectors `rows`, in place: for each
    block size b, swap the off-diagonal b x b blocks of every 2b x 2b block."""
    out = []
    b = 1
    while b < lanes:
        lo = ", ".join(str(k) if not k & b else str(lanes + k - b) for k in range(lanes))
        hi = ", ".join(str(k + b) if not k & b else str(lanes + k) for k in range(lanes))
        for r in range(lanes):
            if r & b:
                continue
            x, y = rows[r], rows[r + b]
            out.append(f"{{ const pt_vf t0 = __builtin_shufflevector({x}, {y}, {lo}); "
                       f"{y} = __builtin_shufflevector({x}, {y}, {hi}); {x} = t0; }}")
        b *= 2
    return out
