"""ptrinc: pointer increments precomputed per reduction step (extended tensor
contractions, "Pointer Increments Precomputation").

A contraction whose subscripts are data-dependent (a shift convolution
`I(n, c, h + SH(c), w + SW(c))`) or that reduces over several indices (a
convolution's (c, kh, kw)) spends its inner loop on index arithmetic, and on a
bounds check per gathered access. But the address of an operand is
`base(parallel indices) + step(reduction indices)`: the step depends only on the
reduction iteration, so it is computed once per call into a small int64 table
indexed by the flattened reduction, and the kernel does one table load and one
load per operand. The data-dependent subscripts are checked when the table is
built, at the extreme values of the parallel indices that add to them, so an
out-of-range one fails before the kernel runs, with the same error as before.

    block s0 [c:64, o:64, h:26, w:26] #contraction (     none s0_I_steps[0] int64(64:1)
      out O <- O[o, h, w] (1, 1, 1):add                  block s0_bounds [c:64, h:2, w:2] #bounds (
      in SH <- SH[c] (1)                                   in SH <- SH[c]  in I <- I[c, 0, 0] (1, 28, 28) ...
      in I <- I[c, 0, 0] (1, 28, 28)             ->      ) { $h = index(25*h) ... $I_in_range = load(I[_, $y, $x]) }
      in W <- W[o, c] (1, 1)                             block s0_steps [c:64] #ptrinc (
    ) {                                                    in SH <- SH[c] ...  out s0_I_steps <- s0_I_steps[c] )
      $h = index(h)  $sh = load(SH)                      { $sh = load(SH) ... s0_I_steps = store($I_step) }
      $y = add($h, $sh) : int64  ...                     block s0 [c:64, o:64, h:26, w:26] #contraction (
      $I = load(I[_, $y, $x])                              out O <- O[o, h, w]:add
      $W = load(W)  ...                                    in I <- I[0, h, w] (64, 3, 3)          (the window)
    }                                                      in W <- W[o, c]
                                                           in s0_I_steps <- s0_I_steps[c] int64(1)
                                                         ) { $I_step = load(s0_I_steps)
                                                             $I = load(I + $I_step)  $W = load(W) ... }

Several reduction indices become one (`c_kh_kw`, in order of decreasing stride
in the operands, as the paper advises); an operand whose step is a multiple of
that flat index needs no table (`$W_step = index(c_kh_kw)`).

The operand's view in the kernel becomes the window its loads can reach from the
parallel indices' point: its origin moves with the parallel indices, its size is
what the reduction and the checked subscripts add. Tiling that view later works as
for any other view, and the table's offsets stay valid, since they count elements
from the view's origin in the underlying buffer's strides.

The pass runs after fuse (a table then lives in the fused row block, private to
each row) and pack (which never sees the flat offsets it cannot move), and before
autotile, which then schedules the simpler kernel: no index arithmetic on the
parallel indices is left, so a unit-stride one (w) becomes the vector index.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from polytile import dtypes
from polytile.analysis.deps import scalar_indices
from polytile.ir import nodes as N
from polytile.passes.autotile import vector_candidates
from polytile.passes.pipeline import count, flag, register
from polytile.targets.target import Target

MAX_CORNER_INDICES = 4     # 2**4 corners per reduction step at most


# ---------------------------------------------------------------- analysis

def reduction_indices(block: N.Block) -> list[str]:
    """The block's own loop indices that no written view depends on."""
    written = {n for r in block.refs if r.dir in ("out", "inout") for a in r.access
               for n in a.names}
    return [i.name for i in block.idxs if i.affine is None and i.name not in written]


def parallel_parts(block: N.Block, parallel: set[str]) -> dict[str, N.Affine | None]:
    """Each scalar as `a + rest`: `a` affine over the block's own parallel indices and
    `rest` the scalar's value where they are all 0, independent of them (None: the
    scalar is not of that form). The index arithmetic of a shift subscript
    `h + 1 + SH(c)` splits into `h` and `1 + SH(c)`. Splitting is exact in int64's
    wrapping arithmetic (add, sub, neg and products with constants distribute)."""
    deps = scalar_indices(block)
    types: dict[str, dtypes.DType] = {}
    consts: dict[str, int] = {}
    parts: dict[str, N.Affine | None] = {}
    refs = {r.into: r for r in block.refs}
    zero = N.Affine()
    for s in block.stmts:
        if isinstance(s, N.LoadIndex):
            types[s.into] = dtypes.INT64
            parts[s.into] = N.Affine.of({n: c for n, c in s.value.terms if n in parallel})
        elif isinstance(s, N.Constant):
            types[s.into] = s.dtype
            parts[s.into] = zero
            if s.dtype.is_integral and not isinstance(s.value, bool):
                consts[s.into] = int(s.value)
        elif isinstance(s, N.Load):
            types[s.into] = refs[s.ref].shape.dtype
            parts[s.into] = zero if not deps[s.into] & parallel else None
        elif isinstance(s, N.Intrinsic):
            types[s.into] = s.dtype
            parts[s.into] = _intrinsic_part(s, parts, types, consts, deps[s.into] & parallel)
    return parts


def _intrinsic_part(s: N.Intrinsic, parts: Mapping[str, N.Affine | None],
                    types: Mapping[str, dtypes.DType], consts: Mapping[str, int],
                    varies: frozenset[str]) -> N.Affine | None:
    args = [parts.get(a) for a in s.inputs]
    if not varies or all(a is not None and not a.terms for a in args):
        return N.Affine()          # a function of the parts independent of the indices
    if any(a is None for a in args) or s.dtype != dtypes.INT64:
        return None
    if any(types[a] != dtypes.INT64 for a, p in zip(s.inputs, args) if p is not None and p.terms):
        return None
    if s.op in ("add", "sub"):
        a, b = args
        assert a is not None and b is not None
        return a + b if s.op == "add" else a - b
    if s.op == "neg":
        assert args[0] is not None
        return args[0].scale(-1)
    if s.op in ("ident", "cast"):
        return args[0]
    if s.op == "mul":
        for k, other in ((0, 1), (1, 0)):
            factor = consts.get(s.inputs[k])
            part = args[other]
            if factor is not None and part is not None:
                return part.scale(factor)
    return None


def _extremes(a: N.Affine, ranges: Mapping[str, int]) -> tuple[int, int]:
    """Smallest and largest value of `a` (no constant) over the box of `ranges`."""
    low = sum(c * (ranges[n] - 1) for n, c in a.terms if c < 0)
    high = sum(c * (ranges[n] - 1) for n, c in a.terms if c > 0)
    return low, high


def _split_affine(a: N.Affine, names: set[str]) -> tuple[N.Affine, N.Affine]:
    """(terms over `names`, the rest with the constant)."""
    inside = N.Affine.of({n: c for n, c in a.terms if n in names})
    return inside, a - inside


# ---------------------------------------------------------------- the rewrite of one kernel

@dataclass(frozen=True)
class _Operand:
    """One load the kernel will make through a pointer increment."""

    load: N.Load
    ref: N.Refinement                 # the kernel's view before the pass
    window: N.Refinement              # its view after
    red_step: N.Affine                # the step's affine part, over the reduction indices
    dims: tuple[tuple[int, str, int], ...]   # dynamic dims: (stride, subscript scalar, add)
    corners: frozenset[str]           # parallel indices its subscripts' bounds depend on


@dataclass(frozen=True)
class Rewrite:
    """What the pass does to one kernel block: the blocks that go before it, the kernel
    after, and the tables to allocate in the block that holds them."""

    before: tuple[N.Block, ...]
    kernel: N.Block
    tables: tuple[N.Refinement, ...]


@dataclass(frozen=True)
class Settings:
    min_indices: int = 2          # reduction indices that make flattening pay without gathers
    max_table_bytes: int = 1 << 15
    vector_bytes: int = 16

    @staticmethod
    def of(target: Target, params: Mapping[str, Any]) -> Settings:
        budget = params.get("max_table_bytes", target.cache_size("L1") // 2)
        return Settings(int(params.get("min_indices", 2)), int(budget), target.vector_bytes)


def rewrite_kernel(block: N.Block, settings: Settings, taken: set[str],
                   steps_over: list[str] | None = None) -> Rewrite | None:
    """The rewrite of a leaf contraction `block`, or None where it does not apply or pay.
    `taken` holds the names already used in the holding block (for the tables).
    `steps_over` names the indices the table is indexed by when they are not the
    block's reduction (pass gathercopy's copy, whose every index is written: the
    table steps over the channels its shifts come from)."""
    if (block.constraints or "kernel" not in block.tags or block.schedule.micro
            or any(isinstance(s, (N.Block, N.Special)) for s in block.stmts)):
        return None
    if any(i.range < 1 for i in block.idxs if i.affine is None):
        return None      # the kernel runs no iteration, so no subscript may be checked
    red = reduction_indices(block) if steps_over is None else list(steps_over)
    if not red:
        return None
    ranges = {i.name: i.range for i in block.idxs if i.affine is None}
    parallel = {n for n in ranges if n not in red}
    deps = scalar_indices(block)
    parts = parallel_parts(block, parallel)
    types = _types(block)
    refs = {r.into: r for r in block.refs}
    reds = set(red)
    loads = [s for s in block.stmts if isinstance(s, N.Load)
             and (any(set(a.names) & reds for a in refs[s.ref].access)
                  or any(d is not None and deps[d] & reds for d in s.dynamic))]
    if not loads or any(s.offset is not None for s in loads):
        return None
    operands = []
    for load in loads:
        operand = _operand(load, refs[load.ref], parts, types, ranges, reds)
        if operand is None:
            return None
        operands.append(operand)
    # Loads that only fed the subscripts of others go away with them; with one reduction
    # index, the flat index is that index and static views can stay as they are.
    provisional = [N.Load(s.into, s.ref) if s in loads else s for s in block.stmts]
    alive = {getattr(s, "into", None) for s in live(provisional)}
    operands = [o for o in operands if o.load.into in alive and (o.dims or len(red) > 1)]
    gathers = any(o.dims for o in operands)
    if not operands or (not gathers and sum(1 for n in red if ranges[n] > 1)
                        < settings.min_indices):
        return None
    corners = frozenset().union(*(o.corners for o in operands))
    if len(corners) > MAX_CORNER_INDICES:
        return None
    order = _flat_order(block, red)
    flat = order[0] if len(order) == 1 else "_".join(order)
    multiplier, m = {}, 1
    for n in reversed(order):
        multiplier[n] = m
        m *= ranges[n]
    steps = m
    flat_value = N.Affine.of(multiplier)
    tabled = [o for o in operands if o.dims or _flat_multiple(o.red_step, multiplier) is None]
    if steps * 8 * len(tabled) > settings.max_table_bytes:
        return None
    names = Names({r.into for r in block.refs} | taken)
    tables = {o.load.into: names.fresh(f"{block.name}_{o.ref.into}_steps") for o in tabled}
    kernel = _kernel(block, operands, tables, flat, steps, multiplier, reds)
    if kernel is None or not _keeps_vectors(block, kernel, red, gathers, settings):
        return None
    table_shape = N.TensorShape(dtypes.INT64, (N.Dim(steps, 1),))
    allocations = tuple(N.Refinement("none", "", name, (N.Affine(),), table_shape)
                        for name in tables.values())
    before = []
    if any(o.dims for o in operands):
        before.append(_bounds_block(block, operands, corners, red, ranges))
    if tabled:
        before.append(_steps_block(block, tabled, tables, flat_value, red, ranges))
    return Rewrite(tuple(before), kernel, allocations)


def _keeps_vectors(before: N.Block, after: N.Block, red: list[str], gathers: bool,
                   settings: Settings) -> bool:
    """The flat reduction index is a scalar loop (its steps come from a table), so the
    rewrite must not take away a reduction index the kernel would have vectorized (a row
    sum over contiguous (h, w), a gather's rows read along a long unit-stride index).
    Without gathers, whose checks it removes, it pays only where the micro-kernel runs
    the reduction as scalar steps around vectors along a parallel index (a
    convolution's (c, kh, kw) around w)."""
    out = next((r for r in before.refs if r.dir in ("out", "inout")), None)
    if out is None:
        return False
    lanes = settings.vector_bytes // max(1, out.shape.dtype.bits // 8)
    ranges = {i.name: i.range for i in before.idxs if i.affine is None}
    if any(n in red and ranges[n] >= lanes for n in vector_candidates(before)):
        return False
    return gathers or any(n not in red for n in vector_candidates(after))


def _operand(load: N.Load, ref: N.Refinement, parts: Mapping[str, N.Affine | None],
             types: Mapping[str, dtypes.DType], ranges: Mapping[str, int],
             reds: set[str]) -> _Operand | None:
    """The window and step of one load, or None when its subscripts do not split into a
    parallel-index part and a part the reduction step alone decides."""
    origin: list[N.Affine] = []
    dims: list[N.Dim] = []
    dynamic: list[tuple[int, str, int]] = []
    red_step = N.Affine()
    corners: set[str] = set()
    subscripts = load.dynamic or (None,) * len(ref.access)
    for access, dim, sub in zip(ref.access, ref.shape.dims, subscripts):
        red_part, rest = _split_affine(access, reds)
        red_low, red_high = _extremes(red_part, ranges)
        if sub is None:
            # A static subscript reads the view's origin in this dimension.
            origin.append(rest + red_low)
            dims.append(N.Dim(1 + red_high - red_low, dim.stride))
            red_step = red_step + (red_part - red_low).scale(dim.stride)
            continue
        part = parts.get(sub)
        if part is None or not types[sub].is_integral:
            return None
        low, high = _extremes(part, ranges)
        size = dim.size - (high - low) + (red_high - red_low)
        if size < 1:
            return None     # every iteration fails the check; the kernel keeps reporting it
        origin.append(rest + part - low + red_low)
        dims.append(N.Dim(size, dim.stride))
        red_step = red_step + (red_part - red_low).scale(dim.stride)
        dynamic.append((dim.stride, sub, low))
        corners |= {n for n in part.names if ranges[n] > 1}
    window = replace(ref, access=tuple(origin), shape=N.TensorShape(ref.shape.dtype, tuple(dims)))
    return _Operand(load, ref, window, red_step, tuple(dynamic), frozenset(corners))


def _flat_order(block: N.Block, red: list[str]) -> list[str]:
    """Reduction indices by decreasing stride in the views (the innermost is unit-stride
    where some operand allows it), as the paper unpacks its reduction axis."""
    def stride(n: str) -> int:
        return max((abs(a.coeff(n)) * d.stride for r in block.refs
                    for a, d in zip(r.access, r.shape.dims)), default=0)
    return sorted(red, key=lambda n: -stride(n))


def _flat_multiple(step: N.Affine, multiplier: Mapping[str, int]) -> tuple[int, int] | None:
    """(alpha, const) when `step` is alpha * flat + const, else None."""
    alpha = None
    for n, m in multiplier.items():
        c = step.coeff(n)
        if c % m:
            return None
        if alpha is None:
            alpha = c // m
        elif c != alpha * m:
            return None
    return (alpha or 0, step.const)


class Names:
    def __init__(self, taken: Iterable[str]):
        self.taken = set(taken)

    def fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self.taken:
            name, k = f"{base}_{k}", k + 1
        self.taken.add(name)
        return name


def _kernel(block: N.Block, operands: list[_Operand], tables: Mapping[str, str], flat: str,
            steps: int, multiplier: Mapping[str, int], reds: set[str]) -> N.Block | None:
    """The kernel over the flat reduction index: each operand load reads its window
    through its step; the subscript arithmetic that fed the old loads is dropped."""
    by_load = {o.load.into: o for o in operands}
    scalars = Names(_scalars(block))
    refs_by_name = {r.into: r for r in block.refs}
    uses: dict[str, int] = {}
    for s in block.stmts:
        if isinstance(s, N.Load):
            uses[s.ref] = uses.get(s.ref, 0) + 1
    ref_names = Names(refs_by_name)
    new_refs: dict[str, N.Refinement] = {}
    steps_of: set[str] = set()             # the step scalars made here
    stmts: list[N.Statement] = []
    for s in block.stmts:
        operand = by_load.get(s.into) if isinstance(s, N.Load) else None
        if operand is None:
            stmts.append(s)
            continue
        step = scalars.fresh(f"${operand.ref.into}_step")
        steps_of.add(step)
        into = operand.load.into
        if into in tables:
            table = tables[into]
            stmts.append(N.Load(step, table))
            new_refs[table] = N.Refinement("in", table, table, (N.Affine.index(flat),),
                                           N.TensorShape(dtypes.INT64, (N.Dim(1, 1),)))
        else:
            multiple = _flat_multiple(operand.red_step, multiplier)
            assert multiple is not None
            stmts.append(N.LoadIndex(step, N.Affine.of({flat: multiple[0]}, multiple[1])))
        view = operand.ref.into if uses[operand.ref.into] == 1 else ref_names.fresh(
            f"{operand.ref.into}_window")
        new_refs[view] = replace(operand.window, into=view)
        stmts.append(N.Load(into, view, (), step))
    stmts = live(stmts)
    for s in stmts:
        if isinstance(s, N.LoadIndex) and set(s.value.names) & reds and s.into not in steps_of:
            return None      # an index value of the reduction is used as data
    used = {s.ref for s in stmts if isinstance(s, (N.Load, N.Store))}
    refs = []
    for r in block.refs:
        if r.dir != "in":
            refs.append(r)
        elif r.into in new_refs and r.into in used:
            refs.append(new_refs.pop(r.into))
        elif r.into in used:
            refs.append(r)
    refs += [r for name, r in new_refs.items() if name in used]
    idxs: list[N.Index] = []
    for i in block.idxs:
        if i.name in reds:
            if not any(x.name == flat for x in idxs):
                idxs.append(N.Index(flat, steps))
            continue
        idxs.append(i)
    return replace(block, idxs=tuple(idxs), refs=tuple(refs), stmts=tuple(stmts))


def _scalars(block: N.Block) -> set[str]:
    return {s.into for s in block.stmts if isinstance(s, (N.Load, N.LoadIndex, N.Constant,
                                                          N.Intrinsic))}


def _inputs(s: N.Statement) -> list[str]:
    if isinstance(s, N.Store):
        return [s.value] + [d for d in s.dynamic if d is not None]
    if isinstance(s, N.Intrinsic):
        return list(s.inputs)
    if isinstance(s, N.Load):
        return [d for d in s.dynamic if d is not None] + (
            [s.offset] if s.offset is not None else [])
    return []


def live(stmts: list[N.Statement]) -> list[N.Statement]:
    """The statements that a store needs (the rest computed dropped subscripts)."""
    needed: set[str] = set()
    kept: list[N.Statement] = []
    for s in reversed(stmts):
        if isinstance(s, N.Store) or getattr(s, "into", None) in needed:
            needed.update(_inputs(s))
            kept.append(s)
    return kept[::-1]


def chain(block: N.Block, roots: Iterable[str]) -> list[N.Statement]:
    """The statements that compute `roots`, in order."""
    needed = set(roots)
    kept: list[N.Statement] = []
    for s in reversed(block.stmts):
        if getattr(s, "into", None) in needed and not isinstance(s, N.Block):
            needed.update(_inputs(s))
            kept.append(s)
    return kept[::-1]


def _at(stmts: list[N.Statement], values: Mapping[str, N.Affine]) -> list[N.Statement]:
    return [replace(s, value=s.value.substitute(values)) if isinstance(s, N.LoadIndex) else s
            for s in stmts]


def passed_indices(block: N.Block) -> tuple[N.Index, ...]:
    return tuple(i for i in block.idxs if i.affine is not None)


def _bounds_block(block: N.Block, operands: list[_Operand], corners: frozenset[str],
                  red: list[str], ranges: Mapping[str, int]) -> N.Block:
    """Each data-dependent subscript at the extreme values of the parallel indices it
    adds to (every corner of their box), checked by a load of the kernel's own view:
    the loads that would fail in the kernel fail here, with the same error."""
    checked = [o for o in operands if o.dims]
    deps = scalar_indices(block)
    # Only the reduction indices the subscripts depend on: a check does not change along
    # the others (e.g. the channels of a sparse filter whose taps come from data).
    varying = set().union(*(deps[sub] for o in checked for _, sub, _ in o.dims))
    parallel = [n for n in ranges if n not in red]
    at = {n: (N.Affine.index(n).scale(ranges[n] - 1) if n in corners else N.Affine())
          for n in parallel + [n for n in red if n not in varying]}
    stmts = _at(chain(block, [sub for o in checked for _, sub, _ in o.dims]), at)
    refs = {r.into: r for r in block.refs}
    used = {s.ref for s in stmts if isinstance(s, N.Load)}
    views = [refs[name] for name in refs if name in used]
    names = Names(_scalars(block))
    for o in checked:
        view = replace(o.ref, access=tuple(a.substitute(at) for a in o.ref.access))
        if o.ref.into not in used:
            views.append(view)
            used.add(o.ref.into)
        stmts.append(N.Load(names.fresh(f"${o.ref.into}_in_range"), o.ref.into, o.load.dynamic))
    idxs = tuple(N.Index(n, ranges[n]) for n in red if n in varying) + tuple(
        N.Index(n, 2) for n in parallel if n in corners) + passed_indices(block)
    around = ", ".join(f"{n} in {{0, {ranges[n] - 1}}}" for n in parallel if n in corners)
    return N.Block(f"{block.name}_bounds", idxs, (), tuple(views), tuple(stmts),
                   frozenset({"bounds"}),
                   f"the subscripts of {block.name} that come from data, checked once"
                   + (f" at {around}" if around else ""))


def _steps_block(block: N.Block, tabled: list[_Operand], tables: Mapping[str, str],
                 flat_value: N.Affine, red: list[str], ranges: Mapping[str, int]) -> N.Block:
    """The tables: per reduction step, each operand's element offset from its window's
    origin (the subscripts' parts that do not depend on the parallel indices)."""
    parallel = [n for n in ranges if n not in red]
    zero = {n: N.Affine() for n in parallel}
    stmts = _at(chain(block, [sub for o in tabled for _, sub, _ in o.dims]), zero)
    refs = {r.into: r for r in block.refs}
    used = {s.ref for s in stmts if isinstance(s, N.Load)}
    views = [refs[name] for name in refs if name in used]
    names = Names(_scalars(block))
    types = _types(block)
    for o in tabled:
        table = tables[o.load.into]
        step = o.red_step + sum((o_low * stride for stride, _, o_low in o.dims), 0)
        total = names.fresh(f"${o.ref.into}_step")
        stmts.append(N.LoadIndex(total, step))
        for stride, sub, _ in o.dims:
            value = sub
            if types[sub] != dtypes.INT64:
                value = names.fresh(f"{sub}_i64")
                stmts.append(N.Intrinsic("cast", (sub,), value, dtypes.INT64))
            if stride != 1:
                scale = names.fresh("$stride")
                scaled = names.fresh(f"{sub}_scaled")
                stmts += [N.Constant(scale, stride, dtypes.INT64),
                          N.Intrinsic("mul", (value, scale), scaled, dtypes.INT64)]
                value = scaled
            added = names.fresh(f"${o.ref.into}_step")
            stmts.append(N.Intrinsic("add", (total, value), added, dtypes.INT64))
            total = added
        stmts.append(N.Store(table, total))
        views.append(N.Refinement("out", table, table, (flat_value,),
                                  N.TensorShape(dtypes.INT64, (N.Dim(1, 1),))))
    idxs = tuple(N.Index(n, ranges[n]) for n in red) + passed_indices(block)
    what = ", ".join(o.ref.into for o in tabled)
    return N.Block(f"{block.name}_steps", idxs, (), tuple(views), tuple(stmts),
                   frozenset({"ptrinc"}),
                   f"pointer increments of {what} per reduction step of {block.name}")


def _types(block: N.Block) -> dict[str, dtypes.DType]:
    refs = {r.into: r for r in block.refs}
    out: dict[str, dtypes.DType] = {}
    for s in block.stmts:
        if isinstance(s, N.Load):
            out[s.into] = refs[s.ref].shape.dtype
        elif isinstance(s, N.LoadIndex):
            out[s.into] = dtypes.INT64
        elif isinstance(s, (N.Constant, N.Intrinsic)):
            out[s.into] = s.dtype
    return out


# ---------------------------------------------------------------- the pass

KernelRewrite = Callable[[N.Block, set[str]], tuple[list[N.Statement], list[N.Refinement]] | None]


def rewrite_kernels(holder: N.Block, rewrite: KernelRewrite) -> N.Block:
    """`holder` with each kernel among its statements (and inside its non-kernel child
    blocks, e.g. fused rows) replaced by the statements `rewrite(kernel, names taken)`
    gives, whose buffers become locals of the block holding the kernel; `holder` itself
    where nothing changes. Shared with pass gathercopy."""
    stmts: list[N.Statement] = []
    refs = list(holder.refs)
    changed = False
    for s in holder.stmts:
        if not isinstance(s, N.Block):
            stmts.append(s)
            continue
        if "kernel" not in s.tags and any(isinstance(x, N.Block) for x in s.stmts):
            inner = rewrite_kernels(s, rewrite)
            changed |= inner is not s
            stmts.append(inner)
            continue
        rewritten = rewrite(s, {r.into for r in refs})
        if rewritten is None:
            stmts.append(s)
            continue
        changed = True
        stmts += rewritten[0]
        refs += rewritten[1]
    if not changed:
        return holder
    return replace(holder, refs=tuple(refs), stmts=tuple(stmts))


def _with_tables(kernel: N.Block, settings: Settings, taken: set[str]
                 ) -> tuple[list[N.Statement], list[N.Refinement]] | None:
    rewrite = rewrite_kernel(kernel, settings, taken)
    if rewrite is None:
        return None
    return [*rewrite.before, rewrite.kernel], list(rewrite.tables)


def ptrinc(fn: N.Function, target: Target, params: dict[str, Any]) -> N.Function:
    """Precompute pointer increments for the contractions with data-dependent or
    several-index reductions. Parameters: `enabled`, `min_indices` (reduction indices
    that make flattening pay when no subscript comes from data; default 2),
    `max_table_bytes` (default half of L1)."""
    if not params.get("enabled", True):
        return fn
    settings = Settings.of(target, params)
    body = rewrite_kernels(fn.body, lambda k, taken: _with_tables(k, settings, taken))
    return fn if body is fn.body else replace(fn, body=body)


register("ptrinc", ptrinc, enabled=flag, min_indices=count, max_table_bytes=count)
