"""The OpenCL side of the GPU backend: launches derived from the loop IR, the printed
OpenCL C (on any host: printing needs no device), the target's refusal where no device
works, and the cache entry that keeps the device binary. Running the kernels against the
references is tests/conformance/test_opencl.py."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import polytile as pt
from polytile import cli
from polytile.backends.opencl import lowered
from polytile.codegen.opencl import print_opencl
from polytile.compile import kernel_cache
from polytile.config import Config
from polytile.errors import ArgumentError
from polytile.loops.launch import launches
from polytile.passes.gpu import gpu
from polytile.runtime import opencl as runtime
from polytile.targets import target as T

from passes.helpers import lowered as stripe
from passes.helpers import target

TMM = "def tmm(float(M,K) A, float(N,K) B) -> (C) {\n  C(m,n) +=! A(m,k) * B(n,k)\n}\n"


def tmm_kernel(m: int = 37, n: int = 29, k: int = 53):  # type: ignore[no-untyped-def]
    fn = gpu(stripe(TMM, {"A": (m, k), "B": (n, k)}), target("opencl"), {})
    return lowered(fn)


def test_each_statement_is_one_launch_with_the_mapped_sizes() -> None:
    init, product = launches(tmm_kernel())
    # x is the innermost mapped index (n: 29 in 4 groups of 8), y is m (37 in 5 of 8)
    assert (init.groups, init.threads) == ((4, 5), (8, 8))
    # the product's work-items compute 2 x 2 points each: groups of 16 x 16 points
    assert (product.groups, product.threads) == ((2, 3), (8, 8))
    assert sorted(kind for _, kind, _ in product.dims) == ["grid", "grid", "thread", "thread"]


def test_a_reduction_into_a_scalar_runs_across_one_work_group() -> None:
    fn = gpu(stripe("def dot(float(N) x, float(N) y) -> (d) {\n  d +=! x(i) * y(i)\n}\n",
                    {"x": (77,), "y": (77,)}), target("opencl"), {})
    init, dot = launches(lowered(fn))
    assert (init.groups, init.threads) == ((1,), (1,))       # d = 0: one work-item
    assert (dot.groups, dot.threads) == ((1,), (64,))
    text = print_opencl(lowered(fn)).text
    assert "__local float l0[64];  /* partial results of i */" in text
    assert text.count("barrier(CLK_LOCAL_MEM_FENCE);") == 7     # 64 -> 32 -> ... -> 1


def test_a_block_without_parallel_indices_runs_in_one_work_item() -> None:
    fn = gpu(stripe("def total(float(M,N) A) -> (s) {\n  s +=! A(i, j)\n}\n",
                    {"A": (7, 9)}), target("opencl"), {})
    (single,) = launches(lowered(fn))          # s = 0 and the sum, one after the other
    assert (single.groups, single.threads) == ((1,), (1,))


def test_staged_tmm_prints_local_tiles_barriers_and_register_tiles() -> None:
    text = print_opencl(tmm_kernel()).text
    # 16 x 16 boxes, rows padded to 17 against bank conflicts
    assert "__local float l0[272];  /* A: staged 16x16 (rows of 17) */" in text
    assert "__local float l1[272];  /* B: staged 16x16 (rows of 17) */" in text
    assert "l0[17*i6 + i8 + 136*i9 - i11]" in text
    assert text.count("barrier(CLK_LOCAL_MEM_FENCE);") == 2
    assert "get_group_id(1)" in text and "get_local_id(0)" in text
    # the 2 x 2 accumulators are a private array, added to C once per element
    assert "float l2[4] = {0};  /* accumulators of the register tile */" in text
    assert "l2[2*i9 + i10] += s7;" in text and "const float s8 = l2[2*i9 + i10];" in text
    assert "b2[" in text and "+= s8;" in text


def test_without_padding_the_staged_rows_are_the_data_s() -> None:
    fn = gpu(stripe(TMM, {"A": (37, 53), "B": (29, 53)}), target("opencl"), {"pad": 0})
    text = print_opencl(lowered(fn)).text
    assert "__local float l0[256];  /* A: staged 16x16 */" in text


def test_without_staging_and_reductions_across_there_is_no_local_memory() -> None:
    fn = gpu(stripe(TMM, {"A": (37, 53), "B": (29, 53)}), target("opencl"),
             {"tile_k": 0, "reduce": 0})
    text = print_opencl(lowered(fn)).text
    assert "__local" not in text and "barrier(" not in text


def test_show_prints_the_kernel_on_any_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(runtime, "device_problem", lambda: "pyopencl (test: none here)")
    monkeypatch.setenv("POLYTILE_CACHE_DIR", str(tmp_path / "cache"))
    source = tmp_path / "tmm.tc"
    source.write_text(TMM)
    assert cli.main(["show", str(source), "--stage", "opencl", "--target", "opencl",
                     "--sizes", "M=64,K=64,N=64"]) == 0
    out = capsys.readouterr().out
    assert "__kernel void pt_k1(" in out and "__local float" in out and "barrier(" in out


def test_selecting_the_target_without_a_device_says_what_is_missing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "device_problem", lambda: "pyopencl (No module named x)")
    with pytest.raises(ArgumentError, match="needs pyopencl .No module named x.") as info:
        T.select_target("opencl")
    assert "polytile[gpu]" in (info.value.hint or "")


@pytest.mark.skipif(runtime.device_problem() is not None,
                    reason=f"the opencl target needs {runtime.device_problem()}")
def test_a_kernel_is_loaded_again_from_its_cached_device_binary(tmp_path: Path) -> None:
    config = Config(cache_dir=tmp_path / "cache")
    A = np.random.default_rng(0).standard_normal((9, 5)).astype(np.float32)
    B = np.random.default_rng(1).standard_normal((7, 5)).astype(np.float32)
    first = pt.define(TMM, target="opencl", config=config).tmm(A, B)
    kernel_cache(config).clear_memory()
    entries = list((tmp_path / "cache" / "kernels").iterdir())
    assert len(entries) == 1 and len(list(entries[0].glob("kernel-*.bin"))) == 1
    assert (entries[0] / "kernel.cl").read_text().startswith("/* Generated by polytile")
    again = pt.define(TMM, target="opencl", config=config).tmm(A, B)
    np.testing.assert_array_equal(first, again)
    np.testing.assert_allclose(again, A @ B.T, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(runtime.device_problem() is not None,
                    reason=f"the opencl target needs {runtime.device_problem()}")
def test_float64_on_a_device_without_fp64_is_refused_clearly(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    from polytile.errors import UnsupportedError
    device = dataclasses.replace(runtime.opencl_device(), fp64=False)
    monkeypatch.setattr(runtime, "opencl_device", lambda: device)
    with pytest.raises(UnsupportedError, match="lacks cl_khr_fp64"):
        runtime.build_program("__kernel void k(__global double *x) { x[0] = 1.0; }", ())


def test_pocl_builds_programs_with_row_groups_unoptimized() -> None:
    """PoCL 3.1's optimizer miscompiled a row group (polytile.runtime.opencl); other
    programs with barriers stay optimized."""
    from polytile.loops.gpu_rows import ROW_GROUP_MARK
    row_group = f"/* block fused_0: {ROW_GROUP_MARK} of 64 work-items */ barrier(...);"
    device = runtime.Device(None, None, None, None, True, False, 256, pocl=True)
    assert device.options(row_group, ("-cl-std=CL1.2",)) == [
        "-cl-std=CL1.2", "-cl-opt-disable"]
    assert device.options("barrier(CLK_LOCAL_MEM_FENCE);", ("-cl-std=CL1.2",)) == [
        "-cl-std=CL1.2"]
    other = runtime.Device(None, None, None, None, True, False, 256)
    assert other.options(row_group, ()) == []
