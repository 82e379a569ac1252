"""A TC function in single-assignment form, and derived statements as data.

A tensor written by several statements (fcrelu's `y`) gets one version per statement,
so the backward can read the value each statement saw. Versions that nothing reads
after the statement that updates them share that statement's tensor (`share`): the
update is done in place, as in the original function, with no copy.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

from polytile.autodiff import rules
from polytile.dtypes import DType
from polytile.sema import program as P
from polytile.sema import typing as T
from polytile.sema.printer import format_expr
from polytile.sema.sizes import SizeExpr, Sym, tc_text

ZERO = SizeExpr.const_(0)
Ranges = tuple[tuple[str, P.Range], ...]


@dataclass(frozen=True)
class Stmt:
    """`tensor(lhs) op rhs where ranges`, every range explicit."""

    tensor: str
    lhs: tuple[P.TExpr, ...]
    op: str                          # =, +=, *=, max=, min=, or one of those with !
    rhs: P.TExpr
    ranges: Ranges

    @cached_property
    def reads(self) -> frozenset[str]:
        return frozenset(r.tensor for e in (self.rhs, *self.lhs) for r in T.reads(e))

    @property
    def elementwise(self) -> bool:
        """Every index is a plain subscript of the left-hand side."""
        names = [x.name for x in self.lhs if isinstance(x, P.IndexVar)]
        return len(names) == len(self.lhs) and set(names) == {i for i, _ in self.ranges}

    def text(self) -> str:
        where = ", ".join(f"{i} in {tc_text(r.lo)}:{tc_text(r.hi)}" for i, r in self.ranges)
        text = (f"{self.tensor}({', '.join(_subscript(x) for x in self.lhs)}) {self.op} "
                f"{format_expr(self.rhs)}")
        return f"{text} where {where}" if where else text


def _subscript(x: P.TExpr) -> str:
    """A left-hand subscript as TC: a bare name there is an index, so a scalar argument
    or a size (`d_A(s) += ...` from a read `A(s)`) is written as a value, `int64(s)`."""
    text = format_expr(x)
    if not isinstance(x, P.IndexVar) and text.isidentifier():
        return f"int64({text})"
    return text


def typed(e: P.TExpr, dtype: DType) -> P.TExpr:
    """`e`, cast to `dtype` when it reads nothing: printed, a literal is weakly typed,
    and a tensor assigned only literals would get the literal's default type."""
    if T.reads(e) or any(isinstance(x, (P.IndexVar, P.ScalarArg, P.SizeVal))
                         for x in _leaves(e)):
        return e
    return P.Op("cast", (e,), dtype)


def _leaves(e: P.TExpr) -> list[P.TExpr]:
    return [x for a in e.args for x in _leaves(a)] if isinstance(e, P.Op) else [e]


@dataclass
class Version:
    """Tensor `tensor` as one statement leaves it; `old` is the version it starts from."""

    name: str
    tensor: P.Tensor
    old: str | None


class Names:
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


class Program:
    """`fn` with one version per statement, and helpers to write statements over them."""

    def __init__(self, fn: P.Function):
        self.fn = fn
        self.names = Names(_identifiers(fn))
        self.axes: list[str] = []
        self.versions: list[Version] = []
        self.reads: list[dict[str, str]] = []       # per statement: tensor -> version read
        last = {st.tensor: k for k, st in enumerate(fn.statements)}
        current: dict[str, str] = {p.name: p.name for p in fn.params}
        for k, st in enumerate(fn.statements):
            self.reads.append(dict(current))
            name = st.tensor if last[st.tensor] == k else self.names.fresh(f"{st.tensor}_{k}")
            self.versions.append(Version(name, fn.tensor(st.tensor), current.get(st.tensor)))
            current[st.tensor] = name
        tensors = fn.params + fn.outputs + fn.temps
        self.shapes = {t.name: t.shape for t in tensors}
        self.dtypes = {t.name: t.dtype for t in tensors}
        for v in self.versions:
            self.shapes[v.name], self.dtypes[v.name] = v.tensor.shape, v.tensor.dtype
        self.storage: dict[str, str] = {}        # version -> the tensor that holds it
        self.in_place: set[int] = set()          # statements updating their old version

    # ------------------------------------------------------------ versions
    def share(self, kept: set[str]) -> None:
        """Versions outside `kept` that a statement updates live in that statement's
        tensor (see the module docstring)."""
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

    def full(self, k: int) -> bool:
        """Statement k writes every element of its tensor."""
        st = self.fn.statements[k]
        if st.scatter:
            return False
        shape = self.versions[k].tensor.shape
        return all(st.range_of(i) == P.Range(ZERO, n) for i, n in zip(st.indices, shape))

    def rename(self, e: P.TExpr, k: int) -> P.TExpr:
        """`e` of statement k reading the versions that statement sees."""
        if isinstance(e, P.Read):
            version = self.reads[k].get(e.tensor, e.tensor)
            return P.Read(self.storage.get(version, version),
                          tuple(self.rename(i, k) for i in e.indices), e.dtype, e.loc)
        if isinstance(e, P.Op):
            return P.Op(e.op, tuple(self.rename(a, k) for a in e.args), e.dtype, e.loc)
        return e

    def lhs(self, k: int) -> tuple[P.TExpr, ...]:
        st = self.fn.statements[k]
        return st.scatter or tuple(P.IndexVar(i, T.INDEX) for i in st.indices)

    def forward(self, k: int) -> Iterator[Stmt]:
        """Statement k on versions, after a copy of the old version where the statement
        keeps part of it and the old version must survive."""
        st, v = self.fn.statements[k], self.versions[k]
        into = self.storage.get(v.name, v.name)
        if v.old is None and not self.full(k) and v.tensor in self.fn.outputs:
            # An output starts at zero, and its first statement writes only part of it;
            # the derived program holds it in a temporary, which does not.
            yield self.zero(into, like=v.name)
        if self.keeps_old(k) and k not in self.in_place:
            assert v.old is not None
            yield self.copy(into, self.storage.get(v.old, v.old), like=v.name)
        yield Stmt(into, self.lhs(k), st.op + ("!" if st.init else ""),
                   typed(self.rename(st.rhs, k), v.tensor.dtype), st.ranges)

    # ------------------------------------------------------------ statements
    def whole(self, like: str) -> tuple[tuple[P.TExpr, ...], Ranges]:
        """Indices over every element of a tensor shaped like `like`, and their ranges."""
        shape = self.shapes[like]
        while len(self.axes) < len(shape):
            self.axes.append(self.names.fresh(f"i{len(self.axes)}"))
        ranges = tuple((n, P.Range(ZERO, s)) for n, s in zip(self.axes, shape))
        return tuple(P.IndexVar(n, T.INDEX) for n, _ in ranges), ranges

    def copy(self, into: str, source: str, like: str) -> Stmt:
        idx, ranges = self.whole(like)
        return Stmt(into, idx, "=", P.Read(source, idx, self.dtypes[like]), ranges)

    def zero(self, into: str, like: str) -> Stmt:
        idx, ranges = self.whole(like)
        dtype = self.dtypes[like]
        return Stmt(into, idx, "=", typed(rules.const(0, dtype), dtype), ranges)

    # ------------------------------------------------------------ declarations
    def param(self, p: P.Tensor) -> str:
        """A forward parameter, declared again."""
        if p.kind == "scalar":
            return f"{p.dtype} {p.name}"
        return self.declare(p.name, p.shape, str(p.dtype))

    def declare(self, name: str, shape: tuple[SizeExpr, ...], dtype: str) -> str:
        """`float(N, K) name`; a dimension that is not a size name or a constant gets a
        size name of its own (the caller checks the shape: pt.grad against the
        forward's, polytile.torch by construction)."""
        dims = []
        for d, s in enumerate(shape):
            plain = len(s.terms) == 1 and s.const == 0 and s.terms[0][1] == 1 and \
                len(s.terms[0][0]) == 1 and isinstance(s.terms[0][0][0], Sym)
            if s.is_const or plain:
                dims.append(str(s))
            else:
                dims.append(self.names.fresh(f"{name}_{d}".upper()))
        return f"{dtype}({', '.join(dims)}) {name}"

    def function(self, name: str, params: list[str], outputs: list[str],
                 body: list[Stmt]) -> str:
        lines = [f"def {name}({', '.join(params)}) -> ({', '.join(outputs)}) {{"]
        lines += [f"  {s.text()}" for s in body]
        return "\n".join(lines + ["}"]) + "\n"
