"""Edits of loop IR for the GPU tests: a kernel with its barriers taken out, to show that
a test's result depends on them."""
from __future__ import annotations

import dataclasses

from polytile.loops import nodes as L


def without_barriers(stmts: tuple[L.Stmt, ...]) -> tuple[L.Stmt, ...]:
    """`stmts` with every Barrier removed, inside loops, allocations and branches too."""
    kept: list[L.Stmt] = []
    for st in stmts:
        if isinstance(st, L.Barrier):
            continue
        if isinstance(st, (L.Loop, L.Alloc)):
            st = dataclasses.replace(st, body=without_barriers(st.body))
        elif isinstance(st, L.If):
            st = dataclasses.replace(st, then=without_barriers(st.then),
                                     else_=without_barriers(st.else_))
        kept.append(st)
    return tuple(kept)
