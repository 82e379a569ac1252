"""Whether a contraction's first writes can make an init block's writes (BLAS's beta = 0).

A reduction `O(i) +=! ...` compiles to an init block that fills O with 0 and a
contraction that adds into it. Once tiled, the contraction's vector micro-kernel keeps
its sums in registers across its reduction loop and adds them into O after it:

    block s0_init [...] #init (out o0 <- o0[...])     { $init = const(0, float32)
                                                        o0 = store($init) }
    block pack_p1 [...] (...)                           (touches no o0)
    block s0 [i0_c:8, i4_c:2] (out o0 <- o0[...]:add)
      block s0_tile [i4:128, i4_c = i4_c, ...] schedule(micro, vector(...), order(i4))

At i4_c = 0 each element's sum is its first write: stored with assign instead of added,
the init block need not run, and the kernel neither writes O once more nor reads it back
(pass `fold`: `folded(s0)` on the init, `first(i4_c)` on the micro-kernel). `fold(scope,
k, j)` proves that the init block `k` and the contraction `j` of scope's block may be
folded so, and returns the micro-kernel's outer reduction indices (names passed into it),
or why not. The conditions:

* the init writes the aggregation's identity, the only thing it does, and exactly the
  elements the contraction writes (isl); no statement between them touches the buffer;
* the contraction is a chain of blocks, one inside the other, ending in a vector
  micro-kernel (no dot product: its vector index is written; no unrolled reduction
  index, whose copies would each store) with one store, that reaches
  the buffer through one view per level, writes it with one aggregation and never reads
  it, except in blocks that end a level above the leaf and read, in each iteration of the
  level, only what the chain below wrote in it, final (`analysis.sink`, pass sink); no
  level combines it across threads or has a schedule beyond a parallel loop (a
  tensorized block, pass tensorize, is such a micro-kernel: its register tiles sum the
  whole reduction before their one store, and it has no outer reduction indices);
* constraints bound reduction indices (those the written element does not depend on)
  from above only, and every outer level's reduction index is passed into the
  micro-kernel. Then an element written at all is written where its reduction indices
  are 0 (a chunk cut short by `k + 128*k_c <= 699` still starts at 0), and since loops
  run upwards from 0 in whatever order they nest, that write comes first.

The IR's meaning does not change: the interpreter runs the init as before; the lowering
(polytile.loops.vector) emits nothing for the init, and the micro-kernel's stores assign
where its reduction indices (the outer ones and those it loops outside its sums) are 0.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from polytile.analysis.overwrite import touches
from polytile.analysis.sink import final_reads, only
from polytile.ir.nodes import (
    AGG_IDENTITY,
    Affine,
    Block,
    BlockSchedule,
    Constant,
    Load,
    Refinement,
    Store,
)
from polytile.ir.polyhedra import WRITE, Conj, Scope, distinct, element_vars, footprint, to_set


def fold(scope: Scope, k: int, j: int) -> tuple[str, ...] | str:
    """The micro-kernel's outer reduction indices when the init block `k` of scope's
    block folds into the contraction `j` (`k < j`), else why not."""
    parent = scope.block
    init, contraction = parent.stmts[k], parent.stmts[j]
    if not (isinstance(init, Block) and isinstance(contraction, Block) and k < j):
        return "the init and the contraction must be blocks, the init first"
    filled = _filled(init)
    if filled is None:
        return f"block {init.name} does more than fill one buffer with a constant"
    buffer, value = filled
    if any(touches(st, buffer) for st in parent.stmts[k + 1:j]):
        return f"a statement between {init.name} and {contraction.name} touches {buffer}"
    levels = chain(contraction)
    if not levels:
        return f"block {contraction.name} is not a chain of blocks ending in a leaf"
    level_scope = scope.child(contraction)
    for level in levels[:-1]:
        if len(level.stmts) > 1:
            why = final_reads(level_scope)
            if why is not None:
                return why
        inner = level.stmts[0]
        assert isinstance(inner, Block)
        level_scope = level_scope.child(inner)
    views = _views(levels, buffer, value)
    if isinstance(views, str):
        return views
    written = _written_indices(levels, views)
    first = _first(levels, views, written)
    if isinstance(first, str):
        return first
    if not _one_point_per_element(scope.child(contraction), levels, views, written):
        return f"{contraction.name} writes an element from two points of its output indices"
    if not same_writes(scope, init, contraction, buffer):
        return f"{init.name} and {contraction.name} write different elements of {buffer}"
    return first


def same_writes(scope: Scope, a: Block, b: Block, buffer: str) -> bool:
    """Whether blocks `a` and `b` of scope's block write the same elements of its buffer
    `buffer` (isl)."""
    return same_elements(scope, buffer, (a, WRITE), (b, WRITE))


def same_elements(scope: Scope, buffer: str, a: tuple[Block, str],
                  b: tuple[Block, str]) -> bool:
    """Whether two blocks of scope's block touch the same elements of its buffer
    `buffer`, each as a (block, READ or WRITE) pair says (isl)."""
    elems = scope.variables + element_vars(scope.depth, len(scope.block.ref(buffer).shape.dims))
    sets = [to_set(elems, [footprint(only(scope, st), buffer, mode)]) for st, mode in (a, b)]
    return bool(sets[0].is_equal(sets[1]))


def chain(block: Block) -> list[Block]:
    """`block` and the blocks nested one in the other below it, down to a leaf. A level
    above the leaf may end with more blocks after the next level (readers of what it
    wrote, pass sink), which `fold` proves harmless."""
    levels = [block]
    while True:
        stmts = levels[-1].stmts
        if not any(isinstance(st, Block) for st in stmts):
            return levels
        first = stmts[0]
        if not isinstance(first, Block) or not all(isinstance(st, Block) for st in stmts):
            return []
        levels.append(first)


def with_leaf(block: Block, edit: Callable[[Block], Block]) -> Block:
    """`block` with the leaf at the end of its chain replaced by `edit(leaf)`."""
    levels = chain(block)
    new = edit(levels[-1])
    for level in reversed(levels[:-1]):
        new = replace(level, stmts=(new, *level.stmts[1:]))
    return new


def _filled(init: Block) -> tuple[str, float] | None:
    """The parent buffer the init fills, level by level through one assigning view, and
    the constant it fills it with."""
    levels = chain(init)
    if not levels or any(len(level.stmts) != 1 for level in levels[:-1]):
        return None
    for level in levels:
        if len(level.refs) != 1 or level.refs[0].dir != "out" or level.refs[0].agg != "assign":
            return None
    stmts = levels[-1].stmts
    if not (len(stmts) == 2 and isinstance(stmts[0], Constant) and isinstance(stmts[1], Store)
            and stmts[1].value == stmts[0].into and not stmts[1].dynamic):
        return None
    return init.refs[0].from_, float(stmts[0].value)


def _views(levels: list[Block], buffer: str, value: float) -> list[Refinement] | str:
    """The view of `buffer` at each level of the contraction's chain, which writes it
    with one aggregation whose identity is `value`, else why not."""
    views = chain_views(levels, buffer)
    if isinstance(views, str):
        return views
    for level, view in zip(levels, views):
        # Above the leaf, inout where statements after the next level read it (proved
        # by `final_reads`), and assign where one updates it in place (pass epilogue;
        # the verifier proves that no two iterations write one element of it).
        above = level is not levels[-1]
        if view.dir not in (("out", "inout") if above else ("out",)):
            return (f"block {level.name} must write {view.from_} through one view and read "
                    "none of it")
        if AGG_IDENTITY.get(view.agg) != value and not (above and view.agg == "assign"):
            return (f"{buffer} starts at {value}, not the identity of block {level.name}'s "
                    f"aggregation {view.agg}")
    if len({v.agg for v in views if v.agg != "assign"}) != 1:
        return f"block {levels[0].name}'s levels write {buffer} with different aggregations"
    return views


def chain_views(levels: list[Block], buffer: str) -> list[Refinement] | str:
    """The view of `buffer` at each level of a chain, each level's one refinement of the
    view above it, else why not."""
    views, name = [], buffer
    for level in levels:
        found = [r for r in level.refs if r.from_ == name]
        if len(found) != 1:
            return f"block {level.name} must write {name} through one view and read none of it"
        views.append(found[0])
        name = found[0].into
    return views


def _first(levels: list[Block], views: list[Refinement], written: list[set[str]]
           ) -> tuple[str, ...] | str:
    """The micro-kernel's names of the outer levels' reduction indices, else why not."""
    outer: dict[tuple[int, str], str] = {}  # (level, reduction index there) -> name here
    for depth, level in enumerate(levels):
        passed = {i.affine.names[0]: i.name for i in level.idxs
                  if i.affine is not None and i.affine == Affine.index(i.affine.names[0])}
        mixed = [i.name for i in level.idxs if i.affine is not None and i.name not in
                 passed.values() and set(i.affine.names) & set(outer.values())]
        lost = sorted(o for o in outer.values() if o not in passed)
        if mixed or lost:
            return (f"block {level.name} is not passed the reduction indices "
                    f"{lost or mixed} as they are")
        outer = {o: passed[here] for o, here in outer.items()}
        own = {i.name for i in level.idxs if i.affine is None and i.name not in written[depth]}
        reductions = own | set(outer.values())
        if any(c.coeff(r) > 0 for c in level.constraints for r in reductions):
            return f"a constraint of block {level.name} bounds a reduction index from below"
        s = level.schedule
        if views[depth].into in s.combine or s.parallel in own:
            return f"block {level.name} runs its reduction across threads"
        if depth < len(levels) - 1:
            if replace(s, parallel=None) != BlockSchedule():
                return f"block {level.name} has a schedule beyond a parallel loop"
            outer.update({(depth, r): r for r in own})
    leaf = levels[-1]
    s = leaf.schedule
    # A tensorized block (polytile.loops.tensorize) sums every group and window position
    # of a register tile in registers before its one store: it is its own micro-kernel.
    tensorized = s.tensorize is not None and \
        replace(s, parallel=None, tensorize=None, first=None) == BlockSchedule()
    if not tensorized and not (s.micro and s.vector is not None and s.vector.index in written[-1]
            and set(s.unroll) <= written[-1]
            and s.boundary in (None, "remainders") and not s.stream
            and replace(s, micro=False, vector=None, boundary=None, unroll=(), order=(),
                        prefetch=0, next_row=(), first=None) == BlockSchedule()):
        return f"block {leaf.name} is not a vector outer-product micro-kernel or tensorized"
    stores = [st for st in leaf.stmts if isinstance(st, Store)]
    name = views[-1].into
    if len(stores) != 1 or stores[0].ref != name or stores[0].dynamic or \
            any(isinstance(st, Load) and st.ref == name for st in leaf.stmts):
        return f"block {leaf.name} must store into {name} once and never load it"
    return tuple(sorted(outer.values()))


def _written_indices(levels: list[Block], views: list[Refinement]) -> list[set[str]]:
    """Per level, the indices the written element depends on: those of its view, and
    those passed into a level below where they are written there."""
    below: set[str] = set()
    out: list[set[str]] = []
    for level, view in zip(reversed(levels), reversed(views)):
        names = {n for a in view.access for n in a.names}
        passed = {i.name: i.affine for i in level.idxs if i.affine is not None}
        out.append({n for n in names | below if n not in passed})
        below = {m for n in names | below if n in passed for m in passed[n].names}
    return list(reversed(out))


def _one_point_per_element(top: Scope, levels: list[Block], views: list[Refinement],
                           written: list[set[str]]) -> bool:
    """Whether iterations of the chain below `top` that write one element differ in
    reduction indices only (isl): a scatter `x(p + r) += ...` writes an element from
    several (p, r), and its first write is not where r is 0."""
    scopes = [top]
    for level in levels[1:]:
        scopes.append(scopes[-1].child(level))
    mine = [v for sc in scopes for v in sc.own]
    other = {v: f"{v}_q" for v in mine}
    output = [v for sc, names in zip(scopes, written) for v, i in zip(sc.own, sc.block.idxs)
              if i.affine is None and i.name in names]
    leaf = scopes[-1]
    same = tuple(sum((sc.affine(view.access[d]) for sc, view in zip(scopes, views)),
                     Affine()) for d in range(len(views[0].access)))
    there = leaf.domain.rename(other)
    eqs = tuple(a - a.substitute({v: Affine.index(q) for v, q in other.items()}) for a in same)
    free = leaf.variables + tuple(other.values())
    points = to_set(free, [(leaf.domain & there & Conj((), eqs, ()),), distinct(
        (v, other[v]) for v in output)])
    return bool(points.is_empty())
