"""The GPU printer's forms of warp-level instructions (Tensor Cores): a `Fragment` is an
array of the elements one thread of the warp holds, filled through the description's
layout; the instruction is its template (`forms["cuda"]`) over those arrays. Nothing is
decided here: the layouts and templates are the description's (polytile/isa), the tiles
and offsets the lowering's (polytile.loops.warp_mma).

    Let v0: float16x256 = Fragment(mma_f16_m16n8k16, a, d1, l0, 32*d3)
      ->  uint16_t v0[8];
          #pragma unroll
          for (int pt_e = 0; pt_e < 8; pt_e++)
              v0[pt_e] = l0[32*d3 + ((d1/4 + 8*(pt_e/2%2))*16 + (d1%4)*2 + pt_e%2 + 8*(pt_e/4))];
"""
from __future__ import annotations

import re
from typing import Protocol

from polytile.errors import IRError, UnsupportedError
from polytile.loops import nodes as L
from polytile.loops.instructions import InstructionDef, instruction


class _Printer(Protocol):
    types: dict[str, L.VType]

    def iexpr(self, e: L.IExpr) -> str: ...


def is_warp(st: L.Stmt) -> bool:
    """Whether `st` is one of the warp-level statements printed here."""
    if isinstance(st, (L.Let, L.Var)):
        return isinstance(st.value, L.Fragment)
    if isinstance(st, L.FragmentStore):
        return True
    return isinstance(st, L.Instruction) and instruction(st.name).warp


def print_warp(printer: _Printer, st: L.Stmt, form: str, dialect: str) -> list[str]:
    if isinstance(st, (L.Let, L.Var)):
        assert isinstance(st.value, L.Fragment)
        f = st.value
        definition = _warp(f.instruction)
        held = definition.held(f.operand)
        printer.types[st.name] = st.type
        lines = [f"{st.type.dtype.c_name} {st.name}[{held}];"]
        if not f.buffer:
            if f.fill != 0:
                raise UnsupportedError(f"a fragment filled with {f.fill}: only 0 is printed")
            return lines + [f"for (int pt_e = 0; pt_e < {held}; pt_e++) {st.name}[pt_e] = 0;"]
        place = _place(definition, f.operand, f.lane)
        load = (f"for (int pt_e = 0; pt_e < {held}; pt_e++) "
                f"{st.name}[pt_e] = {f.buffer}[{printer.iexpr(f.offset)} + {place}];")
        return [*lines, "#pragma unroll", load]
    if isinstance(st, L.FragmentStore):
        definition = _warp(st.instruction)
        held = definition.held(st.operand)
        place = _place(definition, st.operand, st.lane)
        store = (f"for (int pt_e = 0; pt_e < {held}; pt_e++) "
                 f"{st.buffer}[{printer.iexpr(st.offset)} + {place}] = {st.value}[pt_e];")
        return ["#pragma unroll", store]
    assert isinstance(st, L.Instruction)
    definition = _warp(st.name)
    template = definition.forms.get(form) if form else None
    if template is None:
        raise UnsupportedError(f"instruction {st.name} has no {dialect} form",
                               hint=f"its forms: {', '.join(definition.forms)}")
    lines = []
    for k, (name, t) in enumerate(zip(st.outputs, definition.outputs)):
        if name not in st.inputs:        # an accumulator updated in place is declared
            printer.types[name] = t
            lines.append(f"{t.dtype.c_name} {name}[{definition.held(f'out{k}')}];")
    operands = {f"out{k}": n for k, n in enumerate(st.outputs)}
    operands.update({f"in{k}": n for k, n in enumerate(st.inputs)})

    def operand(m: re.Match[str]) -> str:
        if m.group(1) not in operands:
            raise IRError(f"the {dialect} form of {st.name} names {m.group(0)}, which it "
                          "does not have")
        return operands[m.group(1)]
    return lines + [re.sub(r"\{((?:out|in)\d+)\}", operand, template)]


def _warp(name: str) -> InstructionDef:
    definition = instruction(name)
    if not definition.warp:
        raise IRError(f"instruction {name} is not a warp-level instruction (no layouts)")
    return definition


def _place(definition: InstructionDef, operand: str, lane: str) -> str:
    formula = definition.layouts[definition.operand_name(operand)][1]
    return "(" + formula.replace("{lane}", lane).replace("{e}", "pt_e") + ")"
