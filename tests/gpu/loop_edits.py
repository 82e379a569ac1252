"""Edits and walks of loop IR for the GPU tests: a kernel with its barriers taken out, to
show that a test's result depends on them, and the statements every work-item reaches."""
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


def uniform_count(stmts: tuple[L.Stmt, ...], kind: type, guarded: bool = False) -> int:
    """The statements of class `kind` (barriers, warp shuffles) under `stmts`, asserting
    that none is under a condition or in a serial loop, where work-items could differ."""
    found = 0
    for st in stmts:
        if isinstance(st, kind):
            assert not guarded, f"a {kind.__name__} under a condition"
            found += 1
        elif isinstance(st, L.If):
            found += uniform_count(st.then + st.else_, kind, True)
        elif isinstance(st, L.Loop):
            found += uniform_count(st.body, kind, guarded or st.kind == "serial")
        elif isinstance(st, L.Alloc):
            found += uniform_count(st.body, kind, guarded)
    return found
