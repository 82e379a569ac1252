"""Generated C for loads through pointer increments (polytile/passes/ptrinc.py): scalar
and vector code agree with the IR interpreter and with NumPy, on every shipped target,
at sizes that leave partial vectors and register tiles, on non-contiguous inputs; an
out-of-range shift raises the same OutOfBoundsError as without the pass, and the
kernel keeps working afterwards."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from c_harness import FLAGS, CKernel, needs_cc
from conformance.programs import _shift_conv
from conformance.test_conformance import assert_agrees, relayout
from test_vector import LANES, vector_leaves

import polytile as pt
from polytile.codegen import ERR_INDEX
from polytile.codegen.c import COptions, generate_c
from polytile.ir import interp
from polytile.dtypes import FLOAT32
from polytile.ir import nodes as N
from polytile.ir.parser import parse_function
from polytile.ir.printer import format_function
from polytile.sema.specialize import specialize

pytestmark = needs_cc
GOLDEN = Path(__file__).parents[1] / "golden" / "ir"
SHIFT = """def shiftconv(float(N,C,H,W) I, int(C) SH, int(C) SW, float(F,C) Wt) -> (O) {
  O(n,f,h,w) +=! I(n, c, h + 1 + SH(c), w + 1 + SW(c)) * Wt(f,c) where h in 0:H-2, w in 0:W-2
}
"""
TARGETS = [None, "cpu-avx2", "cpu-generic"]
_MODULES: dict[tuple[str | None, bool], pt.Module] = {}


def module(target: str | None, enabled: bool = True) -> pt.Module:
    key = (target, enabled)
    if key not in _MODULES:
        try:
            mod = pt.define(SHIFT, target=target)
        except pt.PolytileError as err:          # a host without AVX2
            pytest.skip(str(err))
        assert mod.compiler is not None
        mod.compiler.options = {} if enabled else {"ptrinc.enabled": False}
        _MODULES[key] = mod
    return _MODULES[key]


def inputs(rng: np.random.Generator, n: int, c: int, h: int, w: int, f: int
           ) -> tuple[np.ndarray, ...]:
    return (rng.standard_normal((n, c, h, w)).astype(np.float32),
            rng.integers(-1, 2, c).astype(np.int32), rng.integers(-1, 2, c).astype(np.int32),
            rng.standard_normal((f, c)).astype(np.float32))


def optimized_ir(mod: pt.Module, args: tuple[np.ndarray, ...]) -> N.Function:
    assert mod.compiler is not None
    fn = mod.shiftconv.fn
    shapes = {p.name: a.shape for p, a in zip(fn.params, args)}
    return mod.compiler.ir(specialize(fn, shapes, {}))


@pytest.mark.parametrize("target", TARGETS, ids=["default", "avx2", "generic"])
def test_shift_convolution_runs_vector_code_through_the_table(target: str | None) -> None:
    mod = module(target)
    for k, size in enumerate([(2, 7, 9, 30, 5), (3, 5, 13, 11, 17), (1, 1, 3, 3, 1)]):
        args = inputs(np.random.default_rng(k), *size)
        want = _shift_conv(*args)
        assert_agrees(mod.shiftconv(*args), want, 1e-5, f"{size}")
        assert_agrees(mod.shiftconv(*args), want, 1e-5, f"{size} (fast path)")
        if k == 0:
            ir = optimized_ir(mod, args)
            (leaf, index), = [(b, i) for b, i in vector_leaves(ir) if "contraction" in b.tags]
            out = next(r for r in leaf.refs if r.dir != "in")
            assert out.access[-1].coeff(index) == 1          # w: the vector index
            assert any(isinstance(s, N.Load) and s.offset for s in leaf.stmts)
            assert mod.compiler is not None
            lanes = LANES[mod.compiler.target.name]
            text = generate_c(ir, COptions(symbol="polytile_kernel")).text
            assert f"vector_size({4 * lanes})" in text and ": vector" in text


@pytest.mark.parametrize("layout", ["f", "strided"])
def test_non_contiguous_inputs(layout: str) -> None:
    args = inputs(np.random.default_rng(4), 2, 6, 10, 21, 3)
    got = module(None).shiftconv(*(relayout(a, layout) for a in args))
    assert_agrees(got, _shift_conv(*args), 1e-5, layout)


def test_same_results_without_the_pass() -> None:
    args = inputs(np.random.default_rng(5), 2, 9, 12, 19, 4)
    with_pass = module(None).shiftconv(*args)
    without = module(None, enabled=False).shiftconv(*args)
    np.testing.assert_allclose(with_pass, without, rtol=1e-5, atol=1e-5)
    reference = pt.define(SHIFT, backend="interp").shiftconv(*args)
    assert_agrees(with_pass, reference, 1e-5, "reference interpreter")


@pytest.mark.parametrize("enabled", [True, False], ids=["ptrinc", "no-ptrinc"])
@pytest.mark.parametrize("which, bad, dim", [("SH", 2, 2), ("SH", -2, 2), ("SW", 2, 3),
                                             ("SW", -9, 3)])
def test_out_of_range_shift_raises_like_without_the_pass(enabled: bool, which: str, bad: int,
                                                         dim: int) -> None:
    mod = module(None, enabled)
    args = list(inputs(np.random.default_rng(6), 2, 5, 8, 9, 3))
    good = tuple(args)
    pos = {"SH": 1, "SW": 2}[which]
    shifts = args[pos].copy()
    shifts[3] = bad
    args[pos] = shifts
    reference = pt.define(SHIFT, backend="interp")
    for fn in (reference.shiftconv, mod.shiftconv, mod.shiftconv):   # checked, then fast path
        with pytest.raises(pt.OutOfBoundsError, match=f"I is indexed at (-?\\d+) in dimension "
                                                      f"{dim}") as info:
            fn(*args)
        value = int(info.value.message.split("indexed at ")[1].split()[0])
        size = 8 if dim == 2 else 9
        assert value < 0 or value >= size
    out = np.full((2, 3, 6, 7), 5.0, np.float32)
    with pytest.raises(pt.OutOfBoundsError):
        mod.shiftconv(*args, out=out)
    assert_agrees(mod.shiftconv(*good, out=out), _shift_conv(*good), 1e-5, "after the error")


def pointer_increments(schedule: N.BlockSchedule) -> N.Function:
    fn = parse_function((GOLDEN / "pointer_increments.ir").read_text())
    stmts = tuple(replace(s, schedule=schedule)
                  if isinstance(s, N.Block) and s.name == "kernel" else s for s in fn.body.stmts)
    return replace(fn, body=replace(fn.body, stmts=stmts))


VECTOR = N.BlockSchedule(micro=True, vector=N.VectorLoop("i", FLOAT32, 4))


@pytest.mark.parametrize("schedule", [N.BlockSchedule(), VECTOR], ids=["scalar", "vector"])
def test_hand_written_table_matches_the_interpreter(tmp_path: Any,
                                                    schedule: N.BlockSchedule) -> None:
    fn = pointer_increments(schedule)
    kernel = CKernel(fn, tmp_path)
    assert ("vector" in kernel.source.text) == (schedule == VECTOR)
    rng = np.random.default_rng(8)
    x, w = rng.standard_normal(9).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    s = np.array([3, 0, 2], np.int32)
    y, want = np.zeros(6, np.float32), np.zeros(6, np.float32)
    assert kernel(x, s, w, y)[0] == 0
    interp.run(fn, {"X": x, "S": s, "W": w, "Y": want})
    np.testing.assert_allclose(y, want, rtol=1e-6)


def test_bounds_block_reports_the_subscript_and_dimension(tmp_path: Any) -> None:
    """The table's check fails with the error code, buffer and dimension of the gather it
    replaces, and a subscript value some iteration of the kernel would have used."""
    mod = module(None)
    args = list(inputs(np.random.default_rng(9), 1, 4, 6, 7, 2))
    args[2] = args[2].copy()
    args[2][0] = 3                            # w + 1 + 3 reaches 4..8 for w in 0..4; W = 7
    ir = optimized_ir(mod, tuple(args))
    assert "#bounds" in format_function(ir)
    kernel = CKernel(ir, tmp_path, flags=FLAGS + ("-march=native",))   # the host's target
    status, err = kernel(*args, np.zeros((1, 2, 4, 5), np.float32))
    assert status == ERR_INDEX and err[:3] == (ERR_INDEX, 0, 3) and err[3] in (7, 8)


def test_failed_check_inside_the_parallel_row_loop(tmp_path: Any) -> None:
    """Large enough for the fused rows to run in OpenMP threads: the tables are private
    to each row, and a failing check in one row still reaches the caller."""
    mod = module(None)
    args = list(inputs(np.random.default_rng(10), 4, 64, 18, 18, 32))
    ir = optimized_ir(mod, tuple(args))
    assert "#pragma omp parallel for" in generate_c(ir, COptions(symbol="k")).text
    assert_agrees(mod.shiftconv(*args), _shift_conv(*args), 1e-5, "parallel rows")
    args[1] = args[1].copy()
    args[1][63] = -5
    with pytest.raises(pt.OutOfBoundsError, match="I is indexed at -"):
        mod.shiftconv(*args)


def test_bench_workload_agrees_with_its_numpy_version() -> None:
    from polytile.bench.contractions import shift_conv
    wl = shift_conv(2, 9, 5, 11, 20)
    args = wl.make_inputs(np.random.default_rng(11))
    got = pt.define(wl.tc)[wl.function](*args)
    np.testing.assert_allclose(got, wl.numpy(*args), rtol=wl.rtol, atol=wl.atol)
    np.testing.assert_allclose(got, _shift_conv(*args), rtol=1e-4, atol=1e-5)
