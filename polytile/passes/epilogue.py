"""epilogue: a layer's bias and activation run on each register tile right after its sums.

`O(b,o) = B(o); O(b,o) += X(b,m) * W(o,m); O(b,o) = fmaxf(O(b,o), 0)` (fcrelu, an MLP
layer) lowers to three kernels: the bias fills O, the contraction adds into it, and the
activation reads O back and writes it again. This pass, before fuse, writes the layer so
that the bias and the activation are one elementwise statement after the contraction,
tagged #epilogue, and the contraction starts from zero (an init pass fold turns into its
first writes):

    block s0 [b, o] #elementwise (out O, in B) { O = B }       block s0 [b, o] #init { O = 0 }
    block s1 [b, o, m] #contraction (out O:add, ...)     ->     block s1 [b, o, m] #contraction
    block s2 [b, o] #elementwise (inout O) {                    block s2 [b, o] #epilogue (
      O = fmax(O, 0) }                                            inout O, in B) {
                                                                O = fmax(O + B, 0) }

(b + sum and sum + b are one rounding apart when the sum is split in chunks; every
contraction's sum is reassociated by tiling anyway.) Pass autotile then runs the epilogue
inside the tiled contraction (`place`): as the last statement of the level that loops
over its register tiles, over the tile the micro-kernel has just stored, while it is in
L1. It does so only where each tile's sums are final there: no level above the
micro-kernel splits the reduction (the chain's writes are disjoint across every outer
iteration, which the verifier proves again for the `assign` views this makes). Elsewhere
the epilogue stays a kernel of its own, right after the contraction.

A statement after a contraction is an epilogue when it rewrites exactly the elements the
contraction wrote (isl), each from itself and from other buffers, at its own indices; a
bias statement before it becomes part of the epilogue when nothing between them touches
the output, and nothing up to the epilogue writes what the bias reads. A contraction
into a temporary that only the next statement reads, element by element, writes that
statement's output instead (`z +=! x * w; y = f(z)` -> `y +=! x * w; y = f(y)`). Pass fuse
leaves epilogues out of its row loops.

Intel Xeon (Cascade Lake), two threads: see docs/architecture.md, "Pass epilogue", for
the measurements. Parameters: `enabled` (default true).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from polytile.analysis.fold import chain, chain_views, same_elements, same_writes
from polytile.analysis.overwrite import touches
from polytile.analysis.vectorizable import boundary_versions, why_not_vector
from polytile.ir import nodes as N
from polytile.ir.polyhedra import READ, WRITE, Scope, writes_disjoint
from polytile.passes.merge import merged
from polytile.passes.names import fresh_name
from polytile.passes.pipeline import flag, register
from polytile.targets.target import Target

EPILOGUE = "epilogue"


def epilogue(fn: N.Function, target: Target, params: dict[str, Any]) -> N.Function:
    if not params.get("enabled", True):
        return fn
    fn = _renamed(fn)
    root = Scope.root(fn.body)
    stmts = list(fn.body.stmts)
    for j in range(len(stmts) - 1):
        contraction, after = stmts[j], stmts[j + 1]
        out = _accumulated(contraction)
        if out is None or not isinstance(contraction, N.Block) or \
                not isinstance(after, N.Block) or in_place_view(after, out.from_) is None or \
                not same_writes(root, contraction, after, out.from_):
            continue
        k = _bias(root, stmts, j, out.from_)
        if k is not None:
            init = stmts[k]
            assert isinstance(init, N.Block)
            stmts[k] = _zero_fill(init, out.from_)
            after = replace(merged(_adding(init, out.from_), after), name=after.name)
        stmts[j + 1] = replace(after, tags=after.tags | {EPILOGUE})
    return replace(fn, body=replace(fn.body, stmts=tuple(stmts)))


def _renamed(fn: N.Function) -> N.Function:
    """`z +=! x * w; y = f(z, ...)`, where z is a temporary that nothing else reads, with
    the contraction (and z's fills before it) writing y instead, and the statement
    `y = f(y, ...)` in place, which the loop in `epilogue` then takes."""
    root, stmts = Scope.root(fn.body), list(fn.body.stmts)
    for j in range(len(stmts) - 1):
        contraction, after = stmts[j], stmts[j + 1]
        out = _accumulated(contraction)
        if out is None or not isinstance(contraction, N.Block) or \
                not isinstance(after, N.Block) or fn.body.ref(out.from_).dir != "none":
            continue
        temp = out.from_
        target = _reader_writing(after, temp)
        if target is None or fn.body.ref(target).shape != fn.body.ref(temp).shape:
            continue
        users = [k for k, st in enumerate(stmts) if touches(st, temp)]
        fills = [k for k in users if k < j]
        if users[-1] != j + 1 or not all(_fills(root, stmts[k], contraction, temp)
                                          for k in fills) or \
                any(touches(st, target) for st in stmts[users[0]:j + 1]) or \
                not same_elements(root, temp, (after, READ), (contraction, WRITE)):
            continue
        for k in users[:-1]:
            st = stmts[k]
            assert isinstance(st, N.Block)
            stmts[k] = replace(st, refs=tuple(replace(r, from_=target) if r.from_ == temp
                                              else r for r in st.refs))
        stmts[j + 1] = _in_place(after, temp)
        refs = tuple(r for r in fn.body.refs if r.into != temp)
        fn = replace(fn, body=replace(fn.body, refs=refs, stmts=tuple(stmts)))
        root = Scope.root(fn.body)
    return fn


def _reader_writing(b: N.Block, temp: str) -> str | None:
    """The buffer elementwise leaf `b` writes element by element (`in_place_view`, the
    only view it writes), when it reads `temp` through one view at the same elements."""
    views = [r for r in b.refs if r.from_ == temp]
    writes = [r for r in b.refs if r.dir != "in"]
    if len(views) != 1 or views[0].dir != "in" or len(writes) != 1 or \
            in_place_view(b, writes[0].from_, "out") is None or \
            views[0].access != writes[0].access:
        return None
    return writes[0].from_


def _fills(root: Scope, st: N.Statement, contraction: N.Block, temp: str) -> bool:
    """Whether `st`, before the contraction, only fills the elements of `temp` the
    contraction adds into."""
    return isinstance(st, N.Block) and not any(isinstance(x, N.Block) for x in st.stmts) \
        and all(r.dir == "out" for r in st.refs if r.from_ == temp) \
        and same_writes(root, st, contraction, temp)


def _in_place(b: N.Block, temp: str) -> N.Block:
    """`b` (see `_reader_writing`) reading what it overwrites from its output's view."""
    view = next(r for r in b.refs if r.from_ == temp)
    out = next(r for r in b.refs if r.dir != "in")
    refs = tuple(replace(r, dir="inout") if r is out else r for r in b.refs if r is not view)
    stmts = tuple(replace(s, ref=out.into) if isinstance(s, N.Load) and s.ref == view.into
                  else s for s in b.stmts)
    return replace(b, refs=refs, stmts=stmts)


def _accumulated(st: N.Statement) -> N.Refinement | None:
    """The one view a plain contraction leaf adds into."""
    if not (isinstance(st, N.Block) and "contraction" in st.tags and _plain_leaf(st)):
        return None
    writes = [r for r in st.refs if r.dir != "in"]
    if len(writes) != 1 or writes[0].dir != "out" or writes[0].agg != "add" or \
            not writes[0].shape.dtype.is_float:
        return None
    return writes[0]


def _plain_leaf(b: N.Block) -> bool:
    """No schedule, no nested block, no data-dependent or flat access."""
    return b.schedule == N.BlockSchedule() and not any(
        isinstance(s, (N.Block, N.Special, N.LoadIndex))
        or isinstance(s, (N.Load, N.Store)) and any(d is not None for d in s.dynamic)
        or isinstance(s, N.Load) and s.offset is not None for s in b.stmts)


def in_place_view(b: N.Block, buffer: str, direction: str = "inout") -> N.Refinement | None:
    """`b`'s view of `buffer` when `b` is an elementwise leaf that writes it (and nothing
    else) at its own indices, one per dimension, and reads everything else (also pass
    outlayout's test of a statement it can do in its transposing copy)."""
    if not (_plain_leaf(b) and "elementwise" in b.tags) or b.constraints or \
            any(i.affine is not None for i in b.idxs):
        return None
    views = [r for r in b.refs if r.from_ == buffer]
    others_read = all(r.dir == "in" for r in b.refs if r.from_ != buffer)
    if len(views) != 1 or not others_read:
        return None
    view = views[0]
    names = [a.names[0] if a.terms and a == N.Affine.index(a.names[0]) else ""
             for a in view.access]
    if view.dir != direction or view.agg != "assign" or "" in names or \
            sorted(names) != sorted(i.name for i in b.idxs):
        return None
    stores = [s for s in b.stmts if isinstance(s, N.Store)]
    return view if len(stores) == 1 and stores[0].ref == view.into else None


def _bias(root: Scope, stmts: list[N.Statement], j: int, buffer: str) -> int | None:
    """The statement before contraction `j` that fills its output with values of other
    buffers, when it can move after the contraction into the epilogue `j + 1`."""
    k = next((k for k in range(j - 1, -1, -1) if touches(stmts[k], buffer)), None)
    if k is None:
        return None
    init, contraction, after = stmts[k], stmts[j], stmts[j + 1]
    if not (isinstance(init, N.Block) and isinstance(contraction, N.Block)
            and isinstance(after, N.Block)) or \
            in_place_view(init, buffer, "out") is None or init.idxs != after.idxs or \
            not same_writes(root, init, contraction, buffer):
        return None
    read = {r.from_ for r in init.refs if r.dir == "in"}
    for st in stmts[k + 1:j + 2]:
        if isinstance(st, N.Block) and any(r.dir != "in" and r.from_ in read for r in st.refs):
            return None
        if not isinstance(st, N.Block) and any(touches(st, name) for name in read):
            return None
    return k


def _zero_fill(init: N.Block, buffer: str) -> N.Block:
    """`init` filling `buffer` with the sum's identity instead (what `+=!` lowers to)."""
    view = next(r for r in init.refs if r.from_ == buffer)
    stmts = (N.Constant("$init", N.AGG_IDENTITY["add"], view.shape.dtype),
             N.Store(view.into, "$init"))
    return replace(init, refs=(view,), stmts=stmts, tags=frozenset({"init", "kernel"}))


def _adding(init: N.Block, buffer: str) -> N.Block:
    """`init` adding its value into `buffer` instead of assigning it."""
    view = next(r for r in init.refs if r.from_ == buffer)
    store = next(s for s in init.stmts if isinstance(s, N.Store))
    taken = {s.into for s in init.stmts if isinstance(s, (N.Load, N.Constant, N.Intrinsic))}
    old, total = fresh_name(f"${view.into}", taken), fresh_name("$bias", taken)
    dtype = view.shape.dtype
    stmts = (N.Load(old, view.into), *(s for s in init.stmts if s is not store),
             N.Intrinsic("add", (old, store.value), total, dtype), N.Store(view.into, total))
    refs = tuple(replace(r, dir="inout") if r is view else r for r in init.refs)
    return replace(init, refs=refs, stmts=stmts)


# ------------------------------------------------------------------ placing (autotile)

def place(tiled: N.Statement, e: N.Block, main: N.Block) -> N.Block | None:
    """The contraction `tiled` (autotile's chain of levels down to a vector micro-kernel)
    with the epilogue `e` (untiled, the statement right after it) run as the last
    statement of the level above the micro-kernel, over the tile it stored; None where
    the sums are not final there, or the epilogue cannot run as the same vector code."""
    if EPILOGUE not in e.tags or not isinstance(tiled, N.Block) or "tiled" not in tiled.tags:
        return None
    levels = chain(tiled)
    if len(levels) < 2 or any(len(level.stmts) != 1 for level in levels[:-1]):
        return None
    leaf, holder = levels[-1], levels[-2]
    own = next(r for r in e.refs if r.dir == "inout")
    views = chain_views(levels, own.from_)
    if isinstance(views, str) or any(v.dir != "out" or v.agg != "add" for v in views) or \
            leaf.schedule.vector is None or not leaf.schedule.micro:
        return None
    if any(i.affine is None and not writes_disjoint(level, i.name)
           for level in levels[:-1] for i in level.idxs):
        return None         # a level splits the reduction: a tile is not final there
    written = {n for a in views[-1].access for n in a.names}
    reductions = {i.name for i in leaf.idxs if i.affine is None and i.name not in written}
    if any(set(c.names) & reductions for c in leaf.constraints):
        return None
    absolute = _absolute(levels, views)
    if absolute is None:
        return None
    at = {a.names[0]: x for a, x in zip(own.access, absolute)}
    taken = {r.into for level in levels[:-1] for r in level.refs}
    passed: list[N.Refinement] = []       # the other buffers, whole, through the levels
    refs = [replace(views[-1], into=own.into, dir="inout", agg="assign")]
    for r in e.refs:
        if r is own:
            continue
        name = fresh_name(r.from_, taken)
        taken.add(name)
        passed.append(replace(main.ref(r.from_), dir="in", from_=r.from_, into=name,
                              access=tuple(N.Affine() for _ in r.access), agg="assign",
                              location=None))
        refs.append(replace(r, from_=name, access=tuple(a.substitute(at) for a in r.access)))
    s = leaf.schedule
    assert s.vector is not None
    idxs = tuple(i for i in leaf.idxs if i.name not in reductions)
    kept = {i.name for i in idxs}
    moved = replace(e, idxs=idxs, constraints=leaf.constraints, refs=tuple(refs),
                    schedule=N.BlockSchedule(micro=True, vector=s.vector,
                                             unroll=tuple(u for u in s.unroll if u in kept)))
    moved = replace(moved, schedule=replace(moved.schedule, boundary=boundary_versions(moved)))
    if why_not_vector(moved, s.vector.index) is not None:
        return None
    new: N.Block = moved
    for depth in range(len(levels) - 2, -1, -1):
        level = levels[depth]
        level_refs = tuple(replace(r, dir="inout", agg="assign") if r is views[depth] else r
                           for r in level.refs)
        inner = (leaf, new) if level is holder else (new,)
        here = tuple(x if depth == 0 else replace(x, from_=x.into) for x in passed)
        new = replace(level, refs=level_refs + here, stmts=inner)
    return new


def _absolute(levels: list[N.Block], views: list[N.Refinement]) -> list[N.Affine] | None:
    """The element the micro-kernel writes, in the coordinates of the buffer the top
    level views, over the micro-kernel's index names (every index a level uses is passed
    down to it as it is)."""
    absolute = list(views[-1].access)
    to_leaf = {i.name: i.name for i in levels[-1].idxs}    # this level's names -> leaf's
    for below, level, view in zip(reversed(levels[1:]), reversed(levels[:-1]),
                                  reversed(views[:-1])):
        up: dict[str, N.Affine] = {}
        for i in below.idxs:
            if i.affine is None:
                continue
            if i.affine != N.Affine.index(i.affine.names[0]) or i.name not in to_leaf:
                return None
            up[i.affine.names[0]] = N.Affine.index(to_leaf[i.name])
        if any(not set(a.names) <= set(up) for a in view.access):
            return None
        absolute = [x + a.substitute(up) for x, a in zip(absolute, view.access)]
        to_leaf = {name: a.names[0] for name, a in up.items()}
    return absolute


register("epilogue", epilogue, enabled=flag)
