"""A block nest as integer sets, for the verifier's exact questions (answered by isl).

Every index of every block on the path from the root gets its own isl variable
(`i{depth}_{position}`), so a set over a block's context is exact: a child's
iterations are limited by its ancestors' ranges and constraints through the
equalities of its passed-in indices. Element coordinates of a refinement of
the block at `depth` are `e{depth}_{dim}`, counted from the view's origin.

A set is kept as a union of `Conj`s (each: exists hidden vars, equalities and
inequalities over affine expressions) and written out as isl text only to ask
isl a question, so that building footprints is plain Python.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import islpy as isl

from polytile.ir.nodes import Affine, Block, Load, Special, Store

READ, WRITE = "read", "write"
READ_DIRS = ("in", "inout")
WRITE_DIRS = ("out", "inout")


@dataclass(frozen=True)
class Conj:
    """exists `hidden`: every `eqs` affine == 0 and every `ineqs` affine >= 0."""

    hidden: tuple[str, ...] = ()
    eqs: tuple[Affine, ...] = ()
    ineqs: tuple[Affine, ...] = ()

    def __and__(self, other: Conj) -> Conj:
        return Conj(self.hidden + other.hidden, self.eqs + other.eqs, self.ineqs + other.ineqs)

    def rename(self, names: Mapping[str, str]) -> Conj:
        subst = {old: Affine.index(new) for old, new in names.items()}
        return Conj(tuple(names.get(h, h) for h in self.hidden),
                    tuple(a.substitute(subst) for a in self.eqs),
                    tuple(a.substitute(subst) for a in self.ineqs))

    def text(self) -> str:
        parts = [f"{a} = 0" for a in self.eqs] + [f"{a} >= 0" for a in self.ineqs]
        body = " and ".join(parts) or "0 = 0"
        return f"(exists ({', '.join(self.hidden)} : {body}))" if self.hidden else f"({body})"


Disjunction = tuple[Conj, ...]


def between(var: str, lo: int, hi: int) -> tuple[Affine, Affine]:
    """lo <= var <= hi as two inequalities."""
    v = Affine.index(var)
    return v - lo, v.scale(-1) + hi


def element_vars(depth: int, rank: int) -> tuple[str, ...]:
    return tuple(f"e{depth}_{d}" for d in range(rank))


@dataclass(frozen=True)
class Scope:
    """A block in its context: the isl variables of its indices and its iteration
    domain over the variables of all its ancestors' indices and its own."""

    block: Block
    depth: int
    path: str                               # "main/tile/kernel", for messages
    own: tuple[str, ...]                    # isl variable of each index, in order
    outer: tuple[str, ...]                  # all ancestors' variables
    labels: Mapping[str, str]               # isl variable -> "block.index", for messages
    domain: Conj

    @staticmethod
    def root(block: Block) -> Scope:
        return Scope._make(block, 0, block.name, (), {}, {}, Conj())

    @staticmethod
    def detached(block: Block) -> Scope:
        """`block` out of context: indices passed in from its parent are free variables."""
        own = tuple(f"i0_{n}" for n in range(len(block.idxs)))
        ineqs: list[Affine] = []
        for v, idx in zip(own, block.idxs):
            if idx.affine is None:
                ineqs += between(v, 0, idx.range - 1)
        to_var = {idx.name: Affine.index(v) for v, idx in zip(own, block.idxs)}
        ineqs += [c.substitute(to_var) for c in block.constraints]
        labels = {v: idx.name for v, idx in zip(own, block.idxs)}
        return Scope(block, 0, block.name, own, (), labels, Conj((), (), tuple(ineqs)))

    def child(self, block: Block) -> Scope:
        parent_vars = {idx.name: v for v, idx in zip(self.own, self.block.idxs)}
        return Scope._make(block, self.depth + 1, f"{self.path}/{block.name}", self.variables,
                           parent_vars, self.labels, self.domain)

    @staticmethod
    def _make(block: Block, depth: int, path: str, outer: tuple[str, ...],
              parent_vars: Mapping[str, str], parent_labels: Mapping[str, str],
              parent_domain: Conj) -> Scope:
        own = tuple(f"i{depth}_{n}" for n in range(len(block.idxs)))
        labels = dict(parent_labels)
        labels.update({v: f"{block.name}.{idx.name}" for v, idx in zip(own, block.idxs)})
        parent_subst = {name: Affine.index(v) for name, v in parent_vars.items()}
        eqs: list[Affine] = []
        ineqs: list[Affine] = []
        for v, idx in zip(own, block.idxs):
            if idx.affine is None:
                ineqs += between(v, 0, idx.range - 1)
            else:
                eqs.append(Affine.index(v) - idx.affine.substitute(parent_subst))
        to_var = {idx.name: Affine.index(v) for v, idx in zip(own, block.idxs)}
        ineqs += [c.substitute(to_var) for c in block.constraints]
        domain = parent_domain & Conj((), tuple(eqs), tuple(ineqs))
        return Scope(block, depth, path, own, outer, labels, domain)

    def label(self, var: str) -> str:
        """How a message names a variable: own indices by name, others as block.index."""
        if var in self.own:
            return self.block.idxs[self.own.index(var)].name
        return self.labels.get(var, var)

    @property
    def variables(self) -> tuple[str, ...]:
        return self.outer + self.own

    @property
    def iterated(self) -> tuple[str, ...]:
        return tuple(v for v, idx in zip(self.own, self.block.idxs) if idx.affine is None)

    def affine(self, a: Affine) -> Affine:
        """`a` over this block's index names, rewritten over isl variables."""
        return a.substitute({idx.name: Affine.index(v) for v, idx in zip(self.own,
                                                                          self.block.idxs)})


def footprint(scope: Scope, ref: str, mode: str) -> Disjunction:
    """The elements of `ref` (a refinement of scope's block) that the block reads or
    writes, as a set over scope.variables + element_vars(scope.depth, rank): the
    block's own statements, and its children's through their refinements of `ref`."""
    block = scope.block
    shape = block.ref(ref).shape
    elems = element_vars(scope.depth, len(shape.dims))
    pieces: list[Conj] = []
    dirs = READ_DIRS if mode == READ else WRITE_DIRS
    for stmt in block.stmts:
        if isinstance(stmt, Block):
            child = scope.child(stmt)
            for sub in stmt.refs:
                if sub.from_ != ref or sub.dir not in dirs:
                    continue
                child_elems = element_vars(child.depth, len(elems))
                links = tuple(Affine.index(e) - child.affine(a) - Affine.index(ce)
                              for e, a, ce in zip(elems, sub.access, child_elems))
                hidden = child.own + child_elems
                pieces += [Conj(p.hidden + hidden, p.eqs + links, p.ineqs)
                           for p in footprint(child, sub.into, mode)]
            continue
        for whole in _touched_dims(stmt, ref, mode, len(elems)):
            eqs: list[Affine] = []
            ineqs: list[Affine] = []
            for e, is_whole, dim in zip(elems, whole, shape.dims):
                if is_whole:
                    ineqs += between(e, 0, dim.size - 1)
                else:
                    eqs.append(Affine.index(e))
            pieces.append(scope.domain & Conj((), tuple(eqs), tuple(ineqs)))
    return tuple(pieces)


def parent_footprint(scope: Scope, ref: str, mode: str) -> tuple[tuple[str, ...], Disjunction]:
    """`footprint` in the coordinates of the buffer that `ref` views (`x{depth}_{dim}`), where
    the elements touched by different iterations of the block can be compared."""
    access = scope.block.ref(ref).access
    elems = element_vars(scope.depth, len(access))
    coords = tuple(f"x{scope.depth}_{d}" for d in range(len(access)))
    links = tuple(Affine.index(x) - scope.affine(a) - Affine.index(e)
                  for x, a, e in zip(coords, access, elems))
    return coords, tuple(Conj(p.hidden + elems, p.eqs + links, p.ineqs)
                         for p in footprint(scope, ref, mode))


def writes_disjoint(block: Block, index: str, combined: Iterable[str] = ()) -> bool:
    """True if iterations of `block` that differ in `index` (the indices before it
    equal, those after it anything) never write the same element of the buffers it
    writes, apart from the `combined` ones (threads accumulate those privately: see
    BlockSchedule.combine): the exact test for running that index's loop in parallel
    threads."""
    scope = Scope.detached(block)
    iterated = scope.iterated
    mine = scope.own[[i.name for i in block.idxs].index(index)]
    loop = iterated.index(mine)
    other = {v: f"{v}_q" for v in iterated[loop:]}
    for ref in block.refs:
        if ref.dir not in WRITE_DIRS or not ref.from_ or ref.into in combined:
            continue
        coords, writes = parent_footprint(scope, ref.into, WRITE)
        if not writes:
            continue
        theirs = tuple(c.rename({**other, **{h: f"{h}_q" for h in c.hidden}}) for c in writes)
        free = scope.variables + tuple(other.values()) + coords
        if not to_set(free, [writes, theirs, distinct([(mine, other[mine])])]).is_empty():
            return False
    return True


def _touched_dims(stmt: object, ref: str, mode: str, rank: int) -> list[tuple[bool, ...]]:
    """For each access of `ref` by a non-block statement: per dimension, whether it may
    touch the whole extent (True: a dynamic or flat offset, or a whole-buffer special) or only
    the view's origin (False)."""
    if mode == READ and isinstance(stmt, Load) and stmt.ref == ref:
        if stmt.offset is not None:     # a pointer increment may reach any element of the view
            return [(True,) * rank]
        return [tuple(d is not None for d in stmt.dynamic) or (False,) * rank]
    if mode == WRITE and isinstance(stmt, Store) and stmt.ref == ref:
        return [tuple(d is not None for d in stmt.dynamic) or (False,) * rank]
    if isinstance(stmt, Special):
        names = stmt.inputs if mode == READ else stmt.outputs
        return [(True,) * rank for name in names if name == ref]
    return []


def to_set(free: Sequence[str], conjunction: Iterable[Disjunction]) -> isl.Set:
    """The set over `free` of points in every union of `conjunction` (each a disjunction)."""
    clauses = [" or ".join(c.text() for c in union) or "1 = 0" for union in conjunction]
    return isl.Set(f"{{ [{', '.join(free)}] : {' and '.join(f'({c})' for c in clauses)} }}")


def distinct(pairs: Iterable[tuple[str, str]]) -> Disjunction:
    """Points where at least one pair of variables differs."""
    out = []
    for a, b in pairs:
        diff = Affine.index(a) - Affine.index(b)
        out += [Conj((), (), (diff - 1,)), Conj((), (), (diff.scale(-1) - 1,))]
    return tuple(out)


def witness(points: isl.Set, free: Sequence[str]) -> dict[str, int] | None:
    """The set's lexicographically first point as {variable: value} (the smallest
    example makes the clearest message), or None when the set is empty."""
    if points.is_empty():
        return None
    point = points.lexmin().sample_point()
    return {name: int(point.get_coordinate_val(isl.dim_type.set, n).to_python())
            for n, name in enumerate(free)}
