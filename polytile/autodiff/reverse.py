"""Reverse-mode differentiation of a TC function, written as another TC function.

The forward function is first put in single-assignment form: a tensor written by
several statements (fcrelu's `y`) gets one version per statement, so the backward
can read the value each statement saw. Then the statements are walked in reverse,
and each read of a floating-point tensor `A(s)` in a statement over indices `I`
adds `g * d rhs / d A(s)` to the adjoint `d_A` at `s`, for every point of `I`:

* `s` is distinct plain indices (`x(n, i)`): a reduction over the other indices,
  `d_x(n, i) +=! ...` (TC's own form, which the passes optimize as a contraction);
* otherwise (`x(n, c, h + r, w + s)`, `x(2 * i)`): a scatter, `d_x(n, c, h + r,
  w + s) += ...`, which adds once per iteration.

Reductions route the adjoint of their result: `+=` to every term; `max=`/`min=` to the
terms equal to the result, split evenly between ties (torch.amax's rule); `*=` to
each factor times the product of the others, counted without dividing by zero.

`backward(fn)` recomputes the forward values the derivatives need inside the
backward; `backward(fn, saved=True)` instead reads them as parameters, and
`forward_saving(fn)` is the forward that also returns them (what a training
framework runs: the forward once, the backward from what it kept).
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from polytile.autodiff import emit, rules
from polytile.autodiff.rules import mul, select
from polytile.errors import UnsupportedError
from polytile.sema import program as P
from polytile.sema import ranges as R
from polytile.sema import typing as T
from polytile.sema.sizes import SizeExpr, Sym

ZERO = SizeExpr.const_(0)


@dataclass(frozen=True)
class Backward:
    """A derived TC function and how its parameters and outputs relate to the forward's."""

    source: str                                   # the TC text of `name`
    name: str
    gradients: tuple[tuple[str, str], ...]        # (forward input, its gradient output)
    seeds: tuple[tuple[str, str], ...]            # (forward output, its gradient parameter)
    saved: tuple[str, ...] = ()                   # forward values read as parameters


@dataclass
class _Version:
    """One statement's result: tensor `tensor` as statement `k` leaves it."""

    name: str
    tensor: P.Tensor
    old: str | None          # the version the statement starts from, if any


class _Names:
    def __init__(self, taken: set[str]):
        self.taken = set(taken)

    def fresh(self, base: str) -> str:
        name = base
        while name in self.taken:
            name += "_"
        self.taken.add(name)
        return name


def _identifiers(fn: P.Function) -> set[str]:
    names = {t.name for t in fn.params + fn.outputs + fn.temps} | set(fn.sizes) | {fn.name}
    for st in fn.statements:
        names.update(n for n, _ in st.ranges)
    return names


class _Program:
    """The single-assignment forward and the derived statements, as TC text."""

    def __init__(self, fn: P.Function):
        if fn.inout:
            raise UnsupportedError(
                f"{fn.name} reads outputs before writing them ({', '.join(sorted(fn.inout))}); "
                "polytile does not differentiate in/out outputs yet", fn.loc,
                "start the output from an input instead of its previous contents")
        self.fn = fn
        self.names = _Names(_identifiers(fn))
        self.axes: list[str] = []
        self.versions: list[_Version] = []
        self.reads: list[dict[str, str]] = []       # per statement: tensor -> version read
        writes = [st.tensor for st in fn.statements]
        current: dict[str, str] = {p.name: p.name for p in fn.params}
        for k, st in enumerate(fn.statements):
            self.reads.append(dict(current))
            last = k == max(j for j, t in enumerate(writes) if t == st.tensor)
            name = st.tensor if last else self.names.fresh(f"{st.tensor}_{k}")
            self.versions.append(_Version(name, fn.tensor(st.tensor), current.get(st.tensor)))
            current[st.tensor] = name
        self.shapes: dict[str, tuple[SizeExpr, ...]] = {
            t.name: t.shape for t in fn.params + fn.outputs + fn.temps}
        self.dtypes = {t.name: t.dtype for t in fn.params + fn.outputs + fn.temps}
        for v in self.versions:
            self.shapes[v.name], self.dtypes[v.name] = v.tensor.shape, v.tensor.dtype
        self.storage: dict[str, str] = {}        # version -> the tensor that holds it
        self.in_place: set[int] = set()          # statements updating their old version

    def share(self, kept: set[str]) -> None:
        """Versions that nothing reads after the statement that updates them (all but
        `kept`) live in the tensor of the version that follows: the update is done in
        place, as the original function does it, with no copy."""
        for k in reversed(range(len(self.versions))):
            v = self.versions[k]
            if v.old is not None and self.keeps_old(k) and v.old not in kept:
                self.storage[v.old] = self.storage.get(v.name, v.name)
                self.in_place.add(k)

    def keeps_old(self, k: int) -> bool:
        """Statement k starts from the old version (an accumulation, or an assignment
        to part of the tensor)."""
        st = self.fn.statements[k]
        return self.versions[k].old is not None and (
            st.op != "=" and not st.init or not self.full(k))

    # ------------------------------------------------------------ forward, renamed
    def rename(self, e: P.TExpr, k: int) -> P.TExpr:
        """`e` of statement k with each tensor read as the version that statement sees."""
        if isinstance(e, P.Read):
            version = self.reads[k].get(e.tensor, e.tensor)
            return P.Read(self.storage.get(version, version),
                          tuple(self.rename(i, k) for i in e.indices), e.dtype, e.loc)
        if isinstance(e, P.Op):
            return P.Op(e.op, tuple(self.rename(a, k) for a in e.args), e.dtype, e.loc)
        return e

    def forward(self, k: int) -> Iterator[str]:
        """Statement k on versions: a copy of the old version first where the statement
        keeps part of it and the old version must survive (see share)."""
        st, v = self.fn.statements[k], self.versions[k]
        into = self.storage.get(v.name, v.name)
        if self.keeps_old(k) and k not in self.in_place:
            assert v.old is not None
            yield self.copy(into, self.storage.get(v.old, v.old))
        op = st.op + ("!" if st.init else "")
        yield self.statement(into, self.lhs(k), op, self.rename(st.rhs, k), st.ranges)

    def lhs(self, k: int) -> tuple[P.TExpr, ...]:
        st = self.fn.statements[k]
        return st.scatter or tuple(P.IndexVar(i, T.INDEX) for i in st.indices)

    def full(self, k: int) -> bool:
        """Statement k writes every element of its tensor."""
        st = self.fn.statements[k]
        if st.scatter:
            return False
        shape = self.versions[k].tensor.shape
        return all(st.range_of(i) == P.Range(ZERO, n) for i, n in zip(st.indices, shape))

    # ------------------------------------------------------------ TC text
    def statement(self, tensor: str, lhs: tuple[P.TExpr, ...], op: str, rhs: P.TExpr,
                  ranges: tuple[tuple[str, P.Range], ...]) -> str:
        where = ", ".join(f"{i} in {emit.size(r.lo)}:{emit.size(r.hi)}" for i, r in ranges)
        text = f"{tensor}({', '.join(emit.expr(x) for x in lhs)}) {op} {emit.expr(rhs)}"
        return f"{text} where {where}" if where else text

    def whole(self, tensor: str) -> tuple[tuple[P.TExpr, ...], tuple[tuple[str, P.Range], ...]]:
        """Indices over every element of `tensor`, and their ranges."""
        while len(self.axes) < len(self.shapes[tensor]):
            self.axes.append(self.names.fresh(f"i{len(self.axes)}"))
        names = self.axes[:len(self.shapes[tensor])]
        ranges = tuple((n, P.Range(ZERO, s)) for n, s in zip(names, self.shapes[tensor]))
        return tuple(P.IndexVar(n, T.INDEX) for n in names), ranges

    def copy(self, into: str, source: str, like: str | None = None) -> str:
        """into = source, element by element; `like` names a version of their shape."""
        like = like or source
        idx, ranges = self.whole(like)
        return self.statement(into, idx, "=", P.Read(source, idx, self.dtypes[like]), ranges)

    def zero(self, into: str, like: str) -> str:
        """into(...) = 0 over the whole shape of `like`."""
        idx, ranges = self.whole(like)
        return self.statement(into, idx, "=", rules.const(0, self.dtypes[like]), ranges)

    def param(self, p: P.Tensor, sizes: dict[str, str]) -> str:
        """A forward parameter, declared again."""
        if p.kind == "scalar":
            return f"{p.dtype} {p.name}"
        return self.declare(p.name, p.shape, str(p.dtype), sizes)

    def declare(self, name: str, shape: tuple[SizeExpr, ...], dtype: str,
                sizes: dict[str, str]) -> str:
        """`float(N, K) name`; a dimension that is not a size name or a constant gets
        a size name of its own (the caller checks it)."""
        dims = []
        for d, s in enumerate(shape):
            if s.is_const or (len(s.terms) == 1 and s.const == 0 and s.terms[0][1] == 1
                              and len(s.terms[0][0]) == 1 and isinstance(s.terms[0][0][0], Sym)):
                dims.append(str(s))
            else:
                fresh = self.names.fresh(f"{name}_{d}".upper())
                sizes[fresh] = str(s)
                dims.append(fresh)
        return f"{dtype}({', '.join(dims)}) {name}"


@dataclass
class _Adjoints:
    """The adjoint tensor of each version, the statements that compute them, and
    which forward versions they read."""

    program: _Program
    names: dict[str, str] = field(default_factory=dict)
    ready: set[str] = field(default_factory=set)       # adjoints that hold a value
    given: set[str] = field(default_factory=set)       # adjoints that are parameters
    statements: list[str] = field(default_factory=list)
    read: set[str] = field(default_factory=set)

    def uses(self, e: P.TExpr) -> P.TExpr:
        self.read.update(r.tensor for r in T.reads(e))
        return e

    def name(self, version: str) -> str:
        if version not in self.names:
            self.names[version] = self.program.names.fresh(f"d_{version}")
        return self.names[version]

    def add(self, version: str, subs: tuple[P.TExpr, ...], value: P.TExpr,
            ranges: tuple[tuple[str, P.Range], ...], loc) -> None:  # type: ignore[no-untyped-def]
        """d_version(subs) += value, for every point of `ranges`."""
        prog = self.program
        name = self.name(version)
        if name in self.given:                       # never write into a parameter
            copy = prog.names.fresh(f"{name}_acc")
            self.statements.append(prog.copy(copy, name, like=version))
            self.names[version], name = copy, copy
            self.ready.add(copy)
        self.uses(value)
        plain = [s.name for s in subs if isinstance(s, P.IndexVar)]
        distinct = len(plain) == len(subs) and len(set(plain)) == len(plain)
        shape = prog.shapes[version]
        bounds = dict(ranges)
        covers = distinct and all(bounds[i] == P.Range(ZERO, n) for i, n in zip(plain, shape))
        if name not in self.ready and covers:
            op = "+=!" if len(ranges) > len(plain) else "="
            self.statements.append(prog.statement(name, subs, op, value, ranges))
            self.ready.add(name)
            return
        if name not in self.ready:
            self.statements.append(prog.zero(name, version))
            self.ready.add(name)
        self.statements.append(prog.statement(name, subs, "+=", value, ranges))


def _backprop(e: P.TExpr, g: P.TExpr, out: dict[P.Read, P.TExpr]) -> None:
    """Add the adjoint contribution of every float read in `e` to `out`."""
    if isinstance(e, P.Read):
        if e.dtype.is_float:
            out[e] = rules.add(out[e], g) if e in out else g
        return
    if isinstance(e, P.Op):
        for k, contribution in rules.adjoints(e, g):
            _backprop(e.args[k], contribution, out)


def backward(fn: P.Function, saved: bool = False) -> Backward:
    """The TC function computing the gradients of `fn`'s float inputs from its inputs
    and its outputs' gradients (see the module docstring)."""
    prog = _Program(fn)
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
    gradients = [(p.name, adj.name(p.name)) for p in inputs]
    for k in reversed(range(len(fn.statements))):
        _statement(prog, adj, k)
    for p, g in gradients:
        if g not in adj.ready:
            adj.statements.append(prog.zero(g, p))
    versions = {v.name: k for k, v in enumerate(prog.versions)}
    read = {v for v in adj.read if v in versions}
    prog.share(read)
    kept = sorted(read) if saved else []
    body = [] if saved else _recompute(prog, read)
    sizes: dict[str, str] = {}
    params = [prog.param(p, sizes) for p in fn.params]
    params += [prog.declare(v, prog.shapes[v], str(prog.dtypes[v]), sizes) for v in kept]
    params += [prog.declare(g, prog.shapes[o], str(prog.dtypes[o]), sizes) for o, g in seeds]
    outputs = [prog.declare(g, prog.shapes[p], str(prog.dtypes[p]), sizes)
               for p, g in gradients]
    name = prog.names.fresh(f"{fn.name}_grad")
    lines = [f"def {name}({', '.join(params)}) -> ({', '.join(outputs)}) {{"]
    lines += [f"  {text}" for text in body + adj.statements]
    return Backward("\n".join(lines + ["}"]) + "\n", name, tuple(gradients), tuple(seeds),
                    tuple(kept))


def forward_saving(fn: P.Function, saved: tuple[str, ...]) -> str:
    """`fn` in single-assignment form that also returns the versions `saved` (the
    `saved` of `backward(fn, saved=True)`), as TC text."""
    prog = _Program(fn)
    prog.share(set(saved))
    sizes: dict[str, str] = {}
    params = [prog.param(p, sizes) for p in fn.params]
    outputs = [o.name for o in fn.outputs] + [v for v in saved
                                              if v not in {o.name for o in fn.outputs}]
    lines = [f"def {fn.name}({', '.join(params)}) -> ({', '.join(outputs)}) {{"]
    lines += [f"  {text}" for k in range(len(fn.statements)) for text in prog.forward(k)]
    return "\n".join(lines + ["}"]) + "\n"


def _recompute(prog: _Program, needed: set[str]) -> list[str]:
    """The forward statements that compute `needed` versions, in order."""
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
    return [text for k in sorted(chosen) for text in prog.forward(k)]


def _statement(prog: _Program, adj: _Adjoints, k: int) -> None:
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
        adj.statements.append(prog.copy(name, gname, like=v.name))
        adj.statements.append(prog.statement(name, lhs, "=", rules.const(0, dtype), outer))
        adj.ready.add(name)
    through_old: P.TExpr | None = None          # the adjoint of the old version's element
    through_rhs: P.TExpr
    if st.op in ("=", "+="):
        through_rhs = g
        through_old = g
    elif st.op in ("max=", "min="):
        result = P.Read(v.name, lhs, dtype)
        ties = prog.names.fresh(f"{v.name}_ties")
        hit = lambda e: select(rules.op("eq", e, result), rules.const(1, dtype),  # noqa: E731
                               rules.const(0, dtype))
        _count(prog, adj, ties, lhs, outer, st.ranges, hit, "+=",
               rhs, P.Read(old, lhs, dtype) if accumulates and old else None)
        share = rules.div(g, P.Read(ties, lhs, dtype))
        through_rhs = select(rules.op("eq", rhs, result), share, rules.const(0, dtype))
        if accumulates and old:
            through_old = select(rules.op("eq", P.Read(old, lhs, dtype), result), share,
                                 rules.const(0, dtype))
    else:                                               # "*="
        zeros = prog.names.fresh(f"{v.name}_zeros")
        rest = prog.names.fresh(f"{v.name}_nonzero")
        zero, one = rules.const(0, dtype), rules.const(1, dtype)
        old_read = P.Read(old, lhs, dtype) if accumulates and old else None
        _count(prog, adj, zeros, lhs, outer, st.ranges,
               lambda e: select(rules.op("eq", e, zero), one, zero), "+=", rhs, old_read)
        _count(prog, adj, rest, lhs, outer, st.ranges,
               lambda e: select(rules.op("eq", e, zero), one, e), "*=", rhs, old_read)
        nz, pr = P.Read(zeros, lhs, dtype), P.Read(rest, lhs, dtype)

        def others(f: P.TExpr) -> P.TExpr:
            """The product of every factor but `f`, without dividing by zero."""
            only = rules.op("and", rules.op("eq", nz, one), rules.op("eq", f, zero))
            return select(rules.op("eq", nz, zero), rules.div(pr, f),
                          select(only, pr, zero))
        through_rhs = mul(g, others(rhs))
        if old_read is not None:
            through_old = mul(g, others(old_read))
    if accumulates and old is not None:
        assert through_old is not None
        reads_old = any(r.tensor == old for r in T.reads(rhs))
        if old not in adj.names and through_old is g and not reads_old:
            adj.names[old] = gname                     # `+=` passes the adjoint through
        else:
            adj.add(old, lhs, adj.uses(through_old), outer, st.loc)
    contributions: dict[P.Read, P.TExpr] = {}
    _backprop(rhs, through_rhs, contributions)
    for read, value in contributions.items():
        adj.add(read.tensor, read.indices, value, st.ranges, read.loc)


def _count(prog: _Program, adj: _Adjoints, into: str, lhs: tuple[P.TExpr, ...],
           outer: tuple[tuple[str, P.Range], ...], ranges: tuple[tuple[str, P.Range], ...],
           term, op: str, rhs: P.TExpr, old: P.TExpr | None) -> None:  # type: ignore[no-untyped-def]
    """into(lhs) = term(old) op ... op term(rhs) over the reduction (op is += or *=)."""
    if old is not None:
        adj.statements.append(prog.statement(into, lhs, "=", adj.uses(term(old)), outer))
        adj.statements.append(prog.statement(into, lhs, op, adj.uses(term(rhs)), ranges))
    else:
        adj.statements.append(prog.statement(into, lhs, op + "!", adj.uses(term(rhs)), ranges))
