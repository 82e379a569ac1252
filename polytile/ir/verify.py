"""The Stripe rules (§3.1-3.2) every IR function must keep; `verify` raises at the first break.

Scopes and types, checked per block:

* names are words and unique in their block; the function's parameters are exactly
  the top-level `in|out|inout` refinements;
* a refinement's `<- parent` names a refinement of the parent block, with the same
  dtype, rank and strides; only the top-level block has parameters, and a nested
  block's refinement without a parent is a local allocation (`none`);
* indices, constraints, refinement offsets and `index(...)` are affine in the
  block's own indices; a passed-in index (`i = 4*i1`) is affine in the parent's;
* loads and stores name refinements of their own block; scalars are defined before
  use and assigned once; a store's scalar has the buffer's dtype; dynamic offsets
  and flat offsets (pointer increments) are integers;
* nothing writes an `in` buffer (a store, a special's output, or a child's
  `out|inout` view of it); a child that writes with another aggregation than its
  parent's view needs the parent's to be `assign` (only then is the combination
  of the child's writes well defined).

Integer-set rules, proved with isl over the whole nest (ancestors' ranges and
constraints included, see `polytile.ir.polyhedra`):

* every child view lies inside its parent's view for every iteration that runs;
* two iterations of a block never write one element of an `assign` view;
* no iteration reads an element that another iteration of the same block writes
  (Definition 2.2: iterations share data only through the aggregation).
Local allocations are private to each iteration of their block, so they are exempt.

Schedules (`BlockSchedule`), which passes decide and backends print:

* vector, unrolled and GPU-mapped indices are the block's own loops, each mapped once;
  a vector index moves every view that depends on it by one element (vectors are
  contiguous), its lanes are a power of two, and with `target` at most what one of
  the target's registers holds of its dtype;
* iterations of the parallel index write disjoint elements (isl), but for the
  buffers it combines (aggregation add, float types, at a place fixed across threads);
* a stitched block's phases (`Stitched`) are its blocks, with a barrier after each one
  that a later phase depends on (`polytile.ir.phases`);
* an init `folded` into a later sibling folds by `analysis.fold`, whose micro-kernel
  names the proof's indices in `first`; no `first` without such an init.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from polytile import dtypes
from polytile.analysis.fold import chain, fold
from polytile.errors import IRError
from polytile.ir import intrinsics, polyhedra
from polytile.ir import phases as phases_
from polytile.ir import rows as rows_
from polytile.ir.nodes import (
    AGG_OPS,
    BOUNDARY_KINDS,
    COMBINABLE,
    DIRECTIONS,
    GPU_KINDS,
    Across,
    Affine,
    Block,
    BlockSchedule,
    Constant,
    Function,
    Intrinsic,
    Load,
    LoadIndex,
    Refinement,
    RowGroup,
    Special,
    Staged,
    Stitched,
    Store,
    Tensorized,
    Tiled,
    VectorLoop,
    WarpTiled,
)
from polytile.ir.parser import NAME
from polytile.ir.polyhedra import READ, WRITE, Conj, Scope

if TYPE_CHECKING:       # the IR depends on no target; a caller may pass one to check
    from polytile.targets.target import Target

WRITES = ("out", "inout")


def verify(fn: Function, target: Target | None = None) -> None:
    """Raise `IRError` naming the block and buffer of the first rule `fn` breaks
    (vector widths are checked against `target` when one is given)."""
    _check_params(fn)
    _check_block(fn.body, None, fn.body.name, target)
    _check_sets(Scope.root(fn.body), None)
    _check_folds(Scope.root(fn.body), set())


def _fail(path: str, message: str, hint: str | None = None) -> IRError:
    return IRError(f"block {path}: {message}", None, hint)


def _check_params(fn: Function) -> None:
    declared = [r.into for r in fn.body.refs if not r.from_ and r.dir != "none"]
    if len(set(fn.params)) != len(fn.params):
        raise IRError(f"function {fn.name}: a parameter is listed twice in {fn.params}")
    if set(fn.params) != set(declared):
        raise IRError(f"function {fn.name}: parameters {list(fn.params)} differ from the "
                      f"top-level in/out/inout refinements {declared}",
                      hint="list every top-level buffer that is not `none` as a parameter")


# ---------------------------------------------------------------- scopes and types

def _check_block(block: Block, parent: Block | None, path: str,
                 target: Target | None = None) -> None:
    _check_names(path, "block", [block.name])
    _check_names(path, "index", [i.name for i in block.idxs])
    _check_names(path, "refinement", [r.into for r in block.refs])
    own = {i.name for i in block.idxs}
    for idx in block.idxs:
        if idx.affine is None:
            if idx.range < 0:
                raise _fail(path, f"index {idx.name} has negative range {idx.range}")
            continue
        if parent is None:
            raise _fail(path, f"index {idx.name} is passed in, but the top block has no parent")
        if idx.range != 1:
            raise _fail(path, f"passed-in index {idx.name} has range {idx.range}, not 1")
        _check_affine(path, f"the value of index {idx.name}", idx.affine,
                      {i.name for i in parent.idxs}, "the parent's indices")
    for c in block.constraints:
        _check_affine(path, f"constraint {c} >= 0", c, own, "the block's indices")
    for ref in block.refs:
        _check_refinement(ref, block, parent, path)
    _check_statements(block, path)
    _check_schedule(block, path, target)
    for stmt in block.stmts:
        if isinstance(stmt, Block):
            _check_block(stmt, block, f"{path}/{stmt.name}", target)


def _check_stage(block: Block, stage: Staged, path: str) -> None:
    """A staged reduction: a serial loop of the block in positive tiles, staging inputs
    that plain loads of a leaf thread tile read; one store, adding into the output."""
    threads = [index for index, kind in block.schedule.gpu if kind == "thread"]
    loops = {i.name for i in block.idxs if i.affine is None}
    if not threads or stage.index not in loops - set(threads) or stage.tile < 1 \
            or stage.pad < 0:
        raise _fail(path, f"stage({stage.index}, {stage.tile}) needs thread indices and a "
                          "positive tile of another loop of the block")
    stores = [st for st in block.stmts if isinstance(st, Store)]
    if any(isinstance(st, (Block, Special)) for st in block.stmts) or len(stores) != 1 \
            or block.ref(stores[0].ref).agg != "add":
        raise _fail(path, "a staged block is a leaf with one store, adding into its output")
    if any(isinstance(st, Load) and (st.offset or any(st.dynamic)) for st in block.stmts):
        raise _fail(path, "a staged block has a data-dependent subscript, whose failed check "
                          "would end a work-item between barriers")
    for name in stage.refs:
        if name not in {r.into for r in block.refs if r.dir == "in" and r.from_}:
            raise _fail(path, f"stage names {name}, which is not an input view of the block")


def _check_stitch(block: Block, stitch: Stitched, path: str) -> None:
    """A stitched block: no indices of its own, only blocks as statements, a phase per
    block, shared out only where it can be, and a barrier wherever a dependence between
    phases needs one (`polytile.ir.phases`)."""
    phases = [st for st in block.stmts if isinstance(st, Block)]
    if block.idxs or len(phases) != len(block.stmts) or len(phases) != len(stitch.phases):
        raise _fail(path, f"a stitched block has no indices and one block per phase, not "
                          f"{len(block.idxs)} indices and {len(block.stmts)} statements for "
                          f"{len(stitch.phases)} phases")
    if block.schedule.parallel is not None or block.schedule.combine:
        raise _fail(path, "a stitched block's threads are its phases' (schedule them there)")
    needed = phases_.required_barriers(phases)
    for k, (phase, decided) in enumerate(zip(phases, stitch.phases)):
        if decided.shared and not phases_.shareable(phase):
            raise _fail(path, f"phase {phase.name} is shared out among threads, but its "
                              "schedule runs no first loop in threads (or a constraint "
                              "guards it)")
        if needed[k] and not decided.barrier:
            raise _fail(path, f"phase {phase.name} has no barrier after it, but a later "
                              "phase touches what it writes (or writes what it reads)")


def _check_rows(block: Block, group: RowGroup, path: str) -> None:
    """A row group: one loop, its rows on the grid, a power-of-two group, a phase per
    member that `polytile.ir.rows` says it can run as, and a barrier wherever a later
    member depends on it."""
    loops = [i.name for i in block.idxs if i.affine is None]
    threads = group.threads
    if loops != [group.index] or block.schedule.gpu != ((group.index, "grid"),) \
            or threads < 2 or threads & (threads - 1):
        raise _fail(path, f"rows({group.index}, {threads}) needs the block's one loop on the "
                          "grid and a power-of-two group of work-items")
    _check_warp(group.warp, threads, path)
    members = [st for st in block.stmts if isinstance(st, Block)]
    if len(members) != len(block.stmts) or len(members) != len(group.phases):
        raise _fail(path, f"a row group has a block per phase, not {len(block.stmts)} "
                          f"statements for {len(group.phases)} phases")
    for member, phase in zip(members, group.phases):
        if not rows_.valid_phase(member, phase.kind, phase.loop):
            loop = f"({phase.loop})" if phase.loop else ""
            raise _fail(path, f"member {member.name} cannot run as phase {phase.kind}{loop} "
                              "of a work-group (polytile.ir.rows)")
    needed_after = rows_.required_barriers(members, [(p.kind, p.loop) for p in group.phases])
    for member, needed, phase in zip(members, needed_after, group.phases):
        if needed and not phase.barrier:
            raise _fail(path, f"member {member.name} has no barrier after it, but a later "
                              "member touches what it writes (or writes what it reads)")


def _check_across(block: Block, across: Across, path: str) -> None:
    """A reduction across work-items: a power-of-two group over the only loop of a leaf
    whose one store aggregates along it, without data-dependent subscripts (a failed
    check would end a work-item between barriers)."""
    loops = [i.name for i in block.idxs if i.affine is None and i.range > 1]
    stores = [st for st in block.stmts if isinstance(st, Store)]
    threads = across.threads
    if loops != [across.index] or threads < 2 or threads & (threads - 1) or block.schedule.gpu \
            or any(isinstance(st, (Block, Special)) for st in block.stmts) or len(stores) != 1 \
            or block.ref(stores[0].ref).agg == "assign" \
            or any(isinstance(st, Load) and (st.offset or any(st.dynamic)) for st in block.stmts) \
            or any(across.index in a.names for a in block.ref(stores[0].ref).access):
        raise _fail(path, f"across({across.index}, {threads}) needs a power-of-two group over "
                          "the only loop of a leaf with one aggregating store along it, and no "
                          "data-dependent subscript")
    _check_warp(across.warp, threads, path)


def _check_warp(warp: int, threads: int, path: str) -> None:
    """A group's warps: none, or a power of two of work-items dividing the group, with at
    most `warp` warps (their results are combined by one warp's shuffles)."""
    if warp and (warp < 2 or warp & (warp - 1) or warp > threads or threads > warp * warp):
        raise _fail(path, f"warp = {warp} needs a power of two of at least 2 work-items, up to "
                          f"the group's {threads} and with at most {warp} warps in it")


def contiguous_along(ref: Refinement, index: str) -> bool:
    """Whether consecutive values of `index` reach consecutive elements of `ref`: it
    steps the unit-stride dimension by one and no other."""
    steps = [(a.coeff(index), d.stride) for a, d in zip(ref.access, ref.shape.dims)
             if a.coeff(index)]
    return steps == [(1, 1)]


def _check_stream(block: Block, s: BlockSchedule, path: str) -> None:
    views = {r.into: r for r in block.refs}
    for name in s.stream:
        ref = views.get(name)
        if (not s.micro or s.vector is None or ref is None or ref.dir != "out"
                or ref.agg != "assign" or not contiguous_along(ref, s.vector.index)):
            raise _fail(path, f"stream({name}) needs a vector micro-kernel and an output "
                              "view it assigns to, contiguous along the vector index")


def _check_next_row(block: Block, s: BlockSchedule, path: str) -> None:
    views = {r.into: r for r in block.refs}
    passed = {i.name for i in block.idxs if i.affine is not None}
    for r in s.next_row:
        ref = views.get(r.view)
        if (not s.micro or s.vector is None or ref is None or ref.dir != "in"
                or r.index not in passed or r.rows < 2 or r.stride < 1):
            raise _fail(path, f"next_row({r.view}, {r.index}, {r.rows}, {r.stride}) needs a "
                              "vector micro-kernel, an input view, a passed row index, two "
                              "rows or more and a positive stride")


def _check_tensorize(block: Block, t: Tensorized, path: str) -> None:
    """The instruction is described, and the inspector maps its lane and reduction loops
    onto the block's `lane` and `reduction` (the lowering lays out what it maps)."""
    from polytile.isa import description
    from polytile.isa.inspect import mappings
    if t.rows < 1 or t.chains < 1:
        raise _fail(path, f"the tensorized register tile {t.rows} x {t.chains} is empty")
    d = description(t.instruction)
    if not any([p for _, p in m.loops] == [t.lane, t.reduction]
               for m in mappings(block, d.name, d.reduction)):
        raise _fail(path, f"the schedule runs the block on {t.instruction} with lanes along "
                          f"{t.lane} and groups along {t.reduction}, which the instruction "
                          "does not compute there")


def _check_tiles(block: Block, w: Tiled, path: str) -> None:
    """The inspector maps the instruction's M and N loops onto `rows` and `cols` and its
    two reduction loops onto `reduction`, split, with neither operand broadcast; kept
    tiles belong to an operand that no loop around the tiles changes."""
    from polytile.isa import description
    from polytile.isa.inspect import kinds, tile_mapping, uses
    d = description(w.instruction)
    found = tile_mapping(block, d.name, d.reduction, w.rows, w.cols, w.reduction)
    if found is None:
        raise _fail(path, f"the schedule runs the block on {w.instruction}'s tiles with M, N "
                          f"and K along {w.rows}, {w.cols} and {w.reduction}, which the "
                          "instruction does not compute there")
    second = block.ref(dict(found.operands)[d.operands[1]])
    around = sorted(uses(second) & (set(kinds(block)[0]) - {w.rows, w.cols}))
    if w.kept and around:
        raise _fail(path, f"the block keeps {w.instruction}'s packed tiles between calls, "
                          f"but {', '.join(around)} loops around them and changes them")


def _check_mma(block: Block, w: WarpTiled, path: str) -> None:
    """The instruction is a described warp-level one and the inspector maps its M, N and K
    loops onto `rows`, `cols` and `reduction` with both operands read along them; a block
    of warps fits a CUDA block (1024 threads)."""
    from polytile.isa import WARP, description
    from polytile.isa.inspect import mappings
    d = description(w.instruction)
    if not d.definition.warp:
        raise _fail(path, f"mma({w.instruction}, ...) names an instruction that is not "
                          "warp-level (its description has no fragment layouts)")
    if not 1 <= w.warps_m * w.warps_n * WARP <= 1024 or min(w.warps_m, w.warps_n) < 1:
        raise _fail(path, f"mma's {w.warps_m} x {w.warps_n} warps do not fit a block of at "
                          "most 1024 threads")
    if min(w.tiles_m, w.tiles_n) < 1:
        raise _fail(path, f"mma's warp tile {w.tiles_m} x {w.tiles_n} is empty")
    if not any([p for _, p in m.loops] == [w.rows, w.cols, w.reduction] and not m.broadcast
               for m in mappings(block, d.name, d.reduction)):
        raise _fail(path, f"the schedule runs the block on {w.instruction} with M, N, K along "
                          f"{w.rows}, {w.cols}, {w.reduction}, which the instruction does not "
                          "compute there")


def _check_schedule(block: Block, path: str, target: Target | None) -> None:
    s = block.schedule
    loops = {i.name for i in block.idxs if i.affine is None}
    mapped = list(s.unroll) + [index for index, _ in s.gpu] + ([s.parallel] if s.parallel else [])
    if s.vector is not None:
        mapped.append(s.vector.index)
    for name in mapped:
        if name not in loops:
            raise _fail(path, f"the schedule maps {name}, which is not a loop of the block")
    if len(set(mapped)) != len(mapped):
        raise _fail(path, f"the schedule maps an index twice: {mapped}")
    if not set(s.order) <= loops - set(mapped) - ({s.vector.index} if s.vector else set()) \
            or len(set(s.order)) != len(s.order):
        raise _fail(path, f"the schedule's loop order {list(s.order)} must name the block's "
                          "other loops, once each")
    if any(kind not in GPU_KINDS for _, kind in s.gpu) or s.transpose < 0:
        raise _fail(path, "the schedule has an unknown GPU kind or a negative transpose width")
    if s.boundary is not None and (s.boundary not in BOUNDARY_KINDS or s.vector is None
                                   or not block.constraints):
        raise _fail(path, f"boundary({s.boundary}) needs one of {', '.join(BOUNDARY_KINDS)}, "
                          "a vector index and constraints")
    if s.prefetch < 0 or (s.prefetch and (not s.micro or s.vector is None or not any(
            isinstance(st, Load) and any(d is not None for d in st.dynamic)
            for st in block.stmts))):
        raise _fail(path, f"prefetch({s.prefetch}) needs a positive distance, a vector "
                          "micro-kernel and a data-dependent load in it")
    if s.stream:
        _check_stream(block, s, path)
    if s.next_row:
        _check_next_row(block, s, path)
    if s.tensorize is not None:
        _check_tensorize(block, s.tensorize, path)
    if s.mma is not None:
        _check_mma(block, s.mma, path)
    if s.tiles is not None:
        _check_tiles(block, s.tiles, path)
    for index, kind in s.gpu:
        first = replace(block, idxs=(block.index(index), *(i for i in block.idxs
                                                           if i.name != index)))
        if not polyhedra.writes_disjoint(first, index):
            raise _fail(path, f"the schedule runs index {index} across a GPU's {kind}, but "
                              "its iterations may write the same element")
    if s.stage is not None:
        _check_stage(block, s.stage, path)
    if s.across is not None:
        _check_across(block, s.across, path)
    if s.stitch is not None:
        _check_stitch(block, s.stitch, path)
    if s.rows is not None:
        _check_rows(block, s.rows, path)
    if s.vector is not None:
        _check_vector(block, s.vector, path, target)
    if s.combine:
        _check_combine(block, path)
    if s.parallel and not polyhedra.writes_disjoint(block, s.parallel, s.combine):
        raise _fail(path, f"the schedule runs index {s.parallel} in threads, but its "
                          "iterations may write the same element")


def _check_combine(block: Block, path: str) -> None:
    s = block.schedule
    if s.parallel is None:
        raise _fail(path, f"combine({', '.join(s.combine)}) needs a parallel index")
    refs = {r.into: r for r in block.refs}
    for name in s.combine:
        ref = refs.get(name)
        if ref is None or ref.dir not in ("out", "inout") or ref.agg != "add":
            raise _fail(path, f"combine({name}) needs a written refinement {name} of the "
                              "block with aggregation add")
        if ref.shape.dtype not in COMBINABLE or any(
                a.coeff(s.parallel) for a in ref.access):
            raise _fail(path, f"combine({name}): threads can add private copies of "
                              f"{', '.join(map(str, COMBINABLE))} buffers at a fixed place "
                              "only")


def _check_vector(block: Block, vector: VectorLoop, path: str, target: Target | None) -> None:
    lanes = vector.lanes
    if lanes < 1 or lanes & (lanes - 1):
        raise _fail(path, f"vector lanes {lanes} is not a power of two")
    if target is not None and lanes * max(1, vector.dtype.bits // 8) > target.vector_bytes:
        raise _fail(path, f"{lanes} lanes of {vector.dtype} are wider than the "
                          f"{target.vector_bytes}-byte vectors of target {target.name}")
    if not moves_contiguously(block, vector.index):
        raise _fail(path, f"vector index {vector.index} does not move every view that depends "
                          "on it by one element", "vectors are loaded and stored contiguously")


def moves_contiguously(block: Block, index: str) -> bool:
    """Whether every view of `block` that depends on `index` moves by one element per
    step of it: the condition for running `index` across vector lanes."""
    for ref in block.refs:
        moves = [(a.coeff(index), d.stride) for a, d in zip(ref.access, ref.shape.dims)
                 if a.coeff(index)]
        if moves and moves != [(1, 1)]:
            return False
    return True


def _check_names(path: str, what: str, names: list[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if not NAME.fullmatch(name):
            raise _fail(path, f"{what} name {name!r} is not a word (letters, digits, _)")
        if name in seen:
            raise _fail(path, f"{what} {name} is declared twice")
        seen.add(name)


def _check_affine(path: str, what: str, a: Affine, visible: set[str], scope: str) -> None:
    unknown = [n for n in a.names if n not in visible]
    if unknown:
        raise _fail(path, f"{what} uses {', '.join(unknown)}, which is not one of {scope} "
                    f"({', '.join(sorted(visible)) or 'none'})",
                    "a child sees a parent's index only when it is passed in, e.g. [i = i1]")


def _check_refinement(ref: Refinement, block: Block, parent: Block | None, path: str) -> None:
    name = ref.into
    if ref.dir not in DIRECTIONS or ref.agg not in AGG_OPS:
        raise _fail(path, f"refinement {name} has direction {ref.dir!r} and aggregation "
                    f"{ref.agg!r}", f"directions: {DIRECTIONS}; aggregations: {AGG_OPS}")
    rank = len(ref.shape.dims)
    if len(ref.access) != rank:
        raise _fail(path, f"refinement {name} has {len(ref.access)} offsets for {rank} dims")
    if any(d.size < 0 for d in ref.shape.dims):
        raise _fail(path, f"refinement {name} has a negative size {ref.shape.sizes}")
    for a in ref.access:
        _check_affine(path, f"the offset of {name}", a, {i.name for i in block.idxs},
                      "the block's indices")
    if not ref.from_:
        if parent is not None and ref.dir != "none":
            raise _fail(path, f"refinement {name} has no parent buffer, so it must be a "
                        f"local allocation (`none`), not `{ref.dir}`",
                        f"write `{ref.dir} {name} <- BUFFER[...]` to use a parent's buffer")
        if any(a != Affine.constant(0) for a in ref.access):
            raise _fail(path, f"{name} is a parameter or allocation, so its offsets must be 0")
        if any(d.stride < 0 for d in ref.shape.dims):
            raise _fail(path, f"allocation {name} has a negative stride")
        return
    if parent is None or ref.dir == "none":
        raise _fail(path, f"refinement {name} <- {ref.from_}: only a nested block's "
                    "`in|out|inout` refinement takes a parent buffer")
    try:
        outer = parent.ref(ref.from_)
    except KeyError:
        raise _fail(path, f"refinement {name} <- {ref.from_}: the parent block "
                    f"{parent.name} declares no buffer {ref.from_}",
                    "a block sees only its parent's refinements") from None
    if (ref.shape.dtype, rank) != (outer.shape.dtype, len(outer.shape.dims)):
        raise _fail(path, f"refinement {name} is {ref.shape.dtype} of rank {rank} but its "
                    f"parent {ref.from_} is {outer.shape.dtype} of rank {len(outer.shape.dims)}")
    if [d.stride for d in ref.shape.dims] != [d.stride for d in outer.shape.dims]:
        raise _fail(path, f"refinement {name} has strides {[d.stride for d in ref.shape.dims]}"
                    f" but its parent {ref.from_} has {[d.stride for d in outer.shape.dims]}",
                    "strides count elements of the underlying buffer, so views keep them")
    if ref.dir in WRITES and outer.dir == "in":
        raise _fail(path, f"refinement {name} writes ({ref.dir}) the parent's `in` buffer "
                    f"{ref.from_}", f"make {ref.from_} inout in {parent.name}")
    if ref.dir in WRITES and ref.agg != outer.agg and outer.agg != "assign":
        raise _fail(path, f"refinement {name} aggregates with {ref.agg} inside the parent's "
                    f"{ref.from_}, which aggregates with {outer.agg}",
                    "use the parent's aggregation, or make the parent's view `assign`")


def _check_statements(block: Block, path: str) -> None:
    refs = {r.into: r for r in block.refs}
    scalars: dict[str, dtypes.DType] = {}

    def ref_of(name: str, what: str) -> Refinement:
        if name not in refs:
            raise _fail(path, f"{what} names buffer {name}, which the block does not declare",
                        "declare a refinement for it in the block's header")
        return refs[name]

    def use(names: Iterable[str | None], what: str) -> list[dtypes.DType]:
        for n in names:
            if n is not None and n not in scalars:
                raise _fail(path, f"{what} uses scalar {n} before it is defined")
        return [scalars[n] for n in names if n is not None]

    def define(name: str, dtype: dtypes.DType) -> None:
        if not (name.startswith("$") and NAME.fullmatch(name[1:])):
            raise _fail(path, f"scalar name {name!r} must be $ and a word")
        if name in scalars:
            raise _fail(path, f"scalar {name} is assigned twice",
                        "scalars are single-assignment; use a new name")
        scalars[name] = dtype

    def writable(name: str, what: str) -> Refinement:
        ref = ref_of(name, what)
        if ref.dir == "in":
            raise _fail(path, f"{what} writes {name}, which is an `in` refinement",
                        f"declare {name} out or inout")
        return ref

    for stmt in block.stmts:
        if isinstance(stmt, Load):
            ref = ref_of(stmt.ref, f"load into {stmt.into}")
            if stmt.dynamic and len(stmt.dynamic) != len(ref.shape.dims):
                raise _fail(path, f"load of {stmt.ref} has {len(stmt.dynamic)} offsets for "
                            f"{len(ref.shape.dims)} dims")
            if stmt.offset is not None and any(d.size < 1 for d in ref.shape.dims):
                raise _fail(path, f"load of {stmt.ref} + {stmt.offset} from an empty view")
            _check_static_dims(path, ref, stmt.dynamic or (None,) * len(ref.shape.dims))
            if any(not t.is_integral for t in use(stmt.dynamic, f"load of {stmt.ref}")):
                raise _fail(path, f"load of {stmt.ref} has a non-integer dynamic offset")
            if stmt.offset is not None:
                (offset,) = use([stmt.offset], f"load of {stmt.ref}")
                if not offset.is_integral:
                    raise _fail(path, f"load of {stmt.ref} has a non-integer offset "
                                f"{stmt.offset} ({offset})")
            define(stmt.into, ref.shape.dtype)
        elif isinstance(stmt, Store):
            ref = writable(stmt.ref, f"store of {stmt.value}")
            if stmt.dynamic and len(stmt.dynamic) != len(ref.shape.dims):
                raise _fail(path, f"store to {stmt.ref} has {len(stmt.dynamic)} offsets for "
                            f"{len(ref.shape.dims)} dims")
            if stmt.dynamic and ref.agg == "assign":
                raise _fail(path, f"store to {stmt.ref} at data-dependent offsets through "
                            "`assign`", "two iterations may write one element: aggregate")
            _check_static_dims(path, ref, stmt.dynamic or (None,) * len(ref.shape.dims))
            if any(not t.is_integral for t in use(stmt.dynamic, f"store to {stmt.ref}")):
                raise _fail(path, f"store to {stmt.ref} has a non-integer dynamic offset")
            (value,) = use([stmt.value], f"store to {stmt.ref}")
            if value != ref.shape.dtype:
                raise _fail(path, f"store of {value} scalar {stmt.value} into {ref.shape.dtype} "
                            f"buffer {stmt.ref}", "convert first: $y = cast($x) : dtype")
        elif isinstance(stmt, LoadIndex):
            _check_affine(path, f"index({stmt.value})", stmt.value,
                          {i.name for i in block.idxs}, "the block's indices")
            define(stmt.into, dtypes.INT64)
        elif isinstance(stmt, Constant):
            define(stmt.into, stmt.dtype)
        elif isinstance(stmt, Intrinsic):
            _check_intrinsic(path, stmt)
            use(stmt.inputs, f"{stmt.op} into {stmt.into}")
            define(stmt.into, stmt.dtype)
        elif isinstance(stmt, Special):
            for name in stmt.inputs:
                ref_of(name, f"special {stmt.name}")
            for name in stmt.outputs:
                writable(name, f"special {stmt.name}")


def _check_static_dims(path: str, ref: Refinement, dynamic: tuple[str | None, ...]) -> None:
    """A static subscript reads the view's origin, which must exist."""
    for d, (dyn, dim) in enumerate(zip(dynamic, ref.shape.dims)):
        if dyn is None and dim.size < 1:
            raise _fail(path, f"{ref.into} is accessed at its origin but dimension {d} is empty")


def _check_intrinsic(path: str, stmt: Intrinsic) -> None:
    info = intrinsics.OPS.get(stmt.op)
    if info is None:
        raise _fail(path, f"unknown intrinsic {stmt.op!r} into {stmt.into}",
                    "see polytile.ir.intrinsics.OPS")
    if len(stmt.inputs) != info.arity:
        raise _fail(path, f"{stmt.op} takes {info.arity} operands, got {len(stmt.inputs)}")
    if info.result == intrinsics.BOOL and stmt.dtype != dtypes.BOOL:
        raise _fail(path, f"{stmt.op} gives bool, not {stmt.dtype} ({stmt.into})")
    if info.result == intrinsics.FLOAT and not stmt.dtype.is_float:
        raise _fail(path, f"{stmt.op} gives a float, not {stmt.dtype} ({stmt.into})")


# ---------------------------------------------------------------- integer sets (isl)

def _check_sets(scope: Scope, parent: Block | None) -> None:
    block = scope.block
    for ref in block.refs:
        if ref.from_ and parent is not None:
            _check_inside(scope, ref, parent.ref(ref.from_))
        if ref.dir != "none":       # allocations are private to each iteration
            _check_iterations(scope, ref)
    for stmt in block.stmts:
        if isinstance(stmt, Block):
            _check_sets(scope.child(stmt), block)


def _check_folds(scope: Scope, proved: set[int]) -> None:
    """An init block `folded` into a later sibling folds by `analysis.fold`, and the
    sibling's micro-kernel names the proof's reduction indices in `first`; a `first`
    without such an init would leave its buffer unwritten (`proved`: the ids of the
    micro-kernels of proved folds)."""
    block = scope.block
    if block.schedule.first is not None and id(block) not in proved:
        raise _fail(scope.path, "first(...) without an init block folded into this contraction")
    names = [st.name if isinstance(st, Block) else None for st in block.stmts]
    for k, st in enumerate(block.stmts):
        if not (isinstance(st, Block) and st.schedule.folded is not None):
            continue
        into = st.schedule.folded
        j = names.index(into, k + 1) if into in names[k + 1:] else None
        first = fold(scope, k, j) if j is not None else f"it has no later sibling {into}"
        if isinstance(first, str):
            raise _fail(f"{scope.path}/{st.name}", f"folded({into}) does not hold: {first}")
        leaf = chain(block.stmts[j])[-1]
        if leaf.schedule.first is None or sorted(leaf.schedule.first) != list(first):
            raise _fail(f"{scope.path}/{into}", f"folding {st.name} needs block {leaf.name} "
                        f"scheduled first({', '.join(first)})")
        proved.add(id(leaf))
    for stmt in block.stmts:
        if isinstance(stmt, Block):
            _check_folds(scope.child(stmt), proved)


def _check_inside(scope: Scope, ref: Refinement, outer: Refinement) -> None:
    for d, (a, dim, pdim) in enumerate(zip(ref.access, ref.shape.dims, outer.shape.dims)):
        if dim.size < 1:
            continue
        lo = scope.affine(a)
        for bad in (lo.scale(-1) - 1, lo + (dim.size - pdim.size - 1)):
            piece = scope.domain & Conj((), (), (bad,))
            point = polyhedra.witness(polyhedra.to_set(scope.variables, [(piece,)]),
                                      scope.variables)
            if point is not None:
                start = lo.evaluate(point)
                raise _fail(scope.path, f"view {ref.into} <- {ref.from_} spans "
                            f"{start}..{start + dim.size - 1} in dimension {d}, outside the "
                            f"parent's 0..{pdim.size - 1}, at {_at(scope, point)}",
                            "shrink the view, add a constraint, or split off boundary tiles")


def _check_iterations(scope: Scope, ref: Refinement) -> None:
    """No element of `ref` written by one iteration is written (under assign) or read by
    another iteration of the same block."""
    if not scope.iterated:
        return
    coords, writes = polyhedra.parent_footprint(scope, ref.into, WRITE)
    if not writes:
        return
    other = {v: f"{v}_q" for v in scope.own}
    free = scope.variables + tuple(other.values()) + coords
    differ = polyhedra.distinct((v, other[v]) for v in scope.iterated)
    checks = [("write", writes)] if ref.agg == "assign" else []
    checks.append(("read", polyhedra.parent_footprint(scope, ref.into, READ)[1]))
    for verb, touched in checks:
        theirs = tuple(_renamed(c, other) for c in touched)
        point = polyhedra.witness(polyhedra.to_set(free, [writes, theirs, differ]), free) \
            if theirs else None
        if point is None:
            continue
        element = ", ".join(str(point[x]) for x in coords)
        mine = _at(scope, point, own_only=True)
        yours = _at(scope, {v: point[q] for v, q in other.items()}, own_only=True)
        if verb == "write":
            raise _fail(scope.path, f"iterations ({mine}) and ({yours}) both write element "
                        f"[{element}] of {_viewed(ref)}, whose aggregation is assign",
                        f"give {ref.into} an aggregation (:add, :max, ...) or make the "
                        "written element depend on every index")
        raise _fail(scope.path, f"iteration ({yours}) reads element [{element}] of {_viewed(ref)}"
                    f" that iteration ({mine}) writes",
                    "iterations of a block share data only through the aggregation; "
                    "split the block in two")


def _viewed(ref: Refinement) -> str:
    return f"{ref.from_} (viewed as {ref.into})" if ref.from_ not in ("", ref.into) else ref.into


def _renamed(conj: Conj, other: Mapping[str, str]) -> Conj:
    names = dict(other)
    names.update({h: f"{h}_q" for h in conj.hidden})
    return conj.rename(names)


def _at(scope: Scope, point: Mapping[str, int], own_only: bool = False) -> str:
    names = scope.own if own_only else scope.variables
    return ", ".join(f"{scope.label(v)}={point[v]}" for v in names if v in point) or "the block"
