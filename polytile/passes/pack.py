"""pack: copy an operand into a layout the micro-kernel can stream (the CPU analogue
of TC's shared-memory promotion, §5.5).

A contraction vectorizes best along a parallel index that is unit-stride in its
output (outer-product micro-kernels: broadcast one operand, vector-load the
other). When an input uses that index with a non-unit stride (tmm's B(n, k):
n has stride K), and the input is reused across another parallel index (every
row m of A reads all of B), the input is copied once into a buffer where that
index is innermost, and the kernel reads the copy:

    block s0 [m:M, n:N, k:K] (                       block pack_p1 [a0:N, a1:K] #pack (
      out o0[m, n]:add                                 in p1 <- p1[a0, a1]
      in p0[m, k]                          ->          out p1_packed <- p1_packed[a1, a0] )
      in p1[n, k] )                                  block s0 [m:M, n:N, k:K] (
                                                       ... in p1 <- p1_packed[k, n] (stride 1 in n) )

Reuse pays when the operand is read at least `min_reuse` times per element; the
copy pays when the reduction is short (at most `max_reduction` steps), where a
dot-product kernel would spend much of its time in horizontal sums.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from polytile.ir import nodes as N
from polytile.ir.lower import contiguous
from polytile.passes.pipeline import PASSES
from polytile.passes.schedule import _is_parallel
from polytile.targets.target import Target


def _unit(ref: N.Refinement, index: str) -> int | None:
    """The dimension in which `index` appears alone with coefficient 1, if exactly one."""
    dims = [d for d, a in enumerate(ref.access) if a.coeff(index)]
    if len(dims) != 1 or ref.access[dims[0]] != N.Affine.index(index):
        return None
    return dims[0]


def _plan(block: N.Block, top: dict[str, N.Refinement], lanes: int, min_reuse: int,
          max_reduction: int) -> tuple[str, list[tuple[N.Refinement, int]]] | None:
    """(vector index, [(input ref, dimension to make innermost)]) or None."""
    outs = [r for r in block.refs if r.dir in ("out", "inout")]
    if len(outs) != 1 or any(isinstance(s, N.Block) for s in block.stmts):
        return None
    if any(isinstance(s, N.Load) and s.dynamic for s in block.stmts):
        return None
    ranges = {i.name: i.range for i in block.idxs if i.affine is None}
    out = outs[0]
    if not out.shape.dims or out.shape.dims[-1].stride != 1:
        return None
    reduction = math.prod(r for n, r in ranges.items() if not _is_parallel(block, n))
    if reduction > max_reduction:
        return None     # long reductions amortize a dot-product kernel's horizontal sums
    v = next((n for n in ranges if _unit(out, n) == len(out.access) - 1), None)
    if v is None or ranges[v] < lanes or not _is_parallel(block, v):
        return None
    packs = []
    for ref in block.refs:
        if ref.dir != "in" or not any(a.coeff(v) for a in ref.access):
            continue
        d = _unit(ref, v)
        if d is None or ref.from_ not in top:
            return None
        if ref.shape.dims[d].stride == 1:
            continue
        if any(len(a.terms) > 1 or a.const for a in ref.access):
            return None          # only plain index subscripts are repacked
        used = {n for a in ref.access for n in a.names}
        reuse = math.prod(r for n, r in ranges.items() if n not in used)
        if reuse < min_reuse:
            return None
        packs.append((ref, d))
    return (v, packs) if packs else None


def pack(fn: N.Function, target: Target, params: dict[str, Any]) -> N.Function:
    if not params.get("enabled", True):
        return fn
    min_reuse = int(params.get("min_reuse", 4))
    max_reduction = int(params.get("max_reduction", 256))
    top = {r.into: r for r in fn.body.refs}
    new_refs = list(fn.body.refs)
    stmts: list[N.Statement] = []
    packed: dict[tuple[str, int], str] = {}
    for s in fn.body.stmts:
        if not (isinstance(s, N.Block) and "contraction" in s.tags):
            stmts.append(s)
            continue
        lanes = target.vector_bytes // max(1, (s.refs[0].shape.dtype.bits // 8))
        plan = _plan(s, top, lanes, min_reuse, max_reduction)
        if plan is None:
            stmts.append(s)
            continue
        _, packs = plan
        refs = list(s.refs)
        for ref, d in packs:
            source = top[ref.from_]
            key = (ref.from_, d)
            if key not in packed:
                name = f"{ref.from_}_packed{d}"
                order = [k for k in range(len(source.shape.dims)) if k != d] + [d]
                shape = contiguous(source.shape.dtype,
                                   tuple(source.shape.dims[k].size for k in order))
                new_refs.append(N.Refinement("none", "", name,
                                             tuple(N.Affine() for _ in order), shape))
                stmts.append(_copy_block(source, name, order, shape))
                packed[key] = name
            name = packed[key]
            order = [k for k in range(len(ref.access)) if k != d] + [d]
            dst = next(r for r in new_refs if r.into == name)
            refs[refs.index(ref)] = replace(
                ref, from_=name, access=tuple(ref.access[k] for k in order),
                shape=N.TensorShape(ref.shape.dtype, tuple(
                    N.Dim(ref.shape.dims[k].size, dst.shape.dims[j].stride)
                    for j, k in enumerate(order))))
        # Load statements name refs by `into`, which is unchanged; only the view moved.
        stmts.append(replace(s, refs=tuple(refs)))
    return replace(fn, body=replace(fn.body, refs=tuple(new_refs), stmts=tuple(stmts)))


def _copy_block(source: N.Refinement, name: str, order: list[int],
                shape: N.TensorShape) -> N.Block:
    idxs = tuple(N.Index(f"a{k}", d.size) for k, d in enumerate(source.shape.dims))
    src = N.Refinement("in", source.into, source.into,
                       tuple(N.Affine.index(f"a{k}") for k in range(len(idxs))),
                       N.TensorShape(source.shape.dtype,
                                     tuple(N.Dim(1, d.stride) for d in source.shape.dims)))
    dst = N.Refinement("out", name, name, tuple(N.Affine.index(f"a{k}") for k in order),
                       N.TensorShape(shape.dtype, tuple(N.Dim(1, d.stride) for d in shape.dims)))
    stmts = (N.Load("$x", source.into), N.Store(name, "$x"))
    return N.Block(f"pack_{name}", idxs, (), (src, dst), stmts, frozenset({"kernel", "pack"}))


PASSES["pack"] = pack
