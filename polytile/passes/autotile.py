"""autotile (Stripe §3.3): choose each kernel's schedule from a cost model and apply it.

For every leaf kernel block:

1. vector index: an index that is stride-1 (coefficient 1 in the innermost,
   unit-stride dimension, absent elsewhere) in every view that uses it and that
   no data-dependent offset depends on. A parallel one gives outer-product
   micro-kernels (matmul, elementwise); a reduction one gives dot-product
   kernels with a horizontal sum (tmm, row reductions).
2. register tile: its width along the vector index (`register_vectors`, the one
   decision, which pass pack also asks to size its panels), and up to two other
   parallel indices that some input does not
   depend on (its loads are reused across the unrolled copies; of equal reuse, the
   one whose rows lie closest in memory), the broadcast one first, with as many
   accumulators as fit beside the vectors held through a step and one broadcast
   (12 + 3 + 1 of AVX2's 16 registers, 24 + 6 + 1 of AVX-512's 32).
3. cache tile: sizes of the parallel indices and of the largest reduction index
   that minimize cache lines touched per multiply-accumulate while the tile's
   footprint fits half of L2 and the outer loop keeps every core busy
   (coordinate descent over multiples of the register tile).

    block s1 [i0:128, i1:32, i2:256] #contraction  ->  block s1 [i0_c:2, i1_c:1] schedule(parallel(i0_c))
      out o0[i0, i1]:add  in p0[i0, i2]  in p1[i1, i2]     block s1_tile [i0_r:..] #regtiles
                              block [i0:4, i1:4, i2:256] schedule(micro, vector(i2, float32, 8), unroll(i0, i1))
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from polytile.analysis.deps import scalar_indices
from polytile.analysis.vectorizable import MASKED_LANES
from polytile.errors import ArgumentError
from polytile.ir import nodes as N
from polytile.ir.phases import stitch_schedule
from polytile.ir.verify import contiguous_along
from polytile.passes.epilogue import place
from polytile.passes.pipeline import register
from polytile.passes.schedule import (PAGE_BYTES, Schedule, _is_parallel, apply_schedule,
                                      check_schedule, panel_index, thread_loop)
from polytile.passes.sink import chunk_tiles
from polytile.targets.target import Target

VECTOR_DTYPES = ("float32", "float64", "int32", "int64")
PARALLEL_MIN_WORK = 1 << 15      # work (below) under which a kernel runs on one thread:
# waking OpenMP workers costs microseconds on an idle machine and up to a scheduler
# time slice on a busy one, so small kernels stay serial. Measured on the AMD EPYC host
# (benchmarks/kernel_ab.py, 5 ms between calls so the workers sleep): bias-GELU of 7k
# elements broke even on two threads (3 us), 21k ran 10 -> 6 us, 70k 34 -> 18 us; the old
# threshold of 1M left softmax 256x700 at 62 us on one thread (32 us on two).
GATHER_WEIGHT = 8                 # a data-dependent load costs a cache miss, not a cycle:
# 2LUT (128 bags of 50 rows of 64 floats, 410k iterations) took 0.18 ms on one thread and
# 0.094 ms on two (AMD EPYC host, polytile bench --only 2LUT).
GATHER_VECTORS = 4                # a gathered row is read whole, up to this many vectors:
PREFETCH_DISTANCE = 8             # and, from a table bigger than L2, prefetched this many
# lookups ahead. 2LUT (1M x 64 tables, 128 bags of 50; benchmarks/kernel_ab.py with hand
# variants, AMD EPYC host): half rows 0.046 ms, whole rows 0.031 ms with prefetch; no
# prefetch 0.050 ms, 4 ahead 0.030, 8 ahead 0.029, 16 ahead 0.035.

VECTOR_LOAD_WEIGHT = 1.5         # a vector load of a GEMM's panel streams 64 bytes through the
# caches (from L2 once the panel outgrows L1); a broadcast reads 4 bytes of a row whose
# line serves 16 steps. Of MLP1's gradient's 128x128 by 128x2000 GEMMs, 4x3 register tiles
# (4 broadcasts, 6 vector loads a step) ran 1.37-1.41 ms, 6x2 (6 and 4) 1.16-1.18 ms
# (Xeon, two threads, time_blocks); with equal weights the 4x3 tile, whose 63 panels
# divide by 3, scored higher.
PANEL_THREADS_MARGIN = 1.1        # a kernel reading packed panels runs its threads over
# them, each thread reading only the panels its own thread packed (the pack copy's
# threads split the panels the same way, in contiguous halves), unless the cost model
# finds that split this much worse than threads over the rows, which read every panel,
# half of them written by the other core, or the split gives a thread this much more
# than an even share (3 panels on 2 threads: 2 to one). In one process, two threads, Zen 3 EPYC
# (given schedules, time_blocks, 15-21 rounds): MLP1 128x2000x128 0.599 -> 0.527 and
# 0.574 -> 0.537 ms, tmm 128x1024^2 2.35 -> 2.19 and 2.40 -> 2.20 ms, tmm 1024^3
# 15.9 -> 15.0 ms; with benchmarks/option_ab.py --before autotile.PANEL_THREADS_MARGIN=0
# tmm 128x1024^2 read 2.13 on both sides in a later run (benchmarks/RESULTS.md).


def work(block: N.Block) -> int:
    """Iterations of `block`, each weighted by the data-dependent loads it issues."""
    gathers = sum(1 for s in block.stmts if isinstance(s, N.Load) and (s.dynamic or s.offset))
    iterations = math.prod(i.range for i in block.idxs if i.affine is None)
    return iterations * (1 + GATHER_WEIGHT * gathers)


def vector_candidates(block: N.Block) -> list[str]:
    """Indices that can run across SIMD lanes with plain (unit-stride) vector loads."""
    deps = scalar_indices(block)
    dynamic_deps: set[str] = set()
    for s in block.stmts:
        if isinstance(s, N.Load):
            for d in s.dynamic + (s.offset,):
                if d:
                    dynamic_deps |= deps[d]
        if isinstance(s, N.LoadIndex):
            dynamic_deps |= set(s.value.names)   # index values are not vectorized (yet)
    out = []
    for idx in block.idxs:
        if idx.affine is not None or idx.name in dynamic_deps or idx.range < 2:
            continue
        if all(_unit_stride(r, idx.name) for r in block.refs):
            out.append(idx.name)
    return out


def typed_vector_candidates(block: N.Block) -> list[str]:
    """The vector candidates along which every view holds the output's element type (a
    vector type of the generator); the others (gather subscripts) are read as scalars."""
    out = next((r for r in block.refs if r.dir in ("out", "inout")), None)
    if out is None or out.shape.dtype.name not in VECTOR_DTYPES:
        return []
    return [n for n in vector_candidates(block)
            if all(r.shape.dtype == out.shape.dtype for r in block.refs
                   if any(a.coeff(n) for a in r.access))]


def _unit_stride(ref: N.Refinement, index: str) -> bool:
    uses = [(d, a.coeff(index)) for d, a in enumerate(ref.access) if a.coeff(index)]
    if not uses:
        return True
    if len(uses) != 1:
        return False
    d, c = uses[0]
    return c == 1 and ref.shape.dims[d].stride == 1


def _gathers(block: N.Block) -> dict[tuple[str, int], set[str]]:
    """(view, dimension) read through a data-dependent subscript -> the indices that
    subscript depends on."""
    deps = scalar_indices(block)
    gathered: dict[tuple[str, int], set[str]] = {}
    for s in block.stmts:
        if isinstance(s, N.Load):
            for d, name in enumerate(s.dynamic):
                if name is not None:
                    gathered.setdefault((s.ref, d), set()).update(deps[name])
    return gathered


def _footprint(block: N.Block, tile: dict[str, int], line: int,
               inputs_only: bool = False) -> tuple[int, int]:
    """(bytes, cache lines) of all views (or the inputs) over one tile. A gathered
    dimension holds one element per value of the indices its subscript depends on, not
    the whole view."""
    total_bytes = total_lines = 0
    gathered = _gathers(block)
    for ref in block.refs:
        if inputs_only and ref.dir != "in":
            continue
        elem = max(1, ref.shape.dtype.bits // 8)
        extents = []
        for d, (a, dim) in enumerate(zip(ref.access, ref.shape.dims)):
            if (ref.into, d) in gathered:
                extents.append(min(dim.size, math.prod(tile.get(n, 1)
                                                        for n in gathered[ref.into, d])))
                continue
            extents.append(dim.size + sum(abs(c) * (tile.get(n, 1) - 1) for n, c in a.terms))
        if not extents:
            total_bytes += elem
            total_lines += 1
            continue
        inner = min(range(len(extents)), key=lambda d: ref.shape.dims[d].stride)
        rows = math.prod(e for d, e in enumerate(extents) if d != inner)
        contiguous = ref.shape.dims[inner].stride == 1
        per_row = math.ceil(extents[inner] * elem / line) + 1 if contiguous else extents[inner]
        total_bytes += math.prod(extents) * elem
        total_lines += rows * per_row
    return total_bytes, total_lines


def choose_schedule(block: N.Block, target: Target, member: bool = False) -> Schedule:
    """The block's schedule; a `member` of a fused row block runs inside the row's
    (threaded) loop: no threads of its own, and cache tiles only to sweep rows."""
    loops = {i.name: i.range for i in block.idxs if i.affine is None}
    out = next((r for r in block.refs if r.dir in ("out", "inout")), None)
    if out is None or not loops:
        return Schedule(parallel=False)
    dtype = out.shape.dtype
    parallel = [n for n in loops if _is_parallel(block, n)]
    reductions = [n for n in loops if n not in parallel]
    lanes = target.vector_bytes // max(1, dtype.bits // 8)
    vector, vectors = register_vectors(block, target)
    gathered = _gathers(block)
    picks = _unroll_picks(block, parallel, vector, loops) if vector is not None else []
    registers = _accumulators(target, vectors)
    unroll: list[tuple[str, int]] = []
    # Register tiles pay by reusing loaded operands across multiply-adds; without a
    # reduction there is nothing to accumulate, and unrolling a streaming elementwise
    # block only breaks its unit-stride sweep into strided pieces (batchnorm with out=:
    # 17.1 ms with the old 6x4 tile on its normalize, 11.3 ms without).
    if vector is not None and reductions:
        inputs = [r for r in block.refs if r.dir == "in"]
        budget = registers // vectors
        if len(picks) == 2:
            # An unrolled index whose operand also runs along the vector index loads
            # vectors that stay live through the tile's multiply-adds.
            def loads(p: str) -> bool:
                return any(any(a.coeff(p) for a in r.access)
                           and any(a.coeff(vector) for a in r.access) for r in inputs)
            # The broadcast index first: the lowering unrolls the first index outermost,
            # so each broadcast feeds its multiply-adds and dies while the loaded vectors
            # stay (the other order keeps every broadcast live at once).
            picks.sort(key=loads)
            loaded = [loads(p) for p in picks]
            unroll = _register_tile(picks, loops, vectors, registers, loaded,
                                    target.vector_registers)
        elif picks:
            unroll = [(picks[0], min(loops[picks[0]], budget, 12 if vectors == 2 else 8))]
    # An OpenMP region costs microseconds: not worth it for tiny kernels.
    threaded = work(block) >= PARALLEL_MIN_WORK and not member
    sweep = _row_sweep(block, loops, parallel, reductions, vector, lanes * vectors, target)
    tiles: dict[str, int] = sweep or {}
    order: tuple[str, ...] = ()
    if sweep is None and not member:
        tiles, order = _cache_tiles(block, loops, parallel, reductions, dict(unroll), vector,
                                    lanes * vectors, target, _cores() if threaded else 1)
    # The span of the rows a gathered dimension reaches (the view is one element wide
    # along the others).
    tables = sum(block.ref(v).shape.dims[d].size * block.ref(v).shape.dims[d].stride
                 * block.ref(v).shape.dtype.bits // 8 for v, d in gathered)
    prefetch = PREFETCH_DISTANCE if (vector is not None and reductions
                                     and tables > target.cache_size("L2")) else 0
    return Schedule(vector, lanes if vector else 1, tuple(unroll), vectors if vector else 1,
                    tuple(sorted(tiles.items())), parallel=threaded, order=order,
                    prefetch=prefetch)


def _vector_index(block: N.Block, loops: dict[str, int], parallel: list[str],
                  lanes: int) -> str | None:
    """A parallel candidate at least a vector long, else a reduction one, else any
    parallel one (step 1 above)."""
    candidates = typed_vector_candidates(block)
    ranked = ([n for n in candidates if n in parallel and loops[n] >= lanes]
              + [n for n in candidates if n not in parallel and loops[n] >= lanes]
              + [n for n in candidates if n in parallel])
    return ranked[0] if ranked else None


def register_vectors(block: N.Block, target: Target,
                     panels: bool = True) -> tuple[str | None, int]:
    """(vector index, vectors along it in one register tile): the one decision of the
    register tile's width. Pass pack, which runs first, asks it (`panels=False`) how
    many vectors of a block split into panels two vectors wide a tile would read, and
    cuts the panels to one vector where the answer is one; on the packed block the
    answer is then the panel's width, so the micro-kernel reads one panel per step."""
    loops = {i.name: i.range for i in block.idxs if i.affine is None}
    out = next((r for r in block.refs if r.dir in ("out", "inout")), None)
    if out is None or not loops:
        return None, 1
    parallel = [n for n in loops if _is_parallel(block, n)]
    reductions = [n for n in loops if n not in parallel]
    lanes = target.vector_bytes // max(1, out.shape.dtype.bits // 8)
    vector = _vector_index(block, loops, parallel, lanes)
    if vector is None:
        return None, 1
    if panels and panel_index(vector) in loops:
        return vector, max(1, loops[vector] // lanes)
    if vector not in parallel:
        return vector, 1
    if _gathers(block):
        return vector, max(1, min(GATHER_VECTORS, -(-loops[vector] // lanes)))
    picks = _unroll_picks(block, parallel, vector, loops)
    # Two vectors along the vector index: always with AVX-512's 32 registers (12x32
    # tiles); with AVX2's 16 for register tiles (BLIS's 6x16), which then read one packed
    # panel (pack's width) as whole cache lines, where 4 rows x 3 panels of 8 lanes read
    # three streams 64 KB apart (one thread, Zen 3 EPYC: tmm 960^3 31.4 -> 27.4 ms, tbmm
    # 5.7 -> 5.2 ms) -- unless the pairs would leave more lanes idle than single vectors
    # (a 56-wide convolution row: 7 full vectors, or 3 pairs and a half-empty one: 4.1 ->
    # 26 ms), or the output rows the register tile spans lie a multiple of a page apart:
    # six of them then share one set of L1 (tmm 128x1024x1024 5.5 -> 5.9 ms, MLP3 1024^4
    # 17.5 -> 18.2 ms). On AVX2 a row shorter than a pair takes one pair where it would
    # take two single vectors anyway (gconv's 12-wide rows, two threads, Zen 3: 14.0 ->
    # 10.5 ms median, the tuner's find; its images lie pages apart, but the tile spans
    # its channels and rows, not images). AVX-512 keeps pairs for rows of two vectors
    # or more (not measured otherwise).
    if (target.vector_registers >= 24 and loops[vector] >= 2 * lanes
            or (target.vector_registers < 24 and loops[vector] > lanes and reductions
                and -(-loops[vector] // (2 * lanes)) * 2 <= -(-loops[vector] // lanes)
                and not _page_rows(out, picks, loops))):
        return vector, 2
    if not reductions:
        return vector, 1
    # One broadcast operand (A in A B, dY in dW = dY^T X): the tile's second dimension is
    # two vectors along the vector index, BLIS's 6x16 on AVX2. One vector and 8
    # broadcasts keep 8 accumulators, too few to hide the FMA latency: dW and dX of MLP1
    # (128x2000x128, one thread, Zen 3) ran ~20% slower in 8x8 tiles than in 6x16. Where
    # lanes cannot be masked (SSE's 4), a vector tile that does not divide the range
    # would run its boundary tiles as scalar code.
    if (len(picks) == 1 and loops[vector] >= 2 * lanes
            and (lanes in MASKED_LANES or loops[vector] % (2 * lanes) == 0)):
        return vector, 2
    return vector, 1


def _unroll_picks(block: N.Block, parallel: list[str], vector: str,
                  loops: dict[str, int]) -> list[str]:
    """The (at most two) parallel indices a register tile unrolls: those that most
    inputs do not use (each load then feeds that many multiply-adds); of equal reuse,
    the index whose rows lie closest in memory (in bytes), so the tile's loads share
    cache lines (a convolution's neighbouring output rows, 30 floats apart, rather than
    images 230400 floats apart)."""
    inputs = [r for r in block.refs if r.dir == "in"]
    reuse = {n: sum(1 for r in inputs if not any(a.coeff(n) for a in r.access))
             for n in parallel if n != vector and loops[n] > 1}
    spread = {n: max((abs(a.coeff(n)) * d.stride * max(1, r.shape.dtype.bits // 8)
                      for r in inputs for a, d in zip(r.access, r.shape.dims)), default=0)
              for n in reuse}
    picks = sorted((n for n in reuse if reuse[n] > 0), key=lambda n: (-reuse[n], spread[n], n))[:2]
    # A second index whose rows lie a page or more apart (a batch: images of a 1x1
    # convolution, 800 KB apart), other than the panels of a packed operand, would give
    # each unrolled copy its own stream of pages and leave the batch too few tiles to
    # share among the threads; one index and two vectors (6x16) run it as a GEMM per
    # image.
    if (len(picks) == 2 and spread[picks[1]] >= PAGE_BYTES
            and picks[1] != panel_index(vector)):
        picks = picks[:1]
    return picks


def _accumulators(target: Target, vectors: int) -> int:
    """Vector registers a register tile may hold as accumulators: all but a quarter of the
    file (at least one step's loaded vectors and two) for operands, broadcasts and the
    compiler's temporaries: 12 of AVX2's 16, as BLIS's 6x16 kernel keeps (4x3 runs tmm
    1024^3 7% faster than the 4x2 of a reserve of 8, on a Zen 3 EPYC), 24 of AVX-512's
    32."""
    reserve = max(vectors + 2, target.vector_registers // 4)
    return max(8, target.vector_registers - reserve)


def _page_rows(out: N.Refinement, rows: list[str], loops: dict[str, int]) -> bool:
    """Whether the output rows a register tile spans (the dimensions its unrolled
    indices `rows` run along) lie a multiple of a page apart, so that an L1 indexed
    within the page puts them in one set."""
    elem = max(1, out.shape.dtype.bits // 8)
    return any(any(a.coeff(n) and loops.get(n, 1) > 1 for n in rows)
               and (d.stride * elem) % PAGE_BYTES == 0
               for a, d in zip(out.access, out.shape.dims))


def _register_tile(picks: list[str], loops: dict[str, int], vectors: int,
                   registers: int, loaded: list[bool], total: int) -> list[tuple[str, int]]:
    """Factors (f0, f1) of two unrolled indices: f0*f1*vectors accumulators within the
    registers, maximizing multiply-adds per load (f0 broadcasts and f1*vectors vector
    loads feed f0*f1*vectors FMAs; in an outer product, where the first index's copies
    are broadcasts and the second's vector loads of a panel, a vector load weighs
    VECTOR_LOAD_WEIGHT broadcasts) times the share of the tiles' lanes that do work (a
    factor that does not divide its range leaves a partial tile). The accumulators,
    the second index's loaded vectors (`loaded`: per pick), held through a step, and
    the first index's operand must fit the `total` registers: AVX2's 16 take 4x3
    (12 + 3 + 1), not 3x4 (12 + 4 + 1, which spills or reloads every vector)."""
    weight = VECTOR_LOAD_WEIGHT if loaded == [False, True] else 1.0

    def score(f0: int, f1: int) -> float:
        used = math.prod(loops[n] / (-(-loops[n] // f) * f) for n, f in zip(picks, (f0, f1)))
        return f0 * f1 * vectors / (f0 + weight * f1 * vectors) * used

    def live(f0: int, f1: int) -> int:
        # The inner index's loaded vectors are held through the step; the outer
        # index's operand (a broadcast, or a vector of a dot-product kernel) is one at a
        # time.
        return f0 * f1 * vectors + (f1 * vectors if loaded[1] else 1) + 1
    options = [(f0, f1) for f0 in range(1, min(loops[picks[0]], registers) + 1)
               for f1 in range(1, min(loops[picks[1]], registers) + 1)
               if f0 * f1 * vectors <= registers and live(f0, f1) <= total] or [(1, 1)]
    f0, f1 = max(options, key=lambda f: (score(*f), f[0]))
    return [(picks[0], f0), (picks[1], f1)]


def _cache_tiles(block: N.Block, loops: dict[str, int], parallel: list[str],
                 reductions: list[str], unroll: dict[str, int], vector: str | None,
                 vector_tile: int, target: Target,
                 cores: int) -> tuple[dict[str, int], tuple[str, ...]]:
    """(tile sizes, order): coordinate descent over tile sizes minimizing lines/MAC under
    the L2 budget, times the load imbalance of the threaded tile loop (`cores` threads),
    keeping at least two outer tiles per core when the problem allows it. A kernel
    reading packed panels (pass pack) runs its threads over the panels, the order
    `(panel index,)`, unless that costs more than PANEL_THREADS_MARGIN times the
    threads over its rows or leaves a thread more than that over an even share."""
    budget = target.cache_size("L2") // 2
    line = target.cache_line_bytes

    def step(n: str) -> int:
        if n == vector and n in parallel:
            return vector_tile
        return unroll.get(n, 1)

    def candidates(n: str, cap: int) -> list[int]:
        base = step(n)
        values, m = [], base
        while m < loops[n]:
            values.append(m)
            m *= 2
        values.append(loops[n])
        if n in parallel and cores > 1:     # tiles that split evenly among the threads
            values += [-(-loops[n] // (cores * j * base)) * base for j in range(1, 17)]
        return sorted({v for v in values if v <= min(loops[n], cap)})

    # A parallel index that every view reads (a group or batch index) shares no data
    # between its values: with a tile of one, one group's weights serve all its register
    # tiles from L1 (gconv: 9 KiB a group; a tile of 16 groups cycled 16 groups' weights
    # and images through L1 per register tile).
    batch = _batch_indices(block, parallel, reductions, unroll, vector)
    tile = {n: 1 if n in batch else loops[n] for n in loops}
    if reductions:
        # The micro-kernel streams its inputs over the reduction: keep that stream within
        # the target's `reduction_stream` L1 sizes (half of L1 on AVX2; see Target),
        # unless one register tile's inputs over the whole reduction fit there anyway.
        k = max((n for n in reductions if n != vector), key=lambda n: loops[n], default=None)
        if k is not None:
            stream = int(target.cache_size("L1") * target.reduction_stream)
            register = {**unroll, **({vector: vector_tile} if vector is not None else {})}
            whole = _footprint(block, {**register, k: loops[k]}, line, inputs_only=True)
            if whole[1] * line > stream:
                per_step = _bytes_per_reduction_step(block, k, register, vector, line)
                kc = 1 << max(4, int(math.log2(max(1, stream // per_step))))
                if kc < loops[k]:
                    tile[k] = kc

    def cost(t: dict[str, int], threaded: list[str]) -> float:
        size, lines = _footprint(block, t, line)
        macs = math.prod(t.values())
        outer = math.prod(-(-loops[n] // t[n]) for n in parallel) if parallel else 1
        penalty = 0.0 if size <= budget else 10.0 * size / budget
        if outer < 2 * cores and math.prod(loops[n] for n in parallel) >= 2 * cores * 64:
            penalty += 1.0
        waste = math.prod(-(-loops[n] // t[n]) * t[n] for n in parallel) / math.prod(
            loops[n] for n in parallel)
        return lines / macs * waste * _imbalance(t, loops, threaded, cores) + penalty

    def descend(start: dict[str, int], threaded: list[str],
                caps: dict[str, int]) -> tuple[dict[str, int], float]:
        best_tile, best = start, cost(start, threaded)
        for _ in range(3):
            improved = False
            for n in (n for n in parallel if n not in batch):
                for value in candidates(n, caps.get(n, loops[n])):
                    trial = dict(best_tile)
                    trial[n] = value
                    c = cost(trial, threaded)
                    if c < best - 1e-12:
                        best, best_tile, improved = c, trial, True
            if not improved:
                break
        return best_tile, best

    chosen, chosen_cost = descend(tile, parallel, {})
    order: tuple[str, ...] = ()
    panels = panel_index(vector) if vector is not None else None
    if panels in parallel and cores > 1:
        # At most this many panels per tile, so that every thread gets one.
        cap = -(-loops[panels] // (cores * step(panels))) * step(panels)
        if cap < loops[panels]:
            threaded = [panels] + [n for n in parallel if n != panels]
            split, split_cost = descend({**tile, panels: cap}, threaded, {panels: cap})
            if (split_cost <= PANEL_THREADS_MARGIN * chosen_cost
                    and _imbalance(split, loops, threaded, cores) <= PANEL_THREADS_MARGIN):
                chosen, order = split, (panels,)
    return {n: v for n, v in chosen.items() if v < loops[n]}, order


def _batch_indices(block: N.Block, parallel: list[str], reductions: list[str],
                   unroll: dict[str, int], vector: str | None) -> set[str]:
    """A contraction's parallel indices, other than the vector and unrolled ones, that
    every view varying along the parallel indices reads (a table of reduction steps,
    pass ptrinc, varies along none)."""
    if not reductions:
        return set()

    def reads(r: N.Refinement, names: list[str]) -> bool:
        return any(a.coeff(n) for a in r.access for n in names)
    varying = [r for r in block.refs if reads(r, parallel)]
    batch = {n for n in parallel if n != vector and n not in unroll
             and all(reads(r, [n]) for r in varying)}
    # With no other parallel index beside them (a row reduction), they stay untiled.
    return batch if set(parallel) - batch else set()


def _row_sweep(block: N.Block, loops: dict[str, int], parallel: list[str],
               reductions: list[str], vector: str | None, vector_tile: int,
               target: Target) -> dict[str, int] | None:
    """Cache tiles of single rows, swept whole along the vector index, for a block
    without a reduction that streams its views (`_streams`) where they do not fit in L2
    (they come from memory) or its rows lie pages apart; else None. A tile of several
    rows runs its register tiles across the rows (the micro-kernel loops over them), so
    that each row of each view is read and written in pieces, which the hardware
    prefetcher follows badly (two threads, Xeon: bias+GELU+residual 4096^2 19.3 -> 14.4
    ms, batchnorm's normalization 64x256x28x28 21.0 -> 8.6 ms; as a member of the loop
    over channels, its 400 KB per channel in L2 but its images 800 KB apart, 8.25 ->
    6.78 ms), and what the rows share (a bias that does not move along them) stays in
    L1 anyway. Rows close together in L2 (attention's 128-wide scores) keep the
    footprint model's tiles."""
    rows = {n: 1 for n in parallel if n != vector and loops[n] > 1}
    if (not rows or vector is None or reductions or loops[vector] <= vector_tile
            or not _streams(block, vector)):
        return None
    line = target.cache_line_bytes
    if (_footprint(block, loops, line)[0] > target.cache_size("L2")
            or _pages_apart(block, list(rows))):
        return rows
    return None


def _streams(block: N.Block, vector: str) -> bool:
    """Whether every view of the block that moves along the vector index is contiguous
    along it."""
    moving = [r for r in block.refs if any(a.coeff(vector) for a in r.access)]
    return bool(moving) and all(contiguous_along(r, vector) for r in moving)


def _pages_apart(block: N.Block, rows: list[str]) -> bool:
    """Whether consecutive values of every index in `rows` reach elements of the output
    a page or more apart (batchnorm's images within a channel: 800 KB)."""
    out = next(r for r in block.refs if r.dir in ("out", "inout"))
    elem = max(1, out.shape.dtype.bits // 8)
    return all(min((abs(a.coeff(n)) * d.stride * elem for a, d in zip(out.access, out.shape.dims)
                    if a.coeff(n)), default=0) >= PAGE_BYTES for n in rows)


def _imbalance(tile: dict[str, int], loops: dict[str, int], parallel: list[str],
               cores: int) -> float:
    """How much longer the busiest thread works than an even split would take: threads
    run the outermost parallel tile loop (`schedule.thread_loop`) in contiguous chunks
    (OpenMP's static schedule), and the last tile may be short."""
    n = next((n for n in parallel if tile[n] < loops[n]), None)
    if n is None or cores == 1:
        return 1.0
    tiles = -(-loops[n] // tile[n])
    chunk = -(-tiles // cores)
    busiest = min(loops[n], chunk * tile[n])      # the first thread's chunk is the fullest
    return busiest / (loops[n] / cores)


def _bytes_per_reduction_step(block: N.Block, k: str, extents: dict[str, int],
                              vector: str | None, line: int) -> int:
    """Bytes of input one step of reduction index k reads in one register tile (its
    `extents`: the unrolled indices' and the vector index's). A view
    read through pointer increments from a table (pass ptrinc: a convolution's image,
    whose steps jump between channels and rows) reads whole new cache lines at a step,
    one or more per row of the tile; a view whose increment is k itself (the weights'
    contiguous reduction) reads its elements, as an affine view does."""
    deps = scalar_indices(block)
    indexed = {s.into for s in block.stmts if isinstance(s, N.LoadIndex)}
    stepped = {s.ref: s.offset not in indexed for s in block.stmts
               if isinstance(s, N.Load) and s.offset is not None and k in deps[s.offset]}
    total = 0
    for ref in block.refs:
        if ref.dir != "in" or not (ref.into in stepped or any(a.coeff(k) for a in ref.access)):
            continue
        elem = max(1, ref.shape.dtype.bits // 8)
        names = {n for a in ref.access for n in a.names}
        if stepped.get(ref.into):         # increments from a table
            rows = math.prod(extents.get(n, 1) for n in names if n != vector)
            total += rows * -(-extents.get(vector, 1) * elem // line) * line
        else:
            total += math.prod(extents.get(n, 1) for n in names) * elem
    return max(total, 1)


def _cores() -> int:
    import os
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _is_leaf_kernel(s: N.Statement) -> bool:
    return (isinstance(s, N.Block) and "kernel" in s.tags
            and not any(isinstance(x, N.Block) for x in s.stmts))


def autotile(fn: N.Function, target: Target, params: dict[str, Any]) -> N.Function:
    """Apply the default (or `params["schedules"]`-given, by block name) schedule to every
    kernel block; members of a fused block are vectorized in place and the fused row
    loop runs in parallel."""
    given: dict[str, Schedule] = params.get("schedules", {})
    kernels = [k for s in fn.body.stmts for k in _kernel_blocks(s)]
    unknown = sorted(set(given) - {k.name for k in kernels})
    if unknown:
        raise ArgumentError(f"schedules name blocks {unknown} that this program does not have",
                            hint=f"its kernel blocks are {', '.join(k.name for k in kernels)} "
                                 "(see `polytile show --stage ir`)")
    for k in kernels:
        if k.name in given:
            check_schedule(k, given[k.name], target)
    stmts: list[N.Statement] = []
    for s in fn.body.stmts:
        placed = place(stmts[-1], s, fn.body) if stmts and isinstance(s, N.Block) else None
        if placed is not None:
            # An epilogue, in the contraction's register tiles (a schedule given for it
            # applies where it stays a kernel of its own).
            stmts[-1] = placed
            continue
        if _is_leaf_kernel(s):
            assert isinstance(s, N.Block)
            schedule = given.get(s.name) or _following(stmts, s, choose_schedule(s, target),
                                                       target)
            s = apply_schedule(s, schedule, fn.body)
        elif isinstance(s, N.Block) and "fused" in s.tags:
            s = _schedule_fused(s, target, given)
        elif isinstance(s, N.Block) and "stitched" in s.tags:
            s = _schedule_stitched(s, target, given)
        stmts.append(s)
    return replace(fn, body=replace(fn.body, stmts=tuple(stmts)))


def _following(done: list[N.Statement], block: N.Block, schedule: Schedule,
               target: Target) -> Schedule:
    """`schedule`, with cache tiles that are the chunks the block before writes in an
    iteration where `block` only reads those (pass sink then runs it inside that block,
    reading each chunk from L2)."""
    if not done or not isinstance(done[-1], N.Block) or "tiled" not in done[-1].tags:
        return schedule
    tiles = chunk_tiles(done[-1], block, target.cache_size("L2") // 2)
    if tiles is None:
        return schedule
    return replace(schedule, tiles=tuple(sorted(tiles.items())), order=())


def _kernel_blocks(s: N.Statement) -> list[N.Block]:
    """The blocks autotile schedules: leaf kernels, at top level or in a fused block."""
    return [b for b, _ in scheduled_blocks(s)]


def scheduled_blocks(s: N.Statement) -> list[tuple[N.Block, bool]]:
    """(block, member) for each block autotile schedules in statement `s`: a leaf kernel
    (member False); the leaf kernels of a fused block (member True: a register tile
    only, the fused row loop is the parallel one); those of a stitched block's phases,
    each scheduled as a kernel of its own."""
    if _is_leaf_kernel(s):
        return [(s, False)]  # type: ignore[list-item]
    if isinstance(s, N.Block) and "fused" in s.tags:
        return [(m, True) for m in s.stmts if _is_leaf_kernel(m)]  # type: ignore[misc]
    if isinstance(s, N.Block) and "stitched" in s.tags:
        return [k for m in s.stmts for k in scheduled_blocks(m)]
    return []


def schedules_problem(value: Any) -> str | None:
    """The check of autotile.schedules (and of pack.schedules, which the pipeline passes
    the same): block name -> Schedule."""
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, Schedule) for k, v in value.items()):
        return f"must map block names to schedules, got {value!r}"
    return None


def _schedule_fused(block: N.Block, target: Target, given: dict[str, Schedule]) -> N.Block:
    members = []
    member_work = 0
    for m in block.stmts:
        if _is_leaf_kernel(m):
            assert isinstance(m, N.Block)
            schedule = given.get(m.name) or choose_schedule(m, target, member=True)
            member_work += work(m)
            m = apply_schedule(m, schedule, block)
        members.append(m)
    rows = math.prod(i.range for i in block.idxs if i.affine is None)
    fused = replace(block, stmts=tuple(members))
    if rows >= 2 and rows * member_work >= PARALLEL_MIN_WORK and not fused.schedule.parallel:
        # A column reduction fused into the rows (pass fuse) adds into its result from
        # every row: threads add into private copies of it.
        combined = tuple(r.into for r in fused.refs if r.agg == "add" and r.dir != "in")
        index = thread_loop(fused, combined)
        fused = replace(fused, schedule=replace(fused.schedule, parallel=index,
                                                combine=combined if index else ()))
    return fused


def _schedule_stitched(block: N.Block, target: Target, given: dict[str, Schedule]) -> N.Block:
    """A stitched block's phases are scheduled as if each were a kernel of its own (its
    parallel loop is then shared out among the region's threads); the phases' schedules
    decide which are shared out and where the threads wait (`polytile.ir.phases`)."""
    phases = []
    for m in block.stmts:
        if _is_leaf_kernel(m):
            assert isinstance(m, N.Block)
            m = apply_schedule(m, given.get(m.name) or choose_schedule(m, target), block)
        elif isinstance(m, N.Block) and "fused" in m.tags:
            m = _schedule_fused(m, target, given)
        phases.append(m)
    scheduled = replace(block, stmts=tuple(phases))
    return replace(scheduled, schedule=replace(block.schedule,
                                               stitch=stitch_schedule(scheduled)))


register("autotile", autotile, schedules=schedules_problem)
