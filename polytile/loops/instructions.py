"""Tensorized instructions the loop IR can name (`nodes.Instruction`): each one's operand
types, its meaning on NumPy values (what the interpreter runs), and its form in each
backend that can print it (one entry per backend name, e.g. "c-x86").

    register_instruction(InstructionDef(
        "fmadd_f32x8", outputs=(F8,), inputs=(F8, F8, F8),
        meaning=lambda a, b, c: (a * b + c,),
        forms={"c-x86": "{out0} = {in0} * {in1} + {in2};"}))

A form is a statement template over `{out0}, ...` (the outputs, declared by the
printer) and `{in0}, ...` (the inputs). The shipped instructions are described in TC
(polytile.isa, UNIT §III) and registered from there; no pass finds them in programs yet
(UNIT's inspector and rewriter), so `Instruction` nodes are written by hand (tests, docs).
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from polytile.errors import IRError
from polytile.loops.nodes import VType


@dataclass(frozen=True)
class InstructionDef:
    name: str
    outputs: tuple[VType, ...]
    inputs: tuple[VType, ...]
    meaning: Callable[..., tuple[np.ndarray, ...]]
    forms: Mapping[str, str] = field(default_factory=dict)   # backend name -> template
    feature: str = ""                  # the CPU feature that runs it ("": any)
    cflags: tuple[str, ...] = ()       # what the C compiler needs to emit it
    # A warp-level instruction (Tensor Cores): its operands' names (inputs, then outputs)
    # and, for each, how the 32 threads of a warp hold it: (elements per thread, the place
    # in the flattened operand of thread {lane}'s element {e}, an integer formula in C).
    names: tuple[str, ...] = ()
    layouts: Mapping[str, tuple[int, str]] = field(default_factory=dict)

    @property
    def warp(self) -> bool:
        """Whether the 32 threads of a warp run it together, each holding a fragment."""
        return bool(self.layouts)

    def held(self, operand: str) -> int:
        """Elements of `operand` (a name, or out0 / in1 ...) one thread of a warp holds."""
        return self.layouts[self.operand_name(operand)][0]

    def operand_name(self, operand: str) -> str:
        if operand in self.layouts:
            return operand
        inputs, outputs = len(self.inputs), len(self.outputs)
        names = {**{f"in{k}": n for k, n in enumerate(self.names[:inputs])},
                 **{f"out{k}": n for k, n in enumerate(self.names[inputs:inputs + outputs])}}
        if operand not in names:
            raise IRError(f"instruction {self.name} has no operand {operand!r}",
                          hint=f"operands: {', '.join(self.names)}")
        return names[operand]

    def place(self, operand: str, lane: int, element: int) -> int:
        """Where in the flattened `operand` thread `lane` of a warp holds its `element`."""
        formula = self.layouts[self.operand_name(operand)][1]
        return evaluate_layout(formula, lane, element)


_LAYOUT = re.compile(r"[0-9+*/%() ]*")


def evaluate_layout(formula: str, lane: int, element: int) -> int:
    """A layout formula (C integer arithmetic over {lane} and {e}, both >= 0) at a point."""
    text = formula.replace("{lane}", str(lane)).replace("{e}", str(element))
    if not _LAYOUT.fullmatch(text):
        raise IRError(f"a fragment layout is integer arithmetic over {{lane}} and {{e}} "
                      f"(+ * / % and parentheses), not {formula!r}")
    # C's / and % on non-negative integers are Python's // and %.
    return int(eval(text.replace("/", "//"), {"__builtins__": {}}))  # only digits and + * // % ( )


_INSTRUCTIONS: dict[str, InstructionDef] = {}


def register_instruction(definition: InstructionDef) -> None:
    """Make `definition` known by its name (a second registration replaces the first)."""
    _INSTRUCTIONS[definition.name] = definition


def instruction(name: str) -> InstructionDef:
    if name not in _INSTRUCTIONS:
        from polytile.isa import descriptions     # the shipped ones, described in TC
        descriptions()
    if name not in _INSTRUCTIONS:
        raise IRError(f"unknown instruction {name!r}",
                      hint=f"registered: {', '.join(sorted(_INSTRUCTIONS)) or 'none'}")
    return _INSTRUCTIONS[name]
