"""What the lowering knows at a point in the block tree: views, indices, scalars.

Index values and view origins are `Affine`s over *loop IR names* (the loop variables
`i0, i1, ...` of enclosing loops), so an address is a single folded flat offset such
as `13*i0 + i1` into one buffer however deeply the views are nested.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from polytile.dtypes import DType
from polytile.errors import IRError
from polytile.ir.nodes import Affine, Block, Dim, Refinement


@dataclass(frozen=True)
class View:
    """A refinement as seen by the loops."""

    ptr: str                              # the loop IR buffer (parameter or local)
    dtype: DType
    offset: Affine                        # element offset of the origin, over loop names
    dims: tuple[Dim, ...]
    coords: tuple[Affine, ...] | None     # origin per top-level dimension; None if ranks differ
    param: int                            # position in Function.params, -1 for a local buffer
    agg: str
    writable: bool
    label: str                            # sanitized source name, for comments only


@dataclass(frozen=True)
class Scope:
    idx: Mapping[str, Affine]               # IR index name -> value over loop names
    views: Mapping[str, View]               # IR buffer name -> view
    scalars: dict[str, tuple[str, DType]]   # IR scalar name -> (loop IR name, dtype); the
                                            # block body adds its own as it goes
    parallel: bool                          # inside a parallel loop


_NOT_WORD = re.compile(r"[^A-Za-z0-9_]")


def safe(name: str) -> str:
    """A source name reduced to [A-Za-z0-9_], so it cannot end or escape a C comment."""
    return _NOT_WORD.sub("_", name)[:64] or "_"


def resolve(a: Affine, idx: Mapping[str, Affine], where: str) -> Affine:
    """`a` over IR indices rewritten over loop names; a block sees only its own indices."""
    missing = [n for n in a.names if n not in idx]
    if missing:
        raise IRError(f"{where} uses index {missing[0]!r}, which is not an index of the block",
                      hint="a child block receives a parent's index as an index with an affine")
    return a.substitute(idx)


def fixed_indices(blk: Block, outer: Mapping[str, Affine]) -> dict[str, Affine]:
    """The indices of `blk` that do not loop: passed ones resolved in the holder's
    `outer` indices, and those of range 1 (always 0)."""
    idx: dict[str, Affine] = {}
    for ix in blk.idxs:
        if ix.affine is not None:
            idx[ix.name] = resolve(ix.affine, outer, f"passed index {ix.name!r}")
        elif ix.range == 1:
            idx[ix.name] = Affine.constant(0)
    return idx


def root_view(ref: Refinement, ptr: str, param: int) -> View:
    rank = len(ref.shape.dims)
    if ref.access and len(ref.access) != rank:
        raise IRError(f"top-level buffer {ref.into!r} has {len(ref.access)} offsets for "
                      f"{rank} dimensions")
    coords = ref.access or tuple(Affine.constant(0) for _ in range(rank))
    if any(c.terms for c in coords):
        raise IRError(f"top-level buffer {ref.into!r} has an offset that depends on an index")
    offset = sum((c.const * d.stride for c, d in zip(coords, ref.shape.dims)), 0)
    return View(ptr, ref.shape.dtype, Affine.constant(offset), ref.shape.dims, coords, param,
                ref.agg, ref.dir != "in", safe(ref.into))


def child_view(ref: Refinement, parent: View, idx: Mapping[str, Affine]) -> View:
    """The view `ref` of `parent`: origin = parent origin + sum(access_d * stride_d)."""
    name = ref.into
    if ref.shape.dtype != parent.dtype:
        raise IRError(f"refinement {name!r} is {ref.shape.dtype} but its buffer is "
                      f"{parent.dtype}")
    if len(ref.access) != len(parent.dims):
        raise IRError(f"refinement {name!r} has {len(ref.access)} offsets for a buffer with "
                      f"{len(parent.dims)} dimensions")
    access = tuple(resolve(a, idx, f"refinement {name!r}") for a in ref.access)
    offset = parent.offset
    for a, d in zip(access, parent.dims):
        offset = offset + a.scale(d.stride)
    coords = None
    if parent.coords is not None and len(ref.shape.dims) == len(parent.dims):
        coords = tuple(c + a for c, a in zip(parent.coords, access))
    return View(parent.ptr, parent.dtype, offset, ref.shape.dims, coords, parent.param,
                ref.agg, parent.writable and ref.dir != "in", safe(name))


def extent(dims: tuple[Dim, ...], name: str) -> int:
    """Elements a local buffer needs to hold every element of `dims`."""
    if any(d.stride < 0 for d in dims):
        raise IRError(f"local buffer {name!r} has a negative stride")
    if any(d.size <= 0 for d in dims):
        return 0
    return 1 + sum((d.size - 1) * d.stride for d in dims)


def writes_disjoint(var: str, varying: set[str], views: list[View]) -> bool:
    """True if iterations that differ in loop variable `var` (while the variables in
    `varying` take any values too) never write the same element of any of `views`.

    Sufficient condition, per written view: some dimension's origin is `k*var + g`
    where `g` does not vary and |k| is at least the view's size there, so the
    iterations' slices along that dimension cannot overlap. Relies on the
    verifier's rule that nested views stay inside their parent view.
    """
    for view in views:
        if not view.writable:
            continue
        if view.coords is None:
            return False
        if not any(_separates(c, d.size, var, varying) for c, d in zip(view.coords, view.dims)):
            return False
    return True


def _separates(coord: Affine, size: int, var: str, varying: set[str]) -> bool:
    k = coord.coeff(var)
    return k != 0 and abs(k) >= size and not any(n in varying for n in coord.names if n != var)
