"""sink: a block that reads what the block before it wrote runs inside that block's
iterations, one chunk at a time, while the chunk is in cache.

Pass outlayout sums a convolution into a copy of its output with the channels
innermost, and a copy block transposes it into the output. As two kernels, the copy
reads the whole 9.4 MB local (the TC paper's group convolution) back from memory after
the contraction has written all of it. Each iteration of the contraction's tiled block
writes a box of the local that no other iteration writes (16 images of one group:
147 KB), so the copy of that box can run right after it, reading it from L2:

    block s0 [i0_c:2, i1_c:32] #tiled (                block s0 [i0_c:2, i1_c:32] #tiled (
      out o0 <- o0_t[16*i0_c, i1_c, 0, 0, 0]             inout o0 <- o0_t[16*i0_c, i1_c, ...]
        float32(16:73728, 1:2304, 12:192, ...)            out o0_c <- o0[16*i0_c, i1_c, ...]
    ) { block s0_tile ... }                     ->    ) {
    block s0_out [a0_c:32, a1_c:32] #pack (              block s0_tile ...
      in o0_t <- o0_t[a0_c, a1_c, 0, 0, 0] ...           block s0_out [a0_c:16, a1_c:1] #pack (
      out o0 <- o0[a0_c, a1_c, 0, 0, 0] ...                in o0_t <- o0[a0_c, a1_c, 0, 0, 0]
    ) { block s0_out_tile ... }                            out o0 <- o0_c[a0_c, a1_c, 0, 0, 0]
                                                         ) { block s0_out_tile ... }
                                                       }

The rule: top-level blocks `P` then `C`, where `C` reads a buffer `T` that `P` writes
and each outer index of `C` steps along one dimension of `T` in tiles of its view's
size, and each outer index of `P` along one dimension of `T`, in tiles that are whole
numbers of `C`'s. Pass autotile makes `C`'s tiles `P`'s chunks where it can
(`chunk_tiles`). `C` then runs inside `P` over the tiles of `P`'s box (an index of `C`
on a dimension `P` does not tile runs over all of it); `C`'s other views become views
of `P` over the same iterations. `P`'s box of `T` must fit in half of L2 (the reason for
the move), `P` may not touch what `C` writes, and `analysis.sink` must prove that each
element `C` reads is written by the same iteration of `P` and by no other. Runs last in
the CPU pipelines, after pass fold (whose proof accepts such a reader; the init `P`'s
first writes replace still runs nowhere). A `C` that an init was folded into (its
first writes stores, `first(...)`) stays where it is: in `P`'s chunks a chunk that
splits its reduction would store over the sums of the chunks before it.

Intel Xeon (Cascade Lake), two threads, the group convolution 32x32x16x16x14x14 with its
bias done in the transpose (pass outlayout): 6.57 ms, 7.61 with this pass off
(`benchmarks/option_ab.py --after sink.enabled=false`, 9 rounds).

Parameters: `enabled` (default true).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from polytile.analysis.sink import final_reads
from polytile.ir import nodes as N
from polytile.ir.polyhedra import Scope
from polytile.passes.names import fresh_name
from polytile.passes.pipeline import flag, register
from polytile.targets.target import Target


def sink(fn: N.Function, target: Target, params: dict[str, Any]) -> N.Function:
    if not params.get("enabled", True):
        return fn
    budget = target.cache_size("L2") // 2
    root = Scope.root(fn.body)
    stmts = list(fn.body.stmts)
    k = 0
    while k + 1 < len(stmts):
        first, then = stmts[k], stmts[k + 1]
        moved = _sunk(first, then, budget) if isinstance(first, N.Block) and \
            isinstance(then, N.Block) and not _folded_into(then, stmts[:k + 1]) else None
        if moved is not None and final_reads(root.child(moved)) is None:
            stmts[k:k + 2] = [moved]
        k += 1
    return replace(fn, body=replace(fn.body, stmts=tuple(stmts)))


def _folded_into(c: N.Block, before: list[N.Statement]) -> bool:
    """Whether pass fold folded an init block before `c` into it: `c` then stores its
    first sums (`first(...)`), which holds only as the init's later sibling (moved into
    another block's chunks, a chunk that splits its reduction stores over the chunks
    before it, and the verifier's proof of the fold no longer finds it)."""
    return any(isinstance(s, N.Block) and s.schedule.folded == c.name for s in before)


def _sunk(p: N.Block, c: N.Block, budget: int) -> N.Block | None:
    """`p` with `c` as its last statement over `p`'s chunks (see the module docstring),
    or None where the rule does not apply."""
    found = _source(p, c, budget)
    if found is None or p.constraints or c.constraints or p.schedule.combine or \
            any(i.affine is not None for i in p.idxs) or \
            any(r.from_ in {q.from_ for q in p.refs} for r in c.refs if r.dir != "in") or \
            {i.name for i in p.idxs} & {i.name for i in c.idxs}:
        return None
    box, src = found
    p_range = {i.name: i.range for i in p.idxs}
    c_range = {i.name: i.range for i in c.idxs}
    # Per outer index of C: its value at P's chunk origin (over P's indices) and how
    # many of its tiles one chunk holds.
    start: dict[str, N.Affine] = {}
    count: dict[str, int] = {}
    for pa, ca, pd, cd in zip(box.access, src.access, box.shape.dims, src.shape.dims):
        p_idx = _single(pa, p_range)
        c_idx = _single(ca, c_range)
        if p_idx == "" or c_idx == "":
            return None
        if c_idx is None:           # C takes the dimension whole: so must P's chunk
            if p_idx is not None or pa.const != 0 or ca.const != 0 or pd.size != cd.size:
                return None
            continue
        step = ca.coeff(c_idx)
        if ca.const != 0 or pa.const != 0 or cd.size != step or c_idx in count:
            return None
        if p_idx is None:           # P's chunk holds the whole dimension
            if pd.size != step * c_range[c_idx]:
                return None
            start[c_idx], count[c_idx] = N.Affine.constant(0), c_range[c_idx]
            continue
        tile = pa.coeff(p_idx)
        if tile != pd.size or tile % step or tile * p_range[p_idx] != step * c_range[c_idx]:
            return None
        start[c_idx] = N.Affine.of({p_idx: tile // step})
        count[c_idx] = tile // step
    if set(count) != set(c_range):
        return None
    taken = {r.into for r in p.refs} | {r.from_ for r in p.refs}
    new_refs: list[N.Refinement] = []
    inner: list[N.Refinement] = []
    for r in c.refs:
        if any(k < 0 for a in r.access for _, k in a.terms):
            return None
        if r is src:
            inner.append(replace(r, from_=box.into))
            continue
        name = fresh_name(f"{r.from_}_c", taken)
        taken.add(name)
        dims = tuple(replace(d, size=d.size + sum(k * (count[n] - 1) for n, k in a.terms))
                     for a, d in zip(r.access, r.shape.dims))
        origin = tuple(a.substitute(start) for a in r.access)
        new_refs.append(replace(r, into=name, access=origin, shape=replace(r.shape, dims=dims)))
        inner.append(replace(r, from_=name, access=tuple(a - a.const for a in r.access)))
    idxs = tuple(replace(i, range=count[i.name]) for i in c.idxs)
    moved = replace(c, idxs=idxs, refs=tuple(inner), schedule=replace(c.schedule, parallel=None))
    refs = tuple(replace(r, dir="inout") if r is box else r for r in p.refs) + tuple(new_refs)
    return replace(p, refs=refs, stmts=p.stmts + (moved,))


def chunk_tiles(p: N.Block, c: N.Block, budget: int) -> dict[str, int] | None:
    """Cache tiles for the untiled block `c` that make each of its tiles one chunk of
    what the tiled block `p` before it writes in an iteration (pass autotile asks, so
    that this pass can then move `c` into `p`), or None: `c` reads that buffer at its
    own indices, one per dimension, and `p`'s box of it fits `budget` bytes."""
    found = _source(p, c, budget)
    if found is None:
        return None
    box, src = found
    c_range = {i.name: i.range for i in c.idxs}
    tiles: dict[str, int] = {}
    for ca, pd in zip(src.access, box.shape.dims):
        own = _single(ca, c_range)
        if not own or ca.coeff(own) != 1 or ca.const or own in tiles:
            return None
        tiles[own] = pd.size
    return tiles if set(tiles) == set(c_range) else None


def _source(p: N.Block, c: N.Block, budget: int) -> tuple[N.Refinement, N.Refinement] | None:
    """`p`'s view of the one buffer of `p`'s that `c` reads (and only reads) and `c`'s,
    where `c`'s indices are its own, every outer index of `p` moves that view (an
    iteration writes a box no other does) and the box fits `budget` bytes; else None."""
    if any(i.affine is not None for i in c.idxs):
        return None
    writes = {r.from_: r for r in p.refs if r.dir in ("out", "inout")}
    sources = [r for r in c.refs if r.from_ in writes]
    if len(sources) != 1 or sources[0].dir != "in":
        return None
    box = writes[sources[0].from_]
    moved = {n for a in box.access for n in a.names}
    if box.shape.nbytes > budget or any(i.affine is None and i.name not in moved
                                        for i in p.idxs):
        return None
    return box, sources[0]


def _single(a: N.Affine, ranges: dict[str, int]) -> str | None:
    """The one outer index `a` steps along (positively), None for a constant, "" for
    anything else."""
    if not a.terms:
        return None
    if len(a.terms) != 1 or a.terms[0][0] not in ranges or a.terms[0][1] <= 0:
        return ""
    return a.terms[0][0]


register("sink", sink, enabled=flag)
