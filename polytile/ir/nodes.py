"""Stripe's nested polyhedral IR (Stripe §3.1-3.2), as frozen dataclasses.

A `Block` is a parallel polyhedral block: named indices with ranges, affine
constraints (each `expr >= 0`) over its own indices and the indices it received
from its parent, refinements (views of parent buffers), a statement list that
runs in order for each point of the iteration space, and tags.

Semantics that every pass, the interpreter and the code generator share:

* Iterations of one block are independent except through the aggregation
  declared on an output refinement: `assign` means no element is written by two
  iterations; `add|mul|min|max` combine each written value with the element's
  current content (`C[i] = C[i] + v`).
* A refinement `into` is a view of the parent's buffer `from_` whose origin is at
  `access` (an affine offset per dimension, over the block's indices) and whose
  dimensions have the given sizes and strides. Strides are in elements of the
  underlying (top-level) buffer, so a view of a view keeps its parent's strides.
  In the top-level block, `from_` is "" and the refinement is a function
  parameter (`in|out|inout`) or a local allocation (`none`).
* Scalars are named `$x`; each is assigned once per iteration.
* `Load(into, ref, dynamic)` reads the element at the view's origin, plus, per
  dimension, the integer value of scalar `dynamic[d]` when it is not None (a
  data-dependent subscript; bounds-checked against the view's size at run time).
  With `offset`, it reads that many elements (of the underlying buffer) past
  that element: a pointer increment from a precomputed table
  (`polytile.passes.ptrinc`). It is not checked at run time; whoever computes it
  guarantees that the element lies inside the view, whose footprint is then the
  whole view.
* `Store(ref, value, dynamic)` writes (through the view's aggregation) the element
  at the view's origin plus the `dynamic` offsets, bounds-checked like a load's: a
  scatter-add to data-dependent positions (the gradient of a gather).
* `LoadIndex(into, affine)` gives the value of an affine function of indices.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Union

from polytile import dtypes
from polytile.dtypes import DType

AGG_OPS = ("assign", "add", "mul", "min", "max")
# The value an aggregation starts from: a sum from 0, a maximum from -inf.
AGG_IDENTITY = {"add": 0.0, "mul": 1.0, "max": float("-inf"), "min": float("inf")}
DIRECTIONS = ("in", "out", "inout", "none")


@dataclass(frozen=True)
class Affine:
    """sum(coeff * index) + const, with terms sorted by index name and no zero coefficients."""

    terms: tuple[tuple[str, int], ...] = ()
    const: int = 0

    @staticmethod
    def of(terms: Mapping[str, int] | None = None, const: int = 0) -> "Affine":
        items = tuple(sorted((k, v) for k, v in (terms or {}).items() if v != 0))
        return Affine(items, const)

    @staticmethod
    def index(name: str) -> "Affine":
        return Affine(((name, 1),), 0)

    @staticmethod
    def constant(value: int) -> "Affine":
        return Affine((), value)

    def coeff(self, name: str) -> int:
        return dict(self.terms).get(name, 0)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.terms)

    def __add__(self, other: "Affine | int") -> "Affine":
        if isinstance(other, int):
            return Affine(self.terms, self.const + other)
        merged = dict(self.terms)
        for k, v in other.terms:
            merged[k] = merged.get(k, 0) + v
        return Affine.of(merged, self.const + other.const)

    def __sub__(self, other: "Affine | int") -> "Affine":
        return self + (-other if isinstance(other, int) else other.scale(-1))

    def scale(self, factor: int) -> "Affine":
        return Affine.of({k: v * factor for k, v in self.terms}, self.const * factor)

    def substitute(self, values: Mapping[str, "Affine"]) -> "Affine":
        result = Affine.constant(self.const)
        for k, v in self.terms:
            result = result + (values[k].scale(v) if k in values else Affine(((k, v),), 0))
        return result

    def evaluate(self, env: Mapping[str, int]) -> int:
        return self.const + sum(v * env[k] for k, v in self.terms)

    def __str__(self) -> str:
        parts: list[str] = []
        for name, c in self.terms:
            mag = abs(c)
            term = name if mag == 1 else f"{mag}*{name}"
            parts.append(("- " if c < 0 else "+ ") + term if parts else ("-" if c < 0 else "") + term)
        if self.const or not parts:
            if parts:
                parts.append(f"{'-' if self.const < 0 else '+'} {abs(self.const)}")
            else:
                parts.append(str(self.const))
        return " ".join(parts)


@dataclass(frozen=True)
class Index:
    """An iteration index. With `affine` set it is passed in from the parent:
    its range is 1 and its value is `affine` over the parent's indices."""

    name: str
    range: int
    affine: Affine | None = None


@dataclass(frozen=True)
class Dim:
    size: int
    stride: int


@dataclass(frozen=True)
class TensorShape:
    dtype: DType
    dims: tuple[Dim, ...]

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(d.size for d in self.dims)

    @property
    def nbytes(self) -> int:
        """Bytes of its elements (a view's, not the span of its strides)."""
        return math.prod(self.sizes) * max(1, self.dtype.bits // 8)

    @property
    def element(self) -> TensorShape:
        """The shape of a view of one element of this buffer: sizes 1, its strides."""
        return TensorShape(self.dtype, tuple(Dim(1, d.stride) for d in self.dims))


@dataclass(frozen=True)
class Refinement:
    dir: str                        # in | out | inout | none
    from_: str                      # buffer in the parent's scope; "" at top level
    into: str                       # name in this block
    access: tuple[Affine, ...]      # origin of the view, one affine per dimension
    shape: TensorShape
    agg: str = "assign"             # assign | add | mul | min | max
    location: str | None = None     # memory level, e.g. "stack"; None = wherever the parent has it


# ---------------------------------------------------------------- statements

@dataclass(frozen=True)
class Load:
    into: str                                   # scalar name, "$x"
    ref: str
    dynamic: tuple[str | None, ...] = ()        # per-dimension data-dependent offsets
    offset: str | None = None                   # integer scalar: a flat element offset


@dataclass(frozen=True)
class Store:
    ref: str
    value: str                                  # scalar name
    dynamic: tuple[str | None, ...] = ()        # per-dimension data-dependent offsets


@dataclass(frozen=True)
class LoadIndex:
    into: str
    value: Affine


@dataclass(frozen=True)
class Constant:
    into: str
    value: int | float
    dtype: DType


@dataclass(frozen=True)
class Intrinsic:
    """`$out = op($a, $b, ...)` computed in `dtype` (see polytile.ir.intrinsics)."""

    op: str
    inputs: tuple[str, ...]
    into: str
    dtype: DType


@dataclass(frozen=True)
class Special:
    """A whole-buffer operation the code generator knows by name (e.g. "zero", "copy")."""

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    params: tuple[tuple[str, str], ...] = ()


# How a GPU backend maps an index (a kind the CPU backends refuse).
GPU_KINDS = ("grid", "thread")
# How a vector micro-kernel runs a boundary tile (BlockSchedule.boundary).
BOUNDARY_KINDS = ("remainders", "guarded")


@dataclass(frozen=True)
class VectorLoop:
    """An index whose iterations run across the lanes of SIMD vectors of `dtype`."""

    index: str
    dtype: DType
    lanes: int


@dataclass(frozen=True)
class Tensorized:
    """The block runs on a tensorized instruction (polytile/isa): its `lane` index across
    the instruction's data-parallel lanes, its `reduction` index in the instruction's
    groups (UNIT's mapping, found by polytile.isa.inspect). The register tile is `rows`
    output rows by `chains` chunks of lanes: that many accumulators, each chunk's operand
    load reused by every row, each row's broadcast by every chunk. `kept`: the packed
    operand (a read-only parameter, dense in memory) is kept packed between calls and
    packed again only when its values differ from the ones it was packed from (compared
    element for element on every call, so it is never stale)."""

    instruction: str
    lane: str
    reduction: str
    rows: int = 4
    chains: int = 4
    kept: bool = False


@dataclass(frozen=True)
class WarpTiled:
    """The block runs on a warp-level matrix instruction (Tensor Cores' `mma.sync`,
    described in polytile/isa): the instruction's M, N and K loops are the block's indices
    `rows`, `cols` and `reduction` (the inspector's mapping); each warp of a GPU block
    computes `tiles_m` x `tiles_n` instruction tiles of the output (M x N each: a register
    tile of accumulator fragments, each operand fragment serving several instructions),
    a block `warps_m` x `warps_n` warps, with both operands staged through shared memory
    one K step at a time and zero-filled past the ends (polytile.loops.warp_mma). Other
    output indices run across the grid's third dimension (the first) and in uniform loops
    (the rest)."""

    instruction: str
    rows: str
    cols: str
    reduction: str
    warps_m: int = 2
    warps_n: int = 2
    tiles_m: int = 1
    tiles_n: int = 1


@dataclass(frozen=True)
class Tiled:
    """The block runs on a CPU's matrix instruction on tiles (AMX's tdpbf16ps, tdpbusd,
    tdpbssd, described in polytile/isa): the instruction's M and N loops are the block's
    indices `rows` and `cols`, its two reduction loops (the groups and the values of a
    group) both the block's `reduction`, split by the group's size (the inspector's
    mapping). Both operands are packed per call into the instruction's tiles, zero past
    the ends, and each output tile is accumulated over every step of the reduction
    (polytile.loops.tiles). Other output indices loop around it. `kept`: the second
    operand's tiles are kept between calls, packed again only when its values differ (as
    `Tensorized.kept`; only where no other output index loops around the tiles)."""

    instruction: str
    rows: str
    cols: str
    reduction: str
    kept: bool = False


@dataclass(frozen=True)
class Staged:
    """A GPU thread tile's reduction staged through local (shared) memory (TC §5.5): its
    reduction index `index` runs in tiles of `tile` iterations; per tile the work-group
    copies the box of each of `refs` (inputs several of its work-items read) into local
    memory, waits at a barrier, and each work-item adds its terms from there into an
    accumulator held in a register, stored once at the end. `pad` extra elements end
    each row of a staged box in local memory, so that work-items reading down a column
    hit different memory banks."""

    index: str
    tile: int
    refs: tuple[str, ...]
    pad: int = 0


@dataclass(frozen=True)
class Across:
    """A GPU reduction across the work-items of a group (TC §5.4's reductions across
    threads): the block's reduction index `index` is shared out over `threads`
    work-items (a power of two), each combining every threads-th iteration into a
    register; the group then combines the partial results in a tree in local memory and
    one work-item combines the total into the output. With `warp` (a power of two up to
    `threads`; 0: none), the partial results are combined in registers instead:
    FusionStitching's warp composition (§5), warp shuffles within each warp of `warp`
    work-items, one result per warp through local memory, and shuffles again."""

    index: str
    threads: int
    warp: int = 0


@dataclass(frozen=True)
class Phase:
    """One phase of a stitched block (`Stitched`): `shared`, the iterations of its
    parallel loop are shared out among the region's threads (OpenMP `for`); otherwise one
    thread runs the whole phase (`single`). `barrier`: every thread waits after it until
    all have finished it (a later phase reads or writes what it touched)."""

    shared: bool
    barrier: bool


@dataclass(frozen=True)
class Stitched:
    """A block without indices whose statements (its phases, nested blocks of possibly
    different parallel shapes) run in one team of threads, FusionStitching's block
    composition (§5.1) on a CPU: one OpenMP parallel region, a phase per statement, in
    order, separated by barriers where `polytile.ir.phases` finds a dependence."""

    phases: tuple[Phase, ...]


ROW_PHASE_KINDS = ("single", "spread", "across")


@dataclass(frozen=True)
class RowPhase:
    """One member of a row group (`RowGroup`): `single`, work-item 0 runs it (a member
    without a loop, such as a reduction's initialization); `spread`, the iterations of
    its loop `loop` are dealt out to the work-items, every `threads`-th to each, and each
    work-item runs the member's other loops in full for each of its iterations (an
    elementwise member, or a small contraction whose other loops are reductions: the
    paper's thread composition of a GEMM); `across`, its loop `loop` is a reduction the
    work-items share, each combining every `threads`-th term, then a tree in local
    memory (or shuffles), work-item 0 combining the total into the output, once per
    iteration of the member's other loops, which the output depends on. Members of one
    group may deal out loops of different ranges: the paper's block composition of ops
    with different parallel shapes. `barrier`: the group waits after it (a later member
    touches what it writes, or writes what it reads)."""

    kind: str
    barrier: bool
    loop: str = ""          # the member's index dealt out or shared; "" for single


@dataclass(frozen=True)
class RowGroup:
    """FusionStitching's block composition (§5) on a GPU: a fused row block whose row
    index `index` runs one row per work-group, its `threads` work-items (a power of two)
    running each member statement in turn as described by `phases` (one per member,
    in order). The row's intermediates (the block's local buffers) live where their
    refinement's location says: "shared" is the group's local memory. `warp`: the
    `across` members combine their partial results by warp shuffles (`Across.warp`)."""

    index: str
    threads: int
    phases: tuple[RowPhase, ...]
    warp: int = 0


@dataclass(frozen=True)
class NextRow:
    """Prefetch, beside each vector load of `view`, the same element of the next row,
    `stride` elements further on, while the row index `index` (passed down from a row
    loop of `rows` rows) is not the last (pass `nextrow`)."""
    view: str
    index: str
    rows: int
    stride: int


@dataclass(frozen=True)
class BlockSchedule:
    """How a block's iterations run: decided by passes, recorded here as data, printed
    by backends (which decide nothing). The default is plain serial loops.

    * micro: the block is a register tile: with `vector`, a vector micro-kernel
      (polytile.codegen.vector) across its lanes with the `unroll` indices unrolled;
      without, scalar loops;
    * boundary: how a vector micro-kernel cut short by constraints (a boundary tile)
      runs (BOUNDARY_KINDS): "remainders", one version per remainder of the unrolled
      indices, looped indices bounded and lanes masked; "guarded", the vector code for
      full tiles and scalar loops otherwise (set by pass schedule);
    * transpose: a nonzero panel width makes the block a copy emitted with register
      transposes of that width (polytile.codegen.transpose); set by pass `pack`;
    * order: the loop order of a micro-kernel's loops other than the vector and the
      unrolled indices, outermost first (set by pass `reorder`; empty: block order);
    * parallel: the index whose loop runs in threads (OpenMP); its iterations write
      disjoint elements (the pass that sets it proves that with isl), apart from
    * combine: buffers the parallel loop's iterations accumulate into (refinements
      with aggregation add, e.g. a column sum fused into a row loop): each thread adds
      into a private copy, and the copies are added into the buffer at the end;
    * simd: the innermost loop runs as `omp simd`;
    * gpu: indices mapped to a GPU's grid or threads of a block (GPU_KINDS);
    * prefetch: a vector micro-kernel's data-dependent (gathered) loads are prefetched
      this many iterations of its innermost reduction loop ahead (0: not at all): the
      rows a gather reads are scattered, so no hardware prefetcher sees them coming;
    * tensorize: the block is one tensorized instruction's loop nest (pass `tensorize`);
    * stage: a GPU thread tile's reduction runs in tiles through local memory, with its
      accumulator in a register (pass `gpu`; `Staged`); with `unroll`, the output
      indices whose points each work-item computes (a register tile);
    * across: a GPU reduction shared out over a group's work-items (pass `gpu`; `Across`);
    * stitch: the block's statements are the phases of one parallel region (`Stitched`,
      set by pass autotile on the blocks pass fuse stitches);
    * mma: the block runs on a warp-level matrix instruction, a tile per warp (pass
      `tensor_cores`; `WarpTiled`);
    * tiles: the block runs on a CPU's matrix instruction on tiles (AMX; pass
      `tensorize`; `Tiled`);
    * rows: a fused row block runs a row per work-group, its members as phases across
      the group's work-items (pass `gpu`; `RowGroup`).
    * stream: views of a vector micro-kernel's output whose full-vector stores bypass the
      caches (non-temporal stores; pass `stream`): the buffer is written once, along the
      vector index, and is larger than the last-level cache, so nothing would read it
      from there. Where the address allows no such store (alignment), a plain one.
    * next_row: views of a vector micro-kernel inside a row loop whose next row it
      prefetches while it computes on this one (`NextRow`; pass `nextrow`): the row's
      first reader waits on memory, a later one reads the row from the caches and leaves
      the memory idle.
    * folded: an init block whose writes the named later sibling, a contraction, makes
      with its first writes (`analysis.fold` proves it; pass `fold`): it lowers to
      nothing. The init stays in the IR, so the IR means what it meant;
    * first: in that contraction's vector micro-kernel, the reduction indices passed in
      from outer blocks; where they and its own reduction indices are 0, its stores
      assign instead of aggregating (empty: its own alone; None: no fold). Since no init
      brought the stored lines into the caches, it prefetches them for writing before
      its sums.
    """

    micro: bool = False
    vector: VectorLoop | None = None
    boundary: str | None = None
    unroll: tuple[str, ...] = ()
    order: tuple[str, ...] = ()
    transpose: int = 0
    parallel: str | None = None
    combine: tuple[str, ...] = ()
    simd: bool = False
    gpu: tuple[tuple[str, str], ...] = ()
    prefetch: int = 0
    tensorize: Tensorized | None = None
    stage: Staged | None = None
    across: Across | None = None
    stitch: Stitched | None = None
    mma: WarpTiled | None = None
    tiles: Tiled | None = None
    rows: RowGroup | None = None
    stream: tuple[str, ...] = ()
    next_row: tuple[NextRow, ...] = ()
    folded: str | None = None
    first: tuple[str, ...] | None = None


# The element types whose buffers threads may accumulate privately (BlockSchedule.combine):
# the C types OpenMP reduces, and whose addition has no undefined overflow.
COMBINABLE = (dtypes.FLOAT32, dtypes.FLOAT64)


@dataclass(frozen=True)
class Block:
    name: str
    idxs: tuple[Index, ...] = ()
    constraints: tuple[Affine, ...] = ()        # each: affine >= 0
    refs: tuple[Refinement, ...] = ()
    stmts: tuple["Statement", ...] = ()
    tags: frozenset[str] = field(default_factory=frozenset)   # hints without semantics
    comment: str = ""
    schedule: BlockSchedule = field(default_factory=BlockSchedule)

    def ref(self, name: str) -> Refinement:
        for r in self.refs:
            if r.into == name:
                return r
        raise KeyError(name)

    def index(self, name: str) -> Index:
        for i in self.idxs:
            if i.name == name:
                return i
        raise KeyError(name)


Statement = Union[Load, Store, LoadIndex, Constant, Intrinsic, Special, Block]


@dataclass(frozen=True)
class Function:
    """A compiled TC function: its top-level block and the order of its parameters.

    `params` lists the top-level refinements that are arguments of the generated
    function, in order (inputs, scalars as 0-d tensors, then outputs).
    """

    name: str
    params: tuple[str, ...]
    body: Block
