"""pack: copy an operand into a layout the micro-kernel can stream (the CPU analogue
of TC's shared-memory promotion, §5.5).

A contraction vectorizes best along a parallel index that is unit-stride in its
output (outer-product micro-kernels: broadcast one operand, vector-load the
other). When an input uses that index with a non-unit stride (tmm's B(n, k):
n has stride K), and the input is reused across another parallel index (every
row m of A reads all of B), the input is copied once into a buffer where that
index is innermost, and the kernel reads the copy:

    block s0 [m:M, n:N, k:K] (                       block pack_p1 [a0:N, a1:K] #pack (
      out o0[m, n]:add                                 in p1 <- p1[a0, a1]
      in p0[m, k]                          ->          out p1_packed <- p1_packed[a1, a0] )
      in p1[n, k] )                                  block s0 [m:M, n:N, k:K] (
                                                       ... in p1 <- p1_packed[k, n] (stride 1 in n) )

Reuse pays when the operand is read at least `min_reuse` times per element (a fused
row's copy of its slice, made again in every row, at least `row_min_reuse` times); the
copy pays when the reduction is short (at most `max_reduction` steps), where a
dot-product kernel would spend much of its time in horizontal sums.

Two more copies feed the same kernel from operands it could read in place but would
wait on (both made for the gradients of dense layers, and for any contraction shaped so):
* a vector operand already unit-stride along that index whose rows, which the
  reduction steps through, share a few sets of L1 or lie a page apart
  (`scattered_rows`: W of dX = dY W) goes into the same panels, by a plain copy;
* a broadcast operand read along its rows by the reduction (A(k, m) in A^T B, dY in
  dW = dY^T X) is copied once with the reduction innermost (`_transposes`):

    block s0 [m:M, n:N, k:K] (                       block pack_p0_panels0 [o:1, a1:M, i:K] #pack
      out o0[m, n]:add                      ->       block s0 [m:M, n:N, k:K] (
      in p0[k, m]                                      ... in p0 <- p0_panels0[0, m, k]
      in p1[k, n] )                                    in p1[k, n] )

A float32 contraction that reads bfloat16 (or float16) operands only through casts to
float32 (`widened`: a bf16 matmul where no `vdpbf16ps` took it) gets float32 copies of
them, exact, so the fp32 micro-kernel runs it: the vector operand whatever its reuse,
the broadcast one with the reduction innermost:

    block s0 [m:M, n:N, k:K] (                       block pack_p0_panels0 [..] #pack ( $x = load(p0)
      out o0[m, n] float32:add                         $w = cast($x) : float32  p0_panels0 = store($w) )
      in p0[m, k] bfloat16                  ->       block pack_p1_panels1 [..] #pack ( ..the same.. )
      in p1[k, n] bfloat16                           block s0 [m:M, n_o:N/16, n:16, k:K] (
    ) { $c = cast($p0) : float32 ... }                 in p0 <- p0_panels0[0, m, k] float32
                                                       in p1 <- p1_panels1[n_o, k, n] float32 ) ...
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from polytile import dtypes
from polytile.dtypes import DType
from polytile.ir import nodes as N
from polytile.ir.lower import contiguous
from polytile.isa.inspect import widens
from polytile.passes.autotile import register_vectors, schedules_problem
from polytile.passes.pipeline import count, flag, register
from polytile.passes.schedule import PAGE_BYTES, Schedule, _is_parallel, panel_index
from polytile.passes.tile import substitute_local
from polytile.targets.target import Target


def unit_dim(ref: N.Refinement, index: str) -> int | None:
    """The dimension in which `index` appears alone with coefficient 1, if exactly one."""
    dims = [d for d, a in enumerate(ref.access) if a.coeff(index)]
    if len(dims) != 1 or ref.access[dims[0]] != N.Affine.index(index):
        return None
    return dims[0]


# Reuse (multiply-adds per element) above which copying an operand whose rows lie a page
# or more apart pays: the copy costs a load and a store per element. dX and dW of MLP1
# (rows 8000 bytes apart, used 128 times; one thread, Zen 3, load ~5.6): 1.50 -> 1.17
# and 1.44 -> 1.24 ms median with the copy.
PAGE_ROWS_MIN_REUSE = 64
# Reuse below which a fused row's copy of its slice (made again in every row) costs more
# than the product it feeds gains: the multi-interests scores, 4 x 50 x 64 per row over
# 256 rows (one thread, Zen 3, CPU time, 300 calls): 559 us median with the per-row
# panels at reuse 4, 435 us without.
ROW_MIN_REUSE = 8


def scattered_rows(block: N.Block, ref: N.Refinement, d: int, target: Target) -> bool:
    """Whether the rows of `ref` that a reduction index steps through (a dimension other
    than d) lie so far apart that a micro-kernel reading them in place waits on memory:
    * they fall into so few sets of L1 that they evict each other: rows 4 KiB apart (W of
      a 1024-wide layer) all share one set (8 lines on a 32 KiB L1), so every step of
      the reduction reads from L2;
    * or each row is on another page (more pages than the L1 TLB holds), and the
      operand is reused enough (PAGE_ROWS_MIN_REUSE) for a copy to pay."""
    line = target.cache_line_bytes
    sets = max(1, PAGE_BYTES // line)
    ways = max(1, target.cache_size("L1") // PAGE_BYTES)
    elem = max(1, ref.shape.dtype.bits // 8)
    ranges = {i.name: i.range for i in block.idxs if i.affine is None}
    reuse = _reuse(ref, ranges)
    for j, a in enumerate(ref.access):
        name = a.names[0] if j != d and len(a.names) == 1 else None
        if name not in ranges or _is_parallel(block, name):
            continue
        stride = ref.shape.dims[j].stride * elem
        if stride % line == 0 and ranges[name] > sets // math.gcd(stride // line, sets) * ways:
            return True
        if stride >= PAGE_BYTES and reuse >= PAGE_ROWS_MIN_REUSE:
            return True
    return False


def _reuse(ref: N.Refinement, ranges: dict[str, int]) -> int:
    """How many times the kernel reads each element of `ref` (the loops it does not use)."""
    used = {n for a in ref.access for n in a.names}
    return math.prod(r for n, r in ranges.items() if n not in used)


def _plain(ref: N.Refinement, ranges: dict[str, int]) -> bool:
    """Whether `ref` reads loop indices only as plain subscripts (what a copy repacks)."""
    return not any(set(a.names) & set(ranges) and (len(a.terms) > 1 or a.const)
                   for a in ref.access)


def widened(block: N.Block, ref: N.Refinement) -> DType:
    """The dtype a copy of `ref` holds: float32 where `ref` holds a narrower float whose
    every value is a float32 value (bfloat16, float16: `isa.inspect.widens`) and the block
    reads it only through casts to float32, so the copy changes no value any op sees,
    and the block writes float32 (what the vector micro-kernel computes); else `ref`'s
    own dtype."""
    dtype = ref.shape.dtype
    outs = [r for r in block.refs if r.dir in ("out", "inout")]
    if dtype == dtypes.FLOAT32 or not widens(dtype, dtypes.FLOAT32) \
            or [r.shape.dtype for r in outs] != [dtypes.FLOAT32]:
        return dtype
    loads = {s.into for s in block.stmts if isinstance(s, N.Load) and s.ref == ref.into}
    readers = [s for s in block.stmts if loads & set(_reads(s))]
    if loads and readers and all(isinstance(s, N.Intrinsic) and s.op == "cast"
                                 and s.dtype == dtypes.FLOAT32 for s in readers):
        return dtypes.FLOAT32
    return dtype


def _reads(st: N.Statement) -> tuple[str | None, ...]:
    """The scalars a statement of a leaf block reads."""
    if isinstance(st, (N.Intrinsic, N.Special)):
        return st.inputs
    if isinstance(st, N.Store):
        return (st.value, *st.dynamic)
    if isinstance(st, N.Load):
        return (*st.dynamic, st.offset)
    return ()


def _outer_product_index(block: N.Block, lanes: int) -> str | None:
    """The vector index of an outer-product kernel: the parallel index that is its one
    output's unit-stride innermost subscript, at least a vector long; None where the
    block is not such a kernel (nested blocks, gathers, no such index)."""
    outs = [r for r in block.refs if r.dir in ("out", "inout")]
    if len(outs) != 1 or any(isinstance(s, N.Block) for s in block.stmts):
        return None
    if any(isinstance(s, N.Load) and (s.dynamic or s.offset) for s in block.stmts):
        return None
    out = outs[0]
    if not out.shape.dims or out.shape.dims[-1].stride != 1:
        return None
    ranges = {i.name: i.range for i in block.idxs if i.affine is None}
    v = next((n for n in ranges if unit_dim(out, n) == len(out.access) - 1), None)
    if v is None or ranges[v] < lanes or not _is_parallel(block, v):
        return None
    return v


def _plan(block: N.Block, top: dict[str, N.Refinement], lanes: int, min_reuse: int,
          max_reduction: int, target: Target
          ) -> tuple[str, list[tuple[N.Refinement, int]]] | None:
    """(vector index, [(input ref, dimension to make innermost)]) or None."""
    v = _outer_product_index(block, lanes)
    if v is None:
        return None
    ranges = {i.name: i.range for i in block.idxs if i.affine is None}
    reduction = math.prod(r for n, r in ranges.items() if not _is_parallel(block, n))
    if reduction > max_reduction:
        return None     # long reductions amortize a dot-product kernel's horizontal sums
    packs = []
    for ref in block.refs:
        if ref.dir != "in" or not any(a.coeff(v) for a in ref.access):
            continue
        d = unit_dim(ref, v)
        if d is None or ref.from_ not in top:
            return None
        # A narrow float is vector-loaded only once widened: copied whatever its reuse.
        widen = widened(block, ref) != ref.shape.dtype
        if not widen and ref.shape.dims[d].stride == 1 \
                and not scattered_rows(block, ref, d, target):
            continue
        if not _plain(ref, ranges) or (not widen and _reuse(ref, ranges) < min_reuse):
            return None
        packs.append((ref, d))
    return (v, packs) if packs else None


def _transposes(block: N.Block, top: dict[str, N.Refinement], lanes: int, min_reuse: int,
                line: int) -> list[tuple[N.Refinement, int]]:
    """[(input ref, dimension to make innermost)]: the broadcast operands of an
    outer-product kernel that are read along their rows by the reduction (dW = sum over
    the batch of dY(b, n) * X(b, m), any A^T B): one step of the reduction reads a few
    neighbours of the register tile's index from each row, a new cache line each time,
    and rows a power of two apart share a few sets of L1. Transposed (the reduction
    innermost), each unrolled value streams along one row, as A(m, k) does in A B.
    A broadcast operand that `widened` makes float32 (A of a bfloat16 matmul) is copied
    so with the reduction innermost too, whichever way it is read: converted once rather
    than at each use (in place, the conversions cost a bf16 1024^3 matmul a fifth of its
    time on Zen 3)."""
    v = _outer_product_index(block, lanes)
    if v is None:
        return []
    ranges = {i.name: i.range for i in block.idxs if i.affine is None}
    found = []
    for ref in block.refs:
        if ref.dir != "in" or ref.from_ not in top or not ref.shape.dims:
            continue
        if any(a.coeff(v) for a in ref.access) or not _plain(ref, ranges):
            continue
        inner = min(range(len(ref.access)), key=lambda d: ref.shape.dims[d].stride)
        u = ref.access[inner].names[0] if ref.access[inner].names else None
        reduced = [d for d, a in enumerate(ref.access)
                   if a.names and a.names[0] in ranges and not _is_parallel(block, a.names[0])]
        if widened(block, ref) != ref.shape.dtype:
            if len(reduced) == 1 and _reuse(ref, ranges) >= min_reuse:
                found.append((ref, reduced[0]))
            continue
        if (u is None or u not in ranges or not _is_parallel(block, u)
                or ref.shape.dims[inner].stride != 1 or len(reduced) != 1):
            continue
        d = reduced[0]
        elem = max(1, ref.shape.dtype.bits // 8)
        if ref.shape.dims[d].stride * elem > line and _reuse(ref, ranges) >= min_reuse:
            found.append((ref, d))
    return found


def pack(fn: N.Function, target: Target, params: dict[str, Any]) -> N.Function:
    if not params.get("enabled", True):
        return fn
    settings = (int(params.get("min_reuse", 4)), int(params.get("max_reduction", 1 << 30)))
    row_settings = (int(params.get("row_min_reuse", ROW_MIN_REUSE)), settings[1])
    return replace(fn, body=_pack_members(fn.body, target, settings, row_settings,
                                          given=params.get("schedules", {})))


Hoist = Callable[["_Copy", N.Refinement, int], "str | None"]


def _pack_members(container: N.Block, target: Target, settings: tuple[int, int],
                  row_settings: tuple[int, int], hoist: Hoist | None = None,
                  given: Mapping[str, Schedule] | None = None) -> N.Block:
    """Pack the operands of the contractions among `container`'s statements into local
    buffers of `container`: the function's body (copied once per call) or a fused row
    block (copied once per row, where only that row's slice of the operand is read;
    `row_settings`). A fused row's widened copy of data that every row reads alike (B of
    a bf16 matmul, which other copies leave in place there: it is used once per row) is
    made once, in the container around the row loop (`hoist`), and passed in."""
    min_reuse, max_reduction = settings
    top = {r.into: r for r in container.refs}
    new_refs = list(container.refs)
    stmts: list[N.Statement] = []
    packed: dict[tuple[Any, ...], str] = {}

    def hoisted(copy: _Copy, inner: N.Refinement, lanes: int) -> str | None:
        """The local of this container holding a fused row's widened `copy` of its view
        `inner`, made once here, or None where the rows read different data."""
        rows = {i.name for i in copy.passed}
        if inner.from_ not in top or any(a.terms or a.const for a in inner.access) \
                or any(set(a.names) & rows for a in copy.ref.access):
            return None
        copy = replace(copy, passed=(), ref=replace(copy.ref, from_=inner.from_))
        if copy.key not in packed:
            name = f"{inner.from_}_widened{len(packed)}"
            new_refs.append(N.Refinement("none", "", name, tuple(N.Affine() for _ in
                                                                 copy.shape.dims), copy.shape))
            stmts.append(copy.block(name, top[inner.from_], lanes))
            packed[copy.key] = name
        return packed[copy.key]

    for s in container.stmts:
        if isinstance(s, N.Block) and "fused" in s.tags:
            stmts.append(_pack_members(s, target, row_settings, row_settings, hoisted,
                                       given))
            continue
        if not (isinstance(s, N.Block) and "contraction" in s.tags):
            stmts.append(s)
            continue
        lanes = target.vector_bytes // max(1, (s.refs[0].shape.dtype.bits // 8))

        def place(copy: _Copy, lanes: int = lanes) -> str:
            """The local buffer holding `copy`, made (with its copy block) on first use."""
            if copy.key not in packed:
                zeros = tuple(N.Affine() for _ in copy.shape.dims)
                outer = (hoist(copy, top[copy.ref.from_], lanes)
                         if hoist is not None and copy.widens else None)
                if outer is not None:
                    new_refs.append(N.Refinement("in", outer, outer, zeros, copy.shape))
                    packed[copy.key] = outer
                    return outer
                name = f"{copy.ref.from_}_panels{len(packed)}"
                new_refs.append(N.Refinement("none", "", name, zeros, copy.shape))
                stmts.append(copy.block(name, top[copy.ref.from_], lanes))
                packed[copy.key] = name
            return packed[copy.key]

        for ref, d in _transposes(s, top, lanes, min_reuse, target.cache_line_bytes):
            reduction = ref.access[d].names[0]
            copy = _Copy.of(s, ref, d, next(i.range for i in s.idxs if i.name == reduction),
                            widened(s, ref))
            # One panel as long as the reduction: the view's rows with `reduction` innermost.
            s = _reading(s, ref.into, place(copy), copy, (N.Affine(),) + tuple(
                ref.access[j] for j in copy.looped) + (ref.access[d],))
        plan = _plan(s, top, lanes, min_reuse, max_reduction, target)
        if plan is None:
            stmts.append(s)
            continue
        v, packs = plan
        width = _panel_width(s, v, packs, lanes, target, (given or {}).get(s.name))
        stmts.append(_in_panels(s, v, packs, width, place))
    return replace(container, refs=tuple(new_refs), stmts=tuple(stmts))


def _panel_width(block: N.Block, v: str, packs: list[tuple[N.Refinement, int]], lanes: int,
                 target: Target, given: Schedule | None) -> int:
    """A panel is one register tile wide: the tile a schedule given for the block (the
    tuner's) spans along `v`, else autotile's decision (register_vectors), asked of the
    block in panels of two vectors. Autotile then takes the panel's width."""
    if given is not None and given.vector == v and given.lanes == lanes:
        return lanes * max(1, given.vectors)
    if next(i.range for i in block.idxs if i.name == v) < 2 * lanes:
        return lanes
    trial = _in_panels(block, v, packs, 2 * lanes, lambda copy: copy.ref.from_)
    return 2 * lanes if register_vectors(trial, target, panels=False) == (v, 2) else lanes


def _in_panels(block: N.Block, v: str, packs: list[tuple[N.Refinement, int]], width: int,
               place: Callable[[_Copy], str]) -> N.Block:
    """`block` with index `v` split into panels of `width` and the views `packs` read
    from their panel copies, in the buffers `place` names."""
    copies = {ref.into: _Copy.of(block, ref, d, width, widened(block, ref))
              for ref, d in packs}
    block = split_index(block, v, width)
    for into, copy in copies.items():
        looped = tuple(block.ref(into).access[j] for j in copy.looped)
        block = _reading(block, into, place(copy), copy, (N.Affine.index(panel_index(v)),)
                         + looped + (N.Affine.index(v),))
    return block


def _reading(block: N.Block, into: str, name: str, copy: _Copy,
             access: tuple[N.Affine, ...]) -> N.Block:
    """`block` with its view `into` moved onto buffer `name`, the copy's layout, at
    `access`. Load statements name views by `into`, which is unchanged."""
    refs = tuple(replace(r, from_=name, access=access, shape=copy.shape.element)
                 if r.into == into else r for r in block.refs)
    return replace(block, refs=refs)


@dataclass(frozen=True)
class _Copy:
    """How a contraction's view `ref` of its container's buffer becomes panels:
    panels[o, ...looped dims, i] = buffer[..., width*o + i (dimension d), ...], where
    the dimensions the contraction reads at indices passed from above stay fixed."""

    ref: N.Refinement
    d: int
    width: int
    passed: tuple[N.Index, ...]         # the contraction's passed indices
    looped: tuple[int, ...]             # dimensions read by a plain loop index
    ranges: dict[int, int]              # dimension -> extent read
    shape: N.TensorShape

    @staticmethod
    def of(block: N.Block, ref: N.Refinement, d: int, width: int, dtype: DType) -> _Copy:
        loops = {i.name: i.range for i in block.idxs if i.affine is None}
        looped = tuple(j for j, a in enumerate(ref.access) if j != d and set(a.names) & set(loops))
        ranges = {j: loops[ref.access[j].names[0]] for j in (*looped, d)}
        sizes = (-(-ranges[d] // width),) + tuple(ranges[j] for j in looped) + (width,)
        return _Copy(ref, d, width, tuple(i for i in block.idxs if i.affine is not None),
                     looped, ranges, contiguous(dtype, sizes))

    @property
    def widens(self) -> bool:
        """Whether the copy converts (`widened`: a narrow float to float32)."""
        return self.shape.dtype != self.ref.shape.dtype

    @property
    def key(self) -> tuple[Any, ...]:
        fixed = tuple((j, a) for j, a in enumerate(self.ref.access)
                      if j != self.d and j not in self.looped)
        return (self.ref.from_, self.d, self.width, fixed, self.passed,
                tuple(sorted(self.ranges.items())), self.shape.dtype)

    def block(self, name: str, source: N.Refinement, lanes: int) -> N.Block:
        idxs = (self.passed + (N.Index("o", self.shape.dims[0].size),)
                + tuple(N.Index(f"a{j}", self.ranges[j]) for j in self.looped)
                + (N.Index("i", self.width),))
        value = N.Affine.of({"o": self.width, "i": 1})
        src_access = tuple(value if j == self.d else
                           N.Affine.index(f"a{j}") if j in self.looped else a
                           for j, a in enumerate(self.ref.access))
        constraints = ((N.Affine.constant(self.ranges[self.d] - 1) - value,)
                       if self.ranges[self.d] % self.width else ())
        src = N.Refinement("in", source.into, source.into, src_access, source.shape.element)
        dst_access = ((N.Affine.index("o"),) + tuple(N.Affine.index(f"a{j}") for j in self.looped)
                      + (N.Affine.index("i"),))
        dst = N.Refinement("out", name, name, dst_access, self.shape.element)
        stmts: tuple[N.Statement, ...] = (N.Load("$x", source.into), N.Store(name, "$x"))
        if self.widens:                                 # exactly (`widened`)
            stmts = (stmts[0], N.Intrinsic("cast", ("$x",), "$w", self.shape.dtype),
                     N.Store(name, "$w"))
        # Panels of a dimension that is already unit-stride are plain vector copies
        # (autotile schedules them); the others are register transposes.
        unit = self.ref.shape.dims[self.d].stride == 1
        return N.Block(f"pack_{name}", idxs, constraints, (src, dst), stmts,
                       frozenset({"kernel", "pack"}),
                       schedule=N.BlockSchedule(transpose=0 if unit else lanes))


def split_index(block: N.Block, name: str, width: int) -> N.Block:
    """`name` -> `width*name_o + name` with `name` now ranging over one panel of `width`;
    a constraint removes the overflow of the last panel. The block stays flat."""
    old = next(i for i in block.idxs if i.name == name)
    outer = panel_index(name)
    value = N.Affine.of({outer: width, name: 1})
    idxs: list[N.Index] = []
    for i in block.idxs:
        if i.name == name:
            idxs += [N.Index(outer, -(-old.range // width)), N.Index(name, width)]
        else:
            idxs.append(i)
    constraints = [c.substitute({name: value}) for c in block.constraints]
    if old.range % width:
        constraints.append(N.Affine.constant(old.range - 1) - value)
    refs = tuple(replace(r, access=tuple(a.substitute({name: value}) for a in r.access))
                 for r in block.refs)
    return replace(block, idxs=tuple(idxs), constraints=tuple(constraints), refs=refs,
                   stmts=substitute_local(block.stmts, {name: value}))


register("pack", pack, enabled=flag, min_reuse=count, row_min_reuse=count,
         max_reduction=count, schedules=schedules_problem)
