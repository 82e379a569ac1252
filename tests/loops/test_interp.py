"""The loop IR means what the IR means: every conformance program, lowered for every
target (vector code, boundary versions, transposes, checks), run by the loop IR
interpreter, agrees with its independent NumPy implementation."""
from __future__ import annotations

import numpy as np
import pytest
from conformance.programs import CASES
from conformance.test_conformance import as_tuple, assert_agrees

import polytile as pt
from polytile.compile import Compiler
from polytile.config import load_config
from polytile.loops import interp
from polytile.sema.specialize import specialize
from polytile.targets.target import inspection_target

TARGETS = ("cpu-avx512", "cpu-avx2", "cpu-generic")


def lowered_ir(source: str, function: str, args: tuple, target: str):
    fn = pt.define(source, backend="interp")[function].fn
    shapes = {p.name: np.shape(a) for p, a in zip(fn.params, args) if p.kind == "input"}
    scalars = {p.name: a for p, a in zip(fn.params, args) if p.kind == "scalar"}
    compiler = Compiler(load_config(), inspection_target(target))
    return fn, compiler.ir(specialize(fn, shapes, scalars))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_loop_ir_agrees_with_numpy(case, target):
    rng = np.random.default_rng(0)
    args = case.make_inputs(rng)
    initial = case.make_out(rng, args) if case.make_out else {}
    want = as_tuple(case.numpy_reference(*args, **{k: v.copy() for k, v in initial.items()}))
    fn, ir = lowered_ir(case.source, case.function, args, target)
    names = dict(zip([t.name for t in fn.params + fn.outputs], ir.params))   # in call order
    buffers = {}
    for p, a in zip(fn.params, args):
        buffers[names[p.name]] = np.asarray(a, ir.body.ref(names[p.name]).shape.dtype.numpy)
    for o, w in zip(fn.outputs, want):
        # as the call path allocates: the program's shape (pass collapse may have merged
        # dimensions of the IR's parameter; the interpreter reads the array as those)
        shape = ir.body.ref(names[o.name]).shape
        start = np.zeros(np.shape(w), shape.dtype.numpy)
        buffers[names[o.name]] = np.array(initial.get(o.name, start))
    interp.run(ir, buffers)
    for o, w in zip(fn.outputs, want):
        assert_agrees(buffers[names[o.name]], w, case.tolerance,
                      f"{case.name} on {target}: {o.name}")
