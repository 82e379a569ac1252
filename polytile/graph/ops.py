"""The op graph of one specialized TC function (FusionStitching §4's computation graph).

    graph = op_graph(specialize(fn, shapes, scalars))
    graph.ops[2].kind          # "elementwise" | "row-reduction" | "column-reduction" |
                               # "scalar-reduction" | "contraction" | "gather" | "scatter"
    graph.ops[2].shape         # the parallel shape: the extents of its left-hand indices
    graph.data[2]              # ops whose results op 2 reads (producer -> consumer)

One node per statement, in statement order (a topological order). Edges come from the
tensors: a statement that reads a tensor depends on the last statement that wrote it
(a data edge: the value flows), and every later write of a tensor waits for the earlier
reads and writes of it (ordering edges). Fusion must keep every edge pointing forward;
only data edges save memory traffic when their ends share a kernel.

Bytes are what a kernel of the op alone moves: every tensor it reads (the part its
ranges touch, bounded by the tensor) and what it writes, from range inference.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from polytile.sema import program as P
from polytile.sema import ranges as R
from polytile.sema import typing as T
from polytile.sema.specialize import Specialized

KINDS = ("elementwise", "row-reduction", "column-reduction", "scalar-reduction",
         "contraction", "gather", "scatter")


@dataclass(frozen=True)
class Op:
    index: int                       # the statement's position in its function
    kind: str                        # one of KINDS
    text: str                        # the statement, as TC
    writes: str                      # the tensor it writes
    reads: tuple[str, ...]           # the tensors it reads, first use first
    shape: tuple[int, ...]           # the parallel shape (left-hand index extents)
    reduced: int                     # iterations of its reduction indices (1: none)
    read_bytes: tuple[int, ...]      # per tensor of `reads`
    write_bytes: int
    batched: bool = False            # a contraction with an index every operand shares

    @property
    def bytes(self) -> int:
        return sum(self.read_bytes) + self.write_bytes

    @property
    def rows(self) -> int:
        """Extent of the first (row) index: what a fused row loop would iterate."""
        return self.shape[0] if self.shape else 1


@dataclass(frozen=True)
class OpGraph:
    function: str
    ops: tuple[Op, ...]
    data: tuple[frozenset[int], ...]       # per op: the ops whose values it reads
    order: tuple[frozenset[int], ...]      # per op: every op it must follow (data included)
    outputs: frozenset[str]                # tensors that leave the function
    temps: frozenset[str]
    after: tuple[frozenset[int], ...] = ()   # per op: the ops that must follow it

    def consumers(self, k: int) -> frozenset[int]:
        return frozenset(j for j, d in enumerate(self.data) if k in d)

    def producers(self, k: int) -> frozenset[int]:
        return self.data[k]

    def successors(self, k: int) -> frozenset[int]:
        return self.after[k]

    def convex(self, members: frozenset[int]) -> bool:
        """No path of ordering edges leaves `members` and comes back: fusing them into
        one kernel keeps the graph a DAG."""
        stack = [j for k in members for j in self.successors(k) if j not in members]
        seen: set[int] = set()
        while stack:
            k = stack.pop()
            if k in seen:
                continue
            seen.add(k)
            for j in self.successors(k):
                if j in members:
                    return False
                stack.append(j)
        return True


def op_graph(spec: Specialized) -> OpGraph:
    fn = spec.fn
    ops = tuple(_op(k, st, spec) for k, st in enumerate(fn.statements))
    data: list[frozenset[int]] = []
    order: list[frozenset[int]] = []
    last_writer: dict[str, int] = {}
    readers: dict[str, list[int]] = {}
    writers: dict[str, list[int]] = {}
    for op in ops:
        flows = {last_writer[t] for t in op.reads if t in last_writer and last_writer[t] != op.index}
        before = set(flows)
        before.update(j for j in readers.get(op.writes, ()) if j != op.index)
        before.update(writers.get(op.writes, ()))
        data.append(frozenset(flows))
        order.append(frozenset(before))
        for t in op.reads:
            readers.setdefault(t, []).append(op.index)
        writers.setdefault(op.writes, []).append(op.index)
        last_writer[op.writes] = op.index
    after = tuple(frozenset(j for j, o in enumerate(order) if op.index in o) for op in ops)
    return OpGraph(fn.name, ops, tuple(data), tuple(order),
                   frozenset(t.name for t in fn.outputs), frozenset(t.name for t in fn.temps),
                   after)


def _op(k: int, st: P.Statement, spec: Specialized) -> Op:
    extents = {n: hi - lo for n, lo, hi in spec.ranges[k]}
    reads: dict[str, int] = {}
    for r in T.reads(st.rhs):
        size = _footprint(r, extents, spec)
        reads[r.tensor] = max(reads.get(r.tensor, 0), size)
    fn = spec.fn
    out = fn.tensor(st.tensor)
    width = _width(out)
    shape = tuple(extents[i] for i in st.indices)
    written = math.prod(shape) if not st.scatter else math.prod(spec.shape(st.tensor))
    reduced = math.prod(extents[i] for i in st.reduction_indices)
    kind = _kind(st, spec)
    batched = kind == "contraction" and any(
        all(any(i in T.index_names(x) for x in r.indices) for r in T.reads(st.rhs))
        for i in st.indices)
    return Op(k, kind, _text(st), st.tensor, tuple(reads), shape, reduced,
              tuple(reads.values()), written * width, batched)


def _width(t: P.Tensor) -> int:
    return max(1, t.dtype.bits // 8)


def _footprint(r: P.Read, extents: dict[str, int], spec: Specialized) -> int:
    """Bytes of `r`'s tensor that the statement can touch: per dimension the span of an
    affine subscript over the ranges, the whole dimension otherwise."""
    t = spec.fn.tensor(r.tensor)
    shape = spec.shape(r.tensor)
    elems = 1
    for sub, size in zip(r.indices, shape):
        lin = R.linearize(sub)
        if lin is None:
            elems *= size
            continue
        env = spec.sizes
        span = 1 + sum(abs(c.evaluate(env)) * (extents.get(n, 1) - 1) for n, c in lin.coeffs)
        elems *= min(size, span)
    return elems * _width(t)


def _kind(st: P.Statement, spec: Specialized) -> str:
    if st.scatter:
        return "scatter"
    reads = T.reads(st.rhs)
    if any(R.linearize(i) is None for r in reads for i in r.indices):
        return "gather"
    reduced = st.reduction_indices
    if not reduced:
        return "elementwise"
    if not st.indices:
        return "scalar-reduction"
    if _is_product(st.rhs, reduced) and st.op == "+=":
        return "contraction"
    # A row reduction reduces along its largest input's innermost dimension (each row's
    # elements are contiguous); anything else walks columns.
    big = max(reads, key=lambda r: math.prod(spec.shape(r.tensor)), default=None)
    if big is not None and big.indices and T.index_names(big.indices[-1]) & set(reduced):
        return "row-reduction"
    return "column-reduction"


def _is_product(e: P.TExpr, reduced: tuple[str, ...]) -> bool:
    """A multiply of two different tensors' plain reads that both run over a reduction
    index (a GEMM-like contraction; `(x - m) * (x - m)` is a reduction, not a GEMM)."""
    e = _uncast(e)
    if not (isinstance(e, P.Op) and e.op == "mul"):
        return False
    args = [_uncast(a) for a in e.args]
    if not all(isinstance(a, P.Read) for a in args):
        return False
    reads = [a for a in args if isinstance(a, P.Read)]
    return (len({r.tensor for r in reads}) == 2 and all(
        any(T.index_names(i) & set(reduced) for i in r.indices) for r in reads))


def _uncast(e: P.TExpr) -> P.TExpr:
    while isinstance(e, P.Op) and e.op == "cast":
        e = e.args[0]
    return e


def _text(st: P.Statement) -> str:
    from polytile.sema.printer import format_expr
    subscripts = [format_expr(x) for x in st.scatter] or list(st.indices)
    return (f"{st.tensor}({', '.join(subscripts)}) {st.op}{'!' if st.init else ''} "
            f"{format_expr(st.rhs)}")
