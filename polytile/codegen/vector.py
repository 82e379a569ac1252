"""Vector code for register-tiled leaf blocks (schedule `micro, vector(V, float32, L),
unroll(U)`), with GCC vector extensions: no hope in the auto-vectorizer.

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
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from polytile import dtypes
from polytile.analysis.deps import scalar_indices
from polytile.analysis.vectorizable import boundary_versions, lane_bound, why_not_vector
from polytile.codegen import cexpr
from polytile.codegen.cops import C_OPS, VECTOR_IDENTITIES, Lanewise
from polytile.codegen.cscope import Scope, c_affine, child_view, fixed_indices, resolve, safe
from polytile.errors import IRError
from polytile.ir.nodes import Affine, Block, Constant, Intrinsic, Load, LoadIndex, Store

if TYPE_CHECKING:
    from polytile.codegen.c import _FunctionWriter

DOT_CHAINS = 4      # independent accumulator chains a dot-product kernel keeps at least
_IDENTITY = {"add": "0.0f", "mul": "1.0f", "max": "-__builtin_inff()", "min": "__builtin_inff()"}


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
    bounds: dict[str, str] = field(default_factory=dict)   # looped index -> C upper bound
    # Upper bounds on a parallel vector index (its last valid value) as (part over the
    # unrolled indices + constant, part over C variables; their namespaces overlap): a
    # tile cut short by a constraint runs with masked lanes.
    vec_bounds: list[tuple[Affine, Affine]] = field(default_factory=list)


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


def emit(w: "_FunctionWriter", blk: Block, outer: Scope) -> list[str] | None:
    """Lines for `blk`, or None to let the scalar generator handle it."""
    p = plan(blk)
    if p is None:
        return None
    w.vector_lanes = p.lanes
    idx = fixed_indices(blk, outer.idx)
    if not blk.constraints:
        return [f"/* block {safe(blk.name)}: vector */"] + _Emitter(w, blk, outer, p, idx).lines()
    boundary, needed = blk.schedule.boundary, boundary_versions(blk)
    if boundary != needed:
        given = f"boundary({boundary})" if boundary else "nothing"
        raise IRError(f"vector block {blk.name} has constraints, so its schedule must say how "
                      f"boundary tiles run: boundary({needed}), not {given}")
    if boundary == "remainders":
        counts = _unroll_counts(blk, p, idx)
        return ([f"/* block {safe(blk.name)}: vector code, one version per tile remainder */"]
                + _versions(w, blk, outer, p, idx, counts, {}))
    full = _full_tile(blk, idx)
    body = _Emitter(w, blk, outer, p, idx).lines()
    scalar = w.block(replace(blk, schedule=replace(blk.schedule, micro=False)), outer)
    return ([f"/* block {safe(blk.name)}: vector code for full tiles */", f"if ({full}) {{"]
            + _ind(body) + ["} else {"] + _ind(scalar) + ["}"])


def _unroll_counts(blk: Block, p: _Plan, idx: dict[str, Affine]) -> dict[str, str]:
    """For a boundary tile of kind "remainders" (every constraint an upper bound on one
    unrolled or looped index, or a lane bound; analysis.vectorizable), the C expression of
    how many values of each such index run; looped indices get it as their loop bound
    (`p.bounds`), and lane bounds become lane counts (`p.vec_bounds`)."""
    counts: dict[str, str] = {}
    loops = {i.name for i in blk.idxs if i.affine is None and i.range > 1}
    looped = {n for n, _ in p.par_loops + p.red_loops}
    for c in blk.constraints:
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
        r = c_affine(rest)
        bound = f"(({r}) >= 0 ? ({r}) / {a} + 1 : 0)"
        counts[x] = f"pt_imin({counts[x]}, {bound})" if x in counts else bound
    for x in looped & set(counts):
        p.bounds[x] = counts.pop(x)
    return counts


def _versions(w: "_FunctionWriter", blk: Block, outer: Scope, p: _Plan, idx: dict[str, Affine],
              counts: dict[str, str], fixed: dict[str, int]) -> list[str]:
    """Nested switches over the remainders; each case is the vector code for that size."""
    pending = [u for u in counts if u not in fixed]
    if not pending:
        sub = replace(p, unroll={u: fixed.get(u, r) for u, r in p.unroll.items()})
        return _Emitter(w, blk, outer, sub, idx).lines()
    u = pending[0]
    var = w.fresh("n")
    lines = [f"const int64_t {var} = {counts[u]};", f"switch ({var} < {p.unroll[u]} ? {var} : "
             f"{p.unroll[u]}) {{"]
    for value in range(p.unroll[u], 0, -1):
        lines.append(f"case {value}: {{")
        lines += _ind(_versions(w, blk, outer, p, idx, counts, {**fixed, u: value}))
        lines.append("    break;")
        lines.append("}")
    lines += ["default: break;", "}"]
    return ["{"] + _ind(lines) + ["}"]


def _full_tile(blk: Block, idx: dict[str, Affine]) -> str | None:
    """C condition that every constraint holds on the whole box, or None if there are none."""
    conds = []
    ranges = {i.name: i.range for i in blk.idxs if i.affine is None}
    for c in blk.constraints:
        low = Affine.constant(c.const)
        for name, coeff in c.terms:
            if name in ranges:
                low = low + (coeff * (ranges[name] - 1) if coeff < 0 else 0)
            else:
                low = low + idx[name].scale(coeff)
        conds.append(f"({c_affine(low)}) >= 0")
    return " && ".join(conds) if conds else None


class _Emitter:
    def __init__(self, w: "_FunctionWriter", blk: Block, outer: Scope, p: _Plan,
                 idx: dict[str, Affine]):
        self.w, self.blk, self.outer, self.p = w, blk, outer, p
        self.base_idx = dict(idx)
        self.deps = scalar_indices(blk)
        self.store = next(s for s in blk.stmts if isinstance(s, Store))
        self.out = blk.ref(self.store.ref)
        self.dtypes: dict[str, dtypes.DType] = {}     # scalar (non-vector) values' types
        # Looked up once per value: built once (rebuilding it per lookup was quadratic).
        self.defs: dict[str, object] = {s.into: s for s in blk.stmts
                                        if isinstance(s, (Load, Constant, Intrinsic, LoadIndex))}

    # ------------------------------------------------------------ structure
    def lines(self) -> list[str]:
        p, w = self.p, self.w
        idx = dict(self.base_idx)
        par_vars = []
        for name, _ in p.par_loops:
            var = w.fresh("i")
            idx[name] = Affine.index(var)
            par_vars.append(var)
        red_vars = []
        for name, _ in p.red_loops:
            var = w.fresh("i")
            idx[name] = Affine.index(var)
            red_vars.append(var)
        combos = [dict(zip(p.unroll, vals)) for vals in
                  itertools.product(*(range(r) for r in p.unroll.values()))] or [{}]
        if p.vec_is_reduction:
            body = self.dot(idx, combos)
        else:
            body = self.outer_product(idx, combos)
        inner = body
        # the reduction loops sit inside `body` already; wrap the parallel loops
        for var, (name, rng) in reversed(list(zip(par_vars, p.par_loops))):
            inner = ([f"for (int64_t {var} = 0; {var} < {self._hi(name, rng)}; {var}++) {{"]
                     + _ind(inner) + ["}"])
        return ["{"] + _ind(inner) + ["}"]

    def _hi(self, name: str, rng: int) -> str:
        bound = self.p.bounds.get(name)
        return str(rng) if bound is None else f"pt_imin({rng}, {bound})"

    def _red_loops(self, idx: dict[str, Affine], body: list[str]) -> list[str]:
        for (name, rng) in reversed(self.p.red_loops):
            var = c_affine(idx[name])
            body = ([f"for (int64_t {var} = 0; {var} < {self._hi(name, rng)}; {var}++) {{"]
                    + _ind(body) + ["}"])
        return body

    def outer_product(self, idx: dict[str, Affine], combos: list[dict[str, int]]) -> list[str]:
        p = self.p
        chunks = [(c * p.lanes, min(p.lanes, p.vec_range - c * p.lanes))
                  for c in range(-(-p.vec_range // p.lanes))]
        accumulate = bool(p.red_loops)
        pre, body, post = [], [], []
        memo: dict = {}
        accs: dict[tuple, str] = {}
        for combo in combos:
            for base, width in chunks:
                n = self._lanes(combo, base, width, pre)
                if n == 0:
                    continue
                at = dict(idx)
                at.update({u: Affine.constant(v) for u, v in combo.items()})
                at[p.vector] = Affine.constant(base)
                value, is_vec = self.value(self.store.value, at, combo, base, n, memo, body)
                value = value if is_vec else f"pt_vsplat({value})"
                view = child_view(self.out, self.outer.views[self.out.from_], at)
                addr = f"&{self.w.element(view, view.offset)}"
                if not accumulate:
                    body += self._combine_store(addr, value, n, p.agg)
                    continue
                acc = self.w.fresh("acc")
                accs[(tuple(combo.items()), base)] = acc
                pre.append(f"pt_vf {acc} = pt_vsplat({_IDENTITY[p.agg]});")
                body.append(f"{acc} = {self._combine('add' if p.agg == 'add' else p.agg, acc, value)};")
                post += self._combine_store(addr, acc, n, p.agg)
        return pre + self._red_loops(idx, body) + post

    def _lanes(self, combo: dict[str, int], base: int, width: int, out: list[str]) -> int | str:
        """Lanes of the chunk at `base` that the vector bounds leave active: a number, or
        a C variable declared in `out` when it depends on outer indices."""
        fixed = {u: Affine.constant(v) for u, v in combo.items()}
        counts = [unrolled.substitute(fixed) + outside + (1 - base)
                  for unrolled, outside in self.p.vec_bounds]
        static = min([width] + [c.const for c in counts if not c.terms])
        dynamic = [c_affine(c) for c in counts if c.terms]
        if static <= 0 or not dynamic:
            return max(static, 0)
        var = self.w.fresh("nv")
        expr = str(static)
        for d in dynamic:
            expr = f"pt_imin({expr}, {d})"
        out.append(f"const int64_t {var} = {expr} > 0 ? {expr} : 0;")
        return var

    def dot(self, idx: dict[str, Affine], combos: list[dict[str, int]]) -> list[str]:
        p = self.p
        chunk = self.w.fresh("i")
        tail = p.vec_range % p.lanes
        start = p.vec_range - tail
        # With few accumulators, each gets DOT_CHAINS // len(combos) copies fed by
        # consecutive chunks: one chain of vector adds (or max) would wait for the
        # previous result every chunk.
        copies = max(1, min(DOT_CHAINS // len(combos), start // p.lanes))
        accs = [[self.w.fresh("acc") for _ in combos] for _ in range(copies)]
        pre = [f"pt_vf {a} = pt_vsplat({_IDENTITY[p.agg]});" for row in accs for a in row]

        def step(base: Affine, n: int, row: list[str]) -> list[str]:
            body: list[str] = []
            memo: dict = {}
            for combo, acc in zip(combos, row):
                at = dict(idx)
                at.update({u: Affine.constant(v) for u, v in combo.items()})
                at[p.vector] = base
                value, is_vec = self.value(self.store.value, at, combo, 0, n, memo, body)
                value = value if is_vec else f"pt_vsplat({value})"
                if n < p.lanes:
                    value = f"pt_vsel(pt_viota() < {n}, {value}, pt_vsplat({_IDENTITY[p.agg]}))"
                body.append(f"{acc} = {self._combine(p.agg, acc, value)};")
            return body

        stride = copies * p.lanes
        inner = [f"int64_t {chunk} = 0;"]
        if start >= stride:
            unrolled = [x for j in range(copies)
                        for x in step(Affine.index(chunk) + j * p.lanes, p.lanes, accs[j])]
            inner += [f"for (; {chunk} + {stride} <= {start}; {chunk} += {stride}) {{",
                      *_ind(unrolled), "}"]
        if start % stride:
            inner += [f"for (; {chunk} < {start}; {chunk} += {p.lanes}) {{",
                      *_ind(step(Affine.index(chunk), p.lanes, accs[0])), "}"]
        if tail:
            inner += step(Affine.constant(start), tail, accs[0])
        post = [f"{acc} = {self._combine(p.agg, acc, row[k])};"
                for row in accs[1:] for k, acc in enumerate(accs[0])]
        reduce = {"add": "pt_vhsum", "max": "pt_vhmax", "min": "pt_vhmin", "mul": "pt_vhprod"}
        for combo, acc in zip(combos, accs[0]):
            at = dict(idx)
            at.update({u: Affine.constant(v) for u, v in combo.items()})
            view = child_view(self.out, self.outer.views[self.out.from_], at)
            post.append(self.w.assign(view, view.offset, f"{reduce[p.agg]}({acc})", p.agg))
        return pre + self._red_loops(idx, inner) + post

    # ------------------------------------------------------------ values
    def value(self, name: str, at: dict[str, Affine], combo: dict[str, int], base: int,
              n: int | str,
              memo: dict, out: list[str]) -> tuple[str, bool]:
        """C variable holding scalar `name` at this point; True if it is a vector."""
        stmt = self.defs[name]
        deps = self.deps[name]
        key = (name, tuple(sorted((u, v) for u, v in combo.items() if u in deps)),
               base if self.p.vector in deps else None)
        if key in memo:
            return memo[key]
        if isinstance(stmt, Constant):
            result = (cexpr.literal(stmt.value, stmt.dtype), False)
            self.dtypes[name] = stmt.dtype
        elif isinstance(stmt, LoadIndex):     # a scalar: plan() keeps the vector index out
            result = (f"({c_affine(resolve(stmt.value, at, 'an index value'))})", False)
            self.dtypes[name] = dtypes.INT64
        elif isinstance(stmt, Load):
            result = self.load(stmt, at, n, out, combo, memo)
        else:
            assert isinstance(stmt, Intrinsic)
            args = [self.value(a, at, combo, base, n, memo, out) for a in stmt.inputs]
            result = self.intrinsic(stmt, args, out)
        memo[key] = result
        return result

    def load(self, st: Load, at: dict[str, Affine], n: int | str, out: list[str],
             combo: dict[str, int], memo: dict) -> tuple[str, bool]:
        ref = self.blk.ref(st.ref)
        view = child_view(ref, self.outer.views[ref.from_], at)
        address = view.offset
        for d, name in enumerate(st.dynamic):
            if name is None:
                continue
            # A data-dependent subscript (a gather): checked before the access.
            value, _ = self.value(name, at, combo, 0, n, memo, out)
            var = self.w.fresh("d")
            out.append(f"const int64_t {var} = (int64_t)({value});")
            out.append(f"if ({var} < 0 || {var} >= {view.dims[d].size}) {{")
            out += _ind(self.w.fail(self.outer.fail, "PT_ERR_INDEX", view.param, d, var))
            out.append("}")
            address = address + Affine.index(var).scale(view.dims[d].stride)
        if st.offset is not None:
            # A pointer increment (polytile.passes.ptrinc), the same for every lane.
            value, _ = self.value(st.offset, at, combo, 0, n, memo, out)
            var = self.w.fresh("d")
            out.append(f"const int64_t {var} = (int64_t)({value});")
            address = address + Affine.index(var)
        element = self.w.element(view, address)
        if self.p.vector in self.deps[st.into]:
            var = self.w.fresh("v")
            load = f"pt_vload(&{element})" if n == self.p.lanes else f"pt_vload_n(&{element}, {n})"
            out.append(f"const pt_vf {var} = {load};")
            return var, True
        var = self.w.fresh("s")
        dt = view.dtype
        self.dtypes[st.into] = dt
        out.append(f"const {cexpr.scalar_type(dt)} {var} = "
                   f"{cexpr.load(element, dt, self.w.needs)};")
        return var, False

    def intrinsic(self, st: Intrinsic, args: list[tuple[str, bool]],
                  out: list[str]) -> tuple[str, bool]:
        vec = any(v for _, v in args)
        xs = [a if v or not vec else f"pt_vsplat({a})" for a, v in args]
        op = st.op
        if op in VECTOR_IDENTITIES and vec:     # float32 -> float32 on vectors
            return args[0]
        if not vec:
            typed = [(a, self.dtypes.get(n, dtypes.FLOAT32)) for (a, _), n in
                     zip(args, st.inputs)]
            expr = cexpr.intrinsic(op, typed, st.dtype, self.w.needs)
            var = self.w.fresh("s")
            self.dtypes[st.into] = st.dtype
            out.append(f"const {cexpr.scalar_type(st.dtype)} {var} = {expr};")
            return var, False
        form = C_OPS[op].vector
        if isinstance(form, Lanewise):
            var = self.w.fresh("v")
            out.append(f"pt_vf {var};")
            lane = self.w.fresh("l")
            out.append(f"for (int {lane} = 0; {lane} < {self.p.lanes}; {lane}++) "
                       f"{var}[{lane}] = {form.template.format(f'{xs[0]}[{lane}]')};")
            return var, True
        assert form is not None, f"{op} has no vector form (analysis.vectorizable admits it)"
        var = self.w.fresh("v")
        out.append(f"const pt_vf {var} = {form.format(*xs)};")
        return var, True

    @staticmethod
    def _combine(agg: str, acc: str, value: str) -> str:
        if agg == "add":
            return f"{acc} + {value}"
        if agg == "mul":
            return f"{acc} * {value}"
        return f"pt_v{'max' if agg == 'max' else 'min'}_nan({acc}, {value})"

    def _combine_store(self, addr: str, value: str, n: int | str, agg: str) -> list[str]:
        full = n == self.p.lanes
        load = f"pt_vload({addr})" if full else f"pt_vload_n({addr}, {n})"
        if agg != "assign":
            value = self._combine(agg, load, value)
        store = f"pt_vstore({addr}, {value});" if full else f"pt_vstore_n({addr}, {value}, {n});"
        return [store]


def _ind(lines: list[str]) -> list[str]:
    return ["    " + x for x in lines]
