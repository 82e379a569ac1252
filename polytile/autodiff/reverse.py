"""Reverse-mode differentiation of a TC function, written as another TC function.

The forward function is first put in single-assignment form: a tensor written by
several statements (fcrelu's `y`) gets one version per statement, so the backward
can read the value each statement saw. Then the statements are walked in reverse,
and each read of a floating-point tensor `A(s)` in a statement over indices `I`
adds `g * d rhs / d A(s)` to the adjoint `d_A` at `s`, for every point of `I`:

* `s` is distinct plain indices (`x(n, i)`): a reduction over the other indices,
  `d_x(n, i) +=! ...` (TC's own form, which the passes optimize as a contraction);
* otherwise (`x(n, c, h + r, w + s)`, `x(2 * i)`): a scatter, `d_x(n, c, h + r,
  w + s) += ...`, which adds once per iteration;
* an index that neither `s` nor the value uses is not iterated: the value is
  multiplied by its extent (a where clause names only indices its statement uses).

Reductions route the adjoint of their result: `+=` to every term; `max=`/`min=` to the
terms equal to the result, split evenly between ties (torch.amax's rule); `*=` to
each factor times the product of the others, counted without dividing by zero.

The gradients of the inputs are sinks (nothing reads them): their statements are
emitted last, grouped per input, and consecutive elementwise ones merged into one
(`d_x = a` then `d_x += b` becomes `d_x = a + b`), so the fusion pass finds rows of
like statements instead of a column reduction between every two.

`backward(fn)` recomputes the forward values the derivatives need inside the
backward; `backward(fn, saved=True)` instead reads them as parameters, and
`forward_saving(fn)` is the forward that also returns them (what a training
framework runs: the forward once, the backward from what it kept).
"""
from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from polytile import dtypes
from polytile.autodiff import rules
from polytile.autodiff.rules import mul, select
from polytile.autodiff.ssa import ZERO, Program, Ranges, Stmt
from polytile.errors import ArgumentError, UnsupportedError
from polytile.sema import program as P
from polytile.sema import sizes as S
from polytile.sema import typing as T


@dataclass(frozen=True)
class Backward:
    """A derived TC function and how its parameters and outputs relate to the forward's."""

    source: str                                   # the TC text of `name`
    name: str
    gradients: tuple[tuple[str, str], ...]        # (forward input, its gradient output)
    seeds: tuple[tuple[str, str], ...]            # (forward output, its gradient parameter)
    saved: tuple[str, ...] = ()                   # forward values read as parameters


@dataclass
class _Adjoints:
    """The adjoint tensor of each version and the statements computing them."""

    program: Program
    names: dict[str, str] = field(default_factory=dict)
    ready: set[str] = field(default_factory=set)       # adjoints that hold a value
    given: set[str] = field(default_factory=set)       # adjoints that are parameters
    sinks: set[str] = field(default_factory=set)       # the inputs' gradients
    statements: list[Stmt] = field(default_factory=list)
    deferred: list[Stmt] = field(default_factory=list)

    def name(self, version: str) -> str:
        if version not in self.names:
            self.names[version] = self.program.names.fresh(f"d_{version}")
        return self.names[version]

    def emit(self, stmt: Stmt) -> None:
        if stmt.tensor in self.sinks:      # only its own statements touch a sink
            mine = [k for k, s in enumerate(self.deferred) if s.tensor == stmt.tensor]
            last = self.deferred[mine[-1]] if mine else None
            if last is not None and _mergeable(last, stmt):
                self.deferred[mine[-1]] = Stmt(last.tensor, last.lhs, last.op,
                                               rules.add(last.rhs, stmt.rhs), last.ranges)
            else:
                self.deferred.append(stmt)
            return
        if any(stmt.tensor in s.reads for s in self.deferred):
            self.flush()        # a deferred statement reads what this one changes
        self.statements.append(stmt)

    def flush(self) -> None:
        """The deferred statements, grouped per gradient in order of first appearance."""
        order = list(dict.fromkeys(s.tensor for s in self.deferred))
        self.statements += sorted(self.deferred, key=lambda s: order.index(s.tensor))
        self.deferred = []

    def add(self, version: str, subs: tuple[P.TExpr, ...], value: P.TExpr,
            ranges: Ranges) -> None:
        """d_version(subs) += value, for every point of `ranges`."""
        value, ranges = _counted(subs, value, ranges)
        prog = self.program
        name = self.name(version)
        if name in self.given:                       # never write into a parameter
            copy = prog.names.fresh(f"{name}_acc")
            self.emit(prog.copy(copy, name, like=version))
            self.names[version], name = copy, copy
            self.ready.add(copy)
        plain = [s.name for s in subs if isinstance(s, P.IndexVar)]
        distinct = len(plain) == len(subs) and len(set(plain)) == len(plain)
        bounds = dict(ranges)
        covers = distinct and all(bounds[i] == P.Range(ZERO, n)
                                  for i, n in zip(plain, prog.shapes[version]))
        if name not in self.ready and covers:
            op = "+=!" if len(ranges) > len(plain) else "="
            self.emit(Stmt(name, subs, op, value, ranges))
            self.ready.add(name)
            return
        if name not in self.ready:
            self.emit(prog.zero(name, version))
            self.ready.add(name)
        self.emit(Stmt(name, subs, "+=", value, ranges))


def _counted(subs: tuple[P.TExpr, ...], value: P.TExpr,
             ranges: Ranges) -> tuple[P.TExpr, Ranges]:
    """(value, ranges) of `d(subs) += value over ranges`, without the indices that
    neither the element nor the value uses (`O(k) +=! A(k) + B(i)` adds A(k) once per
    i; a where clause may only name indices its statement uses): the value is
    multiplied by the number of their points instead."""
    used = set().union(*(T.index_names(e) for e in (*subs, value)))
    unused = [r for i, r in ranges if i not in used]
    if not unused:
        return value, ranges
    count = S.SizeExpr.const_(1)
    for r in unused:
        count = count * S.extreme([r.hi - r.lo, S.SizeExpr.const_(0)], is_max=True)
    factor = P.Op("cast", (P.SizeVal(count, dtypes.INT64),), value.dtype)
    return mul(value, factor), tuple((i, r) for i, r in ranges if i in used)


def _mergeable(first: Stmt, then: Stmt) -> bool:
    return (first.tensor == then.tensor and first.lhs == then.lhs and then.op == "+="
            and first.op in ("=", "+=") and first.ranges == then.ranges
            and first.elementwise)


def backward(fn: P.Function, saved: bool = False,
             wrt: Collection[str] | None = None) -> Backward:
    """The TC function computing the gradients of `fn`'s float inputs (those named in
    `wrt`, default all) from its inputs and its outputs' gradients (see the module
    docstring). Statements only the other inputs' gradients need are not computed."""
    if fn.inout:
        raise UnsupportedError(
            f"{fn.name} reads outputs before writing them ({', '.join(sorted(fn.inout))}); "
            "polytile does not differentiate in/out outputs yet", fn.loc,
            "start the output from an input instead of its previous contents")
    prog = Program(fn)
    adj = _Adjoints(prog)
    seeds = []
    for o in fn.outputs:
        if o.dtype.is_float:
            name = adj.name(o.name)
            adj.given.add(name)
            adj.ready.add(name)
            seeds.append((o.name, name))
    inputs = [p for p in fn.params if p.kind == "input" and p.dtype.is_float]
    if not inputs or not seeds:
        raise UnsupportedError(f"{fn.name} has no floating-point {'input' if seeds else 'output'}"
                               " to differentiate", fn.loc)
    if wrt is not None:
        unknown = sorted(set(wrt) - {p.name for p in inputs})
        if unknown or not wrt:
            raise ArgumentError(
                f"{fn.name} has no floating-point input {', '.join(unknown)} to differentiate"
                if unknown else f"no input of {fn.name} to differentiate with respect to",
                fn.loc, hint="its floating-point inputs: " + ", ".join(p.name for p in inputs))
        inputs = [p for p in inputs if p.name in wrt]
    gradients = [(p.name, adj.name(p.name)) for p in inputs]
    adj.sinks = {g for _, g in gradients}
    for k in reversed(range(len(fn.statements))):
        _statement(prog, adj, k)
    for p, g in gradients:
        if g not in adj.ready:
            adj.emit(prog.zero(g, p))
    adj.flush()
    statements = _live(adj.statements, {g for _, g in gradients})
    versions = {v.name for v in prog.versions}
    read = set().union(*(st.reads for st in statements)) & versions
    prog.share(read)
    kept = sorted(read) if saved else []
    body = [] if saved else _recompute(prog, read)
    params = [prog.param(p) for p in fn.params]
    params += [prog.declare(v, prog.shapes[v], str(prog.dtypes[v])) for v in kept]
    params += [prog.declare(g, prog.shapes[o], str(prog.dtypes[o])) for o, g in seeds]
    outputs = [prog.declare(g, prog.shapes[p], str(prog.dtypes[p])) for p, g in gradients]
    name = prog.names.fresh(f"{fn.name}_grad")
    source = prog.function(name, params, outputs, body + statements)
    return Backward(source, name, tuple(gradients), tuple(seeds), tuple(kept))


def _live(statements: list[Stmt], outputs: set[str]) -> list[Stmt]:
    """The statements an output depends on: adjoints that reach no input's gradient
    (the zero-counting temporaries of `*=` whose factors are integers or scalar
    arguments) are not computed."""
    needed, kept = set(outputs), []
    for st in reversed(statements):
        if st.tensor in needed:
            kept.append(st)
            needed |= st.reads
    return kept[::-1]


def forward_saving(fn: P.Function, saved: tuple[str, ...]) -> str:
    """`fn` in single-assignment form that also returns the versions `saved` (the
    `saved` of `backward(fn, saved=True)`), as TC text."""
    prog = Program(fn)
    prog.share(set(saved))
    params = [prog.param(p) for p in fn.params]
    outputs = [o.name for o in fn.outputs]
    outputs += [v for v in saved if v not in outputs]
    body = [s for k in range(len(fn.statements)) for s in prog.forward(k)]
    return prog.function(fn.name, params, outputs, body)


def _recompute(prog: Program, needed: set[str]) -> list[Stmt]:
    """The forward statements that compute `needed` versions, in order."""
    needed = set(needed)
    chosen = []
    for k in reversed(range(len(prog.versions))):
        v = prog.versions[k]
        if v.name not in needed:
            continue
        chosen.append(k)
        needed |= {prog.reads[k].get(r.tensor, r.tensor)
                   for r in T.reads(prog.fn.statements[k].rhs)}
        if prog.keeps_old(k):
            assert v.old is not None
            needed.add(v.old)
    return [s for k in sorted(chosen) for s in prog.forward(k)]


def _statement(prog: Program, adj: _Adjoints, k: int) -> None:
    """The adjoint statements of forward statement k."""
    st, v = prog.fn.statements[k], prog.versions[k]
    gname = adj.names.get(v.name)
    if not v.tensor.dtype.is_float or gname is None or gname not in adj.ready:
        return                                       # nothing depends on this value
    dtype = v.tensor.dtype
    lhs = prog.lhs(k)
    outer = tuple((i, st.range_of(i)) for i in st.indices)
    g = P.Read(gname, lhs, dtype)
    rhs = prog.rename(st.rhs, k)
    accumulates = st.op != "=" and not st.init
    old = v.old
    if old is not None and not accumulates and not prog.full(k):
        # The elements this statement does not write keep the old version's values.
        name = adj.name(old)
        adj.emit(prog.copy(name, gname, like=v.name))
        adj.emit(Stmt(name, lhs, "=", rules.const(0, dtype), outer))
        adj.ready.add(name)
    old_read = P.Read(old, lhs, dtype) if accumulates and old is not None else None
    through_old: P.TExpr | None = None          # the adjoint of the old version's element
    through_rhs: P.TExpr
    zero, one = rules.const(0, dtype), rules.const(1, dtype)
    if st.op in ("=", "+="):
        through_rhs = through_old = g
    elif st.op in ("max=", "min="):
        result = P.Read(v.name, lhs, dtype)
        ties = prog.names.fresh(f"{v.name}_ties")
        _count(adj, ties, lhs, outer, st.ranges, "+=", rhs, old_read,
               lambda e: select(rules.op("eq", e, result), one, zero))
        share = rules.div(g, P.Read(ties, lhs, dtype))
        through_rhs = select(rules.op("eq", rhs, result), share, zero)
        if old_read is not None:
            through_old = select(rules.op("eq", old_read, result), share, zero)
    else:                                               # "*="
        zeros = prog.names.fresh(f"{v.name}_zeros")
        rest = prog.names.fresh(f"{v.name}_nonzero")
        _count(adj, zeros, lhs, outer, st.ranges, "+=", rhs, old_read,
               lambda e: select(rules.op("eq", e, zero), one, zero))
        _count(adj, rest, lhs, outer, st.ranges, "*=", rhs, old_read,
               lambda e: select(rules.op("eq", e, zero), one, e))
        nz, pr = P.Read(zeros, lhs, dtype), P.Read(rest, lhs, dtype)

        def others(f: P.TExpr) -> P.TExpr:
            """The product of every factor but `f`, without dividing by zero."""
            only = rules.op("and", rules.op("eq", nz, one), rules.op("eq", f, zero))
            return select(rules.op("eq", nz, zero), rules.div(pr, f), select(only, pr, zero))
        through_rhs = mul(g, others(rhs))
        if old_read is not None:
            through_old = mul(g, others(old_read))
    if accumulates and old is not None:
        assert through_old is not None
        reads_old = any(r.tensor == old for r in T.reads(rhs))
        if old not in adj.names and through_old is g and not reads_old:
            adj.names[old] = gname                     # `+=` passes the adjoint through
        elif not prog.full(k):
            # The elements this statement does not update pass the adjoint through.
            name = adj.name(old)
            adj.emit(prog.copy(name, gname, like=v.name))
            adj.emit(Stmt(name, lhs, "=", through_old, outer))
            adj.ready.add(name)
        else:
            adj.add(old, lhs, through_old, outer)
    contributions: dict[P.Read, P.TExpr] = {}
    _backprop(rhs, through_rhs, contributions)
    for read, value in contributions.items():
        adj.add(read.tensor, read.indices, value, st.ranges)


def _count(adj: _Adjoints, into: str, lhs: tuple[P.TExpr, ...], outer: Ranges,
           ranges: Ranges, op: str, rhs: P.TExpr, old: P.TExpr | None, term) -> None:  # type: ignore[no-untyped-def]
    """into(lhs) = term(old) op ... op term(rhs) over the reduction (op is += or *=)."""
    if old is not None:
        adj.emit(Stmt(into, lhs, "=", term(old), outer))
        adj.emit(Stmt(into, lhs, op, term(rhs), ranges))
    else:
        adj.emit(Stmt(into, lhs, op + "!", term(rhs), ranges))


def _backprop(e: P.TExpr, g: P.TExpr, out: dict[P.Read, P.TExpr]) -> None:
    """Add the adjoint contribution of every float read in `e` to `out`."""
    if isinstance(e, P.Read):
        if e.dtype.is_float:
            out[e] = rules.add(out[e], g) if e in out else g
        return
    if isinstance(e, P.Op):
        for k, contribution in rules.adjoints(e, g):
            _backprop(e.args[k], contribution, out)
