"""Tensor Cores on the cuda targets (pass `tensor_cores`, polytile/loops/warp_mma.py, the
`mma_*` descriptions in polytile/isa): which contractions take them, what the IR records,
that the loop IR is exact in the loop interpreter against the reference interpreter on
sizes that are not multiples of the instruction's tiles (transposed and batched forms
too), and that NVRTC compiles the printed CUDA for sm_80 and sm_90 into code whose PTX
holds the mma.sync instructions. Running it needs a GPU: those tests skip, saying so."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from gpu.cubin import cubin_arch
from gpu.loop_edits import without_barriers

import polytile as pt
from polytile.backends.cuda import NVRTC_FLAGS
from polytile.cli import main as cli_main
from polytile.codegen.cuda import print_cuda
from polytile.codegen.opencl import print_opencl
from polytile.compile import Compiler
from polytile.config import load_config
from polytile.errors import ArgumentError, IRError, UnsupportedError
from polytile.ir.parser import parse_function
from polytile.ir.printer import format_function
from polytile.ir.verify import verify
from polytile.isa import WARP, descriptions, load_description
from polytile.loops import interp
from polytile.loops import nodes as L
from polytile.loops.lower import lower
from polytile.passes.tensor_cores import warp_instructions
from polytile.runtime import cuda as runtime
from polytile.sema.specialize import specialize
from polytile.targets import target as T

NVRTC = runtime.nvrtc_problem()
DEVICE = runtime.device_problem("sm_80")
needs_nvrtc = pytest.mark.skipif(NVRTC is not None, reason=f"compiling CUDA needs {NVRTC}")

TMM16 = ("def tmm16(half(M,K) A, half(N,K) B) -> (C) {\n"
         "  C(m,n) +=! float(A(m,k)) * float(B(n,k))\n}\n")
MM16 = ("def mm16(half(M,K) A, half(K,N) B) -> (C) {\n"        # B read down its columns
        "  C(m,n) +=! float(A(m,k)) * float(B(k,n))\n}\n")
TT16 = ("def tt16(half(K,M) A, half(K,N) B) -> (C) {\n"        # both operands transposed
        "  C(m,n) +=! float(A(k,m)) * float(B(k,n))\n}\n")
BMM16 = ("def bmm16(half(B,M,K) A, half(B,N,K) W) -> (C) {\n"
         "  C(b,m,n) +=! float(A(b,m,k)) * float(W(b,n,k))\n}\n")
BMM16_4D = ("def bmm4(half(G,B,M,K) A, half(G,B,N,K) W) -> (C) {\n"   # batch: grid z + a loop
            "  C(g,b,m,n) +=! float(A(g,b,m,k)) * float(W(g,b,n,k))\n}\n")
TMMBF = ("def tmmbf(bfloat16(M,K) A, bfloat16(N,K) B) -> (C) {\n"
         "  C(m,n) +=! float(A(m,k)) * float(B(n,k))\n}\n")
TMM8 = ("def tmm8(int8(M,K) A, int8(N,K) B) -> (C) {\n"
        "  C(m,n) +=! int32(A(m,k)) * int32(B(n,k))\n}\n")
TMM32 = "def tmm(float(M,K) A, float(N,K) B) -> (C) {\n  C(m,n) +=! A(m,k) * B(n,k)\n}\n"


def function(source: str):  # type: ignore[no-untyped-def]
    return next(iter(pt.define(source, backend="interp")._functions.values()))


def ir(source: str, target: str = "cuda-sm80", options: dict | None = None, **shapes):  # type: ignore[no-untyped-def]
    compiler = Compiler(load_config(), T.inspection_target(target))
    compiler.options = options or {}
    return compiler.ir(specialize(function(source).fn, shapes, {}))


def mma(fn) -> list:  # type: ignore[no-untyped-def]
    return [s.schedule.mma for s in fn.body.stmts if s.schedule.mma is not None]


# ------------------------------------------------------------------ descriptions

WARP_NAMES = ["mma_f16_m16n8k16", "mma_bf16_m16n8k16", "mma_s8_m16n8k32"]


def warp_description(name: str):  # type: ignore[no-untyped-def]
    return next(d for d in descriptions() if d.name == name)


@pytest.mark.parametrize("name", WARP_NAMES)
def test_each_layout_puts_every_element_in_one_threads_registers(name: str) -> None:
    d = warp_description(name).definition
    for operand, t in zip(d.names, d.inputs + d.outputs):
        held = d.held(operand)
        assert held * WARP == t.lanes
        places = [d.place(operand, lane, e) for lane in range(WARP) for e in range(held)]
        assert sorted(places) == list(range(t.lanes))
    # The PTX ISA's m16n8k16 fragments, element by element: thread 5 (group 1, thread 1 in
    # it) holds a's rows 1 and 9, columns 2, 3, 10, 11, and c's row 1 and 9, columns 2, 3.
    if name != "mma_s8_m16n8k32":
        assert [divmod(d.place("a", 5, e), 16) for e in range(8)] == [
            (1, 2), (1, 3), (9, 2), (9, 3), (1, 10), (1, 11), (9, 10), (9, 11)]
        assert [divmod(d.place("acc", 5, e), 8) for e in range(4)] == [
            (1, 2), (1, 3), (9, 2), (9, 3)]
        assert [divmod(d.place("b", 5, e), 16) for e in range(4)] == [   # (n, k)
            (1, 2), (1, 3), (1, 10), (1, 11)]


def test_a_layout_that_misses_an_element_is_refused() -> None:
    text = warp_description("mma_f16_m16n8k16").source.replace(
        "# layout-b: 4: ({lane}/4)*16", "# layout-b: 4: ({lane}/8)*16")
    with pytest.raises(IRError, match="layout of b does not place each"):
        load_description(text, "bad.tc")


def test_the_f16_and_bf16_meanings_are_the_matrix_product() -> None:
    rng = np.random.default_rng(1)
    for name, dt in (("mma_f16_m16n8k16", np.float16), ("mma_bf16_m16n8k16", ml_dtypes.bfloat16)):
        d = warp_description(name).definition
        acc = rng.standard_normal((16, 8)).astype(np.float32)
        a = rng.standard_normal((16, 16)).astype(dt)
        b = rng.standard_normal((8, 16)).astype(dt)
        (got,) = d.meaning(acc.reshape(-1), a.reshape(-1), b.reshape(-1))
        want = acc + a.astype(np.float64) @ b.astype(np.float64).T
        assert np.allclose(got.reshape(16, 8), want, rtol=1e-6, atol=1e-5)


def test_the_s8_meaning_is_exact_and_wraps_like_int32() -> None:
    rng = np.random.default_rng(2)
    d = warp_description("mma_s8_m16n8k32").definition
    acc = np.full((16, 8), 2**31 - 100, np.int32)
    a = rng.integers(-128, 128, (16, 32), dtype=np.int8)
    b = rng.integers(-128, 128, (8, 32), dtype=np.int8)
    (got,) = d.meaning(acc.reshape(-1), a.reshape(-1), b.reshape(-1))
    want = (acc.astype(np.int64) + a.astype(np.int64) @ b.astype(np.int64).T)
    assert np.array_equal(got.reshape(16, 8), want.astype(np.uint32).astype(np.int32))


# ------------------------------------------------------------------ the pass

def test_only_the_cuda_targets_provide_the_warp_instructions() -> None:
    for name in ("cuda-sm80", "cuda-sm90"):
        assert {d.name for d in warp_instructions(T.inspection_target(name))} == set(WARP_NAMES)
    for name in ("opencl", "cpu-avx2", "cpu-avx512", "cpu-generic"):
        assert warp_instructions(T.inspection_target(name)) == []
    assert not T.inspection_target("cpu-avx512").has("tensor_cores")


@pytest.mark.parametrize("source, instruction", [(TMM16, "mma_f16_m16n8k16"),
                                                 (TMMBF, "mma_bf16_m16n8k16"),
                                                 (TMM8, "mma_s8_m16n8k32")])
def test_a_contraction_of_the_instructions_types_gets_a_tile_per_warp(
        source: str, instruction: str) -> None:
    for target in ("cuda-sm80", "cuda-sm90"):
        fn = ir(source, target, A=(64, 48), B=(40, 48))
        (w,) = mma(fn)
        # rows -> m, cols -> n (the output's unit-stride index), reduction -> k
        assert (w.instruction, w.rows, w.cols, w.reduction) == (instruction, "i0", "i1", "i2")
        assert (w.warps_m, w.warps_n, w.tiles_m, w.tiles_n) == (2, 2, 2, 2)
        (s0,) = [s for s in fn.body.stmts if s.schedule.mma is not None]
        assert "tensorized" in s0.tags and "kernel" not in s0.tags
        assert f"schedule(mma({instruction}, i0, i1, i2, 2, 2, 2, 2))" in format_function(fn)


def test_float32_and_opencl_stay_on_the_gpu_mapping() -> None:
    assert mma(ir(TMM32, "cuda-sm90", A=(64, 48), B=(40, 48))) == []
    # A loop of one iteration is no loop for an instruction (the inspector's rule): a
    # 1 x N product stays on CUDA cores.
    assert mma(ir(TMM16, "cuda-sm90", A=(1, 48), B=(40, 48))) == []
    opencl = ir(TMM16, "opencl", A=(64, 48), B=(40, 48))
    assert mma(opencl) == [] and "schedule(grid(" in format_function(opencl)


def test_the_warps_per_block_and_tiles_per_warp_are_the_pass_options() -> None:
    fn = ir(TMM16, "cuda-sm80", {"tensor_cores.warps_m": 4, "tensor_cores.warps_n": 1,
                                 "tensor_cores.tiles_m": 1, "tensor_cores.tiles_n": 3},
            A=(64, 48), B=(40, 48))
    (w,) = mma(fn)
    assert (w.warps_m, w.warps_n, w.tiles_m, w.tiles_n) == (4, 1, 1, 3)
    with pytest.raises(ArgumentError, match="more than a block's 1024 threads"):
        ir(TMM16, "cuda-sm80", {"tensor_cores.warps_m": 8, "tensor_cores.warps_n": 8},
           A=(64, 48), B=(40, 48))
    # 8 x 8 warps of 2 x 2 tiles stage 256 x 128 floats of C: 128 KiB
    with pytest.raises(ArgumentError, match="more than a block's 49152"):
        ir(TMM16, "cuda-sm80", {"tensor_cores.warps_m": 4, "tensor_cores.warps_n": 8,
                                "tensor_cores.tiles_m": 2, "tensor_cores.tiles_n": 2},
           A=(64, 48), B=(40, 48))
    off = ir(TMM16, "cuda-sm80", {"tensor_cores.enabled": False}, A=(64, 48), B=(40, 48))
    assert mma(off) == []


def test_the_schedule_parses_back_and_the_verifier_checks_it() -> None:
    fn = ir(BMM16, "cuda-sm90", A=(3, 37, 29), W=(3, 53, 29))
    assert parse_function(format_function(fn)) == fn
    verify(fn)
    (w,) = mma(fn)
    text = format_function(fn)
    wrong = text.replace(f"mma({w.instruction}, {w.rows}, {w.cols}, {w.reduction}",
                         f"mma({w.instruction}, {w.cols}, {w.reduction}, {w.rows}")
    with pytest.raises(IRError, match="which the instruction does not compute there"):
        verify(parse_function(wrong))
    too_many = text.replace(", 2, 2, 2, 2))", ", 8, 8, 2, 2))")
    with pytest.raises(IRError, match="do not fit a block"):
        verify(parse_function(too_many))


# ------------------------------------------------------------------ exact in the interpreter

def run_loops(source: str, shapes: dict, inputs: list[np.ndarray], target: str = "cuda-sm80",
              options: dict | None = None) -> np.ndarray:
    fn = ir(source, target, options, **shapes)
    assert mma(fn), "the contraction did not go to Tensor Cores"
    out_shape = specialize(function(source).fn, shapes, {}).shape(function(source).fn.outputs[0].name)
    out_dtype = function(source).fn.outputs[0].dtype.numpy
    result = np.full(out_shape, 12345, out_dtype)      # overwritten by the init kernel
    buffers = dict(zip(fn.params, [*inputs, result]))
    interp.run(fn, buffers, lower(fn))
    return buffers[fn.params[-1]]


def small_ints(rng: np.random.Generator, shape: tuple[int, ...], dt) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Integers in [-8, 8]: every product and partial sum is exact in float32, so the
    result does not depend on the order of the additions and must be equal."""
    return rng.integers(-8, 9, shape).astype(dt)


@pytest.mark.parametrize("m, n, k", [(37, 53, 29), (16, 8, 16), (2, 3, 2), (33, 17, 48)])
def test_fp16_tmm_is_exact_on_sizes_that_divide_no_tile(m: int, n: int, k: int) -> None:
    rng = np.random.default_rng(m * 100 + n)
    A, B = small_ints(rng, (m, k), np.float16), small_ints(rng, (n, k), np.float16)
    got = run_loops(TMM16, {"A": (m, k), "B": (n, k)}, [A, B])
    want = function(TMM16)(A, B)                    # the NumPy reference interpreter
    assert got.dtype == np.float32 and np.array_equal(got, want)
    assert np.array_equal(want, (A.astype(np.float64) @ B.astype(np.float64).T))


def test_fp16_on_random_normal_data_is_within_float32_rounding() -> None:
    rng = np.random.default_rng(5)
    A = rng.standard_normal((37, 29)).astype(np.float16)
    B = rng.standard_normal((53, 29)).astype(np.float16)
    got = run_loops(TMM16, {"A": (37, 29), "B": (53, 29)}, [A, B])
    want = A.astype(np.float64) @ B.astype(np.float64).T
    assert np.allclose(got, want, rtol=1e-5, atol=1e-5)
    assert np.allclose(got, function(TMM16)(A, B), rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("source, shapes, operands", [
    (MM16, {"A": (37, 29), "B": (29, 53)}, lambda A, B: (A, B)),
    (TT16, {"A": (29, 37), "B": (29, 53)}, lambda A, B: (A.T, B)),
])
def test_transposed_forms_are_exact(source: str, shapes: dict, operands) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(7)
    A = small_ints(rng, shapes["A"], np.float16)
    B = small_ints(rng, shapes["B"], np.float16)
    got = run_loops(source, shapes, [A, B])
    a, b = operands(A, B)
    assert np.array_equal(got, a.astype(np.float64) @ b.astype(np.float64))
    assert np.array_equal(got, function(source)(A, B))


def test_batched_forms_are_exact() -> None:
    rng = np.random.default_rng(8)
    A, W = small_ints(rng, (3, 19, 21), np.float16), small_ints(rng, (3, 10, 21), np.float16)
    got = run_loops(BMM16, {"A": A.shape, "W": W.shape}, [A, W])
    assert np.array_equal(got, np.einsum("bmk,bnk->bmn", A.astype(np.float64),
                                         W.astype(np.float64)))
    A4, W4 = small_ints(rng, (2, 2, 9, 17), np.float16), small_ints(rng, (2, 2, 5, 17), np.float16)
    got = run_loops(BMM16_4D, {"A": A4.shape, "W": W4.shape}, [A4, W4])
    assert np.array_equal(got, function(BMM16_4D)(A4, W4))


@pytest.mark.parametrize("warps_m, warps_n, tiles_m, tiles_n",
                         [(1, 3, 1, 1), (2, 1, 3, 2), (1, 1, 1, 4)])
def test_other_warp_shapes_are_exact(warps_m: int, warps_n: int, tiles_m: int,
                                     tiles_n: int) -> None:
    rng = np.random.default_rng(9)
    A, B = small_ints(rng, (37, 20), np.float16), small_ints(rng, (45, 20), np.float16)
    options = {"tensor_cores.warps_m": warps_m, "tensor_cores.warps_n": warps_n,
               "tensor_cores.tiles_m": tiles_m, "tensor_cores.tiles_n": tiles_n}
    got = run_loops(TMM16, {"A": A.shape, "B": B.shape}, [A, B], options=options)
    assert np.array_equal(got, function(TMM16)(A, B))


def test_bf16_is_exact_on_small_integers() -> None:
    rng = np.random.default_rng(10)
    A = small_ints(rng, (37, 29), ml_dtypes.bfloat16)
    B = small_ints(rng, (53, 29), ml_dtypes.bfloat16)
    got = run_loops(TMMBF, {"A": A.shape, "B": B.shape}, [A, B], target="cuda-sm90")
    assert np.array_equal(got, function(TMMBF)(A, B))


def test_int8_is_bit_exact_on_full_range_data() -> None:
    rng = np.random.default_rng(11)
    A = rng.integers(-128, 128, (37, 70), dtype=np.int8)
    B = rng.integers(-128, 128, (21, 70), dtype=np.int8)
    got = run_loops(TMM8, {"A": A.shape, "B": B.shape}, [A, B])
    assert np.array_equal(got, (A.astype(np.int64) @ B.astype(np.int64).T).astype(np.int32))


# ------------------------------------------------------------------ barriers in the interpreter

def test_the_interpreter_runs_a_groups_threads_in_lock_step() -> None:
    """The opencl target's staged tmm (barriers in its thread loops) runs in the loop
    interpreter; without its barriers, a thread reads a staged tile before the others
    filled it, and the result shows it."""
    rng = np.random.default_rng(12)
    A = rng.standard_normal((37, 29)).astype(np.float32)
    B = rng.standard_normal((21, 29)).astype(np.float32)
    fn = ir(TMM32, "opencl", A=A.shape, B=B.shape)
    kernel = lower(fn)
    out = np.zeros((37, 21), np.float32)
    buffers = dict(zip(fn.params, [A, B, out]))
    interp.run(fn, buffers, kernel)
    assert np.allclose(buffers[fn.params[2]], A @ B.T, rtol=1e-5, atol=1e-5)

    racy = dataclasses.replace(kernel, body=without_barriers(kernel.body))
    out = np.zeros((37, 21), np.float32)
    buffers = dict(zip(fn.params, [A, B, out]))
    interp.run(fn, buffers, racy)
    assert not np.allclose(buffers[fn.params[2]], A @ B.T, rtol=1e-5, atol=1e-5, equal_nan=False)


def test_threads_that_reach_different_barriers_are_an_error() -> None:
    from polytile.ir.nodes import Affine
    t = "i0"
    kernel = L.Kernel("k", (L.Buffer("b0", pt.dtypes.FLOAT32, 0, param=0),), (), (
        L.Loop(t, Affine.constant(0), Affine.constant(4), (
            L.If((Affine.constant(1) - Affine.index(t),), (L.Barrier("shared"),)),), "thread"),))
    with pytest.raises(IRError, match="reach different barriers"):
        interp.run_kernel(kernel, [np.zeros(1, np.float32)])


# ------------------------------------------------------------------ CUDA: NVRTC, PTX, device

def cuda_text(source: str, target: str, **shapes) -> str:  # type: ignore[no-untyped-def]
    return print_cuda(lower(ir(source, target, **shapes))).text


def test_the_printed_cuda_loads_fragments_through_the_layouts() -> None:
    text = cuda_text(TMM16, "cuda-sm90", A=(37, 29), B=(53, 29))
    # 64 x 32 outputs per block: 1 x 2 blocks over 37 x 53
    assert "pt_k1: 1 x 2 blocks of 128 x 1 threads" in text
    assert "__shared__ uint16_t l0[1024];" in text and "__shared__ float l2[2048];" in text
    # 2 x 2 instructions per warp and step, from 2 fragments of A and 2 of B
    assert text.count('asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32') == 4
    assert text.count("(d1/4 + 8*(pt_e/2%2))*16 + (d1%4)*2 + pt_e%2 + 8*(pt_e/4)") == 2
    assert text.count("__syncthreads();") == 4


def test_opencl_has_no_form_for_a_warp_instruction() -> None:
    fn = ir(TMM16, "cuda-sm80", A=(16, 16), B=(8, 16))
    with pytest.raises(UnsupportedError, match="has no OpenCL form"):
        print_opencl(lower(fn))


@needs_nvrtc
@pytest.mark.parametrize("source, shapes, ptx", [
    (TMM16, {"A": (37, 29), "B": (53, 29)}, "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"),
    (BMM16, {"A": (3, 37, 29), "W": (3, 53, 29)},
     "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"),
    (TMMBF, {"A": (37, 29), "B": (53, 29)},
     "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"),
    (TMM8, {"A": (37, 70), "B": (53, 70)}, "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32"),
])
@pytest.mark.parametrize("arch", [80, 90])
def test_nvrtc_compiles_it_and_the_ptx_runs_mma_sync(source: str, shapes: dict, ptx: str,
                                                     arch: int) -> None:
    text = cuda_text(source, f"cuda-sm{arch}", **shapes)
    cubin, _ = runtime.compile_cubin(text, (f"--gpu-architecture=sm_{arch}", *NVRTC_FLAGS))
    assert cubin_arch(cubin) == arch
    code = runtime.compile_ptx(text, (f"--gpu-architecture=compute_{arch}", *NVRTC_FLAGS))
    assert f".target sm_{arch}" in code
    assert sum(ptx in line for line in code.splitlines()) == 4    # a warp's 2 x 2 tiles


@needs_nvrtc
def test_define_on_a_cuda_target_builds_the_tensor_core_kernel(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    """The call path: a CUBIN in the cache; run where there is a device, else the reason."""
    monkeypatch.setenv("POLYTILE_CACHE_DIR", str(tmp_path))
    rng = np.random.default_rng(13)
    A, B = small_ints(rng, (37, 29), np.float16), small_ints(rng, (53, 29), np.float16)
    tmm = pt.define(TMM16, target="cuda-sm80").tmm16
    if DEVICE is not None:
        with pytest.raises(UnsupportedError, match="no CUDA device"):
            tmm(A, B)
        (source,) = tmp_path.glob("kernels/*/kernel.cu")
        assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in source.read_text()
        (cubin,) = tmp_path.glob("kernels/*/kernel-*.bin")
        assert cubin_arch(cubin.read_bytes()) == 80
        pytest.skip(f"{DEVICE}: the Tensor Core kernel was built, not run")
    assert np.array_equal(tmm(A, B), function(TMM16)(A, B))


@pytest.mark.skipif(DEVICE is not None, reason=f"{DEVICE}")
@pytest.mark.parametrize("source, dt", [(TMM16, np.float16), (TMMBF, ml_dtypes.bfloat16)])
def test_tensor_cores_on_a_device_match_the_reference(source: str, dt) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(14)
    for m, n, k in [(37, 53, 29), (128, 128, 64), (1, 1, 1)]:
        A = rng.standard_normal((m, k)).astype(dt)
        B = rng.standard_normal((n, k)).astype(dt)
        got = pt.define(source, target="cuda-sm80")[function(source).name](A, B)
        want = A.astype(np.float64) @ B.astype(np.float64).T
        assert np.allclose(got, want, rtol=1e-4, atol=1e-3)


# ------------------------------------------------------------------ command line

def test_show_prints_it_and_instructions_lists_it(capsys: pytest.CaptureFixture[str]) -> None:
    path = Path(__file__).with_name("tmm16.tc")        # the file docs/gpu.md shows
    assert path.read_text() == TMM16
    assert cli_main(["show", str(path), "--stage", "cuda", "--target", "cuda-sm90",
                     "--sizes", "M=128,N=128,K=64"]) == 0
    out = capsys.readouterr().out
    assert "mma_f16_m16n8k16 on Tensor Cores, 2x2 warps of 2x2 16x8 tiles per block" in out
    assert "mma.sync.aligned.m16n8k16" in out
    assert cli_main(["instructions"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    for name in WARP_NAMES:
        assert "tensor_cores" in rows[name] and "cuda-sm80,cuda-sm90" in rows[name]
