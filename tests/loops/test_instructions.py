"""Tensorized instructions in the loop IR: registered once with their meaning and their
C form, run by the interpreter, printed and compiled by the C backend; refused clearly
where a backend has no form or the operands do not fit."""
from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from polytile.codegen.c import print_c
from polytile.dtypes import FLOAT32, INT32
from polytile.errors import IRError, UnsupportedError
from polytile.ir.nodes import Affine
from polytile.loops import nodes as L
from polytile.loops.instructions import InstructionDef, register_instruction
from polytile.loops.interp import run_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "codegen"))
from c_harness import CC, FLAGS, needs_cc  # noqa: E402

F8 = L.VType(FLOAT32, 8)
F1 = L.VType(FLOAT32)
register_instruction(InstructionDef(
    "test_fmadd_hsum", outputs=(F8, F1), inputs=(F8, F8, F8),
    meaning=lambda a, b, c: (a * b + c, np.float32((a * b + c).sum())),
    forms={"c-x86": "{out0} = {in0} * {in1} + {in2}; {out1} = pt_vhsum({out0});"}))
register_instruction(InstructionDef("test_no_c_form", (F8,), (F8,), lambda a: (a,)))
START = Affine.constant(0)


def kernel(name: str = "test_fmadd_hsum", inputs: tuple[str, ...] = ("v0", "v1", "v2"),
           outputs: tuple[str, ...] = ("v3", "s0")) -> L.Kernel:
    params = tuple(L.Buffer(f"b{p}", FLOAT32, 0, param=p, writable=p >= 3) for p in range(5))
    return L.Kernel("fmadd", params, (), (
        *(L.Let(f"v{p}", F8, L.Read(f"b{p}", START + 8 * p, 8)) for p in range(3)),
        L.Instruction(name, outputs, inputs),
        L.Store("b3", START, outputs[0]),
        *((L.Store("b4", START, outputs[1]),) if len(outputs) > 1 else ())))


def arrays() -> list[np.ndarray]:
    rng = np.random.default_rng(4)
    return ([rng.standard_normal(24).astype(np.float32) for _ in range(3)]
            + [np.zeros(8, np.float32), np.zeros(1, np.float32)])


def test_the_interpreter_runs_the_registered_meaning() -> None:
    args = arrays()
    run_kernel(kernel(), args)
    a, b, c = args[0][0:8], args[1][8:16], args[2][16:24]
    np.testing.assert_allclose(args[3], a * b + c, rtol=1e-6)
    np.testing.assert_allclose(args[4][0], (a * b + c).sum(), rtol=1e-5)


@needs_cc
def test_the_c_form_compiles_and_agrees_with_the_interpreter(tmp_path: Path) -> None:
    source = print_c(kernel(), "k")
    assert "v3 = v0 * v1 + v2; s0 = pt_vhsum(v3);" in source.text
    (tmp_path / "k.c").write_text(source.text)
    subprocess.run([CC, *FLAGS, "-Wno-psabi", "-shared", "-fPIC", "-o", str(tmp_path / "k.so"),
                    str(tmp_path / "k.c"), "-lm"], check=True)
    compiled, interpreted = arrays(), arrays()
    pointers = (ctypes.c_void_p * 5)(*[a.ctypes.data for a in compiled])
    err = (ctypes.c_int64 * 4)()
    assert ctypes.CDLL(str(tmp_path / "k.so")).k(pointers, err) == 0
    run_kernel(kernel(), interpreted)
    for got, want in zip(compiled[3:], interpreted[3:]):
        np.testing.assert_allclose(got, want, rtol=1e-5)


def test_an_instruction_without_a_c_form_is_refused_by_the_c_backend() -> None:
    with pytest.raises(UnsupportedError, match="no c-x86 form for the C backend"):
        print_c(kernel("test_no_c_form", ("v0",), ("v3",)))


def test_unknown_instructions_and_wrong_operands_are_ir_errors() -> None:
    with pytest.raises(IRError, match="unknown instruction 'nope'"):
        print_c(kernel("nope"))
    with pytest.raises(IRError, match="takes 3 inputs and 2 outputs"):
        run_kernel(kernel(inputs=("v0", "v1")), arrays())
    bad = L.Kernel("k", kernel().params, (), (
        L.Let("v0", L.VType(INT32, 8), L.Lit(1)),
        L.Instruction("test_no_c_form", ("v1",), ("v0",))))
    with pytest.raises(IRError, match="takes float32x8, not int32x8 v0"):
        run_kernel(bad, arrays())
