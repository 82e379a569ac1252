"""Vector loops for register-tiled leaf blocks (schedule `micro, vector(V, float32, L),
unroll(U)`): explicit vectors, accumulators and masks, no hope in an auto-vectorizer.

The block's iteration space splits into
* V, the vector index: L lanes per vector, all chunks of a parallel V unrolled
  (outer-product kernels), or a loop over chunks of a reduction V followed by a
  horizontal reduction (dot-product kernels);
* U, unrolled indices: one copy of the body per value (the register tile);
* other parallel indices, looped outside, and reduction indices, looped inside
  around accumulators that stay in registers.

Values are memoized per (statement, values of the unrolled indices it depends
on), so a load that does not depend on an unrolled index is issued once and
broadcast: `acc[m][w] += A[m,k] * B[k, w*L:(w+1)*L]` loads A once per m and B
once per w. Tails (fewer than L lanes) use masked loads and stores; a reduction
tail masks inactive lanes to the aggregation's identity. A tile cut short by a
constraint runs the scalar code instead (boundary tiles), so the vector code has
no guards.

    block [m:8, n:32, k:256] schedule(micro, vector(n, float32, 16), unroll(m))
      ->  pt_vf a0_0 = {0}, ... (8 x 2 accumulators)
          for (k...) { b0 = load(B+..); b1 = ...; a = splat(A[..]); acc += a * b0; ... }
          C[...] += acc ...
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from polytile import dtypes
from polytile.analysis.deps import scalar_indices
from polytile.analysis.vectorizable import (boundary_versions, lane_bound, tile_condition,
                                           why_not_vector)
from polytile.codegen.cops import MASK_OPS, VECTOR_IDENTITIES
from polytile.errors import IRError
from polytile.ir.nodes import (AGG_IDENTITY, Affine, Block, Constant, Intrinsic, Load, LoadIndex,
                               Store)
from polytile.loops import nodes as L
from polytile.loops.views import Scope, View, child_view, fixed_indices, resolve, safe

if TYPE_CHECKING:
    from polytile.loops.lower import Lowering

LINE_BYTES = 64     # a cache line: the prefetched rows' lines are this far apart
DOT_CHAINS = 4      # independent accumulator chains a dot-product kernel keeps at least
INT64 = L.VType(dtypes.INT64)


@dataclass
class _Plan:
    vector: str
    lanes: int
    unroll: dict[str, int]             # index -> range (every value unrolled)
    par_loops: list[tuple[str, int]]   # parallel indices looped outside the accumulators
    red_loops: list[tuple[str, int]]   # reduction indices looped inside
    vec_range: int
    vec_is_reduction: bool
    agg: str
    bounds: dict[str, L.IExpr] = field(default_factory=dict)   # looped index -> upper bound
    # Upper bounds on a parallel vector index (its last valid value) as (part over the
    # unrolled indices + constant, part over loop names; their namespaces overlap): a
    # tile cut short by a constraint runs with masked lanes.
    vec_bounds: list[tuple[Affine, Affine]] = field(default_factory=list)

    @property
    def vtype(self) -> L.VType:
        return L.VType(dtypes.FLOAT32, self.lanes)


def plan(blk: Block) -> _Plan | None:
    """The vector plan for a leaf whose schedule names a vector index (None without one).
    The pass that recorded the index proved it vectorizable (analysis.vectorizable); a
    schedule that is not (hand-written IR) is an IRError, never a silent scalar fallback."""
    loop = blk.schedule.vector
    if loop is None:
        return None
    vector, n_lanes = loop.index, loop.lanes
    reason = why_not_vector(blk, vector)
    if reason is not None:
        raise IRError(f"block {blk.name} is scheduled as vector code along {vector}, but "
                      f"{reason}")
    out = blk.ref(next(s for s in blk.stmts if isinstance(s, Store)).ref)
    loops = {i.name: i.range for i in blk.idxs if i.affine is None and i.range > 1}
    written = {n for a in out.access for n in a.names}
    unroll = {u: loops[u] for u in blk.schedule.unroll if u in loops and u != vector}
    rest = [(n, r) for n, r in loops.items() if n != vector and n not in unroll]
    par, red = _split(rest, blk.schedule.order, written)
    return _Plan(vector, n_lanes, unroll, par, red, loops[vector], vector not in written,
                 out.agg)


def _split(rest: list[tuple[str, int]], order: tuple[str, ...], written: set[str]
           ) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """The loops outside the accumulators and those inside: in the schedule's order
    (pass `reorder`), the trailing run of reduction loops goes inside; without an
    order, the parallel loops outside and the reductions inside, in block order."""
    if sorted(order) != sorted(n for n, _ in rest):
        return [x for x in rest if x[0] in written], [x for x in rest if x[0] not in written]
    ranges = dict(rest)
    loops = [(n, ranges[n]) for n in order]
    split = len(loops)
    while split > 0 and loops[split - 1][0] not in written:
        split -= 1
    return loops[:split], loops[split:]


def lower_block(low: "Lowering", blk: Block, outer: Scope) -> list[L.Stmt] | None:
    """The loops of `blk`, or None to lower it as scalar loops."""
    p = plan(blk)
    if p is None:
        return None
    low.vector_lanes = p.lanes
    idx = fixed_indices(blk, outer.idx)
    if not blk.constraints:
        return [L.Comment(f"block {safe(blk.name)}: vector"),
                *_Emitter(low, blk, outer, p, idx).lines()]
    boundary, needed = blk.schedule.boundary, boundary_versions(blk)
    if boundary != needed:
        given = f"boundary({boundary})" if boundary else "nothing"
        raise IRError(f"vector block {blk.name} has constraints, so its schedule must say how "
                      f"boundary tiles run: boundary({needed}), not {given}")
    if boundary == "remainders":
        whole = tuple(c for c in blk.constraints if tile_condition(blk, c))
        counts = _unroll_counts(blk, p, idx)
        comment = L.Comment(f"block {safe(blk.name)}: vector code, one version per tile "
                            "remainder")
        if p.vec_bounds:
            # Lanes are a remainder too: a tile whose lanes are all in bounds (every tile
            # but the last along the vector index) runs plain loads and stores; masked
            # moves in the reduction loop cost a GEMM micro-kernel a fifth of its time on
            # AVX2.
            lanes = replace(blk, constraints=tuple(c for c in blk.constraints
                                                   if lane_bound(blk, c)))
            full = _versions(low, blk, outer, replace(p, vec_bounds=[]), idx, counts, {})
            versions = [L.If(_full_tile(lanes, idx), tuple(full),
                             tuple(_versions(low, blk, outer, p, idx, counts, {})))]
        else:
            versions = _versions(low, blk, outer, p, idx, counts, {})
        if whole:       # the tile runs whole or not at all
            versions = [L.If(_full_tile(replace(blk, constraints=whole), idx),
                             tuple(versions), ())]
        return [comment, *versions]
    body = _Emitter(low, blk, outer, p, idx).lines()
    scalar = low.block(replace(blk, schedule=replace(blk.schedule, micro=False)), outer)
    return [L.Comment(f"block {safe(blk.name)}: vector code for full tiles"),
            L.If(_full_tile(blk, idx), tuple(body), tuple(scalar))]


def _unroll_counts(blk: Block, p: _Plan, idx: dict[str, Affine]) -> dict[str, L.IExpr]:
    """For a boundary tile of kind "remainders" (every constraint an upper bound on one
    unrolled or looped index, or a lane bound; analysis.vectorizable), how many values of
    each such index run; looped indices get it as their loop bound (`p.bounds`), and lane
    bounds become lane counts (`p.vec_bounds`)."""
    counts: dict[str, L.IExpr] = {}
    loops = {i.name for i in blk.idxs if i.affine is None and i.range > 1}
    looped = {n for n, _ in p.par_loops + p.red_loops}
    for c in blk.constraints:
        if tile_condition(blk, c):
            continue
        if lane_bound(blk, c):
            unrolled = Affine.of({n: k for n, k in c.terms if n in loops and n != p.vector},
                                 c.const)
            outside = Affine()
            for name, coeff in c.terms:
                if name not in loops:
                    outside = outside + idx[name].scale(coeff)
            p.vec_bounds.append((unrolled, outside))
            continue
        (x,) = [n for n in c.names if n in loops]
        a = -c.coeff(x)
        rest = Affine.constant(c.const)
        for name, coeff in c.terms:
            if name != x:
                rest = rest + idx[name].scale(coeff)
        # values x = 0, 1, ... with a*x <= rest: floor(rest / a) + 1 of them, or none
        bound = L.IMax((rest + 1 if a == 1 else L.IDiv(rest + a, a), Affine.constant(0)))
        counts[x] = L.IMin((counts[x], bound)) if x in counts else bound
    for x in looped & set(counts):
        p.bounds[x] = counts.pop(x)
    return counts


def _versions(low: "Lowering", blk: Block, outer: Scope, p: _Plan, idx: dict[str, Affine],
              counts: dict[str, L.IExpr], fixed: dict[str, int]) -> list[L.Stmt]:
    """Nested switches over the remainders; each case is the vector code for that size."""
    pending = [u for u in counts if u not in fixed]
    if not pending:
        sub = replace(p, unroll={u: fixed.get(u, r) for u, r in p.unroll.items()})
        return _Emitter(low, blk, outer, sub, idx).lines()
    u = pending[0]
    var = low.fresh("n")
    cases = tuple((value, tuple(_versions(low, blk, outer, p, idx, counts, {**fixed, u: value})))
                  for value in range(p.unroll[u], 0, -1))
    return [L.Let(var, INT64, L.IntValue(counts[u])),
            L.Switch(L.IMin((Affine.index(var), Affine.constant(p.unroll[u]))), cases)]


def _full_tile(blk: Block, idx: dict[str, Affine]) -> tuple[Affine, ...]:
    """Conditions (each >= 0) that every constraint holds on the whole box."""
    conds = []
    ranges = {i.name: i.range for i in blk.idxs if i.affine is None}
    for c in blk.constraints:
        low = Affine.constant(c.const)
        for name, coeff in c.terms:
            if name in ranges:
                low = low + (coeff * (ranges[name] - 1) if coeff < 0 else 0)
            else:
                low = low + idx[name].scale(coeff)
        conds.append(low)
    return tuple(conds)


def _count(n: int | str) -> L.IExpr:
    return Affine.constant(n) if isinstance(n, int) else Affine.index(n)


class _Emitter:
    def __init__(self, low: "Lowering", blk: Block, outer: Scope, p: _Plan,
                 idx: dict[str, Affine]):
        self.low, self.blk, self.outer, self.p = low, blk, outer, p
        self.base_idx = dict(idx)
        self.deps = scalar_indices(blk)
        self.store = next(s for s in blk.stmts if isinstance(s, Store))
        self.out = blk.ref(self.store.ref)
        self.dtypes: dict[str, dtypes.DType] = {}     # loop IR scalars' types
        # Looked up once per value: built once (rebuilding it per lookup was quadratic).
        self.defs: dict[str, object] = {s.into: s for s in blk.stmts
                                        if isinstance(s, (Load, Constant, Intrinsic, LoadIndex))}

    # ------------------------------------------------------------ structure
    def lines(self) -> list[L.Stmt]:
        p, low = self.p, self.low
        idx = dict(self.base_idx)
        par_vars = []
        for name, _ in p.par_loops:
            var = low.fresh("i")
            idx[name] = Affine.index(var)
            par_vars.append(var)
        for name, _ in p.red_loops:
            idx[name] = Affine.index(low.fresh("i"))
        combos = [dict(zip(p.unroll, vals)) for vals in
                  itertools.product(*(range(r) for r in p.unroll.values()))] or [{}]
        body = self.dot(idx, combos) if p.vec_is_reduction else self.outer_product(idx, combos)
        # the reduction loops sit inside `body` already; wrap the parallel loops
        for var, (name, rng) in reversed(list(zip(par_vars, p.par_loops))):
            body = [L.Loop(var, Affine.constant(0), self._hi(name, rng), tuple(body))]
        return body

    def _hi(self, name: str, rng: int) -> L.IExpr:
        bound = self.p.bounds.get(name)
        return Affine.constant(rng) if bound is None else L.IMin((Affine.constant(rng), bound))

    def _red_loops(self, idx: dict[str, Affine], body: list[L.Stmt]) -> list[L.Stmt]:
        for (name, rng) in reversed(self.p.red_loops):
            (var,) = idx[name].names
            body = [L.Loop(var, Affine.constant(0), self._hi(name, rng), tuple(body))]
        return body

    def _at(self, idx: dict[str, Affine], combo: dict[str, int]) -> dict[str, Affine]:
        at = dict(idx)
        at.update({u: Affine.constant(v) for u, v in combo.items()})
        return at

    def outer_product(self, idx: dict[str, Affine], combos: list[dict[str, int]]
                      ) -> list[L.Stmt]:
        p = self.p
        chunks = [(c * p.lanes, min(p.lanes, p.vec_range - c * p.lanes))
                  for c in range(-(-p.vec_range // p.lanes))]
        accumulate = bool(p.red_loops)
        first = self._first_write(idx)
        pre: list[L.Stmt] = []
        body: list[L.Stmt] = []
        post: list[L.Store] = []
        memo: dict = {}
        for combo in combos:
            for base, width in chunks:
                n = self._lanes(combo, base, width, pre)
                if n == 0:
                    continue
                at = self._at(idx, combo)
                at[p.vector] = Affine.constant(base)
                value = self.vector(self.store.value, at, combo, base, n, memo, body)
                view = child_view(self.out, self.outer.views[self.out.from_], at)
                count = None if n == p.lanes else _count(n)
                # Masked tails stay plain stores: a streaming store writes whole vectors.
                streams = count is None and self.out.into in self.blk.schedule.stream
                if not accumulate:
                    store = L.Store(view.ptr, view.offset, value, p.agg, count, streams)
                    if first is None:
                        body.append(store)
                    else:
                        post.append(store)
                    continue
                acc = self.low.fresh("acc")
                pre.append(L.Var(acc, p.vtype, L.Lit(AGG_IDENTITY[p.agg])))
                body.append(L.Assign(acc, L.Combine(p.agg, acc, value)))
                post.append(L.Store(view.ptr, view.offset, acc, p.agg, count, streams))
        if self.blk.schedule.prefetch and p.red_loops:
            body = self.prefetches(idx, combos) + body
        if first is not None and accumulate:
            # No init brought the tile's lines into the caches: fetch them while it sums.
            pre += [L.Prefetch(store.buffer, store.offset, write=True) for store in post]
        return pre + self._red_loops(idx, body) + self._first_writes(first, post)

    def _first_write(self, idx: dict[str, Affine]) -> tuple[Affine, ...] | None:
        """Where an element's first write happens (schedule `first`, pass `fold`): the
        conditions (each >= 0) that the outer reduction indices and those looped outside
        the sums are 0; None without a fold."""
        names = self.blk.schedule.first
        if names is None:
            return None
        written = {n for a in self.out.access for n in a.names}
        outside = [*names, *(n for n, _ in self.p.par_loops if n not in written)]
        conds = [idx[n].scale(-1) for n in outside]
        if any(not c.terms and c.const < 0 for c in conds):
            raise IRError(f"block {self.blk.name} folds an init into its first writes, but a "
                          "reduction index it names never is 0")
        return tuple(c for c in conds if c.terms)

    @staticmethod
    def _first_writes(first: tuple[Affine, ...] | None, post: list[L.Store]) -> list[L.Stmt]:
        """The stores after the sums: aggregating, and with a fold, assigning where
        `first` holds (analysis.fold: no unrolled index is a reduction index)."""
        if first is None:
            return list(post)
        assign = tuple(replace(store, agg="assign") for store in post)
        return [L.If(first, assign, tuple(post))] if first else list(assign)

    def prefetches(self, idx: dict[str, Affine], combos: list[dict[str, int]]
                   ) -> list[L.Stmt]:
        """Every cache line of the rows that the gathered loads of this tile will read
        `prefetch` iterations of the innermost reduction loop ahead, while that
        iteration exists. Its subscripts are checked as the load there will check them,
        so a bad one fails the kernel as it would a few iterations later."""
        p, ahead = self.p, self.blk.schedule.prefetch
        name, rng = p.red_loops[-1]
        later = dict(idx)
        later[name] = idx[name] + ahead
        out: list[L.Stmt] = []
        memo: dict = {}
        for combo in combos:
            at = self._at(later, combo)
            at[p.vector] = Affine.constant(0)
            for st in self.blk.stmts:
                if not (isinstance(st, Load) and any(d is not None for d in st.dynamic)):
                    continue
                ref = self.blk.ref(st.ref)
                view = child_view(ref, self.outer.views[ref.from_], at)

                def operand(name: str) -> tuple[str, dtypes.DType]:
                    value, _ = self.value(name, at, combo, 0, p.lanes, memo, out)
                    return value, self.dtypes[value]

                address = self.low.address(view, st, operand, out,
                                           memo.setdefault("checked", {}))
                # An element per cache line the row segment spans, the last one included.
                line = max(1, LINE_BYTES // view.dtype.numpy.itemsize)
                for e in sorted(set(range(0, p.vec_range, line)) | {p.vec_range - 1}):
                    out.append(L.Prefetch(view.ptr, address + e))
        hi = self._hi(name, rng)
        bound: list[L.Stmt] = []
        if not isinstance(hi, Affine):
            var = self.low.fresh("n")
            bound.append(L.Let(var, INT64, L.IntValue(hi)))
            hi = Affine.index(var)
        (var,) = idx[name].names
        return bound + [L.If((hi - Affine.index(var) - (ahead + 1),), tuple(out))]

    def _lanes(self, combo: dict[str, int], base: int, width: int, out: list[L.Stmt]
               ) -> int | str:
        """Lanes of the chunk at `base` that the vector bounds leave active: a number, or
        a name defined in `out` when it depends on outer indices."""
        fixed = {u: Affine.constant(v) for u, v in combo.items()}
        counts = [unrolled.substitute(fixed) + outside + (1 - base)
                  for unrolled, outside in self.p.vec_bounds]
        # A count that the ranges of the loops around it keep at `width` or more is all
        # lanes: the first chunk of a 16-wide tile over a 28-wide row (its last tile holds
        # 12 lanes) loads plainly, where a masked load in the reduction loop cost a 1x1
        # convolution a third of its time (Zen 3).
        counts = [c for c in counts if not c.terms or self._least(c) < width]
        static = min([width] + [c.const for c in counts if not c.terms])
        dynamic = [c for c in counts if c.terms]
        if static <= 0 or not dynamic:
            return max(static, 0)
        var = self.low.fresh("nv")
        active = L.IMin((Affine.constant(static), *dynamic))
        out.append(L.Let(var, INT64, L.IntValue(L.IMax((active, Affine.constant(0))))))
        return var

    def _least(self, count: Affine) -> float:
        """The least value of `count` over the ranges of the loops it names (-inf where
        one is not known)."""
        ranges = self.low.loop_ranges
        if any(n not in ranges for n in count.names):
            return -math.inf
        return count.const + sum(k * (ranges[n] - 1) for n, k in count.terms if k < 0)

    def dot(self, idx: dict[str, Affine], combos: list[dict[str, int]]) -> list[L.Stmt]:
        p, low = self.p, self.low
        tail = p.vec_range % p.lanes
        start = p.vec_range - tail
        # With few accumulators, each gets DOT_CHAINS // len(combos) copies fed by
        # consecutive chunks: one chain of vector adds (or max) would wait for the
        # previous result every chunk.
        copies = max(1, min(DOT_CHAINS // len(combos), start // p.lanes))
        accs = [[low.fresh("acc") for _ in combos] for _ in range(copies)]
        pre: list[L.Stmt] = [L.Var(a, p.vtype, L.Lit(AGG_IDENTITY[p.agg]))
                             for row in accs for a in row]

        def step(base: Affine, n: int, row: list[str]) -> list[L.Stmt]:
            body: list[L.Stmt] = []
            memo: dict = {}
            for combo, acc in zip(combos, row):
                at = self._at(idx, combo)
                at[p.vector] = base
                value = self.vector(self.store.value, at, combo, 0, n, memo, body)
                if n < p.lanes:
                    masked = low.fresh("v")
                    body.append(L.Let(masked, p.vtype,
                                      L.Mask(value, Affine.constant(n), AGG_IDENTITY[p.agg])))
                    value = masked
                body.append(L.Assign(acc, L.Combine(p.agg, acc, value)))
            return body

        stride = copies * p.lanes
        main_end = start - start % stride
        inner: list[L.Stmt] = []
        if main_end:
            chunk = low.fresh("i")
            unrolled = [x for j in range(copies)
                        for x in step(Affine.index(chunk) + j * p.lanes, p.lanes, accs[j])]
            inner.append(L.Loop(chunk, Affine.constant(0), Affine.constant(main_end),
                                tuple(unrolled), step=stride))
        if start % stride:
            chunk = low.fresh("i")
            inner.append(L.Loop(chunk, Affine.constant(main_end), Affine.constant(start),
                                tuple(step(Affine.index(chunk), p.lanes, accs[0])),
                                step=p.lanes))
        if tail:
            inner += step(Affine.constant(start), tail, accs[0])
        post: list[L.Stmt] = [L.Assign(acc, L.Combine(p.agg, acc, row[k]))
                              for row in accs[1:] for k, acc in enumerate(accs[0])]
        views = [child_view(self.out, self.outer.views[self.out.from_], self._at(idx, combo))
                 for combo in combos]
        k = 0
        while k < len(views):
            m = _consecutive(views, k, p.lanes) if p.agg == "add" else 1
            if m > 1:
                # m sums into consecutive elements: one vector of them, by a tree of
                # shuffles, and one store.
                total = _lane_sums(accs[0][k:k + m], p, low, post)
                count = None if m == p.lanes else Affine.constant(m)
                post.append(L.Store(views[k].ptr, views[k].offset, total, p.agg, count))
            else:
                total = low.fresh("s")
                post += [L.Let(total, L.VType(dtypes.FLOAT32), L.Reduce(p.agg, accs[0][k])),
                         L.Store(views[k].ptr, views[k].offset, total, p.agg)]
            k += m
        return pre + self._red_loops(idx, inner) + post

    # ------------------------------------------------------------ values
    def vector(self, name: str, at: dict[str, Affine], combo: dict[str, int], base: int,
               n: int | str, memo: dict, out: list[L.Stmt]) -> str:
        """Scalar `name` at this point as a vector (broadcast if it does not vary)."""
        value, is_vec = self.value(name, at, combo, base, n, memo, out)
        return value if is_vec else self.broadcast(value, memo, out)

    def broadcast(self, name: str, memo: dict, out: list[L.Stmt],
                  dtype: dtypes.DType = dtypes.FLOAT32) -> str:
        """Scalar `name` in every lane, as a float32 vector or, `dtype` bool, a mask (once
        per straight-line body, like values)."""
        key = ("broadcast", name, dtype)
        if key not in memo:
            scalar = self.low.convert(name, self.dtypes[name], dtype, "s", out)
            self.dtypes[scalar] = dtype
            memo[key] = self.low.fresh("v")
            out.append(L.Let(memo[key], L.VType(dtype, self.p.lanes), L.Broadcast(scalar)))
        return memo[key]

    def value(self, name: str, at: dict[str, Affine], combo: dict[str, int], base: int,
              n: int | str, memo: dict, out: list[L.Stmt]) -> tuple[str, bool]:
        """The loop IR name holding IR scalar `name` at this point; True if it is a vector."""
        stmt = self.defs[name]
        deps = self.deps[name]
        key = (name, tuple(sorted((u, v) for u, v in combo.items() if u in deps)),
               base if self.p.vector in deps else None)
        if key in memo:
            return memo[key]
        if isinstance(stmt, Constant):
            result = (self.scalar(stmt.dtype, L.Lit(stmt.value), out), False)
        elif isinstance(stmt, LoadIndex):     # a scalar: plan() keeps the vector index out
            value = L.IntValue(resolve(stmt.value, at, "an index value"))
            result = (self.scalar(dtypes.INT64, value, out), False)
        elif isinstance(stmt, Load):
            result = self.load(stmt, at, n, out, combo, memo)
        else:
            assert isinstance(stmt, Intrinsic)
            args = [self.value(a, at, combo, base, n, memo, out) for a in stmt.inputs]
            result = self.intrinsic(stmt, args, memo, out)
        memo[key] = result
        return result

    def scalar(self, dt: dtypes.DType, value: L.Expr, out: list[L.Stmt]) -> str:
        var = self.low.fresh("s")
        self.dtypes[var] = dt
        out.append(L.Let(var, L.VType(dt), value))
        return var

    def load(self, st: Load, at: dict[str, Affine], n: int | str, out: list[L.Stmt],
             combo: dict[str, int], memo: dict) -> tuple[str, bool]:
        ref = self.blk.ref(st.ref)
        view = child_view(ref, self.outer.views[ref.from_], at)

        def operand(name: str) -> tuple[str, dtypes.DType]:
            value, _ = self.value(name, at, combo, 0, n, memo, out)
            return value, self.dtypes[value]

        address = self.low.address(view, st, operand, out, memo.setdefault("checked", {}))
        if self.p.vector in self.deps[st.into]:
            var = self.low.fresh("v")
            count = None if n == self.p.lanes else _count(n)
            # Reused across the register tile's unrolled values of the indices it does
            # not depend on: held in a register.
            held = any(r > 1 and u not in self.deps[st.into] for u, r in self.p.unroll.items())
            out.append(L.Let(var, self.p.vtype, L.Read(view.ptr, address, self.p.lanes, count),
                             held))
            key = ("next_row", view.ptr, address)
            for ahead in (a for a in self.blk.schedule.next_row if a.view == ref.into):
                if key not in memo:             # once per address, unless this row is the last
                    memo[key] = True
                    last = Affine.constant(ahead.rows - 2) - at[ahead.index]
                    out.append(L.If((last,), (L.Prefetch(view.ptr, address + ahead.stride),)))
            return var, True
        return self.scalar(view.dtype, L.Read(view.ptr, address), out), False

    def intrinsic(self, st: Intrinsic, args: list[tuple[str, bool]], memo: dict,
                  out: list[L.Stmt]) -> tuple[str, bool]:
        if not any(v for _, v in args):
            names = tuple(a for a, _ in args)
            return self.scalar(st.dtype, L.Op(st.op, names, st.dtype), out), False
        if st.op in VECTOR_IDENTITIES:
            source = self.defs[st.inputs[0]]   # a varying bool is a mask op's result
            if st.op == "ident" or not (isinstance(source, Intrinsic)
                                        and source.dtype == dtypes.BOOL):
                return args[0]              # float32 -> float32 on vectors
            # a cast of a mask to float32: 1 where true, else 0
            ones, zeros = (self.broadcast(self.scalar(dtypes.FLOAT32, L.Lit(x), out), memo, out)
                           for x in (1.0, 0.0))
            return self._op("select", (args[0][0], ones, zeros), dtypes.FLOAT32, out), True
        kinds = MASK_OPS[st.op][0] if st.op in MASK_OPS else ("float",) * len(args)
        xs = tuple(a if v else self.broadcast(a, memo, out, dtypes.BOOL if k == "mask"
                                                 else dtypes.FLOAT32)
                   for (a, v), k in zip(args, kinds))
        return self._op(st.op, xs, st.dtype if st.op in MASK_OPS else dtypes.FLOAT32, out), True

    def _op(self, op: str, args: tuple[str, ...], dtype: dtypes.DType,
            out: list[L.Stmt]) -> str:
        """A vector of `op` on vectors `args`: float32, or a mask where `dtype` is bool."""
        var = self.low.fresh("v")
        out.append(L.Let(var, L.VType(dtype, self.p.lanes), L.Op(op, args, dtype)))
        return var


def _consecutive(views: list[View], k: int, lanes: int) -> int:
    """How many of the views from the k-th on, a power of two and at most `lanes`, are
    consecutive elements of one buffer."""
    n = 1
    while (n < lanes and k + n < len(views) and views[k + n].ptr == views[k].ptr
           and views[k + n].offset - views[k].offset == Affine.constant(n)):
        n += 1
    return 1 << (n.bit_length() - 1)


def _lane_sums(accs: list[str], p: _Plan, low: Lowering, out: list[L.Stmt]) -> str:
    """A vector whose lane j < len(accs) is the sum of vector accs[j]'s lanes (len(accs)
    a power of two, at most `lanes`): pairs of vectors exchange blocks of w lanes and
    add, w = 1, 2, 4, ... (len(accs) - 1 adds in all), then the halves of the result fold
    onto its first len(accs) lanes. A horizontal sum per accumulator takes log2(lanes)
    shuffles and adds each."""
    n, level, w = p.lanes, list(accs), 1

    def shuffled(a: str, b: str, lanes: tuple[int, ...]) -> str:
        name = low.fresh("v")
        out.append(L.Let(name, p.vtype, L.Shuffle(a, b, lanes)))
        return name

    def add(x: str, y: str) -> str:
        name = low.fresh("v")
        out.append(L.Let(name, p.vtype, L.Combine("add", x, y)))
        return name
    while len(level) > 1:
        level = [add(shuffled(a, b, tuple(j if (j // w) % 2 == 0 else n + j - w
                                          for j in range(n))),
                     shuffled(a, b, tuple(j + w if (j // w) % 2 == 0 else n + j
                                          for j in range(n))))
                 for a, b in zip(level[0::2], level[1::2])]
        w *= 2
    total, half = level[0], n // 2
    while half >= len(accs):
        total = add(total, shuffled(total, total, tuple(j + half if j < half else j
                                                        for j in range(n))))
        half //= 2
    return total
