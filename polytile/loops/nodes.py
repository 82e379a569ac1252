"""The loop IR: explicit loops, typed values and flat memory, below Stripe's blocks.

A `Kernel` is what a backend prints: every decision is already made. Stripe's blocks
and views are gone: a loop has its kind and bounds, an access names a buffer and a flat
element offset, a value has a type of `lanes` elements of one dtype (1: a scalar).

Names are unique in a kernel and are the backend's identifiers. An integer name (a loop
variable or an int64 `Let`) may appear in `Affine` offsets and bounds; every other value
is named by the `Let` or `Var` that defines it, before its uses.

Semantics (the interpreter, polytile.loops.interp, is the reference):

* `Loop(var, lo, hi, body, kind, step)`: var = lo, lo + step, ... while var < hi. Kind
  "parallel" (threads), "grid" and "thread" (a GPU's blocks and threads) run the
  iterations in any order or at once; they write disjoint elements (the pass that chose
  the kind proved it), except in the spans of `accumulate`, into which they only add:
  each thread adds into a private copy, and the copies are added in at the end (OpenMP's
  array reduction). `simd` allows the iterations to run across the lanes of a vector.
* `Read(buffer, offset, lanes, count)`: `lanes` consecutive elements from `offset`; with
  a count, lanes at or past it read as 0 and touch no memory. `Store` writes the same
  way, combining each element with its aggregation (`Combine` semantics).
* `Combine(agg, acc, value)`: acc + value, acc * value, or max / min where NaN wins,
  lane by lane (an aggregation step). `Reduce(agg, value)` combines a vector's lanes.
* `Check(value, size, param, dim)`: the kernel fails with an index error unless
  0 <= value < size (a data-dependent subscript); `param` and `dim` say where.
* `Alloc(buffers, body)`: local buffers that exist while `body` runs, each filled per
  its `init` ("nan": a quiet NaN, floats only; "zero"; "": unspecified, because the body
  writes every element before reading it).
* `Kept(buffer, state, source, offset, count, body)`: `body` fills `buffer` (a pooled
  top-level local, kept between calls) from the `count` elements of parameter `source`
  that start at `offset`, one contiguous run; it runs unless this block of `buffer` was
  last filled from the same values. Elements `state` onward of `buffer` remember them:
  whether the block was filled, and a copy of the source's elements, compared element for
  element (the interpreter runs `body` every time: skipping it changes no value).
* `Prefetch(buffer, offset)`: a hint that the element (inside the buffer) will be read
  soon; no effect on any value (the interpreter skips it).
* `Store(..., stream=True)`: the same store, written past the caches where the machine
  can (non-temporal; `BlockSchedule.stream`). Such stores may reach memory out of order
  with later ones until a `Fence`, after which they are ordered before every later store
  and visible to a thread that synchronizes with this one (x86 `sfence`). The lowering
  puts one after each thread's share of a parallel loop that streams, and at the
  kernel's end (polytile.loops.fence).
* `Region(body)`: one team of threads runs `body`, a stitched kernel's phases
  (FusionStitching's block composition, §5): each statement of it is a `Comment`, a
  loop of kind "workshare" (its iterations are shared out among the threads, the same
  iterations to the same thread for equal bounds; no thread waits at its end), a
  `Single` (one thread runs its body), a `Fence` (every thread fences its own streaming
  stores) or a `Barrier("global")` (every thread waits until all have arrived, and then
  sees what the others wrote before it). Nothing else: a
  statement every thread would run is not in the loop IR's meaning. Workshare loops and
  `Single`s appear only directly in a region, and regions do not nest.
* `Instruction` runs a tensorized instruction (UNIT) on values. A warp-level one
  (Tensor Cores: its description has fragment layouts) is run by every thread of a warp
  together, on `Fragment` values, and `FragmentStore` stores its result.
* `Barrier("shared")`: in a thread loop, every thread of the group arrives before any
  goes on, and then sees what the others wrote in local memory (GPU backends; the
  interpreter runs the group's threads in lock-step between barriers; the C printer
  refuses it). `Barrier("group")`: the same, and the group's writes to global memory
  are seen too (a row group whose members pass an output between them).
* `WarpXor(name, type, value, mask, place)`: a warp shuffle. Every thread of the group
  runs it together (as it reaches a barrier); `name` is then the value `value` has in
  the thread whose place in the group is this one's `place` xor `mask` (`mask` below
  the warp's size: a thread of the same warp). CUDA's `__shfl_xor_sync`; backends
  without warps refuse it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from polytile.dtypes import DType
from polytile.ir.nodes import Affine

LOOP_KINDS = ("serial", "parallel", "grid", "thread", "workshare")
SPACES = ("global", "shared", "private")
# Where the C backend keeps a buffer: an argument, the stack, a kept pool, or the heap.
PLACEMENTS = ("param", "stack", "pool", "heap")
INITS = ("nan", "zero", "")
AGGS = ("assign", "add", "mul", "min", "max")


@dataclass(frozen=True)
class VType:
    """`lanes` values of `dtype`; one lane is a scalar."""

    dtype: DType
    lanes: int = 1

    def __str__(self) -> str:
        return str(self.dtype) if self.lanes == 1 else f"{self.dtype}x{self.lanes}"


# ---------------------------------------------------------------- integer expressions

@dataclass(frozen=True)
class IMin:
    args: tuple["IExpr", ...]


@dataclass(frozen=True)
class IMax:
    args: tuple["IExpr", ...]


@dataclass(frozen=True)
class IDiv:
    """floor(num / den), or the ceiling with `ceil`; den > 0."""

    num: Affine
    den: int
    ceil: bool = False


IExpr = Union[Affine, IMin, IMax, IDiv]


# ---------------------------------------------------------------- value expressions

@dataclass(frozen=True)
class Lit:
    value: float | int | bool       # in every lane


@dataclass(frozen=True)
class Name:
    name: str


@dataclass(frozen=True)
class IntValue:
    value: IExpr                    # an int64


@dataclass(frozen=True)
class Read:
    buffer: str
    offset: Affine
    lanes: int = 1
    count: IExpr | None = None      # active lanes (masked); None: all


@dataclass(frozen=True)
class Op:
    """An op of polytile.ir.intrinsics with result dtype `dtype`. Scalar operands may
    have any dtypes (converted as the op says); vector operands all have the result's
    lanes."""

    op: str
    args: tuple[str, ...]
    dtype: DType


@dataclass(frozen=True)
class Broadcast:
    value: str                      # a scalar of the vector's dtype


@dataclass(frozen=True)
class Combine:
    agg: str
    acc: str
    value: str


@dataclass(frozen=True)
class Reduce:
    agg: str
    value: str                      # a vector; the result is a scalar


@dataclass(frozen=True)
class Mask:
    value: str
    count: IExpr                    # lanes at or past it become `fill`
    fill: float


@dataclass(frozen=True)
class Shuffle:
    a: str
    b: str
    lanes: tuple[int, ...]          # per result lane: k < L takes a[k], else b[k - L]


@dataclass(frozen=True)
class Fragment:
    """A warp's tile of operand `operand` (a parameter name of its description) of the
    warp-level instruction `instruction` (Tensor Cores): as a value, the whole tile,
    flattened as the description flattens it (what the interpreter holds); on a GPU, each
    of the warp's 32 threads holds the elements the description's layout gives thread
    `lane` (an int64 name: the thread's place in its warp). Read from `buffer`, where the
    tile's elements are consecutive from `offset`; with no buffer, every element is
    `fill`. Every thread of the warp evaluates it with the same buffer and offset."""

    instruction: str
    operand: str
    lane: str
    buffer: str = ""
    offset: Affine = field(default_factory=Affine)
    fill: float = 0


Expr = Union[Lit, Name, IntValue, Read, Op, Broadcast, Combine, Reduce, Mask, Shuffle,
             Fragment]


# ---------------------------------------------------------------- statements

@dataclass(frozen=True)
class Let:
    name: str
    type: VType
    value: Expr
    # A loaded vector that several multiply-adds of a register tile read: kept in a
    # register (C: an empty asm ties it to one; gcc would otherwise reload it as a
    # memory operand of every FMA, which on AVX2 costs a fifth of a GEMM's time).
    held: bool = False


@dataclass(frozen=True)
class Var:
    """A mutable variable (an accumulator, a register of a transpose)."""

    name: str
    type: VType
    value: Expr


@dataclass(frozen=True)
class Assign:
    name: str                       # a Var
    value: Expr


@dataclass(frozen=True)
class Store:
    buffer: str
    offset: Affine
    value: str
    agg: str = "assign"
    count: IExpr | None = None
    stream: bool = False            # bypass the caches (assign, all lanes only)


@dataclass(frozen=True)
class Fence:
    """Streaming stores before it are done before any store after it (see the module)."""


@dataclass(frozen=True)
class FragmentStore:
    """The warp stores the tile `value` (a `Fragment` of `operand` of `instruction`, or an
    instruction's result with that operand's layout) to `buffer`, its elements
    consecutive from `offset`; each thread writes the elements it holds."""

    buffer: str
    offset: Affine
    value: str
    instruction: str
    operand: str
    lane: str


@dataclass(frozen=True)
class Span:
    """Elements [offset, offset + count) of a buffer."""

    buffer: str
    offset: int
    count: int


@dataclass(frozen=True)
class Loop:
    var: str
    lo: IExpr
    hi: IExpr
    body: tuple["Stmt", ...]
    kind: str = "serial"
    step: int = 1
    simd: bool = False
    accumulate: tuple[Span, ...] = ()     # parallel loops only


@dataclass(frozen=True)
class If:
    conds: tuple[IExpr, ...]        # all >= 0
    then: tuple["Stmt", ...]
    else_: tuple["Stmt", ...] = ()


@dataclass(frozen=True)
class Switch:
    value: IExpr
    cases: tuple[tuple[int, tuple["Stmt", ...]], ...]     # no case matches: nothing runs


@dataclass(frozen=True)
class Check:
    value: str
    size: int
    param: int                      # position in the kernel's params, -1 for a local
    dim: int


@dataclass(frozen=True)
class Buffer:
    name: str
    dtype: DType
    size: int                       # elements (a parameter's: 0, the caller's)
    placement: str = "param"
    space: str = "global"
    init: str = ""
    param: int = -1
    writable: bool = True
    label: str = ""                 # what it holds, for comments


@dataclass(frozen=True)
class Alloc:
    buffers: tuple[Buffer, ...]
    body: tuple["Stmt", ...]


KEPT_HEADER = 64     # bytes of a kept state before its copy: whether the block is filled
KEPT_CHUNK = 1 << 20  # bytes of a kept block's source a thread compares at a time


def kept_state(source: DType, count: int, dtype: DType) -> int:
    """Elements of `dtype` a `Kept` state takes: the header and a copy of `count`
    elements of `source`."""
    nbytes = KEPT_HEADER + count * source.numpy.itemsize
    return -(-nbytes // dtype.numpy.itemsize)


@dataclass(frozen=True)
class Kept:
    buffer: str
    state: int                      # the element of `buffer` where its kept state starts
    source: str
    offset: Affine
    count: int
    body: tuple["Stmt", ...]
    threads: bool = False           # compared with the copy in threads, KEPT_CHUNK at a time


@dataclass(frozen=True)
class Comment:
    text: str


@dataclass(frozen=True)
class Prefetch:
    buffer: str
    offset: Affine
    write: bool = False             # the line will be written (fetched for ownership)


@dataclass(frozen=True)
class Barrier:
    space: str = "shared"       # or "group", "global": see the module docstring


GROUP_BARRIERS = ("shared", "group")     # the spaces of barriers among a group's threads


@dataclass(frozen=True)
class WarpXor:
    name: str
    type: VType
    value: str
    mask: int
    place: Affine            # the thread's index in its group


@dataclass(frozen=True)
class Region:
    """One OpenMP parallel region (see the module docstring for what its body holds)."""

    body: tuple[Stmt, ...]


@dataclass(frozen=True)
class Single:
    """In a region: one of its threads runs the body."""

    body: tuple[Stmt, ...]


@dataclass(frozen=True)
class Instruction:
    name: str
    outputs: tuple[str, ...]
    inputs: tuple[str, ...]


Stmt = Union[Let, Var, Assign, Store, Loop, If, Switch, Check, Alloc, Kept, Comment, Prefetch,
             Barrier, WarpXor, Instruction, Region, Single, FragmentStore, Fence]


@dataclass(frozen=True)
class Kernel:
    name: str                       # the source function's
    params: tuple[Buffer, ...]
    locals: tuple[Buffer, ...]      # the top level's; they live for the whole call
    body: tuple[Stmt, ...]
