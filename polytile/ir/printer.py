"""The canonical text form of the IR; `polytile.ir.parser` reads it back.

One construct per line, two spaces of indentation per nesting level:

    function scale(X, Y) {
      block main #program (
        in X[0] float32(10:1)
        out Y[0] float32(10:1)
      ) {
        // one iteration per element
        block kernel_0 [i:10] #elementwise (
          in X <- X[i] float32(1:1)
          out Y <- Y[i] float32(1:1)
        ) {
          $x = load(X)
          $two = const(2.0, float32)
          $y = mul($x, $two) : float32
          Y = store($y)
        }
      }
    }

A block header lists its indices (`i:10` iterates, `i = 4*i1 + 2` is passed in
from the parent with range 1), its tags, its schedule when it has one
(`schedule(micro, vector(j, float32, 16), unroll(i), order(k), transpose(16), parallel(i),
combine(C), simd,
grid(i), thread(j), prefetch(8))`, see `BlockSchedule`), then, inside `( )`, its constraints
(`expr >= 0`) and its refinements:
`dir name <- parent[access] dtype(size:stride, ...)[:agg][ @location]`
(top-level buffers and local allocations have no `<- parent`). A load with
data-dependent offsets is written `load(B[$i, _])`, `_` marking a static dimension;
one with a flat element offset (a pointer increment) `load(B + $off)`.
The printer never fails: it prints even malformed IR, which `verify` then reports.
"""
from __future__ import annotations

import json
import re

import numpy as np

from polytile.ir.nodes import (
    Affine,
    Block,
    BlockSchedule,
    Constant,
    Function,
    Index,
    Intrinsic,
    Load,
    LoadIndex,
    Refinement,
    Special,
    Statement,
    Store,
)

INDENT = "  "
# Tags and locations matching this print bare (`#tile`), anything else JSON-quoted.
BARE_WORD = re.compile(r"[A-Za-z0-9_.\-]+\Z")


def format_function(fn: Function) -> str:
    """The whole function, ending with a newline."""
    lines = [f"function {fn.name}({', '.join(fn.params)}) {{"]
    lines += _block_lines(fn.body, 1)
    lines.append("}")
    return "\n".join(lines) + "\n"


def format_block(block: Block, depth: int = 0) -> str:
    """One block (with its nested blocks), indented `depth` levels, ending with a newline."""
    return "\n".join(_block_lines(block, depth)) + "\n"


def _dynamic(offsets: tuple[str | None, ...]) -> str:
    """`[$d, _]`: the data-dependent offsets of a load or store, if any."""
    return f"[{', '.join(d if d is not None else '_' for d in offsets)}]" if offsets else ""


def format_statement(stmt: Statement) -> str:
    """A single non-block statement, as it appears on its line."""
    if isinstance(stmt, Load):
        plus = f" + {stmt.offset}" if stmt.offset is not None else ""
        return f"{stmt.into} = load({stmt.ref}{_dynamic(stmt.dynamic)}{plus})"
    if isinstance(stmt, Store):
        return f"{stmt.ref}{_dynamic(stmt.dynamic)} = store({stmt.value})"
    if isinstance(stmt, LoadIndex):
        return f"{stmt.into} = index({stmt.value})"
    if isinstance(stmt, Constant):
        return f"{stmt.into} = const({format_number(stmt.value)}, {stmt.dtype})"
    if isinstance(stmt, Intrinsic):
        return f"{stmt.into} = {stmt.op}({', '.join(stmt.inputs)}) : {stmt.dtype}"
    if isinstance(stmt, Special):
        text = f"special {stmt.name}({', '.join(stmt.inputs)}) -> ({', '.join(stmt.outputs)})"
        if stmt.params:
            text += " {" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in stmt.params) + "}"
        return text
    return format_block(stmt).rstrip("\n")


def format_refinement(ref: Refinement) -> str:
    access = f"[{', '.join(str(a) for a in ref.access)}]"
    source = f"{ref.into}{access}" if not ref.from_ else f"{ref.into} <- {ref.from_}{access}"
    dims = ", ".join(f"{d.size}:{d.stride}" for d in ref.shape.dims)
    text = f"{ref.dir} {source} {ref.shape.dtype}({dims})"
    if ref.agg != "assign":
        text += f":{ref.agg}"
    if ref.location is not None:
        text += f" @{_word(ref.location)}"
    return text


def format_index(idx: Index) -> str:
    if idx.affine is None:
        return f"{idx.name}:{idx.range}"
    # A passed index has range 1; any other range is kept so the text stays exact.
    head = idx.name if idx.range == 1 else f"{idx.name}:{idx.range}"
    return f"{head} = {idx.affine}"


def format_constraint(c: Affine) -> str:
    return f"{c} >= 0"


def format_number(value: float | bool) -> str:
    """Exact and re-readable: ints as ints, floats by `repr` (shortest round-trip)."""
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    return repr(float(value))


def _word(text: str) -> str:
    return text if BARE_WORD.match(text) else json.dumps(text)


def format_schedule(s: BlockSchedule) -> str:
    items = ["micro"] if s.micro else []
    if s.vector is not None:
        items.append(f"vector({s.vector.index}, {s.vector.dtype}, {s.vector.lanes})")
    if s.boundary is not None:
        items.append(f"boundary({s.boundary})")
    if s.unroll:
        items.append(f"unroll({', '.join(s.unroll)})")
    if s.order:
        items.append(f"order({', '.join(s.order)})")
    if s.transpose:
        items.append(f"transpose({s.transpose})")
    items += [f"parallel({s.parallel})"] if s.parallel else []
    items += [f"combine({', '.join(s.combine)})"] if s.combine else []
    items += ["simd"] if s.simd else []
    items += [f"{kind}({index})" for index, kind in s.gpu]
    items += [f"prefetch({s.prefetch})"] if s.prefetch else []
    items += [f"stream({', '.join(s.stream)})"] if s.stream else []
    items += [f"next_row({r.view}, {r.index}, {r.rows}, {r.stride})" for r in s.next_row]
    items += [f"folded({s.folded})"] if s.folded is not None else []
    items += [f"first({', '.join(s.first)})"] if s.first is not None else []
    if s.tensorize is not None:
        t = s.tensorize
        kept = ", kept" if t.kept else ""
        items.append(f"tensorize({t.instruction}, {t.lane}, {t.reduction}, {t.rows}, "
                     f"{t.chains}{kept})")
    if s.stage is not None:
        pad = f", pad = {s.stage.pad}" if s.stage.pad else ""
        items.append(f"stage({s.stage.index}, {s.stage.tile}, {', '.join(s.stage.refs)}{pad})")
    if s.across is not None:
        warp = f", warp = {s.across.warp}" if s.across.warp else ""
        items.append(f"across({s.across.index}, {s.across.threads}{warp})")
    if s.mma is not None:
        w = s.mma
        items.append(f"mma({w.instruction}, {w.rows}, {w.cols}, {w.reduction}, {w.warps_m}, "
                     f"{w.warps_n}, {w.tiles_m}, {w.tiles_n})")
    if s.tiles is not None:
        w2 = s.tiles
        items.append(f"tiles({w2.instruction}, {w2.rows}, {w2.cols}, {w2.reduction}"
                     f"{', kept' if w2.kept else ''})")
    if s.stitch is not None:
        phases = (("for" if p.shared else "single") + (" barrier" if p.barrier else "")
                  for p in s.stitch.phases)
        items.append(f"stitch({', '.join(phases)})")
    if s.rows is not None:
        kinds = (p.kind + (f"({p.loop})" if p.loop else "") + (" barrier" if p.barrier else "")
                 for p in s.rows.phases)
        warp = f", warp = {s.rows.warp}" if s.rows.warp else ""
        items.append(f"rows({s.rows.index}, {s.rows.threads}{warp}, {', '.join(kinds)})")
    return f"schedule({', '.join(items)})"


def _block_lines(block: Block, depth: int) -> list[str]:
    pad = INDENT * depth
    lines = [f"{pad}//{' ' + line if line else ''}" for line in block.comment.split("\n")] \
        if block.comment else []
    head = f"{pad}block {block.name}"
    if block.idxs:
        head += f" [{', '.join(format_index(i) for i in block.idxs)}]"
    for tag in sorted(block.tags):
        head += f" #{_word(tag)}"
    if block.schedule != BlockSchedule():
        head += f" {format_schedule(block.schedule)}"
    inner = INDENT * (depth + 1)
    header_items = [format_constraint(c) for c in block.constraints] + \
        [format_refinement(r) for r in block.refs]
    if header_items:
        lines.append(head + " (")
        lines += [inner + item for item in header_items]
        lines.append(f"{pad}) {{")
    else:
        lines.append(head + " () {")
    for stmt in block.stmts:
        if isinstance(stmt, Block):
            lines += _block_lines(stmt, depth + 1)
        else:
            lines.append(inner + format_statement(stmt))
    lines.append(f"{pad}}}")
    return lines
