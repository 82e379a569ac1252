"""UNIT's rewriter for lane-dot instructions (pass `tensorize`, polytile/loops/tensorize.py):
which contractions it takes, on which targets, what the IR records, and that the kernels
are exact (int8) or within float32 rounding (bfloat16) on sizes that divide nothing:
rows not a multiple of 4, lanes not a multiple of 16 or of the 256-lane blocks, a
reduction not a multiple of the instruction's group, strided inputs."""
from __future__ import annotations

from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest

import polytile as pt
from polytile.compile import Compiler
from polytile.config import load_config
from polytile.errors import IRError
from polytile.ir import interp as ir_interp
from polytile.ir.parser import parse_function
from polytile.ir.printer import format_function
from polytile.ir.verify import verify
from polytile.loops import interp
from polytile.loops.lower import lower
from polytile.sema.specialize import specialize
from polytile.targets.target import host_features, inspection_target, load_target

I8 = "def mm(uint8(M,K) A, int8(K,N) B) -> (C) {\n  C(m,n) +=! int32(A(m,k)) * int32(B(k,n))\n}"
BF = ("def bmm(bfloat16(M,K) A, bfloat16(K,N) B) -> (C) {\n"
      "  C(m,n) +=! float(A(m,k)) * float(B(k,n))\n}")
CONV = ("def qconv(uint8(N,C,H,W) I, int8(O,C,KH,KW) F) -> (Out) {\n"
        "  Out(n,o,h,w) +=! int32(I(n,c,h+kh,w+kw)) * int32(F(o,c,kh,kw))\n}")
SIZES = [(1, 1, 1), (3, 9, 37), (5, 4, 16), (6, 13, 300), (64, 64, 64), (9, 130, 515)]


def ir(source: str, target, options: dict | None = None, **shapes):  # type: ignore[no-untyped-def]
    fn = next(iter(pt.define(source, backend="interp")._functions.values())).fn
    compiler = Compiler(load_config(), target)
    compiler.options = options or {}
    return compiler.ir(specialize(fn, shapes, {}))


def schedules(fn) -> list:  # type: ignore[no-untyped-def]
    return [s.schedule.tensorize for s in fn.body.stmts if s.schedule.tensorize is not None]


def test_the_widest_instruction_the_target_has_is_chosen() -> None:
    avx512 = inspection_target("cpu-avx512", frozenset())
    (t,) = schedules(ir(I8, avx512, A=(64, 32), B=(32, 48)))
    assert (t.instruction, t.lane, t.reduction) == ("vpdpbusd_512", "i1", "i2")
    avx2 = load_target("cpu-avx2")
    with_vnni = replace(avx2, features=frozenset({"avx2", "fma", "avx_vnni"}))
    assert [t.instruction for t in schedules(ir(I8, with_vnni, A=(8, 8), B=(8, 16)))] == [
        "vpdpbusd_256"]
    without = replace(avx2, features=frozenset({"avx2", "fma"}))
    assert schedules(ir(I8, without, A=(8, 8), B=(8, 16))) == []
    assert schedules(ir(I8, load_target("cpu-generic"), A=(8, 8), B=(8, 16))) == []


def test_the_ir_records_the_mapping_and_threads_and_round_trips() -> None:
    fn = ir(I8, inspection_target("cpu-avx512", frozenset()), A=(512, 256), B=(256, 512))
    text = format_function(fn)
    assert "#tensorized schedule(parallel(i0), tensorize(vpdpbusd_512, i1, i2))" in text
    assert format_function(parse_function(text)) == text
    swapped = text.replace("tensorize(vpdpbusd_512, i1, i2)", "tensorize(vpdpbusd_512, i2, i1)")
    with pytest.raises(IRError, match="does not compute there"):
        verify(parse_function(swapped))


def test_it_can_be_switched_off_and_leaves_other_reductions_alone() -> None:
    avx512 = inspection_target("cpu-avx512", frozenset())
    assert schedules(ir(I8, avx512, {"tensorize.enabled": False}, A=(8, 8), B=(8, 16))) == []
    # a convolution has reductions besides the groups' (c, kh, kw): not lowered yet
    assert schedules(ir(CONV, avx512, I=(1, 8, 6, 6), F=(16, 8, 3, 3))) == []


def test_the_loop_interpreter_runs_the_instruction_descriptions() -> None:
    fn = ir(I8, inspection_target("cpu-avx512", frozenset()), A=(5, 9), B=(9, 20))
    assert schedules(fn)
    rng = np.random.default_rng(1)
    a = rng.integers(0, 256, (5, 9), dtype=np.uint8)
    b = rng.integers(-128, 128, (9, 20), dtype=np.int8)
    loops = {"p0": a, "p1": b, "o0": np.zeros((5, 20), np.int32)}
    blocks = {k: v.copy() for k, v in loops.items()}
    interp.run(fn, loops, lower(fn))
    ir_interp.run(fn, blocks)
    np.testing.assert_array_equal(loops["o0"], blocks["o0"])
    np.testing.assert_array_equal(loops["o0"], a.astype(np.int64) @ b.astype(np.int64))


@pytest.mark.parametrize("m,k,n", SIZES)
def test_int8_kernels_are_exact(m: int, k: int, n: int) -> None:
    mm = pt.define(I8).mm
    rng = np.random.default_rng(m * k * n)
    a = rng.integers(0, 256, (m, k), dtype=np.uint8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    want = (a.astype(np.int64) @ b.astype(np.int64)).astype(np.int32)
    for _ in range(2):                    # the checked path, then the fast path
        np.testing.assert_array_equal(mm(a, b), want)
    # strided and transposed inputs (the call copies them)
    wide = np.zeros((m, 2 * k), np.uint8)
    wide[:, ::2] = a
    np.testing.assert_array_equal(mm(wide[:, ::2], np.asfortranarray(b)), want)


def test_the_int8_kernel_uses_vnni_where_the_host_has_it() -> None:
    if "avx512_vnni" not in host_features():
        pytest.skip("this host has no AVX-512 VNNI")
    mm = pt.define(I8).mm
    a, b = np.ones((4, 8), np.uint8), np.ones((8, 16), np.int8)
    mm(a, b)
    (kernel,) = mm._kernels.values()
    assert "_mm512_dpbusd_epi32" in kernel.source_path.read_text()


@pytest.mark.parametrize("m,k,n", SIZES[1:4])
def test_bfloat16_kernels_round_like_float32(m: int, k: int, n: int) -> None:
    bmm = pt.define(BF).bmm
    rng = np.random.default_rng(k)
    a = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((k, n)).astype(ml_dtypes.bfloat16)
    want = a.astype(np.float64) @ b.astype(np.float64)
    magnitude = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    got = bmm(a, b)
    assert got.dtype == np.float32
    assert np.all(np.abs(got - want) <= magnitude * k * 2.0**-23 + 1e-30)
