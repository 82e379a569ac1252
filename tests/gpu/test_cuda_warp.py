"""Warp shuffles (FusionStitching's warp composition, §5) on the cuda targets: reductions
across a block and the row groups' reductions combine their partial results in
registers (`__shfl_xor_sync` within each warp of 32, one value per warp through shared
memory, shuffles again) instead of a tree in shared memory with a barrier per step.

Checked without a GPU in three ways: the loop IR in the loop interpreter (a shuffle is
a lock-step exchange between the group's threads), the printed CUDA C++ run on the
emulated driver (tests/gpu/cuda_emulation.py: a shuffle is a post and a take between
two barriers of the block) against NumPy, and NVRTC compiling it (test_row_groups.py).
Groups of one warp (no shared memory), two warps and 8 to 32 warps; sums, products,
maxima with a NaN, minima and exact int32 sums."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
from gpu.loop_edits import uniform_count
from gpu.test_row_groups import SOURCES, inputs, ir, reference, row_group, run_loops, shapes_of

import polytile as pt
from polytile.codegen.opencl import print_opencl
from polytile.config import Config
from polytile.errors import ArgumentError, IRError, UnsupportedError
from polytile.ir.parser import parse_function as parse_ir
from polytile.ir.printer import format_function
from polytile.ir.verify import verify
from polytile.loops import nodes as L
from polytile.loops.lower import lower
from polytile.runtime import cuda as runtime

EMULATION = runtime.nvrtc_problem() or (None if shutil.which("g++") else "g++ (for the emulation)")
needs_emulation = pytest.mark.skipif(EMULATION is not None,
                                     reason=f"the emulation needs {EMULATION}")

REDUCE = {"sum": ("+=!", np.sum), "product": ("*=!", np.prod),
          "max": ("max=!", np.max), "min": ("min=!", np.min)}


def reduction(kind: str, dtype: str = "float") -> str:
    return (f"def r({dtype}(N,M) X) -> (Y) {{\n"
            f"  Y(n) {REDUCE[kind][0]} X(n,m)\n}}\n")


# ------------------------------------------------------------------ the loop IR

@pytest.mark.parametrize("name", sorted(SOURCES))
@pytest.mark.parametrize("d,threads", [(37, 64), (1000, 64), (1029, 256), (1029, 1024)])
def test_row_groups_with_shuffles_match_the_reference(name: str, d: int, threads: int) -> None:
    """Rows of 37 get a group of one warp (no shared partial results), 1000 two warps,
    1029 with gpu.rows 256 and 1024: 8 and 32 warps."""
    fn = ir(name, "cuda-sm90", shapes_of(name, 3, d), {"gpu.rows": threads})
    group = row_group(fn)
    assert group is not None and group.warp == 32
    assert group.threads == (32 if d == 37 else threads)
    kernel = lower(fn)
    assert uniform_count(kernel.body, L.WarpXor) > 0
    args = inputs(name, 3, d)
    np.testing.assert_allclose(run_loops(fn, args), reference(name, args),
                               rtol=2e-5, atol=2e-6)


def test_groups_smaller_than_a_warp_use_the_tree_and_the_verifier_checks_warps() -> None:
    fn = ir("softmax", "cuda-sm90", shapes_of("softmax", 2, 37), {"gpu.rows": 16})
    assert row_group(fn).threads == 16 and row_group(fn).warp == 0
    assert uniform_count(lower(fn).body, L.WarpXor) == 0
    text = format_function(ir("softmax", "cuda-sm90", shapes_of("softmax", 2, 100)))
    assert text.count(", 64, warp = 32, ") == 1
    for warp in (128, 24, 1):
        bad = parse_ir(text.replace(", 64, warp = 32, ", f", 64, warp = {warp}, "))
        with pytest.raises(IRError, match=f"warp = {warp} needs a power of two"):
            verify(bad)


def test_the_schedule_prints_and_parses_the_warps() -> None:
    for fn in (ir("layernorm", "cuda-sm90", shapes_of("layernorm", 2, 100)),
               ir("softmax", "cuda-sm90", shapes_of("softmax", 2, 100), {"fuse.strategy": "none"})):
        text = format_function(fn)
        assert "warp = 32" in text
        assert format_function(parse_ir(text)) == text


def test_warp_sizes_are_checked_and_opencl_has_none() -> None:
    with pytest.raises(ArgumentError, match="gpu.warp must be 0 or a power of two"):
        ir("softmax", "cuda-sm90", shapes_of("softmax", 2, 100), {"gpu.warp": 24})
    fn = ir("softmax", "opencl", shapes_of("softmax", 2, 100), {"gpu.warp": 32})
    with pytest.raises(UnsupportedError, match="OpenCL has no warp shuffles"):
        print_opencl(lower(fn))


# ------------------------------------------------------------------ CUDA, emulated

@needs_emulation
@pytest.mark.parametrize("kind", sorted(REDUCE))
@pytest.mark.parametrize("threads", [32, 64, 256, 1024])
def test_reductions_across_a_block_run_with_shuffles(kind: str, threads: int,
                                                     emulated: Config) -> None:
    """One block per row of 1500, `threads` threads (gpu.reduce) sharing it: one warp,
    two, 8 and 32."""
    rng = np.random.default_rng(threads)
    X = (rng.standard_normal((3, 1500)) * (0.02 if kind == "product" else 1) + (
        1 if kind == "product" else 0)).astype(np.float32)
    if kind == "max":
        X[1, 777] = np.nan                  # NaN wins, as in NumPy
    module = pt.define(reduction(kind), target="cuda-sm90", config=emulated)
    assert module.compiler is not None
    module.compiler.options = {"gpu.reduce": threads}
    got = module.r(X)
    np.testing.assert_allclose(got, REDUCE[kind][1](X.astype(np.float64), axis=1),
                               rtol=1e-4, atol=1e-4)
    driver = runtime.cuda_device().driver
    assert ("pt_k1", (3, 1, 1), (threads, 1, 1)) in driver.launched
    assert "__shfl_xor_sync(0xffffffffu, " in module.r.compiled((X,)).source_path.read_text()


@needs_emulation
def test_an_int32_sum_across_a_block_is_exact(emulated: Config) -> None:
    X = np.random.default_rng(0).integers(-2**20, 2**20, (4, 3001), dtype=np.int32)
    module = pt.define(reduction("sum", "int32"), target="cuda-sm90", config=emulated)
    assert module.compiler is not None
    module.compiler.options = {"gpu.reduce": 128}
    np.testing.assert_array_equal(module.r(X), X.sum(axis=1, dtype=np.int64).astype(np.int32))


@needs_emulation
@pytest.mark.parametrize("name", sorted(SOURCES))
def test_row_groups_with_shuffles_run_emulated(name: str, emulated: Config) -> None:
    module = pt.define(SOURCES[name], target="cuda-sm90", config=emulated)
    assert module.compiler is not None
    module.compiler.options = {"fuse.strategy": "rows", "gpu.shared_bytes": 49152,
                               "gpu.rows": 128}
    args = inputs(name, 3, 1029, seed=5)
    np.testing.assert_allclose(module[name](*args), reference(name, args),
                               rtol=2e-5, atol=2e-6)
    assert [launch[2] for launch in runtime.cuda_device().driver.launched] == [(128, 1, 1)]
