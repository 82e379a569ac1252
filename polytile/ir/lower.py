"""Lowering: a Program specialized to one call's sizes -> Stripe blocks.

One block per statement, preceded by an initializing block for each `!`
reduction. Every tensor access becomes a refinement of the top-level buffer
(affine origin, unit-size view) and a load; a subscript that is not affine (a
gather `X(I(i))`, a division) keeps the full dimension in the view and feeds the
load a dynamic offset, which the code generator bounds-checks. Temporaries are
top-level `none` buffers.

    C(i) +=! A(i, k) * x(k)          block s0_init [i:M] #init ( out C <- C[i] ... )
                              ->       { $c = const(0.0); C = store($c) }
                                     block s0 [i:M, k:K] #contraction (
                                       in A <- A[i, k]; in x <- x[k]; out C <- C[i] :add )
                                       { $A = load(A); $x = load(x); $m = mul($A, $x); C = store($m) }
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from polytile.dtypes import DType
from polytile.ir import nodes as N
from polytile.sema import program as P
from polytile.sema import ranges as R
from polytile.sema import typing as T
from polytile.sema.specialize import Specialized
from polytile.sema.widen import widen_reductions

AGG = {"=": "assign", "+=": "add", "*=": "mul", "max=": "max", "min=": "min"}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def contiguous(dtype: DType, shape: tuple[int, ...]) -> N.TensorShape:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return N.TensorShape(dtype, tuple(N.Dim(s, st) for s, st in zip(shape, reversed(strides))))


def ir_name(name: str) -> str:
    """TC names may start with a digit (`2LUT`); IR names are identifiers."""
    # One-to-one: a name that already starts with the prefix gets it once more, so
    # `2LUT` (-> t_2LUT) and `t_2LUT` (-> t_t_2LUT) stay apart.
    return name if _NAME.match(name) and not name.startswith("t_") else "t_" + name


def lower(spec: Specialized) -> N.Function:
    spec = widen_reductions(spec)       # float16 and bfloat16 reduce in float32
    fn = spec.fn
    env = spec.sizes
    read = {r.tensor for st in fn.statements for r in T.reads(st.rhs)}
    top: list[N.Refinement] = []
    for t in fn.params:
        top.append(N.Refinement("in", "", ir_name(t.name), tuple(N.Affine() for _ in t.shape),
                                contiguous(t.dtype, spec.shape(t.name))))
    for t in fn.outputs:
        direction = "inout" if t.name in read or t.name in fn.inout else "out"
        top.append(N.Refinement(direction, "", ir_name(t.name),
                                tuple(N.Affine() for _ in t.shape),
                                contiguous(t.dtype, spec.shape(t.name))))
    for t in fn.temps:
        top.append(N.Refinement("none", "", ir_name(t.name), tuple(N.Affine() for _ in t.shape),
                                contiguous(t.dtype, spec.shape(t.name))))
    shapes = {r.into: r.shape for r in top}
    blocks: list[N.Statement] = []
    for k, (st, ranges) in enumerate(zip(fn.statements, spec.ranges)):
        # A statement over an empty range (a size of 0) does nothing; a `!` reduction over
        # an empty reduction range still starts its elements at the identity.
        empty = {n for n, lo, hi in ranges if hi == lo}
        lowering = _Statement(st, ranges, env, shapes, fn, f"s{k}")
        if st.init and st.reduction_indices and not empty & set(st.indices):
            blocks.append(lowering.init_block())
        if not empty:
            blocks.append(lowering.block())
    params = tuple(ir_name(t.name) for t in fn.params + fn.outputs)
    main = N.Block("main", refs=tuple(top), stmts=tuple(blocks), tags=frozenset({"main"}))
    return N.Function(ir_name(fn.name), params, main)


@dataclass
class _Statement:
    st: P.Statement
    ranges: tuple[tuple[str, int, int], ...]
    env: dict[str, int]
    shapes: dict[str, N.TensorShape]
    fn: P.Function
    name: str
    refs: dict[tuple, N.Refinement] = field(default_factory=dict)
    stmts: list[N.Statement] = field(default_factory=list)
    counter: dict[str, int] = field(default_factory=dict)

    # ------------------------------------------------------------ helpers
    def index_affine(self, name: str) -> N.Affine:
        """Indices run from 0 in the IR; a range starting at lo shifts by lo."""
        lo = next(lo for n, lo, _ in self.ranges if n == name)
        return N.Affine.index(name) + lo

    def affine(self, lin: R.Linear) -> N.Affine:
        result = N.Affine.constant(lin.const.evaluate(self.env))
        for name, coeff in lin.coeffs:
            result = result + self.index_affine(name).scale(coeff.evaluate(self.env))
        return result

    def scalar(self, base: str) -> str:
        base = re.sub(r"[^A-Za-z0-9_]", "_", base)
        n = self.counter.get(base, 0)
        self.counter[base] = n + 1
        return f"${base}" if n == 0 else f"${base}_{n}"

    def idxs(self, names: tuple[str, ...]) -> tuple[N.Index, ...]:
        spans = {n: hi - lo for n, lo, hi in self.ranges}
        return tuple(N.Index(n, spans[n]) for n in names)

    def lhs_ref(self, agg: str, direction: str) -> N.Refinement:
        tensor = ir_name(self.st.tensor)
        parent = self.shapes[tensor]
        if self.st.scatter:      # a data-dependent subscript's view spans its dimension
            lins = [R.linearize(x) for x in self.st.scatter]
            access = tuple(self.affine(lin) if lin is not None else N.Affine() for lin in lins)
            dims = tuple(N.Dim(1 if lin is not None else d.size, d.stride)
                         for lin, d in zip(lins, parent.dims))
        else:
            access = tuple(self.index_affine(i) for i in self.st.indices)
            dims = tuple(N.Dim(1, d.stride) for d in parent.dims)
        return N.Refinement(direction, tensor, tensor, access,
                            N.TensorShape(parent.dtype, dims), agg)

    # ------------------------------------------------------------ blocks
    def init_block(self) -> N.Block:
        dtype = self.shapes[ir_name(self.st.tensor)].dtype
        value = P.identity(self.st.op, dtype)
        ref = self.lhs_ref("assign", "out")
        stmts = (N.Constant("$init", value, dtype), N.Store(ref.into, "$init"))
        return N.Block(f"{self.name}_init", self.idxs(self.st.indices), (), (ref,), stmts,
                       frozenset({"kernel", "init"}))

    def block(self) -> N.Block:
        st = self.st
        reads_self = any(r.tensor == st.tensor for r in T.reads(st.rhs))
        direction = "inout" if reads_self else "out"
        # A `!` form without reduction indices is a plain assignment.
        agg = "assign" if st.init and not st.reduction_indices else AGG[st.op]
        lhs = self.lhs_ref(agg, direction)
        if reads_self:
            self.refs[(st.tensor, tuple(P.IndexVar(i, T.INDEX) for i in st.indices))] = lhs
        value = self.expr(st.rhs)
        target = self.shapes[lhs.from_].dtype
        if st.rhs.dtype != target:
            cast = self.scalar("cast")
            self.stmts.append(N.Intrinsic("cast", (value,), cast, target))
            value = cast
        dynamic = tuple(None if R.linearize(x) is not None else self.expr(x)
                        for x in st.scatter)
        self.stmts.append(N.Store(lhs.into, value, dynamic if any(dynamic) else ()))
        refs = [lhs] + [r for key, r in self.refs.items() if r is not lhs]
        kind = ("scatter" if st.scatter else "contraction" if st.reduction_indices
                else "elementwise")
        names = tuple(n for n, _, _ in self.ranges)
        return N.Block(self.name, self.idxs(names), (), tuple(refs), tuple(self.stmts),
                       frozenset({"kernel", kind}))

    # ------------------------------------------------------------ expressions
    def expr(self, e: P.TExpr) -> str:
        if isinstance(e, P.Const):
            into = self.scalar("c")
            self.stmts.append(N.Constant(into, e.value, e.dtype))
            return into
        if isinstance(e, P.SizeVal):
            into = self.scalar("size")
            self.stmts.append(N.Constant(into, e.expr.evaluate(self.env), e.dtype))
            return into
        if isinstance(e, P.IndexVar):
            into = self.scalar(e.name)
            self.stmts.append(N.LoadIndex(into, self.index_affine(e.name)))
            return into
        if isinstance(e, P.ScalarArg):
            ref = self.ref_for(e.name, ())
            into = self.scalar(e.name)
            self.stmts.append(N.Load(into, ref.into))
            return into
        if isinstance(e, P.Read):
            return self.read(e)
        args = tuple(self.expr(a) for a in e.args)
        into = self.scalar(e.op)
        self.stmts.append(N.Intrinsic(e.op, args, into, e.dtype))
        return into

    def read(self, e: P.Read) -> str:
        lins = [R.linearize(x) for x in e.indices]
        dynamic = tuple(None if lin is not None else self.expr(x)
                        for lin, x in zip(lins, e.indices))
        ref = self.ref_for(e.tensor, e.indices, lins)
        into = self.scalar(e.tensor)
        self.stmts.append(N.Load(into, ref.into, dynamic if any(dynamic) else ()))
        return into

    def ref_for(self, tensor: str, subs: tuple[P.TExpr, ...],
                lins: list[R.Linear | None] | None = None) -> N.Refinement:
        key = (tensor, subs)
        if key in self.refs:
            return self.refs[key]
        parent = self.shapes[ir_name(tensor)]
        lins = lins if lins is not None else [R.linearize(x) for x in subs]
        access = tuple(self.affine(lin) if lin is not None else N.Affine() for lin in lins)
        dims = tuple(N.Dim(1 if lin is not None else d.size, d.stride)
                     for lin, d in zip(lins, parent.dims))
        taken = {r.into for r in self.refs.values()} | {ir_name(self.st.tensor)}
        into = ir_name(tensor)
        n = 1
        while into in taken:
            into, n = f"{ir_name(tensor)}_{n}", n + 1
        ref = N.Refinement("in", ir_name(tensor), into, access,
                           N.TensorShape(parent.dtype, dims))
        self.refs[key] = ref
        return ref
