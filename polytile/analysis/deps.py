"""Which iteration indices each scalar of a leaf block depends on."""
from __future__ import annotations

from polytile.ir import nodes as N


def scalar_indices(block: N.Block) -> dict[str, frozenset[str]]:
    """For each scalar of a leaf block, the block indices its value depends on (through
    the views it loads from, data-dependent and flat offsets and index values)."""
    deps: dict[str, frozenset[str]] = {}
    refs = {r.into: r for r in block.refs}
    for s in block.stmts:
        if isinstance(s, N.Load):
            ref = refs[s.ref]
            names = {n for a in ref.access for n in a.names}
            names |= {n for d in s.dynamic if d for n in deps[d]}
            if s.offset is not None:
                names |= deps[s.offset]
            deps[s.into] = frozenset(names)
        elif isinstance(s, N.LoadIndex):
            deps[s.into] = frozenset(s.value.names)
        elif isinstance(s, N.Constant):
            deps[s.into] = frozenset()
        elif isinstance(s, N.Intrinsic):
            deps[s.into] = frozenset().union(*(deps[a] for a in s.inputs))
    return deps
