"""FusionStitching's block composition (§5) with different parallel shapes: a row group
whose members deal out loops of different ranges (polytile.ir.rows.phase_of). The
multi-interests motif per batch row spreads its small batched GEMM over the columns of
S, shares each interest's row maximum and sum across the group, and spreads the second
GEMM over the columns of O; the attention block per head spreads its two GEMMs and the
softmax over their own loops. An output passed between members goes through global
memory, and the group's barriers order it (`Barrier("group")`).

Checked against the NumPy versions of the fusion bench (float64 inside) at sizes no
group size divides: the loop IR in the loop interpreter (a group's work-items in
lock-step between barriers), the OpenCL kernel on PoCL (C-ordered, Fortran-ordered and
strided inputs), the CUDA C++ on the emulated driver (tests/gpu/cuda_emulation.py, one
launch) and compiled by NVRTC."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from conformance.test_conformance import relayout
from gpu.loop_edits import uniform_count
from gpu.test_cuda_warp import needs_emulation
from gpu.test_row_groups import PROBLEM, needs_nvrtc, needs_opencl
from passes.test_gpu_rows import MEAN_OUT

import polytile as pt
from polytile.backends.cuda import NVRTC_FLAGS
from polytile.bench.fusion_workloads import attention, interests, ln_gelu_residual
from polytile.bench.workload import Workload
from polytile.codegen.cuda import print_cuda
from polytile.codegen.opencl import print_opencl
from polytile.compile import Compiler
from polytile.config import Config, load_config
from polytile.ir import nodes as N
from polytile.loops import interp
from polytile.loops import nodes as L
from polytile.loops.lower import lower
from polytile.runtime import cuda as runtime
from polytile.sema.specialize import specialize
from polytile.targets import target as T

ROWS = {"fuse.strategy": "rows", "gpu.shared_bytes": 49152}
WORKLOADS: dict[str, Callable[[], Workload]] = {
    "interests": lambda: interests(5, 3, 37, 19),
    "attention": lambda: attention(3, 11, 7),
    "ln-gelu-residual": lambda: ln_gelu_residual(5, 67),
}


def arguments(w: Workload, seed: int = 0) -> tuple[np.ndarray, ...]:
    return tuple(w.make_inputs(np.random.default_rng(seed)))


def optimized(w: Workload, target: str, options: dict | None = None) -> N.Function:
    fn = pt.define(w.tc, backend="interp")[w.function].fn
    args = arguments(w)
    shapes = {p.name: np.shape(a) for p, a in zip(fn.params, args) if p.kind != "scalar"}
    scalars = {p.name: a for p, a in zip(fn.params, args) if p.kind == "scalar"}
    compiler = Compiler(load_config(), T.inspection_target(target))
    compiler.options = {**ROWS, **(options or {})}
    return compiler.ir(specialize(fn, shapes, scalars))


def the_group(fn: N.Function) -> tuple[N.Block, N.RowGroup]:
    [block] = [s for s in fn.body.stmts if isinstance(s, N.Block)]
    assert block.schedule.rows is not None, "one row group for the whole workload"
    return block, block.schedule.rows


def dealt_ranges(block: N.Block, group: N.RowGroup) -> set[tuple[str, int]]:
    """(kind, range of the loop dealt out) over the group's phases."""
    members = [m for m in block.stmts if isinstance(m, N.Block)]
    return {(p.kind, m.index(p.loop).range) for m, p in zip(members, group.phases)
            if p.loop}


def run_loops(fn: N.Function, args: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    outs = [r for r in fn.body.refs if r.into in fn.params[len(args):]]
    buffers = {p: np.asarray(a) for p, a in zip(fn.params, args)}
    for r in outs:
        buffers[r.into] = np.full(r.shape.sizes, 12345, r.shape.dtype.numpy)
    interp.run(fn, buffers, lower(fn))
    return tuple(buffers[r.into] for r in outs)


def check(w: Workload, got: object, args: tuple[np.ndarray, ...]) -> None:
    want = w.numpy(*args)
    for g, r in zip(got if isinstance(got, tuple) else (got,),
                    want if isinstance(want, tuple) else (want,)):
        np.testing.assert_allclose(np.asarray(g), r, rtol=w.rtol, atol=w.atol)


def test_the_motif_deals_out_loops_of_different_ranges() -> None:
    """interests(B=5, K=3, L=37, D=19): the GEMMs spread over L and D, the row maxima and
    sums share L across the group once for each of the 3 interests, and the squash's
    sum of squares shares D."""
    block, group = the_group(optimized(WORKLOADS["interests"](), "opencl"))
    assert group.threads == 32
    assert dealt_ranges(block, group) >= {("spread", 37), ("spread", 19), ("across", 37),
                                          ("across", 19)}
    members = [m for m in block.stmts if isinstance(m, N.Block)]
    # an across member with another loop (the interest k) runs the group's reduction
    # once per k
    assert any(p.kind == "across" and len([i for i in m.idxs if i.affine is None
                                           and i.range > 1]) == 2
               for m, p in zip(members, group.phases))
    # the output O is written by one member and read by the next, in global memory:
    # the barriers order it; every work-item reaches every barrier
    kernel = lower(optimized(WORKLOADS["interests"](), "opencl"))
    assert uniform_count(kernel.body, L.Barrier) > 0
    assert "barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);" in print_opencl(kernel).text


@pytest.mark.parametrize("target", ["opencl", "cuda-sm90"])
@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_the_loop_ir_matches_numpy(name: str, target: str) -> None:
    w = WORKLOADS[name]()
    fn = optimized(w, target)
    the_group(fn)
    args = arguments(w, seed=3)
    check(w, run_loops(fn, args), args)


def test_a_row_passed_through_global_memory_is_ordered_by_group_barriers() -> None:
    fn = pt.define(MEAN_OUT, backend="interp")["centre"].fn
    compiler = Compiler(load_config(), T.inspection_target("opencl"))
    compiler.options = ROWS
    optimized_fn = compiler.ir(specialize(fn, {"X": (5, 37)}, {}))
    text = print_opencl(lower(optimized_fn)).text
    assert "barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);" in text
    X = np.random.default_rng(1).standard_normal((5, 37)).astype(np.float32)
    Y, mean = run_loops(optimized_fn, (X,))
    np.testing.assert_allclose(mean, X.sum(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(Y, X - X.mean(axis=1, keepdims=True), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ OpenCL on PoCL

@needs_opencl
@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_opencl_on_pocl_matches_numpy(name: str) -> None:
    w = WORKLOADS[name]()
    module = pt.define(w.tc, target="opencl")
    assert module.compiler is not None
    module.compiler.options = ROWS
    args = arguments(w, seed=4)
    for layout in ("c", "f", "strided"):
        check(w, module[w.function](*[relayout(a, layout) for a in args]), args)
    assert "pt_k1" not in print_opencl(lower(optimized(w, "opencl"))).text   # one kernel


@needs_opencl
def test_the_global_handoff_runs_on_pocl() -> None:
    module = pt.define(MEAN_OUT, target="opencl")
    assert module.compiler is not None
    module.compiler.options = ROWS
    X = np.random.default_rng(2).standard_normal((7, 1029)).astype(np.float32)
    Y, mean = module.centre(X)
    np.testing.assert_allclose(mean, X.astype(np.float64).sum(axis=1), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(Y, X - X.mean(axis=1, keepdims=True), rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------ CUDA

@needs_emulation
@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_cuda_runs_emulated_in_one_launch(name: str, emulated: Config) -> None:
    w = WORKLOADS[name]()
    module = pt.define(w.tc, target="cuda-sm90", config=emulated)
    assert module.compiler is not None
    module.compiler.options = ROWS
    args = arguments(w, seed=5)
    check(w, module[w.function](*args), args)
    assert len(runtime.cuda_device().driver.launched) == 1


@needs_nvrtc
@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_nvrtc_compiles_the_group(name: str, arch: int) -> None:
    fn = optimized(WORKLOADS[name](), f"cuda-sm{arch}")
    text = print_cuda(lower(fn)).text
    assert "pt_k1" not in text
    if any(p.kind == "across" for p in the_group(fn)[1].phases):
        assert "__shfl_xor_sync" in text
    cubin, _ = runtime.compile_cubin(text, (*NVRTC_FLAGS, f"--gpu-architecture=sm_{arch}"))
    assert cubin


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_one_row_is_one_work_group_without_a_grid_loop(name: str) -> None:
    """A size of 1 leaves the row loop one iteration, which the lowering drops (the
    fuzzer's find: 'needs one loop over its rows, not 0')."""
    w = {"interests": lambda: interests(1, 3, 37, 19), "attention": lambda: attention(1, 11, 7),
         "ln-gelu-residual": lambda: ln_gelu_residual(1, 67)}[name]()
    fn = optimized(w, "opencl")
    the_group(fn)
    args = arguments(w, seed=6)
    check(w, run_loops(fn, args), args)
    if PROBLEM is not None:     # no OpenCL device here: the loop interpreter is the check
        return
    module = pt.define(w.tc, target="opencl")
    assert module.compiler is not None
    module.compiler.options = ROWS
    check(w, module[w.function](*args), args)


def test_show_prints_the_row_group_with_pass_options(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """`polytile show --option`: the fused kernel a researcher asks for, without the
    Python API; a wrong option is refused naming it."""
    from polytile import cli
    w = WORKLOADS["interests"]()
    source = tmp_path / "interests.tc"
    source.write_text(w.tc)
    sizes = "B=5,K=3,L=37,D=19"
    assert cli.main(["show", str(source), "--stage", "cuda", "--target", "cuda-sm90",
                     "--sizes", sizes, "--option", "fuse.strategy=rows"]) == 0
    out = capsys.readouterr().out
    assert out.count("__global__") == 1 and "a row per work-group" in out
    assert cli.main(["show", str(source), "--stage", "cuda", "--target", "cuda-sm90",
                     "--sizes", sizes]) == 0
    assert capsys.readouterr().out.count("__global__") == 17     # one per statement
    assert cli.main(["show", str(source), "--stage", "ir", "--sizes", sizes,
                     "--option", "fuse.strategy=sideways"]) != 0
    assert "fuse.strategy must be one of" in capsys.readouterr().err
