"""Pass `tensor_cores`: run contractions on a GPU's warp-level matrix instructions
(Tensor Cores' `mma.sync`, described in TC in polytile/isa; UNIT §IV on a GPU target).

For every top-level contraction, the inspector (polytile.isa.inspect) lists the mappings
of each warp-level instruction the target provides (feature `tensor_cores`: the cuda
targets); this pass takes the first mapping whose operands are both read along their
loops (no broadcast), on a block whose only reduction is the instruction's K loop,
preferring the mapping whose N loop is the output's last (unit-stride) dimension. It
records `schedule(mma(instruction, rows, cols, reduction, warps_m, warps_n))` and tags
the block `tensorized` instead of `kernel`/`contraction`, so pass `gpu` leaves it alone;
polytile.loops.warp_mma lowers it: a GPU block of `warps_m` x `warps_n` warps, each warp
computing one M x N tile of the output (16 x 8 for m16n8k16), both operands staged
through shared memory one K tile at a time, zero-filled past the ends of M, N and K (so
every size is computed, and a zero adds nothing to the sum).

    block s0 [i0:M, i1:N, i2:K] #contraction #kernel (     block s0 [i0:M, i1:N, i2:K]
      out o0 <- o0[i0, i1] float32:add               ->       #tensorized schedule(
      in p0 <- p0[i0, i2] float16                              mma(mma_f16_m16n8k16,
      in p1 <- p1[i1, i2] float16 ... )                          i0, i1, i2, 2, 2)) (...)

Parameters: `enabled` (default true), `warps_m`, `warps_n` (warps of a block along the
instruction's M and N loops, default 2 and 2: 128 threads, 32 x 16 outputs per block).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from polytile.errors import ArgumentError
from polytile.ir import nodes as N
from polytile.isa import WARP, Description, descriptions
from polytile.isa.inspect import Mapping, mappings, output, uses
from polytile.passes.pipeline import count, flag, register
from polytile.targets.target import Target

DEFAULT_WARPS = 2
MAX_WARPS = 8          # along each loop
MAX_THREADS = 1024     # a CUDA block's


def warp_instructions(target: Target) -> list[Description]:
    """The warp-level instructions `target` provides and its backend prints."""
    return [d for d in descriptions() if d.definition.warp and target.has(d.feature)
            and target.backend in d.definition.forms]


def tensor_cores(fn: N.Function, target: Target, params: dict[str, Any]) -> N.Function:
    if not params.get("enabled", True):
        return fn
    usable = warp_instructions(target)
    warps = (params.get("warps_m", DEFAULT_WARPS), params.get("warps_n", DEFAULT_WARPS))
    if warps[0] * warps[1] * WARP > MAX_THREADS:
        raise ArgumentError(f"tensor_cores.warps_m x warps_n is {warps[0]} x {warps[1]} warps, "
                            f"more than a block's {MAX_THREADS} threads")
    if not usable:
        return fn
    stmts = tuple(_mapped(s, usable, warps) if isinstance(s, N.Block) else s
                  for s in fn.body.stmts)
    return replace(fn, body=replace(fn.body, stmts=stmts))


def _mapped(block: N.Block, usable: list[Description], warps: tuple[int, int]) -> N.Block:
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
            tiled = N.WarpTiled(d.name, rows, cols, red, *warps)
            tags = (block.tags - {"kernel", "contraction"}) | {"tensorized"}
            return replace(block, tags=tags, schedule=N.BlockSchedule(mma=tiled))
    return block


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


def _warps(value: Any) -> str | None:
    problem = count(value)
    if problem or 1 <= value <= MAX_WARPS:
        return problem
    return f"must be 1..{MAX_WARPS}, got {value}"


register("tensor_cores", tensor_cores, enabled=flag, warps_m=_warps, warps_n=_warps)
