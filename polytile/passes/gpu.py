"""Pass `gpu`: map each kernel's parallel indices to a GPU's grid and the threads of a block
(Tensor Comprehensions §5.4), for any GPU backend (OpenCL now; a CUDA printer reads the same
schedule).

Each top-level statement block is one kernel launch. Its mappable indices are those whose
iterations write disjoint elements whatever the block's other indices do (proved with
isl: `polyhedra.writes_disjoint` with the index first); the innermost `dims` of them are
split by tiling into a grid index (`i_g`, one work-group per tile) and a thread index
(`i`, one work-item per point of the tile):

    block s [i:100, j:60, k:64]          block s [i_g:13, j_g:4] schedule(grid(i_g), grid(j_g))
                                  ->       block s_tile [i:8, j:16, k:64, i_g = i_g, j_g = j_g]
                                             schedule(thread(i), thread(j))   + overflow constraint

A work-group has up to `threads` work-items, shared out by doubling each mapped index's
share in turn, innermost first (the innermost is usually the output's unit-stride
dimension, so neighbouring work-items touch neighbouring elements). A tile that does not
divide its range adds the tiling's overflow constraint: the work-items past the end of
the last tile do nothing, the others run the same code. Indices that are not mapped
(reductions, and indices whose iterations share output elements) stay serial loops
inside a work-item; a block with no mappable index runs in one work-item. Local buffers
of a block stay private to each work-item. The thread tile sizes are the inner block's
ranges, so the schedule holds every decision the backend needs.

Promotion (TC §5.5): a thread tile that is a reduction (one store, adding into its output)
stages the inputs its work-items share (an access missing a thread index: `A(i, k)` is
read by every `j`) through local memory, `tile_k` iterations of its first reduction index
at a time, within `shared_bytes`, and keeps its accumulator in a register
(`BlockSchedule.stage`, lowered by polytile.loops.gpu_tile). Each of its work-items
computes `unroll` points along each mapped index (a register tile: `i` over the
work-items, `i_r` over its points, recorded as `unroll(i_r)`), so every staged element
it reads serves `unroll` accumulators. Each row of a staged box is `pad` (1) elements
longer than the data, against bank conflicts.

Reductions across work-items (TC: reductions across threads, as a tree in shared
memory): a leaf reduction whose only loop besides its output's indices is one reduction
of at least 16 iterations, and that is not staged, runs one work-group per output point
with `reduce` (64) work-items sharing the reduction (`BlockSchedule.across`): each
combines every 64th term in a register, then the group combines the partial results in
a tree in local memory (row maxima and sums of softmax and layernorm, a dot product into
a scalar). With `warp` (the cuda targets: 32; 0 by default, as OpenCL has no portable
warp), groups of 1 to `warp` whole warps combine them by warp shuffles instead
(`Across.warp`, FusionStitching's warp composition); row groups likewise.

Row groups (FusionStitching's block composition): a fused row block of pass `fuse`
(softmax, layernorm) runs one row per work-group, `rows` (64) work-items sharing each of
its members, the row's intermediates in local memory (`BlockSchedule.rows`; decided by
polytile.passes.gpu_rows); where it cannot, a row per work-item as above.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from polytile.errors import ArgumentError
from polytile.ir import nodes as N
from polytile.ir import polyhedra
from polytile.ir.rows import plain_leaf
from polytile.passes.gpu_rows import row_group, warp_of
from polytile.passes.pipeline import between, count, register
from polytile.passes.tile import substitute_local, tile
from polytile.targets.target import Target

DEFAULT_THREADS = 64     # work-items per work-group
DEFAULT_DIMS = 3         # mapped indices per kernel
MAX_DIMS = 3             # OpenCL and CUDA index spaces have three dimensions
MAX_THREADS = 1024       # CUDA's limit, below OpenCL devices' usual one
DEFAULT_TILE_K = 16      # reduction iterations per staged tile (0: no staging)
DEFAULT_SHARED_BYTES = 16384   # local memory a work-group's staged tiles may take
# CUDA's limit for a block's static __shared__ arrays (more needs dynamic shared memory
# and an opt-in per kernel, which the CUDA backend does not do).
CUDA_STATIC_SHARED_BYTES = 49152
DEFAULT_UNROLL = 2       # points per work-item along each mapped index of a staged block
MAX_UNROLL = 8
DEFAULT_REDUCE = 64      # work-items sharing a reduction across a group (0: never)
DEFAULT_ROWS = 64        # work-items sharing a fused row (0: a row per work-item)
MIN_ACROSS = 16          # shorter reductions stay serial in a work-item
MAX_WARP = 64            # work-items of a warp (NVIDIA: 32; 0, the default: no shuffles)
# Elements added to each row of a staged box: rows of 16 floats read down a column by
# neighbouring work-items would fall in the same of 32 banks every other row; 17 apart,
# never (TC pads shared arrays the same way).
DEFAULT_PAD = 1
MAX_PAD = 16
MAX_TILE_K = 256


def mappable(block: N.Block) -> list[str]:
    """The block's loop indices whose iterations write disjoint elements however the
    other indices vary: each can run across work-groups or work-items, together."""
    found = []
    for index in block.idxs:
        if index.affine is not None or index.range <= 1:
            continue
        first = replace(block, idxs=(index, *(i for i in block.idxs if i is not index)))
        if polyhedra.writes_disjoint(first, index.name):
            found.append(index.name)
    return found


def thread_sizes(block: N.Block, mapped: list[str], threads: int) -> dict[str, int]:
    """Work-items per work-group along each mapped index: the sizes double in turn,
    innermost first, while the group stays within `threads` and a size within its range
    (64 threads over two long indices: 8 x 8, a square tile whose staged inputs are reused
    8 times each; over one: 64)."""
    sizes = {name: 1 for name in mapped}
    grown = True
    while grown:
        grown = False
        for name in reversed(mapped):
            if math.prod(sizes.values()) * 2 <= threads \
                    and sizes[name] < block.index(name).range:
                sizes[name] = min(2 * sizes[name], block.index(name).range)
                grown = True
    return sizes


def box(ref: N.Refinement, ranges: dict[str, int], pad: int = 0) -> int:
    """Elements of the smallest box holding what `ref` reads while the indices in
    `ranges` take that many values each (the others fixed), each row `pad` longer."""
    size = 1
    for d, a in enumerate(ref.access):
        extent = 1 + sum(abs(c) * (ranges[n] - 1) for n, c in a.terms if n in ranges)
        size *= extent + (pad if d == len(ref.access) - 1 else 0)
    return size


def stageable(block: N.Block, aggs: tuple[str, ...] = ("add",)) -> bool:
    """Whether a block's shape allows staging (or a reduction across work-items): a leaf
    whose one store aggregates into its output with one of `aggs`, without
    data-dependent subscripts (a failed check ends its work-item, which must not happen
    between barriers)."""
    if not plain_leaf(block):
        return False
    stores = [st for st in block.stmts if isinstance(st, N.Store)]
    return len(stores) == 1 and block.ref(stores[0].ref).agg in aggs


def staging(block: N.Block, threads: list[str], tile_k: int, shared_bytes: int,
            registers: tuple[str, ...] = (), pad: int = 0) -> N.Staged | None:
    """How a thread tile stages its reduction through local memory (N.Staged), or None
    where it does not: a stageable block with a reduction loop; the staged inputs are
    those that some other work-item of the group reads too (their access misses a thread
    index: TC's reuse test), if their boxes for one reduction tile fit in
    `shared_bytes`."""
    if not stageable(block):
        return None
    (store,) = [st for st in block.stmts if isinstance(st, N.Store)]
    loops = {i.name: i.range for i in block.idxs if i.affine is None}
    written = {n for a in block.ref(store.ref).access for n in a.names}
    reductions = [n for n, r in loops.items() if n not in threads and n not in written
                  and r > 1]
    if not reductions:
        return None
    index = reductions[0]
    # What varies within one box: the work-items, their register tiles and the
    # reductions (other output indices are uniform loops around the whole reduction).
    varying = set(threads) | set(registers) | set(reductions)
    ranges = {n: r for n, r in loops.items() if n in varying}
    ranges[index] = min(tile_k, loops[index])
    read = {st.ref for st in block.stmts if isinstance(st, N.Load)}
    staged = [r for r in block.refs if r.dir == "in" and r.from_ and r.into in read
              and r.access and not all(any(a.coeff(t) for a in r.access) for t in threads)]
    size = sum(box(r, ranges, pad) * r.shape.dtype.numpy.itemsize for r in staged)
    if not staged or size > shared_bytes:
        return None
    return N.Staged(index, ranges[index], tuple(r.into for r in staged), pad)


def register_split(block: N.Block, threads: dict[str, int]) -> tuple[N.Block, list[str]]:
    """Each thread index `i` of `block` whose range exceeds its work-items `T` split in
    two: `i` over the work-items and `i_r` over the points each computes, the original
    index being `i + T*i_r` (work-items side by side: neighbours read neighbouring
    elements). The register indices are returned; a point past the range is cut by a
    constraint."""
    values: dict[str, N.Affine] = {}
    idxs: list[N.Index] = []
    extra: list[N.Index] = []
    cut: list[N.Affine] = []          # over the new indices: added after substituting
    names = {i.name for i in block.idxs}
    for index in block.idxs:
        count = threads.get(index.name, 0)
        if not count or index.range <= count or index.name + "_r" in names:
            idxs.append(index)
            continue
        points = -(-index.range // count)
        reg = index.name + "_r"
        values[index.name] = N.Affine.of({index.name: 1, reg: count})
        idxs.append(N.Index(index.name, count))
        extra.append(N.Index(reg, points))
        if count * points > index.range:
            cut.append(N.Affine.constant(index.range - 1) - values[index.name])
    if not values:
        return block, []
    refs = tuple(replace(r, access=tuple(a.substitute(values) for a in r.access))
                 for r in block.refs)
    loops = [i for i in idxs if i.affine is None]
    passed = [i for i in idxs if i.affine is not None]
    split = replace(block, idxs=tuple(loops + extra + passed),
                    constraints=tuple(c.substitute(values) for c in block.constraints) + tuple(cut),
                    refs=refs, stmts=substitute_local(block.stmts, values))
    return split, [i.name for i in extra]


def across(block: N.Block, mapped: list[str], dims: int, threads: int,
           warp: int = 0) -> N.Across | None:
    """A reduction across work-items (N.Across) for a block whose only other loop is one
    reduction of at least MIN_ACROSS iterations, when its output indices are all mappable
    to the grid (a point per work-group), or None. The group is the largest power of two
    up to `threads` and the reduction's range; its partial results are combined by warp
    shuffles where `warp_of` says so."""
    if not threads or not stageable(block, aggs=("add", "mul", "max", "min")):
        return None
    (store,) = [st for st in block.stmts if isinstance(st, N.Store)]
    written = {n for a in block.ref(store.ref).access for n in a.names}
    loops = [i for i in block.idxs if i.affine is None and i.range > 1]
    reductions = [i for i in loops if i.name not in written]
    if len(reductions) != 1 or not written <= set(mapped) or len(written) > dims \
            or reductions[0].range < MIN_ACROSS:
        return None
    group = 1
    while group * 2 <= min(threads, reductions[0].range):
        group *= 2
    return N.Across(reductions[0].name, group, warp_of(group, warp))


def map_across(block: N.Block, reduce: N.Across, parent_sizes: dict[str, tuple[int, ...]]
               ) -> N.Block:
    """One work-group per output point (tiles of 1 along the output's indices), its
    work-items sharing the reduction."""
    (store,) = [st for st in block.stmts if isinstance(st, N.Store)]
    written = [i.name for i in block.idxs
               if any(i.name in a.names for a in block.ref(store.ref).access)]
    tiled = tile(block, {n: 1 for n in written}, parent_sizes, suffix="_g",
                 outer_tags=frozenset({"grid"}))
    if tiled is block:
        return replace(block, schedule=replace(block.schedule, across=reduce))
    inner = tiled.stmts[0]
    assert isinstance(inner, N.Block)
    inner = replace(inner, schedule=replace(inner.schedule, across=reduce))
    grid = tuple((i.name, "grid") for i in tiled.idxs if i.affine is None)
    return replace(tiled, stmts=(inner,), schedule=N.BlockSchedule(gpu=grid))


def map_block(block: N.Block, threads: int, dims: int,
              parent_sizes: dict[str, tuple[int, ...]], tile_k: int = 0,
              shared_bytes: int = 0, unroll: int = 1, reduce_threads: int = 0,
              pad: int = 0, warp: int = 0) -> N.Block:
    """`block` as a grid of work-groups over thread tiles (see the module docstring)."""
    mapped = mappable(block)
    # A reduction is staged where it can be, else shared across work-items where it can.
    reduce = across(block, mapped, dims, reduce_threads, warp)
    mapped = mapped[-dims:]
    if not mapped:
        return block if reduce is None else map_across(block, reduce, parent_sizes)
    sizes = thread_sizes(block, mapped, threads)
    # A staged reduction's work-item computes `unroll` points along each mapped index
    # (a register tile): the group's tile of data is its work-items times that.
    registers = unroll if tile_k and unroll > 1 and stageable(block) else 1
    data = {n: min(block.index(n).range, size * registers) for n, size in sizes.items()}
    tiled = tile(block, data, parent_sizes, suffix="_g", outer_tags=frozenset({"grid"}))
    schedule = replace(block.schedule, gpu=tuple((n, "thread") for n in mapped))
    if tiled is block:         # every tile is a whole range: one work-group
        inner = replace(block, idxs=_first(block.idxs, mapped), schedule=schedule)
    else:
        first = tiled.stmts[0]
        assert isinstance(first, N.Block)
        # Local buffers stay private to each work-item: declared by the thread tile only.
        private = {r.into: r for r in block.refs if not r.from_ and r.dir == "none"}
        inner = replace(first, idxs=_first(first.idxs, mapped), schedule=schedule,
                        refs=tuple(private.get(r.into, r) for r in first.refs))
    unrolled: list[str] = []
    if registers > 1:
        inner, unrolled = register_split(inner, sizes)
    stage = (staging(inner, mapped, tile_k, shared_bytes, tuple(unrolled), pad) if tile_k
             else None)
    if stage is None and unrolled:      # no staging after all: one point per work-item
        return map_block(block, threads, dims, parent_sizes, tile_k, shared_bytes, 1,
                         reduce_threads, pad, warp)
    if stage is None and reduce is not None:
        return map_across(block, reduce, parent_sizes)
    if stage is not None:
        inner = replace(inner, schedule=replace(inner.schedule, stage=stage,
                                                unroll=tuple(unrolled)))
    if tiled is block:
        return inner
    grid = tuple((i.name, "grid") for i in tiled.idxs if i.affine is None)
    return replace(tiled, refs=tuple(r for r in tiled.refs if r.into not in private),
                   stmts=(inner,), schedule=N.BlockSchedule(gpu=grid))


def _first(idxs: tuple[N.Index, ...], names: list[str]) -> tuple[N.Index, ...]:
    """The mapped indices first (outermost), in their order: a block's iterations are
    independent, so any loop order means the same, and thread loops must enclose the
    serial ones."""
    return (tuple(i for n in names for i in idxs if i.name == n)
            + tuple(i for i in idxs if i.name not in names))


def gpu(fn: N.Function, target: Target, params: dict[str, Any]) -> N.Function:
    threads = params.get("threads", DEFAULT_THREADS)
    dims = params.get("dims", DEFAULT_DIMS)
    if not 1 <= threads <= MAX_THREADS or not 1 <= dims <= MAX_DIMS:
        raise ArgumentError(f"gpu.threads must be 1..{MAX_THREADS} and gpu.dims 1..{MAX_DIMS}, "
                            f"got {threads} and {dims}")
    tile_k = params.get("tile_k", DEFAULT_TILE_K)
    shared_bytes = params.get("shared_bytes", DEFAULT_SHARED_BYTES)
    if target.backend == "cuda" and shared_bytes > CUDA_STATIC_SHARED_BYTES:
        raise ArgumentError(f"gpu.shared_bytes is {shared_bytes}, above the "
                            f"{CUDA_STATIC_SHARED_BYTES} bytes of static shared memory a "
                            f"CUDA block may declare ({target.name})",
                            hint="dynamic shared memory (an H100's 227 KiB) is not built: "
                                 f"use at most {CUDA_STATIC_SHARED_BYTES}")
    unroll = params.get("unroll", DEFAULT_UNROLL)
    reduce_threads = params.get("reduce", DEFAULT_REDUCE)
    pad = params.get("pad", DEFAULT_PAD)
    rows = params.get("rows", DEFAULT_ROWS)
    warp = params.get("warp", 0)
    sizes = {r.into: r.shape.sizes for r in fn.body.refs}

    def mapped(block: N.Block) -> N.Block:
        grouped = row_group(block, rows, shared_bytes, warp) if rows else None
        return grouped or map_block(block, threads, dims, sizes, tile_k, shared_bytes,
                                    unroll, reduce_threads, pad, warp)

    stmts = tuple(mapped(s) if isinstance(s, N.Block) and s.schedule.mma is None else s
                  for s in fn.body.stmts)       # pass tensor_cores mapped the others
    return replace(fn, body=replace(fn.body, stmts=stmts))


def _warp_size(value: Any) -> str | None:
    problem = between(0, MAX_WARP)(value)
    if problem or value & (value - 1) == 0:
        return problem
    return f"must be 0 or a power of two, got {value}"


register("gpu", gpu, threads=between(1, MAX_THREADS), dims=between(1, MAX_DIMS),
         tile_k=between(0, MAX_TILE_K), shared_bytes=count, unroll=between(1, MAX_UNROLL),
         reduce=between(0, MAX_THREADS), pad=between(0, MAX_PAD),
         rows=between(0, MAX_THREADS), warp=_warp_size)
