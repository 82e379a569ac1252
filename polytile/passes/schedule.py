"""A kernel block's schedule: every decision the CPU passes make, as one value.

The heuristics (`polytile.passes.autotile`) compute a default; the autotuner
replaces it. `apply_schedule` rewrites the block accordingly:

    block s [m:M, n:N, k:K]          block s [m_t, n_t, k_t] #tiled #parallel    (cache tiles)
                               ->      block s_tile [m_t2, n_t2, ...]            (register tiles)
                                         block s_tile_tile [m:mr, n:VL*W, k:kc] #regtile
                                                           #vec=n #unroll=m       (micro-kernel)
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from polytile.ir import nodes as N
from polytile.passes.tile import tile


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

    def text(self) -> str:
        """Canonical text (cache keys, tuning records)."""
        unroll = ",".join(f"{k}:{v}" for k, v in self.unroll)
        tiles = ",".join(f"{k}:{v}" for k, v in self.tiles)
        order = f" order={','.join(self.order)}" if self.order else ""
        return (f"vec={self.vector}x{self.lanes}x{self.vectors} unroll={unroll} "
                f"tiles={tiles} parallel={int(self.parallel)}{order}")


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
    leaf_tags = {"regtile"}
    if schedule.vector is not None:
        leaf_tags |= {f"vec={schedule.vector}", f"lanes={schedule.lanes}"}
        leaf_tags |= {f"unroll={k}" for k, _ in schedule.unroll}
    register = dict(schedule.unroll)
    inner = _at(result, inner_path)
    inner_ranges = {i.name: i.range for i in inner.idxs if i.affine is None}
    if schedule.vector is not None and _is_parallel(inner, schedule.vector):
        register[schedule.vector] = schedule.lanes * schedule.vectors
    register = {k: v for k, v in register.items() if k in inner_ranges and v < inner_ranges[k]}
    if register:
        holder = result if inner_path else parent
        tiled_inner = tile(inner, register, _sizes(holder), suffix="_r",
                           outer_tags=frozenset({"regtiles"}))
        tiled_inner = _vector_tiles_first(tiled_inner, schedule.vector)
        leaf = tiled_inner.stmts[0]
        assert isinstance(leaf, N.Block)
        tiled_inner = replace(tiled_inner, stmts=(replace(leaf, tags=leaf.tags | leaf_tags),))
        result = _replace_at(result, inner_path, tiled_inner)
    else:
        result = _replace_at(result, inner_path, replace(inner, tags=inner.tags | leaf_tags))
    if schedule.parallel and cache and any(_is_parallel(block, k) for k in cache):
        result = replace(result, tags=result.tags | {"parallel"})
    return result


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
