"""Whether the blocks after a block's first statement read only final values of it.

A block `P` whose statements are a block `W` and then blocks `R...` (pass `sink` puts a
copy of what `W` wrote into `P` this way, so that it reads each chunk while it is in
cache) computes what `P` then `R` computed before when, in every iteration of `P`:

* every element `R` reads of a view that `W` writes, `W` writes in the same iteration
  of `P` (so it was written before `R` reads it), and no other iteration of `P` writes
  it (so it is final when `R` reads it);
* `R` writes no view that `W` touches (a later iteration of `W` would see it) and does
  not write what it reads, except that it may update in place elements `W` wrote in the
  same iteration (and does not read): an epilogue (pass epilogue).

`final_reads(scope)` answers for scope's block with isl (polytile.ir.polyhedra), exactly;
pass `sink` asks it of each block it makes, and `analysis.fold` of a contraction level
that ends with such readers.
"""
from __future__ import annotations

from dataclasses import replace

from polytile.ir.nodes import Block
from polytile.ir.polyhedra import (
    READ,
    WRITE,
    Scope,
    element_vars,
    footprint,
    to_set,
    writes_disjoint,
)


def final_reads(scope: Scope) -> str | None:
    """None when scope's block is `W` then readers `R...` as the module says, else why not."""
    block = scope.block
    if len(block.stmts) < 2 or not all(isinstance(st, Block) for st in block.stmts):
        return f"block {block.name} is not a block followed by blocks"
    writer, readers = block.stmts[0], block.stmts[1:]
    assert isinstance(writer, Block)
    for ref in block.refs:
        rank = len(ref.shape.dims)
        free = scope.variables + element_vars(scope.depth, rank)
        written = footprint(only(scope, writer), ref.into, WRITE)
        read_by_writer = footprint(only(scope, writer), ref.into, READ)
        for reader in readers:
            assert isinstance(reader, Block)
            mine = only(scope, reader)
            writes, reads = footprint(mine, ref.into, WRITE), footprint(mine, ref.into, READ)
            if writes and (written or read_by_writer):
                # an update in place of what the writer wrote (pass epilogue)
                if read_by_writer or not to_set(free, [writes]).is_subset(
                        to_set(free, [written])):
                    return (f"block {reader.name} writes elements of {ref.into} that "
                            f"{writer.name} reads or does not write in the same iteration")
            elif writes and reads:
                return f"block {reader.name} reads and writes {ref.into}"
            if not reads or not written:
                continue
            if not to_set(free, [reads]).is_subset(to_set(free, [written])):
                return (f"block {reader.name} reads elements of {ref.into} that {writer.name} "
                        "does not write in the same iteration")
        if written and any(isinstance(r, Block) and footprint(only(scope, r), ref.into, READ)
                           for r in readers):
            alone = replace(block, stmts=(writer,))
            for index in block.idxs:
                if index.affine is None and not writes_disjoint(alone, index.name):
                    return (f"two iterations of {block.name} write the same element of "
                            f"{ref.into} (along {index.name})")
    return None


def only(scope: Scope, st: Block) -> Scope:
    """Scope's block with `st` as its only statement (the footprints of `st` alone)."""
    return replace(scope, block=replace(scope.block, stmts=(st,)))
