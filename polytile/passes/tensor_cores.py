"""Pass `tensor_cores`: run contractions on a GPU's warp-level matrix instructions
(Tensor Cores' `mma.sync`, described in TC in polytile/isa; UNIT §IV on a GPU target).

For every top-level contraction, the inspector (polytile.isa.inspect) lists the mappings
of each warp-level instruction the target provides (feature `tensor_cores`: the cuda
targets); this pass takes the first mapping whose operands are both read along their
loops (no broadcast), on a block whose only reduction is the instruction's K loop,
preferring the mapping whose N loop is the output's last (unit-stride) dimension. It
records `schedule(mma(instruction, rows, cols, reduction, warps_m, warps_n, tiles_m,
tiles_n))` and tags the block `tensorized` instead of `kernel`/`contraction`, so pass
`gpu` leaves it alone; polytile.loops.warp_mma lowers it: a GPU block of `warps_m` x
`warps_n` warps, each warp computing `tiles_m` x `tiles_n` M x N tiles of the output
(16 x 8 for m16n8k16; each fragment of A it loads serves `tiles_n` instructions, each of
B `tiles_m`), both operands staged through shared memory one K step at a time,
zero-filled past the ends of M, N and K (so every size is computed, and a zero adds
nothing to the sum).

    block s0 [i0:M, i1:N, i2:K] #contraction #kernel (     block s0 [i0:M, i1:N, i2:K]
      out o0 <- o0[i0, i1] float32:add               ->       #tensorized schedule(
      in p0 <- p0[i0, i2] float16                              mma(mma_f16_m16n8k16,
      in p1 <- p1[i1, i2] float16 ... )                          i0, i1, i2, 2, 2, 2, 2)) (...)

Parameters: `enabled` (default true), `warps_m`, `warps_n` (warps of a block along the
instruction's M and N loops, default 2 and 2: 128 threads), `tiles_m`, `tiles_n` (a
warp's instruction tiles, default 2 and 2: 32 x 16 outputs per warp, 64 x 32 per block).
The staged tiles must fit a block's 48 KiB of shared memory.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from polytile.errors import ArgumentError
from polytile.ir import nodes as N
from polytile.isa import WARP, Description, descriptions
from polytile.isa.inspect import Mapping, mappings, output, uses
from polytile.passes.pipeline import between, flag, register
from polytile.targets.target import Target

DEFAULT_WARPS = 2      # per block, along M and along N
DEFAULT_TILES = 2      # instruction tiles per warp, along M and along N
MAX_WARPS = 8          # along each loop
MAX_TILES = 8
MAX_THREADS = 1024     # a CUDA block's
MAX_SHARED_BYTES = 48 * 1024   # a CUDA block's static shared memory


def warp_instructions(target: Target) -> list[Description]:
    """The warp-level instructions `target` provides and its backend prints."""
    return [d for d in descriptions() if d.definition.warp and target.has(d.feature)
            and target.backend in d.definition.forms]


def tensor_cores(fn: N.Function, target: Target, params: dict[str, Any]) -> N.Function:
    if not params.get("enabled", True):
        return fn
    usable = warp_instructions(target)
    counts = (params.get("warps_m", DEFAULT_WARPS), params.get("warps_n", DEFAULT_WARPS),
              params.get("tiles_m", DEFAULT_TILES), params.get("tiles_n", DEFAULT_TILES))
    if counts[0] * counts[1] * WARP > MAX_THREADS:
        raise ArgumentError(f"tensor_cores.warps_m x warps_n is {counts[0]} x {counts[1]} "
                            f"warps, more than a block's {MAX_THREADS} threads")
    if not usable:
        return fn
    stmts = tuple(_mapped(s, usable, counts) if isinstance(s, N.Block) else s
                  for s in fn.body.stmts)
    return replace(fn, body=replace(fn.body, stmts=stmts))


def _mapped(block: N.Block, usable: list[Description], counts: tuple[int, int, int, int]
            ) -> N.Block:
    if not {"kernel", "contraction"} <= block.tags or block.constraints \
            or any(isinstance(s, N.Block) for s in block.stmts):
        return block
    out = output(block)
    if out is None or not out.access:
        return block
    last = set(out.access[-1].names)
    for d in usable:
        found = [m for m in mappings(block, d.name, d.reduction) if _fits(block, d, m)]
        found.sort(key=lambda m: _loops(d, m)[1] not in last)     # N along unit stride first
        if found:
            rows, cols, red = _loops(d, found[0])
            tiled = N.WarpTiled(d.name, rows, cols, red, *counts)
            if shared_bytes(d, tiled) > MAX_SHARED_BYTES:
                raise ArgumentError(
                    f"tensor_cores: {counts[0]} x {counts[1]} warps of {counts[2]} x "
                    f"{counts[3]} tiles of {d.name} stage {shared_bytes(d, tiled)} bytes in "
                    f"shared memory, more than a block's {MAX_SHARED_BYTES}",
                    hint="lower tensor_cores.warps_m, warps_n, tiles_m or tiles_n")
            tags = (block.tags - {"kernel", "contraction"}) | {"tensorized"}
            return replace(block, tags=tags, schedule=N.BlockSchedule(mma=tiled))
    return block


def extents(d: Description) -> tuple[int, int, int]:
    """A warp-level instruction's M, N and K: its output's two loops and its reduction."""
    out = output(d.reduction)
    assert out is not None
    rows, cols = (a.names[0] for a in out.access)
    ranges = {i.name: i.range for i in d.reduction.idxs}
    (red,) = (n for n in ranges if n not in (rows, cols))
    return ranges[rows], ranges[cols], ranges[red]


def block_tile(d: Description, w: N.WarpTiled) -> tuple[int, int]:
    """The outputs (along M, along N) one GPU block computes."""
    tm, tn, _ = extents(d)
    return tm * w.warps_m * w.tiles_m, tn * w.warps_n * w.tiles_n


def shared_bytes(d: Description, w: N.WarpTiled) -> int:
    """The block's staged A and B rows of one K step and its output tiles."""
    _, _, tk = extents(d)
    acc, a, b = (t.dtype.numpy.itemsize for t in d.definition.inputs)
    bm, bn = block_tile(d, w)
    return bm * tk * a + bn * tk * b + bm * bn * acc


def _loops(d: Description, m: Mapping) -> tuple[str, str, str]:
    """The program's indices taking the instruction's M, N and K loops."""
    out = output(d.reduction)
    assert out is not None
    rows, cols = (a.names[0] for a in out.access)
    loops = dict(m.loops)
    red = next(p for q, p in m.loops if q not in (rows, cols))
    return loops[rows], loops[cols], red


def _fits(block: N.Block, d: Description, m: Mapping) -> bool:
    """Both operands read along the instruction's loops (a tile of each is staged), and
    the instruction's K loop is the block's only reduction."""
    if m.broadcast or len(m.loops) != 3:
        return False
    out = output(block)
    assert out is not None
    written = uses(out)
    _, _, red = _loops(d, m)
    return all(i.name in written or i.name == red or i.range == 1
               for i in block.idxs if i.affine is None)


register("tensor_cores", tensor_cores, enabled=flag, warps_m=between(1, MAX_WARPS),
         warps_n=between(1, MAX_WARPS), tiles_m=between(1, MAX_TILES),
         tiles_n=between(1, MAX_TILES))
