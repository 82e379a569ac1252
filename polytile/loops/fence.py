"""Store fences after streaming stores (`Store.stream`, decided by pass `stream`).

Streaming stores are weakly ordered: until a fence, another thread (or the caller, once
the kernel returns) may not see them. So every thread fences after its share of a
parallel loop that streams, before the barrier that lets the others go on, and a kernel
that streams anywhere fences before it returns. A fence waits until the thread's
streamed lines have reached memory: one per iteration of softmax's row loop made it 1.5x
slower (27.4 vs 17.2 ms on one thread, Zen 3 EPYC), so the parallel loop becomes a
region whose threads share the loop out and then fence once each:

    parallel for i0 in [0, N):              region:
      ...                             ->      workshare for i0 in [0, N):
      store stream b1[...] = v14                ...
                                                store stream b1[...] = v14
                                              fence
                                            fence

A parallel loop that accumulates into private copies (OpenMP reductions, which a
workshare loop without a wait cannot end with) fences at the end of each iteration
instead; a `Single` at its end; a workshare loop of a stitched region right after it.
"""
from __future__ import annotations

from dataclasses import replace

from polytile.loops import nodes as L


def fenced(kernel: L.Kernel) -> L.Kernel:
    """`kernel` with the fences its streaming stores need (itself when it has none)."""
    if not streams(kernel.body):
        return kernel
    return replace(kernel, body=(*_inside(kernel.body), L.Fence()))


def streams(stmts: tuple[L.Stmt, ...]) -> bool:
    """Whether any store in `stmts`, at any depth, is a streaming store."""
    return any(isinstance(s, L.Store) and s.stream
               or any(streams(body) for body in _bodies(s)) for s in stmts)


def _bodies(st: L.Stmt) -> tuple[tuple[L.Stmt, ...], ...]:
    if isinstance(st, (L.Loop, L.Alloc, L.Region, L.Single)):
        return (st.body,)
    if isinstance(st, L.If):
        return (st.then, st.else_)
    if isinstance(st, L.Switch):
        return tuple(body for _, body in st.cases)
    return ()


def _inside(stmts: tuple[L.Stmt, ...]) -> tuple[L.Stmt, ...]:
    out: list[L.Stmt] = []
    for st in stmts:
        if isinstance(st, L.Loop) and st.kind == "parallel" and streams(st.body):
            if st.accumulate:
                st = replace(st, body=(*st.body, L.Fence()))
            else:
                st = L.Region((replace(st, kind="workshare"), L.Fence()))
        elif isinstance(st, L.Loop) and st.kind == "workshare" and streams(st.body):
            out += [st, L.Fence()]
            continue
        elif isinstance(st, L.Single) and streams(st.body):
            st = replace(st, body=(*st.body, L.Fence()))
        elif isinstance(st, (L.Loop, L.Alloc, L.Region)):
            st = replace(st, body=_inside(st.body))
        elif isinstance(st, L.If):
            st = replace(st, then=_inside(st.then), else_=_inside(st.else_))
        elif isinstance(st, L.Switch):
            st = replace(st, cases=tuple((v, _inside(b)) for v, b in st.cases))
        out.append(st)
    return tuple(out)
