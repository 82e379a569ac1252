"""The loop IR as text (`polytile show --stage loops`): one line per node, nesting by
indentation.

    kernel matmul(b0 (A: in float32 13x7), b1 (B: in float32 7x11), b2 (C: out float32 13x11))
      parallel for i0 in [0, 13):
        for i1 in [0, 11):
          s0: float32 = b0[7*i0]
          v0: float32x16 = b1[i1] x16 (count nv0)
          store b2[11*i0 + i1] += s0
"""
from __future__ import annotations

from polytile.ir.nodes import Affine
from polytile.loops import nodes as L

_INDENT = "  "


def kernel_text(k: L.Kernel) -> str:
    params = ", ".join(_buffer(b) for b in k.params)
    lines = [f"kernel {k.name}({params})"]
    lines += [_INDENT + "local " + _buffer(b) for b in k.locals]
    lines += _stmts(k.body, 1)
    return "\n".join(lines) + "\n"


def _buffer(b: L.Buffer) -> str:
    if b.placement == "param":
        return f"{b.name} ({b.label})"
    init = f", fill {b.init}" if b.init else ""
    space = "" if b.space == "global" else f" {b.space}"
    return f"{b.name}: {b.dtype}[{b.size}]{space} on {b.placement}{init}  # {b.label}"


def iexpr(e: L.IExpr) -> str:
    if isinstance(e, Affine):
        return str(e)
    if isinstance(e, (L.IMin, L.IMax)):
        name = "min" if isinstance(e, L.IMin) else "max"
        return f"{name}({', '.join(iexpr(a) for a in e.args)})"
    return f"{'ceil' if e.ceil else 'floor'}(({e.num}) / {e.den})"


def _access(buffer: str, offset: Affine, lanes: int, count: L.IExpr | None) -> str:
    text = f"{buffer}[{offset}]"
    if lanes > 1:
        text += f" x{lanes}"
    if count is not None:
        text += f" (count {iexpr(count)})"
    return text


def expr(e: L.Expr) -> str:
    if isinstance(e, L.Lit):
        return repr(e.value)
    if isinstance(e, L.Name):
        return e.name
    if isinstance(e, L.IntValue):
        return iexpr(e.value)
    if isinstance(e, L.Read):
        return _access(e.buffer, e.offset, e.lanes, e.count)
    if isinstance(e, L.Op):
        return f"{e.op}({', '.join(e.args)}) as {e.dtype}"
    if isinstance(e, L.Broadcast):
        return f"broadcast({e.value})"
    if isinstance(e, L.Combine):
        return f"combine_{e.agg}({e.acc}, {e.value})"
    if isinstance(e, L.Reduce):
        return f"reduce_{e.agg}({e.value})"
    if isinstance(e, L.Mask):
        return f"mask({e.value}, count {iexpr(e.count)}, fill {e.fill!r})"
    if isinstance(e, L.Fragment):
        source = (f"{e.buffer}[{e.offset}]" if e.buffer else f"fill {e.fill!r}")
        return f"fragment {e.instruction}.{e.operand}({source}, lane {e.lane})"
    assert isinstance(e, L.Shuffle)
    return f"shuffle({e.a}, {e.b}, [{', '.join(map(str, e.lanes))}])"


def _stmts(stmts: tuple[L.Stmt, ...], depth: int) -> list[str]:
    out: list[str] = []
    pad = _INDENT * depth
    for st in stmts:
        if isinstance(st, L.Comment):
            out.append(f"{pad}# {st.text}")
        elif isinstance(st, L.Let):
            held = ", held" if st.held else ""
            out.append(f"{pad}{st.name}: {st.type} = {expr(st.value)}{held}")
        elif isinstance(st, L.Var):
            out.append(f"{pad}var {st.name}: {st.type} = {expr(st.value)}")
        elif isinstance(st, L.Assign):
            out.append(f"{pad}{st.name} = {expr(st.value)}")
        elif isinstance(st, L.Store):
            op = "=" if st.agg == "assign" else f"{st.agg}="
            target = _access(st.buffer, st.offset, 1, st.count)
            kind = "store stream" if st.stream else "store"
            out.append(f"{pad}{kind} {target} {op} {st.value}")
        elif isinstance(st, L.Fence):
            out.append(f"{pad}fence")
        elif isinstance(st, L.Loop):
            kind = "" if st.kind == "serial" else f"{st.kind} "
            simd = "simd " if st.simd else ""
            step = "" if st.step == 1 else f" step {st.step}"
            spans = ", ".join(f"{s.buffer}[{s.offset}:{s.offset + s.count}]"
                              for s in st.accumulate)
            adds = f" adding into {spans}" if spans else ""
            out.append(f"{pad}{kind}{simd}for {st.var} in [{iexpr(st.lo)}, {iexpr(st.hi)})"
                       f"{step}{adds}:")
            out += _stmts(st.body, depth + 1)
        elif isinstance(st, L.If):
            conds = " and ".join(f"{iexpr(c)} >= 0" for c in st.conds)
            out.append(f"{pad}if {conds}:")
            out += _stmts(st.then, depth + 1)
            if st.else_:
                out.append(f"{pad}else:")
                out += _stmts(st.else_, depth + 1)
        elif isinstance(st, L.Switch):
            out.append(f"{pad}switch {iexpr(st.value)}:")
            for value, body in st.cases:
                out.append(f"{pad}{_INDENT}case {value}:")
                out += _stmts(body, depth + 2)
        elif isinstance(st, L.Check):
            where = f"param {st.param}" if st.param >= 0 else "a local"
            out.append(f"{pad}check 0 <= {st.value} < {st.size}  # {where}, dimension {st.dim}")
        elif isinstance(st, L.Alloc):
            out += [f"{pad}local {_buffer(b)}" for b in st.buffers]
            out.append(f"{pad}with {', '.join(b.name for b in st.buffers)}:")
            out += _stmts(st.body, depth + 1)
        elif isinstance(st, L.Kept):
            how = ", compared in threads" if st.threads else ""
            out.append(f"{pad}unless {st.buffer} was filled from {st.source}"
                       f"[{st.offset}:{st.offset + st.count}] as it is now (kept at "
                       f"{st.buffer}[{st.state}:]{how}):")
            out += _stmts(st.body, depth + 1)
        elif isinstance(st, L.Prefetch):
            write = " for writing" if st.write else ""
            out.append(f"{pad}prefetch{write} {_access(st.buffer, st.offset, 1, None)}")
        elif isinstance(st, L.Barrier):
            out.append(f"{pad}barrier {st.space}")
        elif isinstance(st, L.WarpXor):
            out.append(f"{pad}{st.name}: {st.type} = {st.value} of the thread at "
                       f"{iexpr(st.place)} xor {st.mask}")
        elif isinstance(st, L.Region):
            out.append(f"{pad}region:")
            out += _stmts(st.body, depth + 1)
        elif isinstance(st, L.Single):
            out.append(f"{pad}single:")
            out += _stmts(st.body, depth + 1)
        elif isinstance(st, L.FragmentStore):
            out.append(f"{pad}store fragment {st.instruction}.{st.operand} "
                       f"{st.buffer}[{st.offset}] = {st.value} (lane {st.lane})")
        else:
            assert isinstance(st, L.Instruction)
            results = f"{', '.join(st.outputs)} = " if st.outputs else ""
            out.append(f"{pad}{results}instruction {st.name}({', '.join(st.inputs)})")
    return out
