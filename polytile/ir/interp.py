"""Run IR on NumPy arrays: the meaning of the IR, and the oracle every pass is tested with.

    run(fn, {"A": a, "B": b, "C": c})      # c (an out buffer) is updated in place

A block runs all its iterations at once: each is one point of a batch, every
statement is one NumPy operation over the points (loads and stores are fancy
indexing into flat storage) and aggregations use `np.<op>.at`, so that several
points may combine into one element. The points are the product of the parent's
points and the block's own index ranges, so index values and addresses are
affine combinations of small broadcast ranges; constraints drop points. A nested
block thus runs once per statement of its parent, over all parent iterations at
once. This equals running iterations one after another because verified IR has
no dependence between iterations except through the aggregation
(`polytile.ir.verify`). Large iteration spaces are cut into chunks, which is
equivalent for the same reason.

Memory: every parameter and allocation is a flat array; a view is, per row, the
flat offset of its origin plus its strides (a child's origin is its parent's plus
the access offsets times the parent's strides). Local (`none`) buffers are private
to each iteration of their block and start as NaN (floats) or 0 (other types),
so a float result that reads one before writing it shows NaN.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from polytile.errors import ArgumentError, IRError, KernelError, UnsupportedError
from polytile.ir import intrinsics
from polytile.ir.nodes import (
    Affine,
    Block,
    Constant,
    Dim,
    Function,
    Intrinsic,
    Load,
    LoadIndex,
    Refinement,
    Special,
    Store,
)

# Points per batch, and elements of local buffers per batch: bounds on memory, large
# enough that NumPy, not Python, dominates the run time.
CHUNK_POINTS = 1 << 18
CHUNK_LOCAL_ELEMENTS = 1 << 22

_AGGREGATE: Mapping[str, np.ufunc] = {"add": np.add, "mul": np.multiply,
                                      "min": np.minimum, "max": np.maximum}


@dataclass(frozen=True)
class _View:
    """A refinement as seen by each point of a batch."""

    storage: np.ndarray          # flat storage of the parameter or allocation
    base: np.ndarray             # int64 per point: flat offset of the view's origin
    dims: tuple[Dim, ...]
    buffer: str                  # the parameter or allocation it views, for messages
    agg: str

    def elements(self) -> np.ndarray:
        """Flat offsets of every element, (points, elements), in row-major element order."""
        return self.base[:, None] + _layout(self.dims)[0].reshape(1, -1)


@dataclass(frozen=True)
class _Grid:
    """The points of one chunk of a block: a product of axes (the parent's points, then
    the block's own index ranges), keeping the flat positions `keep` that satisfy the
    constraints (None: all)."""

    shape: tuple[int, ...]
    terms: Mapping[str, tuple[int, np.ndarray]]   # index -> (axis, values shaped for it)
    keep: np.ndarray | None

    @property
    def count(self) -> int:
        return math.prod(self.shape) if self.keep is None else len(self.keep)

    def evaluate(self, a: Affine, extra: np.ndarray | int = 0) -> np.ndarray:
        """`a` (plus `extra`, broadcast along the axes) at every point, as int64."""
        total: np.ndarray | int = extra + a.const
        # Outer axes first, so partial sums stay small until the last term.
        for name, coeff in sorted(a.terms, key=lambda t: self.terms[t[0]][0]):
            total = total + coeff * self.terms[name][1]
        flat = np.broadcast_to(np.asarray(total, np.int64), self.shape).reshape(-1)
        return flat if self.keep is None else flat[self.keep]


@dataclass(frozen=True)
class _Batch:
    """A batch of iterations of one block: its points and the views they see."""

    grid: _Grid
    views: Mapping[str, _View]

    @property
    def count(self) -> int:
        return self.grid.count


def run(fn: Function, buffers: Mapping[str, np.ndarray]) -> None:
    """Execute `fn` on `buffers` (by top-level refinement name; scalars as 0-d arrays).

    `out`/`inout` arrays are updated in place, and only when the run succeeds.
    """
    layouts = bind(fn, buffers)
    views = {name: view for name, (view, _) in layouts.items()}
    caller = _Batch(_Grid((1,), {}, None), views)
    _run_block(fn.body, caller, fn.body.name)
    for ref in fn.body.refs:
        if ref.into in layouts and ref.dir in ("out", "inout"):
            view, offsets = layouts[ref.into]
            buffers[ref.into][...] = view.storage[offsets].reshape(buffers[ref.into].shape)


def bind(fn: Function, buffers: Mapping[str, np.ndarray]
          ) -> dict[str, tuple[_View, np.ndarray]]:
    """A flat copy of each argument laid out by its refinement's strides, and the flat
    offset of each of its elements."""
    params = {r.into: r for r in fn.body.refs if not r.from_ and r.dir != "none"}
    unknown = sorted(set(buffers) - set(params))
    if unknown:
        raise ArgumentError(f"{fn.name} has no parameter {', '.join(unknown)}",
                            hint=f"parameters: {', '.join(fn.params)}")
    bound = {}
    for name, ref in params.items():
        array = buffers.get(name)
        if not isinstance(array, np.ndarray):
            raise ArgumentError(f"{fn.name}: parameter {name} needs a NumPy array, got "
                                f"{type(array).__name__}")
        want = ref.shape
        if not merges_into(array.shape, want.sizes) or array.dtype != want.dtype.numpy:
            raise ArgumentError(f"{fn.name}: parameter {name} is {array.dtype}{array.shape}, "
                                f"expected {want.dtype}{want.sizes}")
        array = array.reshape(want.sizes)
        offsets, low, span = _layout(want.dims)
        storage = np.zeros(span, want.dtype.numpy)
        storage[offsets - low] = array
        view = _View(storage, np.array([-low], np.int64), want.dims, name, ref.agg)
        bound[name] = (view, offsets - low)
    return bound


def merges_into(shape: tuple[int, ...], sizes: tuple[int, ...]) -> bool:
    """Whether `sizes` is `shape` with runs of adjacent dimensions merged into one, their
    product: a C-contiguous array of `shape` read as `sizes` (a parameter whose dimensions
    pass collapse merged) holds the same elements in the same order."""
    if math.prod(shape) != math.prod(sizes):
        return False
    prefixes = set(itertools.accumulate(shape, lambda a, b: a * b))
    return all(p in prefixes for p in itertools.accumulate(sizes, lambda a, b: a * b))


def _layout(dims: tuple[Dim, ...]) -> tuple[np.ndarray, int, int]:
    """Offsets of every element (shaped like the tensor), the lowest, and the span."""
    offsets = np.zeros((), np.int64)
    for d in dims:
        offsets = offsets[..., None] + np.arange(d.size, dtype=np.int64) * d.stride
    if offsets.size == 0:
        return offsets, 0, 0
    low = int(offsets.min())
    return offsets, low, int(offsets.max()) - low + 1


# ---------------------------------------------------------------- blocks

def _run_block(block: Block, outer: _Batch, path: str) -> None:
    box = tuple(i.range for i in block.idxs if i.affine is None)
    local = sum(_layout(r.shape.dims)[2] for r in block.refs if not r.from_ and r.dir == "none")
    limit = max(1, min(CHUNK_POINTS, CHUNK_LOCAL_ELEMENTS // max(1, local)))
    passed = {i.name: outer.grid.evaluate(i.affine) for i in block.idxs if i.affine is not None}
    for axes in _chunks((outer.count,) + box, limit):
        grid = _grid(block, axes, passed)
        if grid.count:
            views = {r.into: _refine(r, outer, axes[0], grid, path) for r in block.refs}
            _execute(block, _Batch(grid, views), path)


def _chunks(shape: tuple[int, ...], limit: int) -> Iterator[tuple[np.ndarray, ...]]:
    """Sub-grids of at most `limit` points covering `shape`, as the values along each
    axis: the innermost axes whole, one axis sliced, the outer ones a value at a time."""
    split, inner = len(shape), 1
    while split > 0 and inner * shape[split - 1] <= limit:
        split -= 1
        inner *= shape[split]
    whole = tuple(np.arange(n, dtype=np.int64) for n in shape[split:])
    if split == 0:
        if inner:
            yield whole
        return
    width = max(1, limit // max(1, inner))
    for prefix in itertools.product(*(range(n) for n in shape[:split - 1])):
        for start in range(0, shape[split - 1], width):
            sliced = np.arange(start, min(start + width, shape[split - 1]), dtype=np.int64)
            yield tuple(np.array([v], np.int64) for v in prefix) + (sliced,) + whole


def _grid(block: Block, axes: tuple[np.ndarray, ...], passed: Mapping[str, np.ndarray]
          ) -> _Grid:
    shape = tuple(len(a) for a in axes)

    def along(axis: int, values: np.ndarray) -> np.ndarray:
        return values.reshape(tuple(-1 if k == axis else 1 for k in range(len(shape))))

    own = iter(range(1, len(axes)))
    terms = {}
    for i in block.idxs:
        if i.affine is None:
            axis = next(own)
            terms[i.name] = (axis, along(axis, axes[axis]))
        else:
            terms[i.name] = (0, along(0, passed[i.name][axes[0]]))
    grid = _Grid(shape, terms, None)
    if block.constraints:
        inside = np.logical_and.reduce([grid.evaluate(c) >= 0 for c in block.constraints])
        grid = _Grid(shape, terms, np.flatnonzero(inside))
    return grid


def _refine(ref: Refinement, outer: _Batch, parent_points: np.ndarray, grid: _Grid,
            path: str) -> _View:
    if not ref.from_ and ref.dir == "none":
        _, low, span = _layout(ref.shape.dims)
        fill = np.nan if ref.shape.dtype.is_float else 0
        storage = np.full(grid.count * span, fill, ref.shape.dtype.numpy)
        base = np.arange(grid.count, dtype=np.int64) * span - low
        return _View(storage, base, ref.shape.dims, ref.into, ref.agg)
    parent = outer.views.get(ref.from_ or ref.into)
    if parent is None:
        raise IRError(f"block {path}: refinement {ref.into} views {ref.from_ or ref.into}, "
                      "which the parent does not have", hint="run polytile.ir.verify first")
    offset = Affine()
    for a, dim in zip(ref.access, parent.dims):
        offset = offset + a.scale(dim.stride)
    origin = parent.base[parent_points].reshape((-1,) + (1,) * (len(grid.shape) - 1))
    return _View(parent.storage, grid.evaluate(offset, origin), ref.shape.dims, parent.buffer,
                 ref.agg)


# ---------------------------------------------------------------- statements

def _execute(block: Block, batch: _Batch, path: str) -> None:
    scalars: dict[str, np.ndarray] = {}
    for stmt in block.stmts:
        if isinstance(stmt, Block):
            _run_block(stmt, batch, f"{path}/{stmt.name}")
        elif isinstance(stmt, Load):
            scalars[stmt.into] = _load(stmt, batch, scalars, path)
        elif isinstance(stmt, Store):
            view = batch.views[stmt.ref]
            address = _address(view, stmt.dynamic, batch, scalars, stmt.ref, path)
            _write(view, address, scalars[stmt.value])
        elif isinstance(stmt, LoadIndex):
            scalars[stmt.into] = batch.grid.evaluate(stmt.value)
        elif isinstance(stmt, Constant):
            scalars[stmt.into] = np.asarray(stmt.value, stmt.dtype.numpy)
        elif isinstance(stmt, Intrinsic):
            args = [scalars[name] for name in stmt.inputs]
            scalars[stmt.into] = intrinsics.evaluate(stmt.op, stmt.dtype, *args)
        elif isinstance(stmt, Special):
            run_special = _SPECIALS.get(stmt.name)
            if run_special is None:
                raise UnsupportedError(f"block {path}: the interpreter has no special "
                                       f"{stmt.name!r}", hint=f"known: {', '.join(_SPECIALS)}")
            run_special(stmt, batch, path)


def _load(stmt: Load, batch: _Batch, scalars: Mapping[str, np.ndarray], path: str) -> np.ndarray:
    view = batch.views[stmt.ref]
    address = _address(view, stmt.dynamic, batch, scalars, stmt.ref, path)
    if stmt.offset is not None:
        address = address + _flat_offset(stmt, view, scalars[stmt.offset], batch.count, path)
    return view.storage[address]


def _address(view: _View, dynamic: tuple[str | None, ...], batch: _Batch,
             scalars: Mapping[str, np.ndarray], ref: str, path: str) -> np.ndarray:
    """The view's origin plus checked data-dependent offsets, per point."""
    address = view.base
    for d, (name, dim) in enumerate(zip(dynamic, view.dims)):
        if name is None:
            continue
        offset = np.broadcast_to(np.asarray(scalars[name]).astype(np.int64), (batch.count,))
        bad = np.flatnonzero((offset < 0) | (offset >= dim.size))
        if len(bad):
            raise KernelError(
                f"index {offset[bad[0]]} is out of range [0, {dim.size}) in dimension {d} of "
                f"{view.buffer} (through {ref} with offset {name} in block {path})",
                hint="the indices come from data; check the index tensor's values")
        address = address + offset * dim.stride
    return address


def _flat_offset(stmt: Load, view: _View, value: np.ndarray, count: int, path: str
                 ) -> np.ndarray:
    """A load's pointer increment, per point. Its producer (a table built by
    polytile.passes.ptrinc) guarantees it stays inside the view; one that does not is
    a compiler bug, reported as such rather than read out of bounds."""
    offset = np.broadcast_to(np.asarray(value).astype(np.int64), (count,))
    low = sum(min(0, (d.size - 1) * d.stride) for d in view.dims)
    high = sum(max(0, (d.size - 1) * d.stride) for d in view.dims)
    bad = np.flatnonzero((offset < low) | (offset > high))
    if len(bad):
        raise IRError(f"block {path}: offset {offset[bad[0]]} of a load from {stmt.ref} "
                      f"(through {stmt.offset}) leaves the view, whose elements lie at "
                      f"offsets {low}..{high} of {view.buffer}",
                      hint="a pointer-increment table must only hold offsets inside the view")
    return offset


def _write(view: _View, address: np.ndarray, values: np.ndarray) -> None:
    values = np.broadcast_to(np.asarray(values).astype(view.storage.dtype, copy=False),
                             address.shape)
    if view.agg == "assign":
        view.storage[address] = values
        return
    with np.errstate(all="ignore"):     # NaN and overflow follow NumPy, as in C
        _AGGREGATE[view.agg].at(view.storage, address, values)


def _zero(stmt: Special, batch: _Batch, path: str) -> None:
    for name in stmt.outputs:
        view = batch.views[name]
        _write(view, view.elements(), np.zeros((), view.storage.dtype))


def _copy(stmt: Special, batch: _Batch, path: str) -> None:
    """copy(src) -> (dst): element-wise copy between views of the same sizes."""
    if len(stmt.inputs) != 1 or len(stmt.outputs) != 1:
        raise IRError(f"block {path}: special copy takes one input and one output")
    src, dst = batch.views[stmt.inputs[0]], batch.views[stmt.outputs[0]]
    if [d.size for d in src.dims] != [d.size for d in dst.dims]:
        raise IRError(f"block {path}: copy from {stmt.inputs[0]} to {stmt.outputs[0]} "
                      "between views of different sizes")
    _write(dst, dst.elements(), src.storage[src.elements()])


_SPECIALS: Mapping[str, Callable[[Special, _Batch, str], None]] = {"zero": _zero, "copy": _copy}
