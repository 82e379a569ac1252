"""outlayout: a convolution sums along its output channels into a copy of its output
that has them innermost, and the copy is transposed into the output.

The micro-kernel vectorizes along its output's unit-stride index (pass autotile). For a
convolution's NKHW output that is w, which the image reads through a window (w + s):
every reduction step loads vectors of the image at another offset, across cache lines,
and a row of 56 fills 56 of 64 lanes. Along the output channels k the weights are the
vector operand instead (packed into panels by pass pack, aligned, every lane used when
K is a multiple of the vector), and the image is broadcast. The sums go into a local
copy of the output laid out with k innermost, which a copy block transposes into the
output in L x L register tiles (`schedule(transpose(L))`, as pack's copies):

    block s0_init [n, k, h, w] #init (                  block s0_init [n, k, h, w] #init (
      out o0 <- o0[n, k, h, w] )                          out o0 <- o0_t[n, h, w, k] )
    block s0 [n, k, h, w, c, r, s] #contraction (  ->   block s0 [...] #contraction (
      out o0 <- o0[n, k, h, w]:add                        out o0 <- o0_t[n, h, w, k]:add ... )
      in p0 <- p0[n, c, h + r, w + s]                   block s0_out [a0, a1, a2, a3] #kernel #pack
      in p1 <- p1[k, c, r, s] )                             schedule(transpose(16)) (
                                                          in o0_t <- o0_t[a0, a2, a3, a1]
                                                          out o0 <- o0[a0, a1, a2, a3] )

It applies to a top-level contraction with one float32 output that it adds into over
the whole buffer (plain subscripts), made by the init block just before it (`+=!`),
whose unit-stride output index an input reads through a window (the index plus a
reduction index in one subscript), and which has another output index that no windowed
input reads, that some input reads, and whose range is a multiple of the target's float32
vector. The output index taken is the last such one (the channels of an NKHW output).
A contraction inside a fused row loop (pass fuse: weights under half of L1) is left alone.
Intel Xeon, two threads, this pass off against on (`benchmarks/option_ab.py`): the 3 x 3
64 -> 64 convolution at 56 x 56 0.74-0.80x the time on cpu-avx512 and 0.92-0.93x on
cpu-avx2; the TC paper's group convolution 1.01-1.05x on cpu-avx512 while its 9.4 MB
output's transpose cost what the contraction gained, 0.82x since its bias is added in the
transpose and the transpose runs in the contraction (pass sink; 8.20 against 9.99 ms),
and 0.78-0.83x on cpu-avx2.

Parameters: `enabled` (default true).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from polytile import dtypes
from polytile.ir import nodes as N
from polytile.ir.lower import contiguous
from polytile.passes.epilogue import in_place_view
from polytile.passes.names import fresh_name
from polytile.passes.pipeline import flag, register
from polytile.passes.schedule import _is_parallel
from polytile.targets.target import Target


def outlayout(fn: N.Function, target: Target, params: dict[str, Any]) -> N.Function:
    if not params.get("enabled", True):
        return fn
    lanes = target.vector_bytes // 4
    top = {r.into: r for r in fn.body.refs}
    refs = list(fn.body.refs)
    stmts = list(fn.body.stmts)
    k = 1
    while k < len(stmts):
        init, block = stmts[k - 1], stmts[k]
        found = _channel_dim(init, block, top, lanes)
        if found is None:
            k += 1
            continue
        assert isinstance(init, N.Block) and isinstance(block, N.Block)
        out, d = found
        buffer = top[out.from_]
        name = fresh_name(f"{out.from_}_t", top)
        order = [j for j in range(len(buffer.shape.dims)) if j != d] + [d]
        copy = contiguous(buffer.shape.dtype, tuple(buffer.shape.dims[j].size for j in order))
        local = N.Refinement("none", "", name, tuple(N.Affine() for _ in order), copy)
        refs.append(local)
        top[name] = local
        stmts[k - 1] = _redirected(init, out.from_, name, order, copy)
        stmts[k] = _redirected(block, out.from_, name, order, copy)
        copy_block = _transpose(f"{block.name}_out", local, buffer, order, lanes)
        after = stmts[k + 1] if k + 1 < len(stmts) else None
        folded = _with_epilogue(copy_block, after, buffer) if after is not None else None
        if folded is not None:
            stmts[k + 1] = folded
        else:
            stmts.insert(k + 1, copy_block)
        k += 2
    return replace(fn, body=replace(fn.body, refs=tuple(refs), stmts=tuple(stmts)))


def _channel_dim(init: N.Statement, block: N.Statement, top: dict[str, N.Refinement],
                 lanes: int) -> tuple[N.Refinement, int] | None:
    """The contraction's output view and the output dimension to make innermost (see the
    module docstring), or None."""
    if not (isinstance(init, N.Block) and isinstance(block, N.Block)) \
            or not {"contraction", "kernel"} <= block.tags or "init" not in init.tags:
        return None
    outs = [r for r in block.refs if r.dir in ("out", "inout")]
    if len(outs) != 1 or any(isinstance(s, N.Block) for s in block.stmts):
        return None
    out = outs[0]
    buffer = top.get(out.from_)
    if buffer is None or out.dir != "out" or out.agg != "add" \
            or out.shape.dtype != dtypes.FLOAT32 or not buffer.shape.dims \
            or buffer.shape.dims[-1].stride != 1:
        return None
    if any(r.from_ == out.from_ for r in block.refs if r is not out):
        return None
    ranges = {i.name: i.range for i in block.idxs if i.affine is None}
    names = [a.names[0] if a.terms and len(a.terms) == 1 and not a.const
             and a.coeff(a.names[0]) == 1 else None for a in out.access]
    if None in names or len(set(names)) != len(names) or any(n not in ranges for n in names) \
            or [ranges[str(n)] for n in names] != [d.size for d in buffer.shape.dims]:
        return None
    # The init assigns the whole buffer at the same subscripts.
    init_outs = [r for r in init.refs if r.dir in ("out", "inout")]
    if len(init.refs) != 1 or len(init_outs) != 1 or init_outs[0].from_ != out.from_ \
            or init_outs[0].access != out.access:
        return None
    v = str(names[-1])
    inputs = [r for r in block.refs if r.dir == "in"]
    windowed = [r for r in inputs if any(
        a.coeff(v) and any(n != v and n in ranges and not _is_parallel(block, n)
                           for n in a.names) for a in r.access)]
    if not windowed:
        return None
    for d in reversed(range(len(names) - 1)):
        n = str(names[d])
        if not _is_parallel(block, n) or ranges[n] % lanes:
            continue
        if any(a.coeff(n) for r in windowed for a in r.access):
            continue
        if any(a.coeff(n) for r in inputs for a in r.access):
            return out, d
    return None


def _redirected(block: N.Block, buffer: str, name: str, order: list[int],
                copy: N.TensorShape) -> N.Block:
    """`block` with its view of `buffer` moved onto the local `name`, dimensions `order`."""
    def moved(r: N.Refinement) -> N.Refinement:
        if r.from_ != buffer:
            return r
        return replace(r, from_=name, access=tuple(r.access[j] for j in order),
                       shape=copy.element)
    return replace(block, refs=tuple(moved(r) for r in block.refs))


def _transpose(name: str, local: N.Refinement, buffer: N.Refinement, order: list[int],
               lanes: int) -> N.Block:
    """buffer[a0, a1, ...] = local[a_order[0], a_order[1], ...], in register transposes."""
    dims = buffer.shape.dims
    idxs = tuple(N.Index(f"a{j}", d.size) for j, d in enumerate(dims))
    plain = tuple(N.Affine.index(f"a{j}") for j in range(len(dims)))
    src = N.Refinement("in", local.into, local.into, tuple(plain[j] for j in order),
                       local.shape.element)
    dst = N.Refinement("out", buffer.into, buffer.into, plain, buffer.shape.element)
    stmts = (N.Load("$x", local.into), N.Store(buffer.into, "$x"))
    return N.Block(name, idxs, (), (src, dst), stmts, frozenset({"kernel", "pack"}),
                   schedule=N.BlockSchedule(transpose=lanes))


def _with_epilogue(copy: N.Block, after: N.Statement, buffer: N.Refinement) -> N.Block | None:
    """The copy block with the elementwise statement `after` it done on the way, when that
    statement only rewrites each element of the output from itself and from views that
    stay the same along the output's unit-stride dimension (a bias per channel); else
    None. The copy then writes each element once, and the transpose's lowering does the
    work per stored row (polytile.loops.transpose)."""
    view = in_place_view(after, buffer.into) if isinstance(after, N.Block) else None
    if view is None:
        return None
    assert isinstance(after, N.Block)
    ranges = {i.name: i.range for i in after.idxs}
    names = [a.names[0] for a in view.access]
    if [ranges[n] for n in names] != list(buffer.shape.sizes):
        return None
    rename = {n: N.Affine.index(f"a{d}") for d, n in enumerate(names)}
    unit = f"a{len(names) - 1}"
    others = [replace(r, access=tuple(a.substitute(rename) for a in r.access))
              for r in after.refs if r is not view]
    if any(any(a.coeff(unit) for a in r.access) or r.into in {c.into for c in copy.refs}
           for r in others):
        return None
    loads = [st for st in after.stmts if isinstance(st, N.Load) and st.ref == view.into]
    stores = [st for st in after.stmts if isinstance(st, N.Store)]
    if len(loads) != 1 or stores[0] is not after.stmts[-1]:
        return None
    first, last = copy.stmts
    assert isinstance(first, N.Load) and isinstance(last, N.Store)
    taken = {st.into for st in after.stmts if isinstance(st, (N.Load, N.Constant, N.Intrinsic))}
    if first.into in taken:
        return None
    subst = {loads[0].into: first.into}
    work: list[N.Statement] = []
    for st in after.stmts[:-1]:
        if st is loads[0]:
            continue
        if isinstance(st, N.Intrinsic):
            st = replace(st, inputs=tuple(subst.get(x, x) for x in st.inputs))
        work.append(st)
    value = subst.get(stores[0].value, stores[0].value)
    return replace(copy, refs=copy.refs + tuple(others),
                   stmts=(first, *work, replace(last, value=value)))


register("outlayout", outlayout, enabled=flag)
