"""collapse: two loop indices that walk one contiguous stretch of every buffer they touch
become one index (h, w -> h_w).

A kernel over NCHW data iterates h and w apart, so its vector index is w alone: a 28-wide
row runs as a 16-wide tile and a 12-wide remainder, a 7-wide row is mostly masked lanes.
Where every view of the block reads and writes h and w together, in two adjacent
dimensions with stride(h) == range(w) * stride(w), the pair is one index of range H*W and
the two dimensions one dimension of that size:

    block s0 [i0:8, i1:256, i2:28, i3:28, i4:256] (      block s0 [i0:8, i1:256, i2_i3:784, i4:256] (
      out o0 <- o0[i0, i1, i2, i3]                         out o0 <- o0[i0, i1, i2_i3]
        float32(1:200704, 1:784, 1:28, 1:1):add     ->       float32(1:200704, 1:784, 1:1):add
      in p0 <- p0[i0, i4, i2, i3]                          in p0 <- p0[i0, i4, i2_i3]
        float32(1:200704, 1:784, 1:28, 1:1)                  float32(1:200704, 1:784, 1:1)
      in p1 <- p1[i4, i1] float32(1:256, 1:1)              in p1 <- p1[i4, i1] float32(1:256, 1:1)

A refinement has the rank of the view it refines (`polytile.ir.verify`), so a merge of two
dimensions is a merge of the buffer's dimensions everywhere: the top-level buffer (a
parameter, which the runtime always passes C-contiguous, or a local) and every view of it
in every block. The pass therefore decides merges a buffer dimension at a time, together
with everything that merge drags in (`_plan`): each view of buffer B at dimensions j, j+1
must be either

* a view whose origin there is constant (a fused row loop's view of the whole tensor, a
  tile): one row's stretch (size 1 along j) or whole rows (size along j+1 the row
  length R, origin 0 along j+1); it becomes size s_j * s_j+1 at origin R*o_j + o_j+1; or
* the element at (a, b), two loop indices of a leaf block alone in those dimensions, with
  range(b) == R; the block then merges a and b, which needs the same of every other view
  of the block that uses a or b (each in its own buffer: more merges in the plan), and
  a and b in no constraint and no statement (`index(h)`, a where-clause's bound); or
* one row's stretch (size 1 along j) of a leaf that only copies (loads and one assigning
  store: pass gathercopy's dense copy of a shifted image, whose source rows are wider),
  which keeps its indices and reaches the merged dimension at R * origin_j + origin_j+1.
  A plan needs at least one block that merges its indices.

A plan that would merge two different dimensions of one buffer or two different pairs
of one block is given up, and so is any buffer that a gather reads or a scatter writes
(data-dependent subscripts are checked per dimension at run time), that a whole-buffer
operation (`Special`) or a statement outside a leaf touches, or whose viewing block
already has a schedule (a tensorized block). Plans are applied one at a time, the
innermost dimension first, until none is left: n, c, h, w of an elementwise kernel over
contiguous arrays become one index.

Runs after fuse (its row loops' views are then whole-row constant views) and before
pack, rowbuffer, ptrinc and autotile, which then see one long index and decide as
they always do. The merged index is named after its parts (`i2_i3`); a schedule (the
tuner's, or a stale tuning record) naming `i2` of such a block is refused by
`schedule.check_schedule`, and a stored record that fails is reported and the
heuristics used (`compile.Compiler.optimized`). `collapse.enabled: false` turns it off.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from polytile.ir import nodes as N
from polytile.passes.names import fresh_name
from polytile.passes.pipeline import flag, register
from polytile.targets.target import Target

Path = tuple[int, ...]              # statement positions from the function's body
Root = tuple[Path, str]             # a buffer: the block that declares it, its name
CONSTANT = ("", "")                 # a view whose origin is constant in the merged dimensions
INDEXED = ("", "+")                 # a view of one row's stretch, at any origin, in a copy
                                    # that keeps its indices: row * a + b in the merged one


@dataclass(frozen=True)
class _Use:
    """A view of a root buffer: the block it is in and its refinement."""

    path: Path
    block: N.Block
    ref: N.Refinement


@dataclass(frozen=True)
class _Plan:
    """Merges applied together: dimension j of each root with j+1; index pair (a, b)
    of each block."""

    dims: tuple[tuple[Root, int], ...]
    pairs: tuple[tuple[Path, tuple[str, str]], ...]


def collapse(fn: N.Function, target: Target, params: dict[str, Any]) -> N.Function:
    if not params.get("enabled", True):
        return fn
    while True:
        plan = _next_plan(fn)
        if plan is None:
            return fn
        fn = _apply(fn, plan)


# ---------------------------------------------------------------- finding a plan

@dataclass(frozen=True)
class _Buffers:
    """The function's root buffers: each one's views, its declaration, the roots no plan
    may touch, and each block's views by name -> the root they view."""

    uses: dict[Root, list[_Use]]
    declared: dict[Root, N.Refinement]
    frozen: set[Root]
    views: dict[Path, dict[str, Root]]


def _buffers(fn: N.Function) -> _Buffers:
    uses: dict[Root, list[_Use]] = {}
    views: dict[Path, dict[str, Root]] = {}
    declared: dict[Root, N.Refinement] = {}
    frozen: set[Root] = set()

    def walk(block: N.Block, path: Path, outer: dict[str, Root]) -> None:
        roots = views.setdefault(path, {})
        for r in block.refs:
            if r.from_:
                if r.from_ not in outer:
                    continue
                roots[r.into] = outer[r.from_]
                uses.setdefault(roots[r.into], []).append(_Use(path, block, r))
            else:
                roots[r.into] = (path, r.into)
                declared[(path, r.into)] = r
                uses.setdefault((path, r.into), [])
        leaf = not any(isinstance(s, N.Block) for s in block.stmts)
        for s in block.stmts:
            touched: tuple[str, ...] = ()
            if isinstance(s, (N.Load, N.Store)):
                checked = any(d is not None for d in s.dynamic) or getattr(s, "offset", None)
                touched = (s.ref,) if checked or not leaf else ()
            elif isinstance(s, N.Special):
                touched = s.inputs + s.outputs
            frozen.update(roots[n] for n in touched if n in roots)
        for k, s in enumerate(block.stmts):
            if isinstance(s, N.Block):
                walk(s, path + (k,), roots)

    walk(fn.body, (), {})
    return _Buffers(uses, declared, frozen, views)


def _next_plan(fn: N.Function) -> _Plan | None:
    """The first plan that holds, trying the innermost dimensions first."""
    buffers = _buffers(fn)
    seeds = sorted(((root, j) for root, ref in buffers.declared.items()
                    if root not in buffers.frozen
                    for j in range(len(ref.shape.dims) - 1)), key=lambda s: -s[1])
    for root, j in seeds:
        plan = _plan(root, j, buffers)
        if plan is not None:
            return plan
    return None


def _row(ref: N.Refinement, j: int) -> int | None:
    """The row length R of a merge of dimensions j and j+1 of root `ref`, or None when
    they are not one contiguous stretch (stride j == R * stride j+1)."""
    dims = ref.shape.dims
    if any(a.names for a in ref.access[j:j + 2]):
        return None
    row = dims[j + 1].size
    return row if dims[j].stride == row * dims[j + 1].stride and row > 0 else None


def _plan(seed: Root, j: int, buffers: _Buffers) -> _Plan | None:
    """The merges that merging dimensions j, j+1 of `seed` needs, or None."""
    dims: dict[Root, int] = {}
    pairs: dict[Path, tuple[str, str]] = {}
    pending = [(seed, j)]
    while pending:
        root, d = pending.pop()
        if root in dims:
            if dims[root] != d:
                return None
            continue
        if root in buffers.frozen:
            return None
        row = _row(buffers.declared[root], d)
        if row is None:
            return None
        dims[root] = d
        for use in buffers.uses[root]:
            pair = _view_pair(use, d, row)
            if pair is None:
                return None
            if pair in (CONSTANT, INDEXED):
                continue
            a, b = pair
            others = _pair_views(use.block, a, b)
            if others is None:      # a copy may keep a and b and index the merged dimension
                if use.path in pairs or not _copy(use.block) or use.ref.shape.dims[d].size != 1:
                    return None
                continue
            if pairs.setdefault(use.path, (a, b)) != (a, b):
                return None
            roots = buffers.views[use.path]
            for name, dim in others:
                if name not in roots:
                    return None
                pending.append((roots[name], dim))
    if not pairs:           # no block would run fewer loops: views would only be rewritten
        return None
    return _Plan(tuple(sorted(dims.items())), tuple(sorted(pairs.items())))


def _view_pair(use: _Use, j: int, row: int) -> tuple[str, str] | None:
    """How view `use` takes a merge of its dimensions j, j+1 (rows of length `row`):
    CONSTANT with a constant origin there, (a, b) as the element at two loop indices
    that its block must merge, None not at all."""
    ref, block = use.ref, use.block
    at, below = ref.access[j], ref.access[j + 1]
    size, inner = ref.shape.dims[j].size, ref.shape.dims[j + 1].size
    if not at.names and not below.names:
        whole_rows = inner == row and below.const == 0
        return CONSTANT if size == 1 or whole_rows else None
    loops = {i.name: i for i in block.idxs if i.affine is None}
    a, b = at.names[0] if at.names else "", below.names[0] if below.names else ""
    if (at == N.Affine.index(a) and below == N.Affine.index(b) and a != b and a in loops
            and b in loops and loops[b].range == row and (size, inner) == (1, 1)
            and _mergeable_block(block, a, b)):
        return (a, b)
    # A copy (pass gathercopy's, whose source is a gather) may keep its indices: within
    # one row (its origin along j+1 and its extent stay in the row, as the view's bounds
    # check), the view is the same elements at row * origin_j + origin_j+1. A kernel
    # that computes keeps its views' shape for the passes after (pack finds its vector
    # index alone in the output's last dimension).
    return INDEXED if size == 1 and _copy(block) else None


def _copy(block: N.Block) -> bool:
    """Whether leaf `block` only copies: loads and one store that assigns, nothing
    computed or accumulated."""
    stores = [s for s in block.stmts if isinstance(s, N.Store)]
    return (len(stores) == 1 and block.ref(stores[0].ref).agg == "assign"
            and all(isinstance(s, (N.Load, N.Store)) for s in block.stmts))


def _mergeable_block(block: N.Block, a: str, b: str) -> bool:
    """Whether leaf `block` may merge loop indices a and b as far as the block itself
    goes: it has no schedule yet, and a and b are in no constraint and no statement."""
    if block.schedule != N.BlockSchedule() or any(isinstance(s, N.Block) for s in block.stmts):
        return False
    if any(a in c.names or b in c.names for c in block.constraints):
        return False
    for s in block.stmts:
        if isinstance(s, N.LoadIndex) and (a in s.value.names or b in s.value.names):
            return False
    return True


def _pair_views(block: N.Block, a: str, b: str) -> list[tuple[str, int]] | None:
    """(view, j) for each view of `block` that uses a or b, which must hold them alone
    at j and j+1 as one element (size 1 in both); None where one does otherwise."""
    out = []
    for ref in block.refs:
        places = [d for d, e in enumerate(ref.access) if a in e.names or b in e.names]
        if not places:
            continue
        if len(places) != 2 or places[1] != places[0] + 1:
            return None
        j = places[0]
        if (ref.access[j] != N.Affine.index(a) or ref.access[j + 1] != N.Affine.index(b)
                or ref.shape.dims[j].size != 1 or ref.shape.dims[j + 1].size != 1):
            return None
        out.append((ref.into, j))
    return out


# ---------------------------------------------------------------- applying it

def _apply(fn: N.Function, plan: _Plan) -> N.Function:
    dims = dict(plan.dims)
    pairs = dict(plan.pairs)

    def rewrite(block: N.Block, path: Path, outer: dict[str, tuple[int, int]]) -> N.Block:
        # outer: the parent's views of planned roots -> (dimension, row length)
        pair = pairs.get(path)
        merged = fresh_name(f"{pair[0]}_{pair[1]}", {i.name for i in block.idxs}) if pair else ""
        own: dict[str, tuple[int, int]] = {}
        refs = []
        for r in block.refs:
            if r.from_ and r.from_ in outer:
                j, row = outer[r.from_]
            elif not r.from_ and (path, r.into) in dims:
                j = dims[(path, r.into)]
                row = r.shape.dims[j + 1].size
            else:
                refs.append(r)
                continue
            own[r.into] = (j, row)
            refs.append(_merged_view(r, j, row, pair, merged))
        stmts = tuple(rewrite(s, path + (k,), own) if isinstance(s, N.Block) else s
                      for k, s in enumerate(block.stmts))
        idxs = block.idxs
        if pair:
            a, b = pair
            size = block.index(a).range * block.index(b).range
            idxs = tuple(N.Index(merged, size) if i.name == a else i
                         for i in block.idxs if i.name != b)
        return replace(block, idxs=idxs, refs=tuple(refs), stmts=stmts)

    return replace(fn, body=rewrite(fn.body, (), {}))


def _merged_view(ref: N.Refinement, j: int, row: int, pair: tuple[str, str] | None,
                 merged: str) -> N.Refinement:
    """`ref` with dimensions j and j+1 as one (see `_view_pair`)."""
    at, below = ref.access[j], ref.access[j + 1]
    outer, inner = ref.shape.dims[j], ref.shape.dims[j + 1]
    if pair and at == N.Affine.index(pair[0]):
        origin = N.Affine.index(merged)
    else:
        origin = at.scale(row) + below
    size = inner.size if outer.size == 1 else outer.size * inner.size
    dim = N.Dim(size, inner.stride)
    access = ref.access[:j] + (origin,) + ref.access[j + 2:]
    shape = replace(ref.shape, dims=ref.shape.dims[:j] + (dim,) + ref.shape.dims[j + 2:])
    return replace(ref, access=access, shape=shape)


register("collapse", collapse, enabled=flag)
