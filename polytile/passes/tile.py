"""The tiling rewrite (Stripe §3.3): one block -> an outer block over tiles and an
inner block over the points of one tile.

    block s [i:100, k:64] (                     block s [i_t:4] #tiled (
      out C <- C[i] (1):add                       out C <- C[32*i_t] (32):add
      in A <- A[i, k] (1, 1)           ->         in A <- A[32*i_t, 0] (32, 64)
    ) { ... }                                   ) {
                                                  block s_tile [i:32, k:64, i_t = i_t] (
                                                    99 - 32*i_t - i >= 0      # overflow
                                                    out C <- C[i] (1):add
                                                    in A <- A[i, k] (1, 1)
                                                  ) { ... }
                                                }

A tile size that does not divide its range rounds the outer range up and adds
the overflow constraint (Stripe: "remove the overflow by adding a constraint").
Indices whose tile is the whole range stay only in the inner block.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from polytile.ir import nodes as N


def substitute_block(block: N.Block, values: Mapping[str, N.Affine]) -> N.Block:
    """Rewrite uses of the *parent's* indices inside `block` (passed-index affines),
    for when the parent's indices change."""
    idxs = tuple(replace(i, affine=i.affine.substitute(values)) if i.affine is not None else i
                 for i in block.idxs)
    return replace(block, idxs=idxs)


def substitute_local(stmts: tuple[N.Statement, ...], values: Mapping[str, N.Affine]
                      ) -> tuple[N.Statement, ...]:
    """Rewrite uses of a block's own indices by its statements (LoadIndex and the
    passed-index affines of child blocks)."""
    out: list[N.Statement] = []
    for s in stmts:
        if isinstance(s, N.LoadIndex):
            out.append(replace(s, value=s.value.substitute(values)))
        elif isinstance(s, N.Block):
            out.append(substitute_block(s, values))
        else:
            out.append(s)
    return tuple(out)


def tile(block: N.Block, sizes: Mapping[str, int], parent_sizes: Mapping[str, tuple[int, ...]],
         suffix: str = "_t", outer_tags: frozenset[str] = frozenset({"tiled"}),
         inner_tags: frozenset[str] | None = None) -> N.Block:
    """Tile `block` with `sizes` (index -> tile size; missing indices are not tiled).

    `parent_sizes` gives the extents of the views `block` refines (by `from_` name): a
    dimension that a non-dividing tile would overflow keeps the parent's whole extent,
    and the overflow constraint keeps every access inside it.
    """
    loops = [i for i in block.idxs if i.affine is None]
    passed = [i for i in block.idxs if i.affine is not None]
    tiled = {i.name: min(sizes[i.name], i.range) for i in loops
             if i.name in sizes and sizes[i.name] < i.range}
    if not tiled:
        return block
    outer_name = {n: n + suffix for n in tiled}
    # A tile can run past the data when it does not divide the range, or when an
    # existing constraint (e.g. an outer tile's overflow) cuts the range short.
    constrained = {k for c in block.constraints for k in c.names}
    overflowing = {n for n, t in tiled.items()
                   if next(i.range for i in loops if i.name == n) % t or n in constrained}
    # i = t*i_t + i  (the inner i now ranges over one tile)
    split = {n: N.Affine.of({outer_name[n]: t, n: 1}) for n, t in tiled.items()}
    inner_range = {i.name: tiled.get(i.name, i.range) for i in loops}

    outer_refs, inner_refs = [], []
    for ref in block.refs:
        origin, rel, dims = [], [], []
        for d, (acc, dim) in enumerate(zip(ref.access, ref.shape.dims)):
            full = acc.substitute(split)
            if (overflowing | constrained) & set(acc.names):
                origin.append(N.Affine())
                rel.append(full)
                dims.append(N.Dim(parent_sizes[ref.from_][d], dim.stride))
                continue
            # Tile indices and indices passed from above are fixed within one tile.
            outer_part = N.Affine.of({k: v for k, v in full.terms if k not in inner_range},
                                     full.const)
            inner_part = N.Affine.of({k: v for k, v in full.terms if k in inner_range})
            # The view starts at the smallest element the tile touches.
            low = sum(c * (inner_range[k] - 1) for k, c in inner_part.terms if c < 0)
            extent = sum(abs(c) * (inner_range[k] - 1) for k, c in inner_part.terms) + dim.size
            origin.append(outer_part + low)
            rel.append(inner_part - low)
            dims.append(N.Dim(extent, dim.stride))
        outer_refs.append(replace(ref, access=tuple(origin),
                                  shape=N.TensorShape(ref.shape.dtype, tuple(dims))))
        inner_refs.append(replace(ref, from_=ref.into, access=tuple(rel)))

    constraints = [c.substitute(split) for c in block.constraints]
    for n, t in tiled.items():
        full_range = next(i.range for i in loops if i.name == n)
        if full_range % t:
            constraints.append(N.Affine.constant(full_range - 1) - split[n])
    inner_idxs = tuple(N.Index(i.name, inner_range[i.name]) for i in loops)
    inner_idxs += tuple(N.Index(outer_name[n], 1, N.Affine.index(outer_name[n])) for n in tiled)
    # Indices the original block received from its parent pass through the outer block.
    inner_idxs += tuple(N.Index(p.name, 1, N.Affine.index(p.name)) for p in passed)
    inner = N.Block(block.name + "_tile", inner_idxs, tuple(constraints), tuple(inner_refs),
                    substitute_local(block.stmts, split),
                    block.tags if inner_tags is None else inner_tags,
                    schedule=block.schedule)    # the tile's iterations run as the block's did
    outer_idxs = tuple(N.Index(outer_name[i.name], -(-i.range // tiled[i.name]))
                       for i in loops if i.name in tiled) + tuple(passed)
    return N.Block(block.name, outer_idxs, (), tuple(outer_refs), (inner,),
                   block.tags | outer_tags)
