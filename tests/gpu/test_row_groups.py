"""Row groups (FusionStitching's block composition on the GPU targets): fused softmax,
layernorm and a bias -> GELU -> residual -> layernorm chain run a row per work-group
with their intermediates in local memory. Checked against the reference interpreter on
rows of 37, 1000 and 1029 elements (no work-group size divides them): the loop IR in the
loop interpreter (a group's work-items in lock-step between barriers), the OpenCL kernels
on PoCL with C-ordered, Fortran-ordered and strided inputs, and the CUDA kernels compiled
to CUBINs by NVRTC. Without PoCL or NVRTC those tests skip, saying what is missing."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest
from conformance.programs import CASES as CORPUS
from conformance.test_conformance import as_tuple, assert_agrees, relayout
from gpu.cubin import cubin_arch
from gpu.loop_edits import uniform_count, without_barriers
from passes.test_gpu_rows import LAYERNORM, SOFTMAX

import polytile as pt
from polytile.backends.cuda import NVRTC_FLAGS
from polytile.codegen.cuda import print_cuda
from polytile.codegen.opencl import print_opencl
from polytile.compile import Compiler
from polytile.config import load_config
from polytile.ir import nodes as N
from polytile.loops import interp
from polytile.loops import nodes as L
from polytile.loops.lower import lower
from polytile.runtime import cuda as runtime
from polytile.runtime.opencl import device_problem
from polytile.sema.specialize import specialize
from polytile.targets import target as T

CHAIN = ("def chain(float(N,D) X, float(D) bias, float(N,D) R, float(D) gamma, float(D) beta)"
         " -> (Y) {\n"
         "  A(n,d) = X(n,d) + bias(d)\n"
         "  G(n,d) = 0.5 * A(n,d) * (1 + erf(A(n,d) * 0.7071067811865476))\n"
         "  H(n,d) = G(n,d) + R(n,d)\n"
         "  mean(n) +=! H(n,d)\n  Z(n,d) = H(n,d) - mean(n) / D\n"
         "  var(n) +=! Z(n,d) * Z(n,d)\n"
         "  Y(n,d) = Z(n,d) / sqrt(var(n) / D + 1e-5) * gamma(d) + beta(d)\n}\n")
# The chain's four rows of 1029 floats take 16 KiB and more: a device's 48 KiB.
LARGE = {"gpu.shared_bytes": 49152}
ROWS = {"fuse.strategy": "rows"}


def shapes_of(name: str, n: int, d: int) -> dict[str, tuple[int, ...]]:
    if name == "softmax":
        return {"X": (n, d)}
    if name == "layernorm":
        return {"X": (n, d), "gamma": (d,), "beta": (d,)}
    return {"X": (n, d), "bias": (d,), "R": (n, d), "gamma": (d,), "beta": (d,)}


SOURCES = {"softmax": SOFTMAX, "layernorm": LAYERNORM, "chain": CHAIN}
CASES = [(name, d) for name in SOURCES for d in (37, 1000, 1029)]


def inputs(name: str, n: int, d: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(3 * rng.standard_normal(s)).astype(np.float32)
            for s in shapes_of(name, n, d).values()]


def reference(name: str, args: list[np.ndarray]) -> np.ndarray:
    return np.asarray(pt.define(SOURCES[name], backend="interp")[name](*args))


def ir(name: str, target: str, shapes: dict[str, tuple[int, ...]],
       options: dict | None = None) -> N.Function:
    fn = pt.define(SOURCES[name], backend="interp")[name].fn
    compiler = Compiler(load_config(), T.inspection_target(target))
    compiler.options = {**ROWS, **LARGE, **(options or {})}
    return compiler.ir(specialize(fn, shapes, {}))


def row_group(fn: N.Function) -> N.RowGroup | None:
    [rows] = [s for s in fn.body.stmts if isinstance(s, N.Block) and "fused" in s.tags]
    return rows.schedule.rows


def run_loops(fn: N.Function, args: list[np.ndarray],
              edit: Callable[[L.Kernel], L.Kernel] = lambda k: k) -> np.ndarray:
    out = np.full(args[0].shape, 12345, np.float32)
    buffers = dict(zip(fn.params, [*args, out]))
    interp.run(fn, buffers, edit(lower(fn)))
    return buffers[fn.params[-1]]


@pytest.mark.parametrize("name,d", CASES)
def test_the_loop_ir_matches_the_reference(name: str, d: int) -> None:
    fn = ir(name, "opencl", shapes_of(name, 5, d))
    group = row_group(fn)
    assert group is not None and group.threads == (32 if d == 37 else 64)
    args = inputs(name, 5, d)
    np.testing.assert_allclose(run_loops(fn, args), reference(name, args),
                               rtol=2e-5, atol=2e-6)


def test_without_its_barriers_a_row_group_reads_what_is_not_yet_written() -> None:
    """The lock-step interpreter shows a missing barrier: work-items read the row's
    maximum and sum before work-item 0 wrote them."""
    fn = ir("softmax", "opencl", shapes_of("softmax", 5, 100))
    args = inputs("softmax", 5, 100)
    racy = run_loops(fn, args, lambda k: dataclasses.replace(
        k, body=without_barriers(k.body)))
    assert not np.allclose(racy, reference("softmax", args), rtol=1e-4, atol=1e-5)


def test_the_chain_without_room_in_local_memory_maps_a_row_per_work_item() -> None:
    fn = ir("chain", "opencl", shapes_of("chain", 5, 1029), {"gpu.shared_bytes": 16384})
    assert row_group(fn) is None
    args = inputs("chain", 5, 1029)
    np.testing.assert_allclose(run_loops(fn, args), reference("chain", args),
                               rtol=2e-5, atol=2e-6)


def test_every_barrier_is_reached_by_every_work_item() -> None:
    """Barriers sit at the top of the group's thread loop or in the tree's unrolled
    steps, never under a condition on the work-item."""
    kernel = lower(ir("layernorm", "opencl", shapes_of("layernorm", 5, 1000)))
    assert uniform_count(kernel.body, L.Barrier) > 0


# ------------------------------------------------------------------ OpenCL on PoCL

PROBLEM = device_problem()
needs_opencl = pytest.mark.skipif(PROBLEM is not None,
                                  reason=f"the opencl target needs {PROBLEM}")


@needs_opencl
@pytest.mark.parametrize("name,d", CASES)
def test_opencl_on_pocl_matches_the_reference(name: str, d: int) -> None:
    mod = pt.define(SOURCES[name], target="opencl")
    assert mod.compiler is not None
    mod.compiler.options = {**ROWS, **LARGE}
    args = inputs(name, 5, d, seed=d)
    want = reference(name, args)
    for layout in ("c", "f", "strided"):
        got = mod[name](*[relayout(a, layout) for a in args])
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6, err_msg=layout)


# The conformance programs whose fused form is a row group.
CORPUS_ROWS = ["softmax (three temporaries)", "softmax in double", "log-softmax",
               "layernorm (scalar eps)", "RMSnorm"]


@needs_opencl
@pytest.mark.parametrize("case", [c for c in CORPUS if c.name in CORPUS_ROWS],
                         ids=lambda c: c.name)
def test_corpus_row_groups_on_pocl_match_their_references(case) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    args = case.make_inputs(rng)
    mod = pt.define(case.source, target="opencl")
    assert mod.compiler is not None
    mod.compiler.options = ROWS
    fn = mod[case.function]
    shapes = {p.name: np.shape(a) for p, a in zip(fn.fn.params, args)
              if isinstance(a, np.ndarray) and a.ndim}
    scalars = {p.name: a for p, a in zip(fn.fn.params, args) if p.name not in shapes}
    assert row_group(mod.compiler.ir(specialize(fn.fn, shapes, scalars))) is not None
    want = as_tuple(case.numpy_reference(*args))
    for layout in ("c", "strided"):
        got = as_tuple(fn(*[relayout(a, layout) for a in args]))
        for g, w in zip(got, want):
            assert_agrees(g, w, case.tolerance, f"{case.name} ({layout})")


@needs_opencl
def test_the_opencl_kernel_is_one_launch_with_local_memory_and_barriers() -> None:
    text = print_opencl(lower(ir("softmax", "opencl", shapes_of("softmax", 5, 1029)))).text
    assert "pt_k1" not in text                      # one kernel for the four statements
    assert "__local float l1[1029];" in text and "barrier(CLK_LOCAL_MEM_FENCE);" in text


# ------------------------------------------------------------------ CUDA through NVRTC

NVRTC = runtime.nvrtc_problem()
needs_nvrtc = pytest.mark.skipif(NVRTC is not None, reason=f"compiling CUDA needs {NVRTC}")


def test_the_cuda_targets_make_the_same_row_groups_as_opencl() -> None:
    """Save the warp shuffles (gpu.warp), which OpenCL lacks."""
    shapes = shapes_of("chain", 5, 1000)
    assert lower(ir("chain", "cuda-sm90", shapes, {"gpu.warp": 0})) == \
        lower(ir("chain", "opencl", shapes))
    assert row_group(ir("chain", "cuda-sm90", shapes)).warp == 32


@needs_nvrtc
@pytest.mark.parametrize("name", sorted(SOURCES))
@pytest.mark.parametrize("arch", [80, 90])
def test_nvrtc_compiles_the_cuda_row_groups(name: str, arch: int) -> None:
    fn = ir(name, f"cuda-sm{arch}", shapes_of(name, 5, 1029))
    assert row_group(fn) is not None
    text = print_cuda(lower(fn)).text
    assert "__shared__ float" in text and "__syncthreads();" in text
    cubin, _ = runtime.compile_cubin(text, (*NVRTC_FLAGS, f"--gpu-architecture=sm_{arch}"))
    assert cubin_arch(cubin) == arch
