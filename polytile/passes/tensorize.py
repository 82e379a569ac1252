"""tensorize: run contractions on a tensorized instruction of the target (UNIT §IV).

For every top-level contraction, the inspector (polytile.isa.inspect) lists the
mappings of each instruction the target has; this pass takes a mapping of a lane-dot
instruction (one lane loop, one reduction loop of its own: vpdpbusd, vdpbf16ps, and
vpmaddwd, which has no accumulator operand: its result is added to the accumulator) that
the lowering (polytile.loops.tensorize) can lay out, by default the first; instructions
that do more products per instruction come first (vpdpbusd's 32 or 64 before vpmaddwd's
16 or 32), so an AVX2 host without AVX-VNNI runs a u8 x s8 matmul on vpmaddwd, its
operands widened to int16:

* the output has one subscript that is the lane loop alone (where it is unit-stride an
  accumulator is stored whole; elsewhere, a convolution's NKHW, the lowering stages
  each tile through a stack buffer);
* the broadcast operand has one subscript that is the reduction loop alone and reads no
  lane (where it is not unit-stride or is widened, it is packed once per call with the
  groups innermost: a convolution's NCHW input as NHW[G]c);
* the other operand reads plain subscripts of the lane and reduction loops and the other
  reduction loops (a convolution's window) and nothing else (it is packed once per call
  into groups of lanes, per window position).

The other reduction loops stay reductions around the instruction (UNIT §IV-B: only the
instruction's loops are tiled innermost):

    block s0 [n:1, k:K, h:OH, o:OW, c:C, r:R, s:S] #contraction #kernel (
      out y <- y[n, k, h, o] int32:add                   ->  #tensorized schedule(
      in x <- x[n, c, h + r, o + s] uint8                      parallel(h),
      in w <- w[k, c, r, s] int8 )                             tensorize(vpmaddwd_256, k, c, 3, 4,
                                                                         kept))

It records `schedule(tensorize(instruction, lane, reduction, rows, chains[, kept]))` and tags
the block `tensorized` instead of `kernel`/`contraction`, so the later passes leave it
alone; `parallel` names the outermost other output loop where the work pays for threads
(for a matmul of at most FEW_ROWS rows and MANY_LANES lanes or more, the lane loop: the
lowering then runs its blocks of lanes in threads).
The register tile is `chains` = 4 chunks of lanes by as many rows (at most 6) as the
target's vector registers hold beside one broadcast row and one instruction result:
6 x 4 with AVX-512's 32 registers (24 accumulators, the 4 chunks of the packed operand
and a broadcast: 29; 7 rows would spill), 3 x 4 with AVX2's 16 (4 x 4 spills two
accumulators there; the packed operand is read as a memory operand). On an AVX-512 VNNI
Xeon, 6 x 4 ran the 1024^3 matmul at 510-519 GOP/s against 4 x 4's 412-424 (two threads).

    block s0 [i0:M, i1:N, i2:K] #contraction #kernel (    block s0 [i0:M, i1:N, i2:K] #tensorized
      out o0 <- o0[i0, i1] int32:add                ->      schedule(parallel(i0),
      in p0 <- p0[i0, i2] uint8                            tensorize(vpdpbusd_512, i1, i2, 6, 4)) (...)
      in p1 <- p1[i2, i1] int8 )

On cpu-avx2 without avx_vnni the same block gets `tensorize(vpmaddwd_256, i1, i2, 3, 4)`.

`kept`: the packed operand is a parameter the kernel only reads, one dense run of memory
(`keepable`), so the kernel keeps it packed between calls and packs it again only when its
values differ from the ones it was packed from (polytile.loops.tensorize.kept): a weight
tensor used by many calls is packed once, as fbgemm's prepacked weights are, and is never
stale.

A matrix instruction on tiles (AMX: `matrix`) comes first where the target has one: the
inspector's split mapping (its groups and a group's values both on the block's
reduction loop), the one whose tiles the block fills best (`filled`), recorded as
`schedule(tiles(instruction, rows, cols, reduction[, kept]))` with `parallel(rows)` where
the work pays for threads (polytile.loops.tiles lowers it; docs/instructions.md, "AMX"):

    block s0 [i0:M, i1:N, i2:K] #contraction #kernel  ->  #tensorized schedule(parallel(i0),
      (bfloat16 A, B; float32 C)                             tiles(tdpbf16ps_amx, i0, i1, i2, kept))

Parameters: `enabled` (default true), `keep` (default true: record `kept` where it holds),
`tiles` (default true: the matrix instructions where the target has one; false: the
lane-dot ones only, a gene of the tuner), and UNIT's tuning space (§IV-B), genes of the tuner (polytile.tune.choices): `mapping`
(default 0: which of the layable mappings, in the order above, the instructions' and
their loops' choice; past the last, the last), `rows` and `chains` (the register tile,
the inner loops unrolled; `rows` 0, the default: as many as the target's vector
registers hold beside `chains` chunks, at most ROWS) and `parallel` (default true: the
outermost other output loop runs in threads where the work pays for them; false: none).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from polytile.errors import UnsupportedError
from polytile.ir import nodes as N
from polytile.ir import polyhedra
from polytile.isa import Description, descriptions
from polytile.isa.inspect import Mapping, kinds, mappings, output, splits, uses
from polytile.passes.autotile import PARALLEL_MIN_WORK, work
from polytile.passes.pack import unit_dim
from polytile.passes.pipeline import between, count, flag, register
from polytile.targets.target import Target


def tensorize(fn: N.Function, target: Target, params: dict[str, Any]) -> N.Function:
    if not params.get("enabled", True):
        return fn
    if target.backend == "cuda":
        raise UnsupportedError(f"tensorize on target {target.name}: pass tensorize runs a CPU's "
                               "lane-dot instructions; a cuda target runs Tensor Cores "
                               "(mma.sync) through pass tensor_cores",
                               hint="name tensor_cores instead of tensorize in the target's passes")
    runs = [d for d in descriptions() if target.has(d.feature)
            and target.backend in d.definition.forms]
    usable = sorted((d for d in runs if lane_dot(d)),
                    key=lambda d: (-d.operand_types[0].lanes, d.name))   # most products first
    tiles = [d for d in runs if matrix(d)] if params.get("tiles", True) else []
    if not usable and not tiles:
        return fn
    keep = params.get("keep", True)
    chains = params.get("chains", CHAINS)
    choice = Choice(params.get("mapping", 0),
                    params.get("rows", 0) or default_rows(target, chains), chains,
                    params.get("parallel", True))
    kept = keepable(fn) if keep else frozenset()
    stmts = tuple(_tiled(s, tiles, choice, kept) or _tensorized(s, usable, choice, kept)
                  if isinstance(s, N.Block) else s for s in fn.body.stmts)
    return replace(fn, body=replace(fn.body, stmts=stmts))


@dataclass(frozen=True)
class Choice:
    """UNIT's tuning space (§IV-B), as the pass's options give it."""

    mapping: int        # which layable mapping (past the last: the last)
    rows: int           # the register tile
    chains: int
    parallel: bool      # threads over the outer loop where the work pays for them


def default_rows(target: Target, chains: int) -> int:
    """Rows of the register tile: as many as the vector registers hold beside one
    broadcast row and one instruction result, at most ROWS."""
    return max(1, min(ROWS, (target.vector_registers - 2) // chains))


def lane_dot(d: Description) -> bool:
    """An instruction with one result of L lanes from two operands of L groups, that
    either reads an accumulator of the result's type or adds its result to one."""
    ins, outs = d.definition.inputs, d.definition.outputs
    if len(outs) != 1 or len(d.operands) != 2:
        return False
    a, b = d.operand_types
    reads = ins == (outs[0], a, b) if d.accumulates else ins == (a, b)
    par, red = kinds(d.reduction)
    return (reads and d.aggregation == "add" and a.lanes == b.lanes
            and a.lanes % outs[0].lanes == 0 and len(par) == 1 and len(red) == 1)


def matrix(d: Description) -> bool:
    """A matrix instruction on tiles (AMX): it reads its accumulator, adds the products
    of two operands along M and N loops and two reduction loops (groups and the values
    of a group, which the inspector maps onto one program loop), and is not a warp's."""
    par, red = kinds(d.reduction)
    return (d.accumulates and len(d.operands) == 2 and d.aggregation == "add"
            and len(par) == 2 and len(red) == 2 and not d.definition.warp)


def _tiled(block: N.Block, tiles: list[Description], choice: Choice,
           keep: frozenset[str]) -> N.Block | None:
    """`block` on the first of `tiles` (AMX) that computes it: a split mapping with no
    operand broadcast (polytile.loops.tiles lays out any affine subscripts; other
    reduction loops, a convolution's window, loop around the reduction's steps); None if
    none does. Of several mappings, by default the one whose tiles the block fills best
    (a convolution's groups along its channels, not along a window of 3); the gene
    `mapping` picks another, in that order (a convolution's pixels along w or h). The second
    operand's tiles are kept between calls where it is one of `keep` and reads no other
    output loop (a convolution's weights)."""
    if not tiles or not {"kernel", "contraction"} <= block.tags or block.constraints \
            or any(isinstance(s, N.Block) for s in block.stmts):
        return None
    for d in tiles:
        found = [m for m in mappings(block, d.name, d.reduction)
                 if splits(m) and not m.broadcast]
        if not found:
            continue
        found.sort(key=lambda m: -filled(block, d, m))     # stable: innermost loops first
        m = found[min(choice.mapping, len(found) - 1)]
        rows, cols, red, _ = (p for _, p in m.loops)
        parallel = _tile_threads(block, d, m) \
            if choice.parallel and work(block) >= PARALLEL_MIN_WORK else None
        second = block.ref(dict(m.operands)[d.operands[1]])
        around = set(kinds(block)[0]) - {rows, cols}
        kept = second.from_ in keep and not uses(second) & around
        tags = (block.tags - {"kernel", "contraction"}) | {"tensorized"}
        return replace(block, tags=tags, schedule=N.BlockSchedule(
            parallel=parallel, tiles=N.Tiled(d.name, rows, cols, red, kept)))
    return None


# Row tiles enough to share among threads; with fewer, a batch loop runs in threads.
SHARED_ROW_TILES = 4


def _tile_threads(block: N.Block, d: Description, m: Mapping) -> str | None:
    """The loop of `block` on the tiles of `d` (mapping `m`) that runs in threads: its row
    tiles where there are SHARED_ROW_TILES of them, else the outermost other output loop
    of two iterations or more (a convolution's image rows, a batch), else the row tiles;
    None where their iterations would write the same elements."""
    ranges = {i.name: i.range for i in block.idxs}
    rows, cols = m.loops[0][1], m.loops[1][1]
    tile = {i.name: i.range for i in d.reduction.idxs}[m.loops[0][0]]
    others = [n for n in kinds(block)[0] if n not in (rows, cols) and ranges[n] > 1]
    order = [rows] if -(-ranges[rows] // tile) >= SHARED_ROW_TILES else others[:1] + [rows]
    return next((n for n in order if polyhedra.writes_disjoint(block, n)), None)


def filled(block: N.Block, d: Description, m: Mapping) -> float:
    """The share of the tiles of matrix instruction `d` that `block`'s values fill under
    mapping `m` (1: every size a multiple of the tile's)."""
    ranges = {i.name: i.range for i in block.idxs}
    extent = {i.name: i.range for i in d.reduction.idxs}
    (dm, rows), (dn, cols), (g, red), (t, _) = m.loops
    share = 1.0
    for size, tile in ((ranges[rows], extent[dm]), (ranges[cols], extent[dn]),
                       (ranges[red], extent[g] * extent[t])):
        share *= size / (-(-size // tile) * tile)
    return share


# A matmul of at most FEW_ROWS rows and at least MANY_LANES lanes runs its blocks of
# lanes in threads instead of its rows: with rows, every thread's panels each stream all
# of the packed operand (four panels of 32 rows at 128 rows); with lanes, each thread
# reads its share of it once and every row passes each block while it is in L2.
FEW_ROWS = 256
MANY_LANES = 512
CHAINS = 4      # chunks of lanes per register tile: independent chains of the instruction
ROWS = 6        # at most, rows per register tile


def keepable(fn: N.Function) -> frozenset[str]:
    """The parameters a packed operand may be kept from between calls: read only and
    dense in memory (their elements one contiguous run, in some order of the
    dimensions), so that the kernel can compare them with a copy of the values it packed
    before (`Tensorized.kept`)."""
    refs = {r.into: r for r in fn.body.refs}
    return frozenset(p for p in fn.params if refs[p].dir == "in" and dense(refs[p].shape.dims))


def dense(dims: tuple[N.Dim, ...]) -> bool:
    """Whether the elements of `dims` fill one run of memory without gaps or overlaps."""
    size = 1
    for d in sorted((d for d in dims if d.size != 1), key=lambda d: abs(d.stride)):
        if d.stride != size:
            return False
        size *= d.size
    return True


def _tensorized(block: N.Block, usable: list[Description], choice: Choice,
                keep: frozenset[str]) -> N.Block:
    if not {"kernel", "contraction"} <= block.tags or block.constraints \
            or any(isinstance(s, N.Block) for s in block.stmts):
        return block
    found = []
    for d in usable:
        for m in mappings(block, d.name, d.reduction):
            if len(m.loops) != 2:
                continue
            (_, lane), (_, red) = m.loops
            views = dict(m.operands)
            first, second = d.operands
            broadcast, packed = views[first], views[second]
            if m.broadcast == (first,) and layable(block, lane, red, broadcast, packed):
                found.append((d.name, lane, red, packed))
        if len(found) > choice.mapping:
            break                   # the wanted one is found: the others are not needed
    if not found:
        return block
    name, lane, red, packed = found[min(choice.mapping, len(found) - 1)]
    kept = block.ref(packed).from_ in keep
    return _record(block, N.Tensorized(name, lane, red, choice.rows, choice.chains, kept),
                   choice.parallel)


def layable(block: N.Block, lane: str, red: str, broadcast: str, packed: str) -> bool:
    """Whether the lowering can lay the operands out (see the module docstring)."""
    out = output(block)
    if out is None:
        return False
    # the other reductions loop around the groups; an index of one iteration is 0
    others = set(other_reductions(block, red)) | {i.name for i in block.idxs if i.range == 1}
    return (unit_dim(out, lane) is not None and unit_dim(block.ref(broadcast), red) is not None
            and not (uses(block.ref(broadcast)) & {lane})
            and _plain(block.ref(packed), {lane, red} | others))


def other_reductions(block: N.Block, red: str) -> list[str]:
    """The block's reduction loops besides the instruction's groups (a convolution's
    window: r, s), in block order; the lowering loops them around the groups."""
    out = output(block)
    written = uses(out) if out is not None else set()
    return [i.name for i in block.idxs if i.affine is None and i.range > 1
            and i.name not in written and i.name != red]


def _plain(ref: N.Refinement, indices: set[str]) -> bool:
    """Every subscript of `ref` is a constant or one of `indices` alone."""
    return all(not a.terms or (len(a.terms) == 1 and a.terms[0][0] in indices
                               and a.terms[0][1] == 1 and a.const == 0) for a in ref.access)


def _record(block: N.Block, t: N.Tensorized, threads: bool) -> N.Block:
    out = output(block)
    written = uses(out) if out is not None else set()
    outer = [i.name for i in block.idxs if i.affine is None and i.name in written
             and i.name != t.lane and i.range > 1]
    parallel = None
    if threads and outer and work(block) >= PARALLEL_MIN_WORK \
            and polyhedra.writes_disjoint(block, outer[0]):
        parallel = outer[0]
        ranges = {i.name: i.range for i in block.idxs}
        if outer == [outer[0]] and ranges[outer[0]] <= FEW_ROWS \
                and ranges[t.lane] >= MANY_LANES:
            parallel = t.lane
    tags = (block.tags - {"kernel", "contraction"}) | {"tensorized"}
    return replace(block, tags=tags, schedule=N.BlockSchedule(parallel=parallel, tensorize=t))


register("tensorize", tensorize, enabled=flag, keep=flag, tiles=flag, mapping=count,
         rows=between(0, 2 * ROWS), chains=between(1, 2 * CHAINS), parallel=flag)
