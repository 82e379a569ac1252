"""UNIT's inspector (§IV-A, Alg. 1): where a program's contraction is an instruction.

A description's reduction statement and a program's contraction are both leaf blocks of
lowered IR: a store that aggregates an expression of loads into the output. The program
block runs on the instruction when

* arithmetic isomorphism: the two expressions are the same tree, op for op and dtype for
  dtype, casts included (a commutative op may take its operands in either order), with
  one aggregation; every load of the description is bound to one view of the program
  that reads no data-dependent subscript and holds the same dtype or one that widens to
  it exactly (`widens`: every uint8 and int8 value is an int16 value, so a u8 x s8
  matmul runs on vpmaddwd's s16 pairs with its operands widened when they are packed;
  the ops above a load see the same value either way);
* loop mapping: each loop of the description goes to its own loop of the program (of
  more than one iteration), of the same kind (data-parallel: the output depends on it;
  reduction: it does not); but the description's last two reduction loops may also both
  go to one reduction loop of the program, split by the inner one's extent T: program
  index = T * outer + inner (AMX's groups g and the values t of a group, T = 2 or 4,
  take one matmul's k: its B tile holds each group of T rows of B side by side);
* access isomorphism: a bound view depends on every mapped loop its description operand
  depends on, except that an operand may be broadcast along a data-parallel loop it
  does not depend on (vpdpbusd's `a` for a matmul's row); it never depends on a mapped
  loop its description operand ignores (the instruction would read one value for all).

Every feasible mapping is returned, innermost program loops first (UNIT enumerates them
so; each is a choice for the tuner). Layout, padding and the loop nest around the
instruction are the rewriter's concern (not built yet).

    block s0 [i0:M, i1:N, i2:K] (            vpdpbusd_512 on s0:
      out o0 <- o0[i0, i1] int32:add           l -> i1, k -> i2; a = p0 (broadcast along l),
      in p0 <- p0[i0, i2] uint8                b = p1
      in p1 <- p1[i2, i1] int8 )           vpmaddwd_256 on s0 (no VNNI):
                                               l -> i1, k -> i2; a = p0 (broadcast,
                                               widened), b = p1 (widened)
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from polytile import dtypes
from polytile.dtypes import DType
from polytile.errors import IRError
from polytile.ir import nodes as N

if TYPE_CHECKING:
    from polytile.isa import Description
    from polytile.sema import program as P
    from polytile.sema.specialize import Specialized

COMMUTATIVE = ("add", "mul", "max", "min")
# Float pairs (narrow, wide) where every value of the narrow is one of the wide: bfloat16
# is float32's upper half (bits << 16), float16's 5-bit exponent and 10-bit significand
# (subnormals too) lie inside float32's, float32's inside float64's.
EXACT_FLOAT_WIDENINGS = frozenset({(dtypes.BFLOAT16, dtypes.FLOAT32),
                                   (dtypes.FLOAT16, dtypes.FLOAT32),
                                   (dtypes.BFLOAT16, dtypes.FLOAT64),
                                   (dtypes.FLOAT16, dtypes.FLOAT64),
                                   (dtypes.FLOAT32, dtypes.FLOAT64)})


@dataclass(frozen=True)
class Mapping:
    instruction: str
    loops: tuple[tuple[str, str], ...]       # (description index, program index)
    operands: tuple[tuple[str, str], ...]    # (description view, program view)
    broadcast: tuple[str, ...] = ()          # description views read once for all lanes
    widened: tuple[str, ...] = ()            # description views wider than the program's

    def text(self) -> str:
        loops = ", ".join(f"{d} -> {p}" for d, p in self.loops)
        views = ", ".join(f"{d} = {p}" + _notes(d in self.broadcast, d in self.widened)
                          for d, p in self.operands)
        return f"{self.instruction}: {loops}; {views}"


def _notes(broadcast: bool, widened: bool) -> str:
    notes = [n for n, on in (("broadcast", broadcast), ("widened", widened)) if on]
    return f" ({', '.join(notes)})" if notes else ""


@dataclass(frozen=True)
class Match:
    statement: int                  # the TC statement (0-based) the contraction comes from
    mapping: Mapping                # in the source's names


def find(spec: Specialized, available: tuple[Description, ...]) -> list[Match]:
    """Every feasible mapping of every description onto the contractions of `spec`,
    named as the source names them (a description's tensors and indices too)."""
    from polytile.ir.lower import lower
    from polytile.sema.canonical import canonical
    fn = lower(canonical(spec))
    found = []
    for block in _leaves(fn.body):
        number = re.fullmatch(r"s(\d+)", block.name)
        if number is None:
            continue
        st = int(number.group(1))
        mine = _names(spec.fn, st)
        for d in available:
            theirs = _names(d.tc, _statement_of(d))
            for m in mappings(block, d.name, d.reduction):
                found.append(Match(st, replace(
                    m, loops=tuple((theirs[a], mine[b]) for a, b in m.loops),
                    operands=tuple((theirs[a], mine[b]) for a, b in m.operands),
                    broadcast=tuple(theirs[a] for a in m.broadcast),
                    widened=tuple(theirs[a] for a in m.widened))))
    return found


def _names(fn: P.Function, statement: int) -> dict[str, str]:
    """Canonical names (polytile.sema.canonical) -> the source's, in one statement."""
    names = {f"{prefix}{k}": t.name for prefix, group in
             (("p", fn.params), ("o", fn.outputs), ("t", fn.temps)) for k, t in enumerate(group)}
    names.update({f"i{k}": n for k, (n, _) in enumerate(fn.statements[statement].ranges)})
    return names


def _statement_of(d: Description) -> int:
    number = re.fullmatch(r"s(\d+)", d.reduction.name)
    assert number is not None
    return int(number.group(1))


def reduction_block(fn: N.Function) -> N.Block:
    """The description's reduction statement: its one leaf block with an aggregating
    output and a loop the output does not depend on."""
    found = []
    for block in _leaves(fn.body):
        out = output(block)
        if out is not None and out.agg != "assign" and _kinds(block, out)[1]:
            found.append(block)
    if len(found) != 1:
        raise IRError(f"an instruction description has {len(found)} reduction statements, "
                      "not one", hint="describe one aggregation over at least one reduction "
                                      "index, e.g. d(l) += a(l,k) * b(l,k)")
    return found[0]


def mappings(block: N.Block, name: str, description: N.Block) -> list[Mapping]:
    """Every feasible mapping of instruction `name` (whose reduction statement is
    `description`) onto the program's leaf `block`."""
    out_p, out_d = output(block), output(description)
    if out_p is None or out_d is None or out_p.agg != out_d.agg \
            or out_p.shape.dtype != out_d.shape.dtype:
        return []
    bindings = _isomorphic(description, _value(description), block, _value(block), {})
    if bindings is None:
        return []
    par_d, red_d = _kinds(description, out_d)
    par_p, red_p = _kinds(block, out_p)
    widened = tuple(sorted(d for d, p in bindings.items()
                           if description.ref(d).shape.dtype != block.ref(p).shape.dtype))
    found = []
    for par in itertools.permutations(reversed(par_p), len(par_d)):
        for red in _reductions(red_d, red_p):
            loops = dict(zip(par_d + red_d, par + red))
            broadcast = _feasible(description, block, bindings, loops, set(par_d))
            if broadcast is not None:
                found.append(Mapping(name, tuple(loops.items()), tuple(bindings.items()),
                                     tuple(sorted(broadcast)), widened))
    return found


def _reductions(red_d: list[str], red_p: list[str]) -> list[tuple[str, ...]]:
    """The program's reduction loops for the description's, innermost first: each its
    own, then (two description loops or more) the last two sharing one (a split)."""
    own = list(itertools.permutations(reversed(red_p), len(red_d)))
    if len(red_d) < 2:
        return own
    return own + [(*r, r[-1]) for r in itertools.permutations(reversed(red_p), len(red_d) - 1)]


def splits(mapping: Mapping) -> bool:
    """Whether `mapping` splits a program loop across two description loops."""
    return any(p0 == p1 for (_, p0), (_, p1) in zip(mapping.loops, mapping.loops[1:]))


def tile_mapping(block: N.Block, name: str, description: N.Block, rows: str, cols: str,
                 reduction: str) -> Mapping | None:
    """The mapping of a matrix instruction (AMX: `schedule(tiles(...))`) that takes its M
    and N loops onto `rows` and `cols` and splits `reduction` across its two reduction
    loops, with no operand broadcast; None if there is none."""
    return next((m for m in mappings(block, name, description)
                 if splits(m) and not m.broadcast
                 and [p for _, p in m.loops] == [rows, cols, reduction, reduction]), None)


# ------------------------------------------------------------------ expressions

def _isomorphic(db: N.Block, d: str, pb: N.Block, p: str,
                bound: dict[str, str]) -> dict[str, str] | None:
    """The views bound (description -> program) if scalar `d` of `db` computes what `p`
    of `pb` does, extending `bound`; None if not."""
    ds, ps = _definition(db, d), _definition(pb, p)
    if isinstance(ds, N.Load) and isinstance(ps, N.Load):
        dv, pv = db.ref(ds.ref), pb.ref(ps.ref)
        if ds.dynamic or ds.offset or ps.dynamic or ps.offset \
                or not widens(pv.shape.dtype, dv.shape.dtype):
            return None
        if dv.into in bound:
            return bound if bound[dv.into] == pv.into else None
        return None if pv.into in bound.values() else {**bound, dv.into: pv.into}
    if isinstance(ds, N.Intrinsic) and isinstance(ps, N.Intrinsic):
        if ds.op != ps.op or ds.dtype != ps.dtype or len(ds.inputs) != len(ps.inputs):
            return None
        orders = [ps.inputs]
        if ds.op in COMMUTATIVE and len(ps.inputs) == 2:
            orders.append(ps.inputs[::-1])
        for order in orders:
            result: dict[str, str] | None = bound
            for a, b in zip(ds.inputs, order):
                result = _isomorphic(db, a, pb, b, result) if result is not None else None
            if result is not None:
                return result
        return None
    if isinstance(ds, N.Constant) and isinstance(ps, N.Constant):
        return bound if (ds.value, ds.dtype) == (ps.value, ps.dtype) else None
    return None


def widens(narrow: DType, wide: DType) -> bool:
    """Whether every value of `narrow` is a value of `wide`: the same dtype, integers
    whose range lies inside the other's (uint8 and int8 in int16, uint16 in int32; not
    int8 in uint16), or a float whose exponent range and significand fit in the other's
    (bfloat16 and float16 in float32, subnormals included; float32 in float64; not
    float16 and bfloat16 in each other, nor integers in floats)."""
    if narrow == wide:
        return True
    if narrow.kind == "f" and wide.kind == "f":
        return (narrow, wide) in EXACT_FLOAT_WIDENINGS
    if narrow.kind not in "ui" or wide.kind not in "ui":
        return False
    if narrow.kind == "i" and wide.kind == "u":
        return False
    return narrow.bits < wide.bits or (narrow.bits == wide.bits and narrow.kind == wide.kind)


def _definition(block: N.Block, name: str) -> N.Statement | None:
    return next((s for s in block.stmts if getattr(s, "into", None) == name), None)


def _value(block: N.Block) -> str:
    return next(s.value for s in block.stmts if isinstance(s, N.Store))


# ------------------------------------------------------------------ loops

def _feasible(db: N.Block, pb: N.Block, bindings: dict[str, str], loops: dict[str, str],
              parallel: set[str]) -> set[str] | None:
    """The description views broadcast under `loops`, or None if it is infeasible."""
    broadcast = set()
    for dv, pv in bindings.items():
        d_uses, p_uses = uses(db.ref(dv)), uses(pb.ref(pv))
        for d_loop, p_loop in loops.items():
            if d_loop in d_uses and p_loop not in p_uses:
                if d_loop not in parallel:
                    return None
                broadcast.add(dv)
            if d_loop not in d_uses and p_loop in p_uses:
                return None
    return broadcast


def kinds(block: N.Block) -> tuple[list[str], list[str]]:
    """A leaf block's loops as (data-parallel, reduction), as the inspector sees them."""
    out = output(block)
    return _kinds(block, out) if out is not None else ([], [])


def _kinds(block: N.Block, out: N.Refinement) -> tuple[list[str], list[str]]:
    """The block's loops as (data-parallel, reduction), in block order; a loop of one
    iteration is no loop for an instruction to take."""
    loops = [i.name for i in block.idxs if i.affine is None and i.range > 1]
    written = uses(out)
    return [n for n in loops if n in written], [n for n in loops if n not in written]


def uses(ref: N.Refinement) -> set[str]:
    """The indices a view's origin depends on."""
    return {n for a in ref.access for n in a.names}


def output(block: N.Block) -> N.Refinement | None:
    """The view a leaf block stores to, if it has one store."""
    stores = [s for s in block.stmts if isinstance(s, N.Store)]
    return block.ref(stores[0].ref) if len(stores) == 1 else None


def _leaves(block: N.Block) -> list[N.Block]:
    children = [s for s in block.stmts if isinstance(s, N.Block)]
    if not children:
        return [block]
    return [leaf for c in children for leaf in _leaves(c)]
