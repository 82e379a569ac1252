"""Whether a leaf block can run as vector code along one index, and how its boundary tiles
run: the conditions the vector micro-kernel generator (polytile.codegen.vector) relies
on. The pass that schedules a block (passes/schedule) records a vector index only when
`why_not_vector` says yes, and the boundary kind `boundary_versions` gives; the generator
then trusts the schedule and decides nothing.

    why_not_vector(block, "n")   # None: it can; else the reason, for messages and tests
    boundary_versions(block)     # None, "remainders" or "guarded" (BlockSchedule.boundary)
"""
from __future__ import annotations

from polytile import dtypes
from polytile.analysis.deps import scalar_indices
from polytile.codegen.cops import MASK_OPS, VECTOR_OPS  # the C backend's vector ops
from polytile.ir.nodes import Affine, Block, Constant, Intrinsic, Load, LoadIndex, Store

MASKED_LANES = (8, 16)     # vector widths with masked moves (AVX, AVX-512)


def why_not_vector(blk: Block, vector: str) -> str | None:
    """None when `blk` can run as float32 vector code along `vector`, else why not."""
    if any(isinstance(s, Block) for s in blk.stmts):
        return "it has nested blocks"
    stores = [s for s in blk.stmts if isinstance(s, Store)]
    if len(stores) != 1:
        return f"it has {len(stores)} stores (one is supported)"
    if stores[0].dynamic:
        return f"it scatters into {stores[0].ref} at data-dependent positions"
    if any(not isinstance(s, (Load, Store, Constant, Intrinsic)) and not _step_index(s, blk, vector)
           for s in blk.stmts):
        return "it computes an index value that differs per lane"
    # Vector loads and stores are contiguous: every view that moves with the vector
    # index must move by one element.
    for ref in blk.refs:
        uses = [(a.coeff(vector), d.stride) for a, d in zip(ref.access, ref.shape.dims)
                if a.coeff(vector)]
        if uses and uses != [(1, 1)]:
            return f"view {ref.into} does not move by one element along {vector}"
    deps = scalar_indices(blk)
    types = _types(blk)
    for st in blk.stmts:
        if isinstance(st, Load):
            if any(d is not None and vector in deps[d] for d in st.dynamic):
                return f"load {st.into} is a gather along {vector}"
            if st.offset is not None and vector in deps[st.offset]:
                return f"load {st.into} moves its pointer per lane"
            if vector in deps[st.into] and blk.ref(st.ref).shape.dtype != dtypes.FLOAT32:
                return f"load {st.into} is not float32"
        elif isinstance(st, Intrinsic) and vector in deps[st.into]:
            reason = _why_not_op(st, types, {a for a in st.inputs if vector in deps[a]})
            if reason is not None:
                return reason
    if types.get(stores[0].value) == dtypes.BOOL:
        return f"it stores the mask {stores[0].value}"
    out = blk.ref(stores[0].ref)
    if out.shape.dtype != dtypes.FLOAT32:     # every aggregation has a vector form
        return f"its output {out.into} is not float32"
    loops = {i.name for i in blk.idxs if i.affine is None and i.range > 1}
    if vector not in loops:
        return f"{vector} is not a loop of more than one iteration"
    written = {n for a in out.access for n in a.names}
    if any(u in loops and u != vector and u not in written for u in blk.schedule.unroll):
        return "an unrolled index is a reduction"
    if vector not in written and out.agg == "assign":
        return f"{vector} is reduced by assignment"
    return None


def _types(blk: Block) -> dict[str, dtypes.DType]:
    """The dtype of every scalar the leaf computes."""
    types: dict[str, dtypes.DType] = {}
    for st in blk.stmts:
        if isinstance(st, Load):
            types[st.into] = blk.ref(st.ref).shape.dtype
        elif isinstance(st, (Constant, Intrinsic)):
            types[st.into] = st.dtype
        elif isinstance(st, LoadIndex):
            types[st.into] = dtypes.INT64
    return types


def _why_not_op(st: Intrinsic, types: dict[str, dtypes.DType], varying: set[str]
                ) -> str | None:
    """None when op `st`, which varies along the vector index, has a vector form for its
    operand types: float32 ops on float32 vectors (scalar operands are converted when
    broadcast; a cast also turns a mask into 1s and 0s), and the mask ops, whose operands
    all have their kind's type (comparisons of float32, logic of masks, select by a
    mask)."""
    if st.op not in VECTOR_OPS:
        return f"{st.op} has no vector form"
    if st.op in MASK_OPS:
        kinds = MASK_OPS[st.op][0]
        wanted = tuple(dtypes.BOOL if k == "mask" else dtypes.FLOAT32 for k in kinds)
    else:
        if st.dtype != dtypes.FLOAT32:
            return f"{st.op} computes {st.dtype}, not float32"
        masks = (dtypes.BOOL,) if st.op == "cast" else ()
        wanted = tuple(types[a] if a not in varying or types[a] in masks
                       else dtypes.FLOAT32 for a in st.inputs)
    for a, want in zip(st.inputs, wanted):
        if types[a] != want:
            return f"{st.op} reads {a} of {types[a]}, not {want}"
    return None


def boundary_versions(blk: Block) -> str | None:
    """How the vector leaf `blk` runs when its constraints cut a tile short: None when it
    has none; "remainders" when each constraint bounds one loop other than the vector
    index from above, is a lane bound (`lane_bound`), or names no loop of the leaf (it
    then holds for the whole tile or for none of it): one version of the code per
    remainder; else "guarded": the vector code only for full tiles."""
    if not blk.constraints or blk.schedule.vector is None:
        return None
    vector = blk.schedule.vector.index
    loops = {i.name for i in blk.idxs if i.affine is None and i.range > 1}
    for c in blk.constraints:
        if lane_bound(blk, c):
            continue
        own = [n for n in c.names if n in loops]
        if own and (len(own) != 1 or own[0] == vector or c.coeff(own[0]) >= 0):
            return "guarded"
    return "remainders"


def tile_condition(blk: Block, c: Affine) -> bool:
    """Whether constraint `c` of a vector leaf names none of its loops: it holds for the
    whole tile or for none of it."""
    return not any(i.name in c.names for i in blk.idxs if i.affine is None and i.range > 1)


def lane_bound(blk: Block, c: Affine) -> bool:
    """Whether constraint `c` bounds the parallel vector index from above given the
    unrolled indices only: a tile cut short there runs with masked lanes."""
    s = blk.schedule
    assert s.vector is not None
    vector = s.vector.index
    loops = {i.name for i in blk.idxs if i.affine is None and i.range > 1}
    out = next(r for r in blk.refs if r.dir in ("out", "inout"))
    parallel = any(vector in a.names for a in out.access)
    return (vector in c.names and c.coeff(vector) == -1 and parallel
            and s.vector.lanes in MASKED_LANES
            and all(n in s.unroll for n in c.names if n in loops and n != vector))


def _step_index(st: object, blk: Block, vector: str) -> bool:
    """An index value used only as the pointer increment of loads (polytile.passes.ptrinc),
    the same for every lane."""
    if not isinstance(st, LoadIndex) or vector in st.value.names:
        return False
    uses = [s for s in blk.stmts if isinstance(s, (Load, Store, Intrinsic))
            and st.into in ((s.offset, *s.dynamic) if isinstance(s, Load)
                            else (s.value,) if isinstance(s, Store) else s.inputs)]
    return all(isinstance(s, Load) and s.offset == st.into and st.into not in s.dynamic
               for s in uses)
