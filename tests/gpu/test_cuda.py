"""The CUDA backend on a host without a GPU: the printed CUDA C++ (shared memory, barriers,
blocks and threads; the same loops the OpenCL target runs on PoCL), NVRTC's CUBIN in the
kernel cache, NVRTC errors quoting the generated line, the clear refusal to run without a
device, and, where a device exists, the corpus against NumPy (skipped here, saying why).

The CUDA semantics of the mapping are checked by running its OpenCL twin: the cuda
targets run the opencl target's passes with the same parameters (and warp shuffles,
which OpenCL lacks), and `test_cuda_kernels_are_the_loops_opencl_runs` checks that the
loop IR printed as CUDA, without the shuffles, is the one
tests/conformance/test_opencl.py executes on PoCL against the references."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from conformance.programs import CASES
from conformance.test_conformance import as_tuple, assert_agrees
from gpu.cubin import cubin_arch
from passes.helpers import lowered as stripe

import polytile as pt
from polytile import cli
from polytile.backends import backend_for
from polytile.backends.cuda import CUDAKernel, target_arch
from polytile.compile import Compiler
from polytile.config import Config, load_config
from polytile.errors import ArgumentError, BuildError, UnsupportedError
from polytile.passes.pipeline import run_pipeline
from polytile.passes.tensorize import tensorize
from polytile.runtime import cuda as runtime
from polytile.sema.specialize import specialize
from polytile.targets import target as T

NVRTC = runtime.nvrtc_problem()
DEVICE = runtime.device_problem("sm_90")
needs_nvrtc = pytest.mark.skipif(NVRTC is not None, reason=f"compiling CUDA needs {NVRTC}")
needs_device = pytest.mark.skipif(DEVICE is not None, reason=f"{DEVICE}")

TMM = "def tmm(float(M,K) A, float(N,K) B) -> (C) {\n  C(m,n) +=! A(m,k) * B(n,k)\n}\n"
TBMM = ("def tbmm(float(B,N,M) X, float(B,K,M) Y) -> (Z) {\n"
        "  Z(b,n,k) +=! X(b,n,m) * Y(b,k,m)\n}\n")
SOFTMAX = ("def softmax(float(N,M) X) -> (Y) {\n  mx(n) max=! X(n,m)\n"
           "  e(n,m) = exp(X(n,m) - mx(n))\n  s(n) +=! e(n,m)\n  Y(n,m) = e(n,m) / s(n)\n}\n")
GCONV = ("def gconv(float(N,G,C,H,W) I, float(G,F,C,KH,KW) W1) -> (O) {\n"
         "  O(n,g,o,h,w) +=! I(n,g,c,h+kh,w+kw) * W1(g,o,c,kh,kw)\n}\n")
PROGRAMS = {"tmm": (TMM, {"A": (37, 53), "B": (29, 53)}),
            "tbmm": (TBMM, {"X": (3, 21, 40), "Y": (3, 19, 40)}),
            "softmax": (SOFTMAX, {"X": (7, 100)}),
            "gconv": (GCONV, {"I": (2, 2, 4, 11, 10), "W1": (2, 8, 4, 3, 3)})}


def stage(name: str, target: str, which: str, options: dict | None = None) -> str:
    source, shapes = PROGRAMS[name]
    fn = pt.define(source, backend="interp")[name].fn
    chosen = T.inspection_target(target)
    ir = Compiler(load_config(), chosen, options=options or {}).ir(specialize(fn, shapes, {}))
    return backend_for(chosen).generate(ir, chosen).text(which)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_cuda_kernels_are_the_loops_opencl_runs(name: str) -> None:
    """Except for warp shuffles, which OpenCL lacks (gpu.warp = 0 leaves them out; the
    shuffles' semantics are checked by tests/gpu/test_cuda_warp.py)."""
    assert stage(name, "cuda-sm90", "loops", {"gpu.warp": 0}) == stage(name, "opencl", "loops")


@pytest.mark.parametrize("name", ["tmm", "tbmm", "softmax", "gconv"])
def test_generated_cuda_stages_tiles_in_shared_memory(name: str) -> None:
    text = stage(name, "cuda-sm90", "cuda")
    assert 'extern "C" __global__ void pt_k' in text
    assert "__shared__ float l" in text and "__syncthreads();" in text
    assert "blockIdx.x" in text and "threadIdx.x" in text
    for opencl in ("__local", "barrier(", "get_group_id", "get_local_id", "__global "):
        assert opencl not in text
    if name != "softmax":      # contractions: each thread keeps a register tile
        assert "accumulators of the register tile */" in text


def test_tmm_prints_padded_tiles_and_a_register_tile() -> None:
    text = stage("tmm", "cuda-sm90", "cuda")
    # (the cache compiles programs with canonical names: p0 is A, p1 is B)
    assert "__shared__ float l0[272];  /* p0: staged 16x16 (rows of 17) */" in text
    assert "__shared__ float l1[272];  /* p1: staged 16x16 (rows of 17) */" in text
    assert text.count("__syncthreads();") == 2
    assert "/* pt_k1: 2 x 3 blocks of 8 x 8 threads */" in text
    assert "const int64_t i7 = 0 + (int64_t)threadIdx.x;" in text
    assert "float l2[4] = {0};  /* accumulators of the register tile */" in text


def test_softmax_reduces_across_a_block_by_warp_shuffles() -> None:
    text = stage("softmax", "cuda-sm90", "cuda")
    # 64 threads: five shuffles within each warp of 32, a barrier to pass the two warps'
    # results through shared memory, one shuffle between them; for the max and the sum
    assert "__shared__ float l3[2];  /* partial results of i1 */" in text
    assert text.count("__shfl_xor_sync(0xffffffffu, ") == 12
    assert text.count("__syncthreads();") == 2


def test_softmax_reduces_across_a_block_in_shared_memory_without_warps() -> None:
    text = stage("softmax", "cuda-sm90", "cuda", {"gpu.warp": 0})
    assert "partial results of" in text and "__shfl" not in text
    # 64 threads combine in a tree: a barrier per halving, for the max and the sum
    assert text.count("__syncthreads();") >= 12


def test_show_prints_cuda_on_any_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture) -> None:
    """Printing needs neither NVRTC nor a device."""
    monkeypatch.setattr(runtime, "nvrtc_problem", lambda: "NVRTC (test: none here)")
    source = tmp_path / "tmm.tc"
    source.write_text(TMM)
    assert cli.main(["show", str(source), "--stage", "cuda", "--target", "cuda-sm90",
                     "--sizes", "M=64,K=64,N=64"]) == 0
    out = capsys.readouterr().out
    assert "__global__ void pt_k1(" in out and "__shared__ float" in out


def test_selecting_a_cuda_target_without_nvrtc_says_what_is_missing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "nvrtc_problem", lambda: "NVRTC (No module named cuda)")
    with pytest.raises(ArgumentError, match="needs NVRTC .No module named cuda.") as info:
        T.select_target("cuda-sm80")
    assert "polytile[gpu]" in (info.value.hint or "")


def test_the_architecture_comes_from_the_target_file() -> None:
    assert target_arch(T.load_target("cuda-sm80")) == "sm_80"
    assert target_arch(T.load_target("cuda-sm90")) == "sm_90"
    with pytest.raises(ArgumentError, match="names no CUDA architecture"):
        target_arch(T.load_target("opencl"))
    assert runtime.arch_version("sm_90") == (9, 0) and runtime.arch_version("sm_86") == (8, 6)


def test_the_kernel_takes_arrays_not_addresses() -> None:
    assert CUDAKernel.takes_addresses is False


@needs_nvrtc
def test_an_nvrtc_error_quotes_the_generated_line() -> None:
    source = ('extern "C" __global__ void k(float *x)\n{\n'
              "    x[threadIdx.x] = not_declared;\n}\n")
    with pytest.raises(BuildError) as info:
        runtime.compile_cubin(source, ("--gpu-architecture=sm_90",))
    message = info.value.message
    assert 'kernel.cu(3): error: identifier "not_declared" is undefined' in message
    assert "3 | x[threadIdx.x] = not_declared;" in message
    assert info.value.source_code == source and "not_declared" in info.value.compiler_output


@needs_nvrtc
def test_define_compiles_a_cached_cubin_and_refuses_to_run_without_a_device(
        tmp_path: Path) -> None:
    if DEVICE is None:
        pytest.skip("this host has a CUDA device: the refusal is not reachable")
    config = Config(cache_dir=tmp_path / "cache")
    tmm = pt.define(TMM, target="cuda-sm90", config=config).tmm   # compile-only use works
    A = np.random.default_rng(0).standard_normal((9, 5)).astype(np.float32)
    B = np.random.default_rng(1).standard_normal((7, 5)).astype(np.float32)
    with pytest.raises(UnsupportedError, match="cannot run a CUDA kernel: no CUDA device"):
        tmm(A, B)
    (entry,) = (tmp_path / "cache" / "kernels").iterdir()
    (binary,) = entry.glob("kernel-*.bin")
    assert cubin_arch(binary.read_bytes()) == 90
    assert (entry / "kernel.cu").read_text().startswith("/* Generated by polytile")
    assert "--gpu-architecture=sm_90" in (entry / "meta.json").read_text()


@needs_nvrtc
def test_each_architecture_is_its_own_cache_entry(tmp_path: Path) -> None:
    source, shapes = PROGRAMS["tmm"]
    fn = pt.define(source, backend="interp").tmm.fn
    arches = []
    for name in ("cuda-sm80", "cuda-sm90"):
        built = Compiler(Config(cache_dir=tmp_path), T.inspection_target(name)).build(
            specialize(fn, shapes, {}))
        arches.append(cubin_arch(built.library.so_path.read_bytes()))
    assert arches == [80, 90]
    assert len(list((tmp_path / "kernels").iterdir())) == 2


@needs_device
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_conformance_on_cuda(case) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    args = case.make_inputs(rng)
    initial = case.make_out(rng, args) if case.make_out else {}
    want = as_tuple(case.numpy_reference(*args, **{k: v.copy() for k, v in initial.items()}))
    fn = pt.define(case.source, target="cuda-sm90")[case.function]
    got = as_tuple(fn(*args, out={k: v.copy() for k, v in initial.items()} or None))
    for output, g, w in zip(fn.fn.outputs, got, want):
        assert_agrees(g, w, case.tolerance, f"{case.name}: output {output.name}")


def test_a_cuda_target_asking_for_the_cpu_tensorize_pass_is_pointed_to_tensor_cores() -> None:
    """A cuda target whose passes ask for tensorize (the CPU's lane-dot instructions) gets a
    clear NotImplementedError naming pass tensor_cores."""
    cuda = dataclasses.replace(T.load_target("cuda-sm90"),
                               passes=(("tensorize", ()),) + T.load_target("cuda-sm90").passes)
    fn = stripe(TMM, {"A": (16, 16), "B": (16, 16)})
    with pytest.raises(NotImplementedError, match="Tensor Cores.*through pass tensor_cores"):
        run_pipeline(fn, cuda, {})
    assert tensorize(fn, cuda, {"enabled": False}) is fn


@pytest.mark.skipif(DEVICE is None, reason="this host has a CUDA device")
@pytest.mark.parametrize("command", [["bench", "--quick", "--only", "tmm"],
                                     ["tune", "TMM", "--sizes", "M=8,K=8,N=8", "--budget", "5s"]])
def test_bench_and_tune_refuse_a_cuda_target_without_a_device(
        command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """They would time nothing: refused before any work, saying why."""
    from polytile.bench import command as bench_command
    monkeypatch.setattr(bench_command, "BLAS_ENV_VARS", ())   # never re-run in a child here
    source = tmp_path / "tmm.tc"
    source.write_text(TMM)
    argv = [str(source) if word == "TMM" else word for word in command]
    assert cli.main([*argv, "--target", "cuda-sm90"]) != 0
    assert "cannot run a CUDA kernel: no CUDA device" in capsys.readouterr().err
