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
