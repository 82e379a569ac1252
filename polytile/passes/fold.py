"""fold: a contraction's first writes replace the init block before it (BLAS's beta = 0).

`O(i) +=! A(i, k) * B(k)` is an init that fills O with zeros and a contraction that adds
into it. After autotile, the contraction's micro-kernel sums in registers across its
reduction loop and adds the sums into O; where its outer reduction indices are 0 it can
store them instead. The init then runs nowhere, and O is written once instead of being
zeroed, read back and written again:

    block s0_init [...] #init ...                  ->  ... schedule(..., folded(s0))
    block s0 [i0_c:8, i1_c:11, i2_i3_c:2, i4_c:2] #contraction ...
      block s0_tile [...]
        block s0_tile_tile [..., i4:128, i4_c = i4_c] schedule(micro, vector(...), ...)
                                                   ->  schedule(..., first(i4_c))

`analysis.fold` proves each fold (the verifier proves it again); the IR keeps the init,
so the interpreter computes what it did. Zen 3, two threads, `benchmarks/option_ab.py`:
shift convolution (8 x 256 x 28 x 28, 256 filters; O is 6.4 MB) 8.78 -> 7.96 ms, group
convolution 11.35 -> 10.43 ms, tmm 1024^3 17.25 -> 16.68 ms. A tensorized block (pass
tensorize) folds too, `first()`: its register tiles start from 0 instead of reading the
output (AVX-512 VNNI Xeon, two threads: UNIT's Table I convolutions, whose tiles were also
copied into a stack buffer first, 1.25x -> 1.53x fbgemm's geomean; the u8 x s8 1024^3
matmul within noise, 493-524 against 510-519 GOP/s).
Runs last in the CPU pipelines, after autotile and reorder have fixed each micro-kernel's
loops.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from polytile.analysis.fold import fold as proof
from polytile.analysis.fold import with_leaf
from polytile.analysis.overwrite import touches
from polytile.ir import nodes as N
from polytile.ir.polyhedra import Scope
from polytile.passes.pipeline import flag, register
from polytile.targets.target import Target


def fold(fn: N.Function, target: Target, params: dict[str, Any]) -> N.Function:
    if not params.get("enabled", True):
        return fn
    return replace(fn, body=_block(Scope.root(fn.body)))


def _block(scope: Scope) -> N.Block:
    stmts = list(scope.block.stmts)
    for k, st in enumerate(stmts):
        if not isinstance(st, N.Block) or st.schedule.folded is not None or len(st.refs) != 1:
            continue
        buffer = st.refs[0].from_
        j = next((j for j in range(k + 1, len(stmts)) if touches(stmts[j], buffer)), None)
        if j is None:
            continue
        first = proof(scope, k, j)
        if isinstance(first, str):
            continue
        stmts[k] = replace(st, schedule=replace(st.schedule, folded=stmts[j].name))
        stmts[j] = _mark(stmts[j], first)
    block = replace(scope.block, stmts=tuple(stmts))
    return replace(block, stmts=tuple(_block(scope.child(st)) if isinstance(st, N.Block) else st
                                      for st in block.stmts))


def _mark(block: N.Block, first: tuple[str, ...]) -> N.Block:
    """`block` with the micro-kernel at the end of its chain scheduled `first(...)`."""
    return with_leaf(block, lambda leaf: replace(leaf, schedule=replace(leaf.schedule,
                                                                        first=first)))


register("fold", fold, enabled=flag)
