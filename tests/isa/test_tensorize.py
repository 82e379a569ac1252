"""UNIT's rewriter for lane-dot instructions (pass `tensorize`, polytile/loops/tensorize.py):
which contractions it takes, on which targets, what the IR records, and that the kernels
are exact (int8) or within float32 rounding (bfloat16) on sizes that divide nothing:
rows not a multiple of 4, lanes not a multiple of 16 or of the 64-lane blocks, a
reduction not a multiple of the instruction's group, strided inputs."""
from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import polytile as pt
from polytile.api import Module
from polytile.codegen.c import print_c
from polytile.compile import Compiler
from polytile.config import load_config
from polytile.errors import IRError
from polytile.ir import interp as ir_interp
from polytile.ir.nodes import Affine
from polytile.ir.parser import parse_function
from polytile.ir.printer import format_function
from polytile.ir.verify import verify
from polytile.lang.parser import parse
from polytile.loops import interp
from polytile.loops import nodes as L
from polytile.loops.lower import lower
from polytile.loops.text import kernel_text
from polytile.passes.pipeline import check_pass_options
from polytile.passes.tensorize import ROWS
from polytile.sema.analyze import analyze
from polytile.sema.specialize import specialize
from polytile.targets.target import host_features, inspection_target, load_target, select_target

I8 = "def mm(uint8(M,K) A, int8(K,N) B) -> (C) {\n  C(m,n) +=! int32(A(m,k)) * int32(B(k,n))\n}"
BF = ("def bmm(bfloat16(M,K) A, bfloat16(K,N) B) -> (C) {\n"
      "  C(m,n) +=! float(A(m,k)) * float(B(k,n))\n}")
CONV = ("def qconv(uint8(N,C,H,W) I, int8(O,C,KH,KW) F) -> (Out) {\n"
        "  Out(n,o,h,w) +=! int32(I(n,c,h+kh,w+kw)) * int32(F(o,c,kh,kw))\n}")
S8 = "def mm(int8(M,K) A, int8(K,N) B) -> (C) {\n  C(m,n) +=! int32(A(m,k)) * int32(B(k,n))\n}"
S16 = ("def mm(int16(M,K) A, int16(K,N) B) -> (C) {\n"
       "  C(m,n) +=! int32(A(m,k)) * int32(B(k,n))\n}")
BATCHED = ("def bmm(int8(B,M,K) A, uint8(K,N) W) -> (C) {\n"
           "  C(b,m,n) +=! int32(A(b,m,k)) * int32(W(k,n))\n}")
GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "loops"
# An AVX-512 VNNI and BF16 machine without AMX (Cooper Lake; AMX's tiles take these
# matmuls where the target has them: tests/isa/test_amx.py).
VNNI_XEON = replace(inspection_target("cpu-avx512", frozenset()), features=frozenset(
    f for f in inspection_target("cpu-avx512", frozenset()).features if not f.startswith("amx")))
SIZES = [(1, 1, 1), (3, 9, 37), (5, 4, 16), (6, 13, 300), (64, 64, 64), (9, 130, 515)]


def ir(source: str, target, options: dict | None = None, **shapes):  # type: ignore[no-untyped-def]
    fn = next(iter(pt.define(source, backend="interp")._functions.values())).fn
    compiler = Compiler(load_config(), target)
    compiler.options = options or {}
    return compiler.ir(specialize(fn, shapes, {}))


def schedules(fn) -> list:  # type: ignore[no-untyped-def]
    return [s.schedule.tensorize for s in fn.body.stmts if s.schedule.tensorize is not None]


def test_the_widest_instruction_the_target_has_is_chosen() -> None:
    avx512 = VNNI_XEON
    (t,) = schedules(ir(I8, avx512, A=(64, 32), B=(32, 48)))
    assert (t.instruction, t.lane, t.reduction) == ("vpdpbusd_512", "i1", "i2")
    avx2 = load_target("cpu-avx2")
    with_vnni = replace(avx2, features=frozenset({"avx2", "fma", "avx_vnni"}))
    assert [t.instruction for t in schedules(ir(I8, with_vnni, A=(8, 8), B=(8, 16)))] == [
        "vpdpbusd_256"]
    # without AVX-VNNI: vpmaddwd, which has no accumulator operand, on widened operands
    without = replace(avx2, features=frozenset({"avx2", "fma"}))
    assert [t.instruction for t in schedules(ir(I8, without, A=(8, 8), B=(8, 16)))] == [
        "vpmaddwd_256"]
    assert schedules(ir(I8, load_target("cpu-generic"), A=(8, 8), B=(8, 16))) == []


def test_the_ir_records_the_mapping_and_threads_and_round_trips() -> None:
    fn = ir(I8, VNNI_XEON, A=(512, 256), B=(256, 512))
    text = format_function(fn)
    assert "#tensorized schedule(parallel(i0), first(), tensorize(vpdpbusd_512, i1, i2, 6, 4, kept))" in text
    assert format_function(parse_function(text)) == text
    swapped = text.replace("tensorize(vpdpbusd_512, i1, i2, 6, 4, kept)",
                           "tensorize(vpdpbusd_512, i2, i1, 6, 4, kept)")
    with pytest.raises(IRError, match="does not compute there"):
        verify(parse_function(swapped))
    empty = text.replace("tensorize(vpdpbusd_512, i1, i2, 6, 4, kept)",
                         "tensorize(vpdpbusd_512, i1, i2, 0, 4, kept)")
    with pytest.raises(IRError, match="register tile 0 x 4 is empty"):
        verify(parse_function(empty))


def test_the_init_of_zeros_folds_into_the_tensorized_tiles() -> None:
    """Pass fold: the tiles' sums start at 0 and are stored, so the init that zeroed the
    output (4 MiB of stores at 1024^2, then read back) runs nowhere; the verifier proves
    the fold again, and a first() without its init is refused."""
    fn = ir(I8, VNNI_XEON, A=(40, 70), B=(70, 90))
    text = format_function(fn)
    assert "folded(s0)" in text and "first(), tensorize(vpdpbusd_512" in text
    loops = kernel_text(lower(fn))
    assert "# block s0_init: made by the first writes of s0" in loops
    assert "var acc0: int32x16 = 0" in loops and "int32x16 = b2[" not in loops
    with pytest.raises(IRError, match="first\\(...\\) without an init"):
        verify(parse_function(text.replace(" schedule(folded(s0))", "")))
    off = ir(I8, VNNI_XEON, {"fold.enabled": False},
             A=(40, 70), B=(70, 90))
    assert "first()" not in format_function(off)


def test_the_register_tile_fits_the_target_s_vector_registers() -> None:
    """Accumulators, one broadcast row and one result in registers: 6 x 4 of AVX-512's
    32 (with the 4 chunks of the packed operand, 29; a seventh row would spill), 3 x 4 of
    AVX2's 16."""
    avx512 = VNNI_XEON
    avx2 = replace(load_target("cpu-avx2"), features=frozenset({"avx2", "fma", "avx_vnni"}))
    for target, tile in ((avx512, (6, 4)), (avx2, (3, 4)), (AVX2_ONLY, (3, 4))):
        (t,) = schedules(ir(I8, target, A=(64, 32), B=(32, 48)))
        assert (t.rows, t.chains) == tile
        assert t.rows * t.chains + 2 <= target.vector_registers
        assert t.rows == ROWS or (t.rows + 1) * t.chains + 2 > target.vector_registers


def test_it_can_be_switched_off() -> None:
    avx512 = VNNI_XEON
    assert schedules(ir(I8, avx512, {"tensorize.enabled": False}, A=(8, 8), B=(8, 16))) == []
    assert schedules(ir(CONV, avx512, {"tensorize.enabled": False}, I=(1, 8, 6, 6),
                        F=(16, 8, 3, 3))) == []


def test_the_loop_interpreter_runs_the_instruction_descriptions() -> None:
    fn = ir(I8, VNNI_XEON, A=(5, 9), B=(9, 20))
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


@pytest.mark.parametrize("m,k,n", [(3, 9, 37), (9, 130, 515)])
def test_int8_kernels_on_avx_vnni_are_exact(m: int, k: int, n: int) -> None:
    """cpu-avx2 where the host has AVX-VNNI (the VEX-encoded vpdpbusd on ymm; AMD's Zen 5
    EPYCs have it): the matmul runs on it, bit-exact on full-range data."""
    if not {"avx2", "fma", "avx_vnni"} <= host_features():
        pytest.skip("this host has no AVX-VNNI: its kernels are compiled, not run, in "
                    "tests/isa/test_tensorize_conv.py")
    mm = pt.define(I8, target="cpu-avx2").mm
    rng = np.random.default_rng(m + k + n)
    a = full_range(rng, np.uint8, (m, k))
    b = full_range(rng, np.int8, (k, n))
    want = (a.astype(np.int64) @ b.astype(np.int64)).astype(np.int32)
    np.testing.assert_array_equal(mm(a, b), want)
    (kernel,) = mm._kernels.values()
    assert "_mm256_dpbusd_avx_epi32" in kernel.source_path.read_text()


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


# ---------------------------------------------------------------- vpmaddwd (AVX2, no VNNI)

AVX2_ONLY = replace(load_target("cpu-avx2"), features=frozenset({"avx2", "fma"}))


def avx2_only(source: str) -> pt.Module:
    """`source` compiled for cpu-avx2 without AVX-VNNI, whatever else the host has (a host
    with AVX-VNNI would otherwise take vpdpbusd)."""
    if not {"avx2", "fma"} <= host_features():
        pytest.skip("this host has no AVX2 and FMA to run cpu-avx2 kernels")
    module = pt.define(source, target="cpu-avx2")
    assert module.compiler is not None
    module.compiler.target = replace(module.compiler.target,
                                     features=module.compiler.target.features - {"avx_vnni"})
    return module


def full_range(rng: np.random.Generator, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)


def test_vpmaddwd_runs_u8_s8_s8_s8_and_s16_matmuls_and_the_ir_round_trips() -> None:
    for source in (I8, S8, S16):
        fn = ir(source, AVX2_ONLY, A=(64, 48), B=(48, 40))
        (t,) = schedules(fn)
        assert (t.instruction, t.lane, t.reduction) == ("vpmaddwd_256", "i1", "i2")
        text = format_function(fn)
        assert format_function(parse_function(text)) == text
        verify(parse_function(text))


def test_the_vpmaddwd_loops_widen_at_packing_and_add_the_result() -> None:
    """Golden loop IR (POLYTILE_UPDATE_GOLDEN=1 to accept a deliberate change): both
    operands packed as int16 (B in groups of pairs, A's rows too, so a row's pair is one
    word), vpmaddwd on the pairs, its result added to the accumulator."""
    fn = ir(I8, AVX2_ONLY, A=(5, 9), B=(9, 20))
    kernel = lower(fn)
    text = kernel_text(kernel)
    path = GOLDEN / "i8mm_vpmaddwd_avx2.loops"
    if os.environ.get("POLYTILE_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), "the loop IR changed; see the docstring"
    assert "vpmaddwd_256" in text and "cast" in text
    c = print_c(kernel).text
    assert "_mm256_madd_epi16" in c and "dpbusd" not in c
    # the accumulator adds as unsigned lanes: it wraps, as int32 sums do in NumPy
    assert "(pt_v_int32x8)((pt_v_uint32x8)acc0 + (pt_v_uint32x8)" in c


@pytest.mark.parametrize("source", [I8, S8, S16])
def test_the_loop_interpreter_runs_vpmaddwd_exactly(source: str) -> None:
    fn = ir(source, AVX2_ONLY, A=(6, 13), B=(13, 21))
    assert schedules(fn)
    rng = np.random.default_rng(3)
    types = {I8: (np.uint8, np.int8), S8: (np.int8, np.int8), S16: (np.int16, np.int16)}
    a_t, b_t = types[source]
    a, b = full_range(rng, a_t, (6, 13)), full_range(rng, b_t, (13, 21))
    buffers = {"p0": a, "p1": b, "o0": np.zeros((6, 21), np.int32)}
    interp.run(fn, buffers, lower(fn))
    want = (a.astype(np.int64) @ b.astype(np.int64)).astype(np.int32)     # mod 2^32
    np.testing.assert_array_equal(buffers["o0"], want)


# (100, 70, 300): threads over panels of 30 rows, the last one short, a row left over,
# four 64-lane blocks and a tail of 44 lanes
@pytest.mark.parametrize("m,k,n", [*SIZES, (100, 70, 300)])
def test_vpmaddwd_int8_kernels_are_exact(m: int, k: int, n: int) -> None:
    mm = avx2_only(I8).mm
    rng = np.random.default_rng(m * k * n + 1)
    a = full_range(rng, np.uint8, (m, k))
    b = full_range(rng, np.int8, (k, n))
    want = (a.astype(np.int64) @ b.astype(np.int64)).astype(np.int32)
    for _ in range(2):                    # the checked path, then the fast path
        np.testing.assert_array_equal(mm(a, b), want)
    # strided, transposed and negatively strided inputs
    wide = np.zeros((m, 3 * k), np.uint8)
    wide[:, ::3] = a
    np.testing.assert_array_equal(mm(wide[:, ::3], np.asfortranarray(b)), want)
    np.testing.assert_array_equal(mm(a[::-1], b[:, ::-1]), want[::-1, ::-1])
    # (a loop of one iteration is no lane or group loop: 1x1x1 stays scalar)
    assert all(("_mm256_madd_epi16" in kernel.source_path.read_text()) == (min(k, n) > 1)
               for kernel in mm._kernels.values())


def test_vpmaddwd_extremes_and_int32_wrap_are_exact() -> None:
    """The largest products (255 * -128, -128 * -128, -32768 * -32768: a pair of those
    sums to 2^31, which wraps in vpmaddwd's lane as in an int32 sum), and a reduction long
    enough that the int32 sum wraps: equal to NumPy's int64 result mod 2^32."""
    k = 70001                             # 255 * 128 * k > 2^31
    mm = avx2_only(I8).mm
    a = np.full((3, k), 255, np.uint8)
    b = np.full((k, 9), -128, np.int8)
    want = (a.astype(np.int64) @ b.astype(np.int64)).astype(np.int32)
    assert (want != a.astype(np.int64) @ b.astype(np.int64)).all()      # it did wrap
    np.testing.assert_array_equal(mm(a, b), want)
    s8 = avx2_only(S8).mm
    c = np.full((2, 37), -128, np.int8)
    np.testing.assert_array_equal(s8(c, c.T.copy()), np.full((2, 2), 37 * 16384, np.int32))
    s16 = avx2_only(S16).mm
    d = np.full((2, 4), -32768, np.int16)
    got = s16(d, d.T.copy())
    np.testing.assert_array_equal(got, (d.astype(np.int64) @ d.T.astype(np.int64))
                                  .astype(np.int32))
    rng = np.random.default_rng(7)
    e, f = full_range(rng, np.int16, (7, 300)), full_range(rng, np.int16, (300, 19))
    np.testing.assert_array_equal(s16(e, f), (e.astype(np.int64) @ f.astype(np.int64))
                                  .astype(np.int32))


@pytest.mark.parametrize("b,m,k,n", [(3, 5, 17, 23), (1, 1, 5, 9), (2, 1, 7, 33),
                                     (3, 7, 19, 45)])
def test_a_batched_matmul_widens_the_rows_of_its_own_batch(b: int, m: int, k: int,
                                                           n: int) -> None:
    """A broadcast operand that depends on an outer output loop (the batch): its packed
    rows are (b, m) pairs; batches and rows of one are no loops."""
    bmm = avx2_only(BATCHED).bmm
    rng = np.random.default_rng(b * m * k * n)
    a = full_range(rng, np.int8, (b, m, k))
    w = full_range(rng, np.uint8, (k, n))
    want = np.einsum("bmk,kn->bmn", a.astype(np.int64), w.astype(np.int64)).astype(np.int32)
    np.testing.assert_array_equal(bmm(a, w), want)
    (kernel,) = bmm._kernels.values()
    assert "_mm256_madd_epi16" in kernel.source_path.read_text()


def parallel_loops(stmts: tuple) -> list[L.Loop]:  # type: ignore[type-arg]
    """The loops of a kernel's loop IR that run in threads, outermost first."""
    found: list[L.Loop] = []
    for st in stmts:
        if isinstance(st, L.Loop) and st.kind == "parallel":
            found.append(st)
        if isinstance(st, (L.Loop, L.Alloc, L.Kept)):
            found += parallel_loops(st.body)
    return found


def test_threads_take_panels_of_rows_through_every_column_block() -> None:
    """One parallel region per call: the 341 3-row tiles in 36 panels of 9 or 10 tiles
    (about 30 rows, a multiple of four panels so that one, two or four threads share them
    evenly), each panel through all sixteen 64-lane blocks; the row left over runs
    serially."""
    fn = ir(I8, AVX2_ONLY, A=(1024, 64), B=(64, 1024))
    assert [(t.rows, t.chains) for t in schedules(fn)] == [(3, 4)]
    tensorized = [loop for loop in parallel_loops(lower(fn).body)
                  if any(isinstance(s, L.Loop) and s.step == 64 for s in loop.body)]
    assert len(tensorized) == 1 and tensorized[0].hi == Affine.constant(36)
    (columns,) = [s for s in tensorized[0].body if isinstance(s, L.Loop)]
    (rows,) = [s for s in columns.body if isinstance(s, L.Loop)]
    p = Affine.index(tensorized[0].var)
    assert (rows.lo, rows.hi) == (L.IDiv(p.scale(341), 36), L.IDiv((p + 1).scale(341), 36))
    spans = [(k * 341 // 36, (k + 1) * 341 // 36) for k in range(36)]
    assert {b - a for a, b in spans} == {9, 10} and spans[-1][1] == 341


# UNIT §IV-B: the tuner's genes of pass tensorize (polytile.tune.choices).
SETTINGS = [{"tensorize.rows": 4, "tensorize.chains": 2},
            {"tensorize.mapping": 1, "tensorize.rows": 3, "tensorize.chains": 1},
            pytest.param({"tensorize.mapping": 1}, marks=pytest.mark.slow),
            pytest.param({"tensorize.rows": 2, "tensorize.parallel": False},
                         marks=pytest.mark.slow)]


def test_the_tuning_options_pick_the_mapping_the_register_tile_and_the_threads() -> None:
    """The layable mappings in order, the widest instruction first (a mapping past the
    last is the last); the register tile as given (rows 0: as many as the registers
    hold beside the chains); threads over the outer loop or none."""
    avx512 = VNNI_XEON

    def tile(options: dict):  # type: ignore[no-untyped-def]
        fn = ir(I8, avx512, options, A=(512, 256), B=(256, 512))
        (block,) = [s for s in fn.body.stmts if s.schedule.tensorize is not None]
        return block.schedule.tensorize, block.schedule.parallel

    (first, threads), (second, _) = tile({}), tile({"tensorize.mapping": 1})
    assert (first.instruction, second.instruction) == ("vpdpbusd_512", "vpmaddwd_512")
    assert (second.lane, second.reduction) == ("i1", "i2") and threads == "i0"
    assert tile({"tensorize.mapping": 9})[0] == second
    assert tile({"tensorize.rows": 3, "tensorize.chains": 2})[0] == replace(first, rows=3,
                                                                          chains=2)
    assert tile({"tensorize.chains": 2})[0].rows == ROWS
    assert tile({"tensorize.parallel": False}) == (first, None)
    conv = ir(CONV, avx512, {"tensorize.mapping": 1}, I=(1, 64, 16, 16), F=(64, 64, 3, 3))
    assert [t.instruction for t in schedules(conv)] == ["vpmaddwd_512"]


@pytest.mark.parametrize("bad", [{"tensorize.rows": -1}, {"tensorize.rows": 13},
                                 {"tensorize.chains": 0}, {"tensorize.mapping": "x"},
                                 {"tensorize.parallel": 1}])
def test_tuning_options_from_outside_are_checked(bad: dict) -> None:
    with pytest.raises(pt.ArgumentError, match="option tensorize"):
        check_pass_options(bad, VNNI_XEON)


@pytest.mark.parametrize("options", SETTINGS)
def test_every_tuning_setting_is_exact(options: dict) -> None:
    """In the loop interpreter on cpu-avx512 and cpu-avx2 (the instructions' TC meaning,
    on any host), and compiled for this host, on sizes that divide no tile."""
    rng = np.random.default_rng(len(str(options)))
    a = full_range(rng, np.uint8, (13, 70))
    b = full_range(rng, np.int8, (70, 37))
    x = full_range(rng, np.uint8, (1, 19, 9, 8))
    w = full_range(rng, np.int8, (21, 19, 3, 2))
    want_mm = a.astype(np.int64) @ b.astype(np.int64)
    want_conv = np.zeros((1, 21, 7, 7), np.int64)
    for r in range(3):
        for s in range(2):
            want_conv += np.einsum("nchw,kc->nkhw", x[:, :, r:r + 7, s:s + 7].astype(np.int64),
                                   w[:, :, r, s].astype(np.int64))
    cases = [(I8, {"A": a, "B": b}, want_mm), (CONV, {"I": x, "F": w}, want_conv)]
    for target in (VNNI_XEON, AVX2_ONLY):
        for source, arrays, want in cases:
            fn = ir(source, target, options, **{k: v.shape for k, v in arrays.items()})
            assert schedules(fn)
            data = {f"p{k}": v for k, v in enumerate(arrays.values())}
            data["o0"] = np.zeros(want.shape, np.int32)
            interp.run(fn, data, lower(fn))
            np.testing.assert_array_equal(data["o0"], want.astype(np.int32))
    for source, arrays, want in cases:
        program = analyze(parse(source))
        compiler = Compiler(load_config(), select_target(), options)
        (fn,) = Module(source, program, "c", compiler)._functions.values()
        np.testing.assert_array_equal(fn(*arrays.values()), want.astype(np.int32))


def test_kept_weights_over_a_mebibyte_are_compared_by_the_threads() -> None:
    """A kept operand is compared with its copy in chunks of 1 MiB by the threads (one
    thread read 64 MiB a call for a 4096^2 bf16 weight): a change in any chunk, the last
    byte's included, is packed again; every result exact."""
    mm = pt.define(I8).mm
    rng = np.random.default_rng(11)
    a = full_range(rng, np.uint8, (64, 1024))
    b = full_range(rng, np.int8, (1024, 1100))          # 1.07 MiB: two chunks

    def check() -> None:
        want = (a.astype(np.int64) @ b.astype(np.int64)).astype(np.int32)
        np.testing.assert_array_equal(mm(a, b), want)
    check()
    for at in ((1023, 1099), (0, 0), (953, 600)):        # the second chunk, the first
        b[at] = 127 if b[at] != 127 else -128
        check()
    (kernel,) = mm._kernels.values()
    assert "reduction(&&:pt_kept_" in kernel.source_path.read_text()


def test_a_matmul_of_few_rows_runs_its_blocks_of_lanes_in_threads() -> None:
    """128 rows, 1024 lanes: threads over the 64-lane blocks (each thread reads its share
    of the packed operand once, every row passing a block while it is in L2) instead of
    over panels of rows (each of which streams all of it); 512 rows stay on panels. The
    results are exact either way, on sizes that divide no tile or block."""
    avx512 = VNNI_XEON

    def parallel(m: int, n: int) -> tuple[str | None, str]:
        fn = ir(I8, avx512, A=(m, 256), B=(256, n))
        (block,) = [s for s in fn.body.stmts if s.schedule.tensorize is not None]
        return block.schedule.parallel, block.schedule.tensorize.lane

    index, lane = parallel(128, 1024)
    assert index == lane
    index, lane = parallel(512, 1024)
    assert index is not None and index != lane
    fn = ir(I8, avx512, A=(128, 256), B=(256, 1024))
    # the 21 tiles of 6 rows, then the 2 rows left over, each over the blocks in threads
    assert [(lp.kind, lp.step) for lp in parallel_loops(lower(fn).body)] == \
        [("parallel", 64)] * 2
    mm = pt.define(I8).mm
    rng = np.random.default_rng(5)
    a, b = full_range(rng, np.uint8, (131, 257)), full_range(rng, np.int8, (257, 1100))
    np.testing.assert_array_equal(mm(a, b), (a.astype(np.int64) @ b.astype(np.int64))
                                  .astype(np.int32))
