"""Pass `gpu`: map each kernel's parallel indices to a GPU's grid and the threads of a block
(Tensor Comprehensions §5.4), for any GPU backend (OpenCL now; a CUDA printer reads the same
schedule).

Each top-level statement block is one kernel launch. Its mappable indices are those whose
iterations write disjoint elements whatever the block's other indices do (proved with isl:
`polyhedra.writes_disjoint` with the index first); up to `dims` of them, outermost first,
are split by tiling into a grid index (`i_g`, one work-group per tile) and a thread index
(`i`, one work-item per point of the tile):

    block s [i:100, j:60, k:64]          block s [i_g:13, j_g:4] schedule(grid(i_g), grid(j_g))
                                  ->       block s_tile [i:8, j:16, k:64, i_g = i_g, j_g = j_g]
                                             schedule(thread(i), thread(j))   + overflow constraint

The innermost mapped index gets the most threads (`threads` per work-group in all; it is
usually the output's unit-stride dimension, so neighbouring work-items touch neighbouring
elements). A tile that does not divide its range adds the tiling's overflow constraint: the
work-items past the end of the last tile do nothing, the others run the same code. Indices
that are not mapped (reductions, and indices whose iterations share output elements) stay
serial loops inside a work-item; a block with no mappable index runs in one work-item.
Local buffers of a block stay private to each work-item. The thread tile sizes are the
inner block's ranges, so the schedule holds every decision the backend needs.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from polytile.errors import ArgumentError
from polytile.ir import nodes as N
from polytile.ir import polyhedra
from polytile.passes.pipeline import count, register
from polytile.passes.tile import tile
from polytile.targets.target import Target

DEFAULT_THREADS = 64     # work-items per work-group
DEFAULT_DIMS = 2         # mapped indices per kernel
MAX_DIMS = 3             # OpenCL and CUDA index spaces have three dimensions
MAX_THREADS = 1024       # CUDA's limit, below OpenCL devices' usual one


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
    """Work-items per work-group along each mapped index: the innermost as many as it has
    iterations, up to `threads`; each outer one what is left of the budget."""
    sizes: dict[str, int] = {}
    left = threads
    for name in reversed(mapped):
        size = max(1, min(block.index(name).range, left))
        sizes[name] = size
        left = max(1, left // size)
    return sizes


def map_block(block: N.Block, threads: int, dims: int,
              parent_sizes: dict[str, tuple[int, ...]]) -> N.Block:
    """`block` as a grid of work-groups over thread tiles (see the module docstring)."""
    mapped = mappable(block)[:dims]
    if not mapped:
        return block
    sizes = thread_sizes(block, mapped, threads)
    tiled = tile(block, sizes, parent_sizes, suffix="_g", outer_tags=frozenset({"grid"}))
    if tiled is block:         # every tile is a whole range: one work-group
        return replace(block, idxs=_first(block.idxs, mapped),
                       schedule=replace(block.schedule, gpu=tuple((n, "thread")
                                                                  for n in mapped)))
    inner = tiled.stmts[0]
    assert isinstance(inner, N.Block)
    # Local buffers stay private to each work-item: declared by the thread tile only.
    private = {r.into: r for r in block.refs if not r.from_ and r.dir == "none"}
    inner = replace(inner, idxs=_first(inner.idxs, mapped),
                    refs=tuple(private.get(r.into, r) for r in inner.refs),
                    schedule=replace(inner.schedule,
                                     gpu=tuple((n, "thread") for n in mapped)))
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
    sizes = {r.into: r.shape.sizes for r in fn.body.refs}
    stmts = tuple(map_block(s, threads, dims, sizes) if isinstance(s, N.Block) else s
                  for s in fn.body.stmts)
    return replace(fn, body=replace(fn.body, stmts=stmts))


def _threads(value: Any) -> str | None:
    problem = count(value)
    if problem or 1 <= value <= MAX_THREADS:
        return problem
    return f"must be 1..{MAX_THREADS}, got {value}"


def _dims(value: Any) -> str | None:
    problem = count(value)
    if problem or 1 <= value <= MAX_DIMS:
        return problem
    return f"must be 1..{MAX_DIMS}, got {value}"


register("gpu", gpu, threads=_threads, dims=_dims)
