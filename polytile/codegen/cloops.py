"""A block's iteration space as C loops: index values, loop bounds and guards.

Every index with range > 1 becomes a loop variable. A constraint `a >= 0` that
involves loop variables of the block is folded into the bounds of the innermost
of them (solving for it; the others are already fixed there), so no iteration
runs that the constraint excludes and no `if` is needed inside the loops. A
constraint over passed-in indices only becomes a guard around the whole block.

    [io (passed), ii:4]  with  12 - 4*io - ii >= 0
      ->  for (int64_t i1 = 0; i1 < pt_min_i64(4, 13 - 4*i0); i1++)
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from polytile.codegen.cexpr import Needs
from polytile.codegen.cscope import c_affine, resolve
from polytile.errors import IRError
from polytile.ir.nodes import Affine, Block


@dataclass
class IterationSpace:
    idx: dict[str, Affine]          # IR index -> value over C variables
    loops: list[str]                # C loop variables, outermost first
    bounds: LoopBounds
    guards: list[Affine]            # each >= 0, over enclosing loop variables


def iteration_space(blk: Block, parent_idx: Mapping[str, Affine], fresh: Callable[[], str],
                    needs: Needs) -> IterationSpace | str:
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
    bounds = LoopBounds(ranges, needs)
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

    def __init__(self, loops: list[tuple[str, int]], needs: Needs):
        self.order = [v for v, _ in loops]
        self.lo: dict[str, tuple[int, list[str]]] = {v: (0, []) for v, _ in loops}
        self.hi: dict[str, tuple[int, list[str]]] = {v: (r, []) for v, r in loops}
        self.needs = needs

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
                self.lo[var] = (const, [*exprs, self._div(rest.scale(-1), c, ceil=True)])
        else:                                  # var < floor(rest / -c) + 1
            const, exprs = self.hi[var]
            if not rest.terms:
                self.hi[var] = (min(const, rest.const // -c + 1), exprs)
            else:
                self.hi[var] = (const, [*exprs, self._div(rest, -c, ceil=False, plus=1)])
        return True

    def _div(self, a: Affine, m: int, ceil: bool, plus: int = 0) -> str:
        if m == 1:
            return c_affine(a + plus)
        self.needs.use("bounds")
        call = f"pt_{'ceil' if ceil else 'floor'}div_i64({c_affine(a)}, {m})"
        return f"{call} + {plus}" if plus else call

    def range_of(self, var: str) -> tuple[str, str]:
        """C expressions for the first value and the end (exclusive) of loop `var`."""
        return (self._combine(*self.lo[var], "max"), self._combine(*self.hi[var], "min"))

    def _combine(self, const: int, exprs: list[str], pick: str) -> str:
        result = str(const)
        for expr in exprs:
            self.needs.use("bounds")
            result = f"pt_{pick}_i64({result}, {expr})"
        return result
