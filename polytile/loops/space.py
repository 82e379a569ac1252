"""A block's iteration space as loops: index values, loop bounds and guards.

Every index with range > 1 becomes a loop variable. A constraint `a >= 0` that
involves loop variables of the block is folded into the bounds of the innermost
of them (solving for it; the others are already fixed there), so no iteration
runs that the constraint excludes and no `If` is needed inside the loops. A
constraint over passed-in indices only becomes a guard around the whole block.

    [io (passed), ii:4]  with  12 - 4*io - ii >= 0
      ->  for i1 in [0, min(4, 13 - 4*i0))
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from polytile.errors import IRError
from polytile.ir.nodes import Affine, Block
from polytile.loops.nodes import IDiv, IExpr, IMax, IMin
from polytile.loops.views import resolve


@dataclass
class IterationSpace:
    idx: dict[str, Affine]          # IR index -> value over loop names
    loops: list[str]                # loop variables, outermost first
    bounds: LoopBounds
    guards: list[Affine]            # each >= 0, over enclosing loop variables


def iteration_space(blk: Block, parent_idx: Mapping[str, Affine], fresh: Callable[[], str]
                    ) -> IterationSpace | str:
    """The loops of `blk`, or why it runs no iteration at all."""
    idx: dict[str, Affine] = {}
    ranges: list[tuple[str, int]] = []
    for ix in blk.idxs:
        if ix.affine is not None:
            if ix.range != 1:
                raise IRError(f"passed index {ix.name!r} of block {blk.name!r} has range "
                              f"{ix.range}, not 1")
            idx[ix.name] = resolve(ix.affine, parent_idx, f"passed index {ix.name!r}")
        elif ix.range <= 0:
            return "an index has range 0"
        elif ix.range == 1:
            idx[ix.name] = Affine.constant(0)
        else:
            var = fresh()
            idx[ix.name] = Affine.index(var)
            ranges.append((var, ix.range))
    bounds = LoopBounds(ranges)
    guards: list[Affine] = []
    for constraint in blk.constraints:
        a = resolve(constraint, idx, f"a constraint of block {blk.name!r}")
        if bounds.fold(a):
            continue
        if not a.terms and a.const < 0:
            return "a constraint never holds"
        if a.terms:
            guards.append(a)
    return IterationSpace(idx, [v for v, _ in ranges], bounds, guards)


class LoopBounds:
    """Loop ranges, narrowed by the constraints folded into them."""

    def __init__(self, loops: list[tuple[str, int]]):
        self.order = [v for v, _ in loops]
        self.lo: dict[str, tuple[int, list[IExpr]]] = {v: (0, []) for v, _ in loops}
        self.hi: dict[str, tuple[int, list[IExpr]]] = {v: (r, []) for v, r in loops}

    def fold(self, a: Affine) -> bool:
        """Fold `a >= 0` into the bounds of its innermost loop variable; False if it has none."""
        own = [v for v in self.order if a.coeff(v)]
        if not own:
            return False
        var = own[-1]
        c = a.coeff(var)
        rest = a + Affine(((var, -c),), 0)    # c*var + rest >= 0
        if c > 0:                              # var >= ceil(-rest / c)
            const, exprs = self.lo[var]
            if not rest.terms:
                self.lo[var] = (max(const, -(rest.const // c)), exprs)
            else:
                neg = rest.scale(-1)
                self.lo[var] = (const, [*exprs, neg if c == 1 else IDiv(neg, c, ceil=True)])
        else:                                  # var < floor(rest / -c) + 1
            const, exprs = self.hi[var]
            if not rest.terms:
                self.hi[var] = (min(const, rest.const // -c + 1), exprs)
            else:
                m = -c
                self.hi[var] = (const, [*exprs, rest + 1 if m == 1 else IDiv(rest + m, m)])
        return True

    def range_of(self, var: str) -> tuple[IExpr, IExpr]:
        """The first value and the end (exclusive) of loop `var`."""
        lo, los = self.lo[var]
        hi, his = self.hi[var]
        return (IMax((Affine.constant(lo), *los)) if los else Affine.constant(lo),
                IMin((Affine.constant(hi), *his)) if his else Affine.constant(hi))
