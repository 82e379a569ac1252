"""A kernel block's schedule: every decision the CPU passes make, as one value.

The heuristics (`polytile.passes.autotile`) compute a default; the autotuner
replaces it. `apply_schedule` rewrites the block accordingly and records the result
as typed data on the blocks (`polytile.ir.nodes.BlockSchedule`), which the code
generator prints:

    block s [m:M, n:N, k:K]     block s [m_c, n_c, k_c] #tiled schedule(parallel(m_c))
                          ->      block s_tile [m_r, n_r, ...] #regtiles            (register tiles)
                                    block s_tile_tile [m:mr, n:VL*W, k:kc]
                                      schedule(micro, vector(n, float32, VL), unroll(m))
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from polytile import dtypes
from polytile.analysis.vectorizable import boundary_versions, why_not_vector
from polytile.dtypes import DType
from polytile.errors import ArgumentError
from polytile.ir import nodes as N
from polytile.ir import polyhedra
from polytile.passes.tile import tile
from polytile.targets.target import Target

# Bounds on what a schedule may ask for, beyond which code size explodes (they are far
# above what the heuristics and the tuner's space use: 8 per index, 4 vectors).
MAX_UNROLL = 64           # register tile factor of one index
MAX_VECTORS = 16          # vectors per register tile along the vector index
MAX_REGISTER_TILE = 256   # copies of the body in one micro-kernel (unroll product x vectors)
MAX_PREFETCH = 64         # iterations a gathered row is prefetched ahead
# An L1 data cache indexed by the address within a page has a page's worth of sets per
# way (Haswell to Zen 3: 32 KiB, 8 ways of 4 KiB; Ice Lake: 48 KiB, 12 ways of 4 KiB).
PAGE_BYTES = 4096


@dataclass(frozen=True)
class Schedule:
    vector: str | None = None                     # index run across SIMD lanes
    lanes: int = 1                                 # lanes per vector
    unroll: tuple[tuple[str, int], ...] = ()       # register tile: index -> factor
    vectors: int = 1                               # vectors per register tile along `vector`
    tiles: tuple[tuple[str, int], ...] = ()        # cache tile: index -> size
    parallel: bool = True                          # run the outer tile loop with OpenMP
    order: tuple[str, ...] = ()                    # cache tile loops, outermost first
                                                   # (indices of `tiles`; () = block order)
    prefetch: int = 0                              # gathered rows, iterations ahead

    def text(self) -> str:
        """Canonical text (cache keys, tuning records)."""
        unroll = ",".join(f"{k}:{v}" for k, v in self.unroll)
        tiles = ",".join(f"{k}:{v}" for k, v in self.tiles)
        order = f" order={','.join(self.order)}" if self.order else ""
        prefetch = f" prefetch={self.prefetch}" if self.prefetch else ""
        return (f"vec={self.vector}x{self.lanes}x{self.vectors} unroll={unroll} "
                f"tiles={tiles} parallel={int(self.parallel)}{order}{prefetch}")


def full_lanes(block: N.Block, target: Target) -> int:
    """Lanes of one of the target's vectors of the block's output element type."""
    return max(1, target.vector_bytes // max(1, _element_type(block).bits // 8))


def check_schedule(block: N.Block, schedule: Schedule, target: Target) -> None:
    """Refuse a schedule (from the tuner, the tuning database or a caller) that names
    indices the block does not have or asks for more than the target's hardware: a
    vector wider than the target's registers would be written past its output."""
    where = f"schedule of block {block.name}"
    check_schedule_values(schedule, full_lanes(block, target), target.name, where)
    loops = [i.name for i in block.idxs if i.affine is None]
    named = [("vector index", schedule.vector)] if schedule.vector is not None else []
    named += [("unrolled index", n) for n, _ in schedule.unroll]
    named += [("tiled index", n) for n, _ in schedule.tiles]
    for what, name in named:
        if name not in loops:
            merged = [i for i in loops if name in i.split("_")]
            # A record made before pass collapse merged this index with its neighbour.
            also = (f"; pass collapse merged {name} into {merged[0]} (name that index, or "
                    "set collapse.enabled to false)" if merged else "")
            raise ArgumentError(f"{where}: {what} {name!r} is not an index of the block",
                                hint=f"its indices are {', '.join(loops) or 'none'}{also}")


def check_schedule_values(schedule: Schedule, widest: int, target: str, where: str) -> None:
    """The checks of a schedule that need no program: lanes a power of two up to
    `widest`, and factors and sizes within bounds."""
    lanes = schedule.lanes
    if not isinstance(lanes, int) or lanes < 1 or lanes & (lanes - 1) or lanes > widest:
        raise ArgumentError(f"{where}: lanes {lanes!r} is not possible on target {target}",
                            hint=f"use a power of two up to {widest}")
    if not 1 <= schedule.vectors <= MAX_VECTORS:
        raise ArgumentError(f"{where}: vectors {schedule.vectors} is outside 1..{MAX_VECTORS}")
    for name, factor in schedule.unroll:
        if not 1 <= factor <= MAX_UNROLL:
            raise ArgumentError(f"{where}: unroll factor {factor} of {name} is outside "
                                f"1..{MAX_UNROLL}")
    copies = math.prod(f for _, f in schedule.unroll) * schedule.vectors
    if copies > MAX_REGISTER_TILE:
        raise ArgumentError(f"{where}: a register tile of {copies} copies of the body is "
                            f"more than {MAX_REGISTER_TILE}", hint="unroll less")
    if not 0 <= schedule.prefetch <= MAX_PREFETCH:
        raise ArgumentError(f"{where}: prefetch distance {schedule.prefetch} is outside "
                            f"0..{MAX_PREFETCH}")
    for name, size in schedule.tiles:
        if size < 1:
            raise ArgumentError(f"{where}: tile size {size} of {name} is not positive")
    tiled = [name for name, _ in schedule.tiles]
    if len(set(schedule.order)) != len(schedule.order) or not set(schedule.order) <= set(tiled):
        raise ArgumentError(f"{where}: order {list(schedule.order)} must name tiled indices "
                            f"once each", hint=f"the tiled indices are {', '.join(tiled)}")


def apply_schedule(block: N.Block, schedule: Schedule, parent: N.Block) -> N.Block:
    """Cache tiling, then register tiling; the innermost block is tagged for the
    vector code generator, the outermost (if it iterates) for OpenMP. `parent` is the
    block that holds `block` (its views bound the tiles' views)."""
    ranges = {i.name: i.range for i in block.idxs if i.affine is None}
    cache = {k: v for k, v in schedule.tiles if k in ranges and v < ranges[k]}
    result = block
    inner_path: list[int] = []
    if cache:
        result = _ordered(tile(block, cache, _sizes(parent), suffix="_c"), schedule.order)
        inner_path = [0]
    leaf = N.BlockSchedule(micro=True)
    if schedule.vector is not None:
        leaf = replace(leaf, vector=N.VectorLoop(schedule.vector, _element_type(block),
                                                 schedule.lanes),
                       unroll=tuple(k for k, _ in schedule.unroll),
                       prefetch=schedule.prefetch if gathers(block) else 0)
    register = dict(schedule.unroll)
    inner = _at(result, inner_path)
    inner_ranges = {i.name: i.range for i in inner.idxs if i.affine is None}
    if schedule.vector is not None and _is_parallel(inner, schedule.vector):
        register[schedule.vector] = schedule.lanes * schedule.vectors
        # Split into panels (pass pack), a micro-kernel runs over one panel unless the
        # schedule unrolls more: the panel loop is a register tile loop, never the
        # micro-kernel's (which would then run every panel of a cache tile, and all of
        # them as scalar code where the tile's last panel is partial).
        register.setdefault(panel_index(schedule.vector), 1)
    register = {k: v for k, v in register.items() if k in inner_ranges and v < inner_ranges[k]}
    if register:
        holder = result if inner_path else parent
        tiled_inner = tile(inner, register, _sizes(holder), suffix="_r",
                           outer_tags=frozenset({"regtiles"}))
        tiled_inner = _vector_tiles_first(tiled_inner, schedule.vector)
        kernel = tiled_inner.stmts[0]
        assert isinstance(kernel, N.Block)
        tiled_inner = replace(tiled_inner, stmts=(_scheduled(kernel, leaf),))
        result = _replace_at(result, inner_path, tiled_inner)
    else:
        result = _replace_at(result, inner_path, _scheduled(inner, leaf))
    if schedule.parallel and cache and any(_is_parallel(block, k) for k in cache):
        result = replace(result, schedule=replace(result.schedule,
                                                  parallel=thread_loop(result)))
    return result


def gathers(block: N.Block) -> bool:
    """Whether the block reads through a data-dependent subscript (a gather)."""
    return any(isinstance(s, N.Load) and any(d is not None for d in s.dynamic)
               for s in block.stmts)


def thread_loop(block: N.Block, combined: tuple[str, ...] = ()) -> str | None:
    """The index whose loop runs in threads: the outermost loop (in the block's order)
    whose iterations write disjoint elements but for the `combined` buffers, proved
    with isl; None if there is none."""
    return next((i.name for i in block.idxs if i.affine is None and i.range > 1
                 and polyhedra.writes_disjoint(block, i.name, combined)), None)


def _scheduled(block: N.Block, leaf: N.BlockSchedule) -> N.Block:
    """The leaf's register-tile schedule, keeping what an earlier pass recorded (the
    transpose width of a pack copy). A vector index the block cannot run as vector code
    along (analysis.vectorizable: a view that does not move by one element, an int
    output, an op without a vector form; a tuner or a caller may ask for one) is not
    recorded: the schedule says scalar code, and the generator prints what it says. A
    vector leaf with constraints records how its boundary tiles run."""
    leaf = replace(leaf, transpose=block.schedule.transpose)
    if leaf.vector is not None and why_not_vector(replace(block, schedule=leaf),
                                                  leaf.vector.index) is not None:
        leaf = replace(leaf, vector=None, unroll=(), prefetch=0)
    leaf = replace(leaf, boundary=boundary_versions(replace(block, schedule=leaf)))
    return replace(block, schedule=leaf)


def _element_type(block: N.Block) -> DType:
    """The element type the block's vectors hold: its output's."""
    out = next((r for r in block.refs if r.dir in ("out", "inout")), None)
    return out.shape.dtype if out is not None else dtypes.FLOAT32


def _ordered(tiled: N.Block, order: tuple[str, ...]) -> N.Block:
    """The cache tile loops of `tiled` with those of `order` first, in that order (a
    Stripe block's iterations are independent: any loop order means the same)."""
    names = [n + "_c" for n in order]
    first = [i for n in names for i in tiled.idxs if i.name == n]
    return replace(tiled, idxs=tuple(first + [i for i in tiled.idxs if i.name not in names]))


def panel_index(name: str) -> str:
    """The index over the vector-width panels that pack.split_index splits `name` into."""
    return name + "_o"


def _vector_tiles_first(block: N.Block, vector: str | None) -> N.Block:
    """Iterate register tiles with the vector index outermost: consecutive micro-kernels
    then share the vector operand's panel, which stays in L1. After packing, the vector
    index's register tiles run over its panels."""
    if vector is None:
        return block
    names = (vector + "_r", panel_index(vector) + "_r")
    first = [i for i in block.idxs if i.name in names]
    return replace(block, idxs=tuple(first + [i for i in block.idxs if i.name not in names]))


def _sizes(block: N.Block) -> dict[str, tuple[int, ...]]:
    return {r.into: r.shape.sizes for r in block.refs}


def _is_parallel(block: N.Block, index: str) -> bool:
    """An index is parallel when every written view depends on it."""
    outs = [r for r in block.refs if r.dir in ("out", "inout")]
    return bool(outs) and all(any(a.coeff(index) for a in r.access) for r in outs)


def _at(block: N.Block, path: list[int]) -> N.Block:
    for k in path:
        child = block.stmts[k]
        assert isinstance(child, N.Block)
        block = child
    return block


def _replace_at(block: N.Block, path: list[int], new: N.Block) -> N.Block:
    if not path:
        return new
    k = path[0]
    child = block.stmts[k]
    assert isinstance(child, N.Block)
    stmts = list(block.stmts)
    stmts[k] = _replace_at(child, path[1:], new)
    return replace(block, stmts=tuple(stmts))
