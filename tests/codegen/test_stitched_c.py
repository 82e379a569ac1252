"""Stitched kernels compiled to C (one OpenMP region, phases separated by barriers) agree
with the reference interpreter on 1, 2 and 3 threads, at sizes large enough that the
phases run in threads and that divide no thread's share, with non-contiguous inputs."""
from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
from conformance.test_conformance import assert_agrees
from passes.test_stitch import INTERLEAVED, MIRRORED, TWO_SHAPES

import polytile as pt
from polytile.api import Module
from polytile.bench.fusion import specialized
from polytile.bench.fusion_workloads import logreg
from polytile.compile import Compiler
from polytile.config import load_config
from polytile.graph.plan import plan_fusion
from polytile.ir import nodes as N
from polytile.loops import nodes as L
from polytile.loops.lower import lower
from polytile.sema.specialize import specialize
from polytile.targets.target import select_target

_GOMP = ctypes.util.find_library("gomp")


@contextmanager
def omp_threads(n: int) -> Iterator[None]:
    """Later parallel regions of this thread run on `n` threads (libgomp's ICV, the one
    OMP_NUM_THREADS sets; the kernels' shared objects use the same libgomp)."""
    gomp = ctypes.CDLL(_GOMP)
    before = gomp.omp_get_max_threads()
    gomp.omp_set_num_threads(n)
    try:
        yield
    finally:
        gomp.omp_set_num_threads(before)


def stitched_blocks(fn: N.Function) -> list[N.Block]:
    return [s for s in fn.body.stmts if isinstance(s, N.Block) and "stitched" in s.tags]


def compiled(source: str, name: str, shapes: dict, groups: list[list[int]]):  # type: ignore[no-untyped-def]
    mod = pt.define(source)
    config = load_config()
    compiler = Compiler(config, select_target(config.target), options={"fuse.groups": groups})
    fn = getattr(mod, name).fn
    ir = compiler.ir(specialize(fn, shapes, {}))
    return getattr(Module(source, mod.program, "c", compiler), name), ir


@pytest.mark.skipif(_GOMP is None, reason="no libgomp to set the thread count with")
@pytest.mark.parametrize("n, d", [(1001, 67), (333, 129)])
def test_two_parallel_shapes_agree_on_one_two_and_three_threads(n: int, d: int) -> None:
    planned, ir = compiled(TWO_SHAPES, "two_shapes", {"X": (n, d), "b": (d,)}, [[0, 1, 2]])
    [block] = stitched_blocks(ir)
    assert block.schedule.stitch is not None
    assert all(p.shared for p in block.schedule.stitch.phases)      # both in threads
    assert block.schedule.stitch.phases[0].barrier
    reference = pt.define(TWO_SHAPES, backend="interp").two_shapes
    rng = np.random.default_rng(n)
    x = rng.standard_normal((d, n)).astype(np.float32).T            # a transposed view
    b = rng.standard_normal(2 * d).astype(np.float32)[::2]          # a strided view
    want_t, want_c = reference(x, b)
    for threads in (1, 2, 3, 2, 2):
        with omp_threads(threads):
            got_t, got_c = planned(x, b)
        assert_agrees(got_t, want_t, 1e-4, f"T on {threads} threads")
        assert_agrees(got_c, want_c, 1e-4, f"c on {threads} threads")


@pytest.mark.skipif(_GOMP is None, reason="no libgomp to set the thread count with")
def test_logreg_plan_is_one_stitched_kernel_and_agrees_on_one_and_two_threads() -> None:
    w = logreg(2001, 67)
    args = w.make_inputs(np.random.default_rng(5))
    spec = specialized(w, args)
    config = load_config()
    target = select_target(config.target)
    plan = plan_fusion(spec, target, config)
    assert plan.groups == (tuple(range(8)),)
    assert any(s.stitched and s.pattern.key == tuple(range(8)) for s in plan.scored)
    compiler = Compiler(config, target, options={"fuse.groups": plan.option})
    ir = compiler.ir(spec)
    assert len(ir.body.stmts) == 1 and len(stitched_blocks(ir)) == 1
    # The inits run before the threads start and the updates after they finish: the
    # region holds only the shared row loop, and waits at no barrier.
    [region] = [s for s in lower(ir).body if isinstance(s, L.Region)]
    assert [type(s).__name__ for s in region.body if not isinstance(s, L.Comment)] == ["Loop"]
    fn = Module(w.tc, pt.define(w.tc).program, "c", compiler).logreg
    x, y, wt, b, lr = args
    x = np.asfortranarray(x)                                         # column-major
    want = pt.define(w.tc, backend="interp").logreg(x, y, wt, b, lr)
    expected = w.numpy(*args)
    for threads in (1, 2, 2, 2):
        with omp_threads(threads):
            got = fn(x, y, wt, b, lr)
        for g, r, e in zip(got, want, expected):
            assert_agrees(np.asarray(g), np.asarray(r), 1e-4, f"{threads} threads")
            np.testing.assert_allclose(g, e, rtol=w.rtol, atol=w.atol)


GATHERED = """
def gathered(float(V,D) E, int32(N) I) -> (Y, Z) {
  Y(n,d) = E(I(n),d)
  Z(d,n) = Y(n,d) * 2
}
"""


@pytest.mark.skipif(_GOMP is None, reason="no libgomp to set the thread count with")
def test_a_failed_check_in_a_phase_is_an_error_after_the_region() -> None:
    n, d, v = 1500, 33, 50
    planned, ir = compiled(GATHERED, "gathered", {"E": (v, d), "I": (n,)}, [[0, 1]])
    [block] = stitched_blocks(ir)
    assert block.schedule.stitch is not None and block.schedule.stitch.phases[0].shared
    rng = np.random.default_rng(1)
    e = rng.standard_normal((v, d)).astype(np.float32)
    index = rng.integers(0, v, n).astype(np.int32)
    want_z = pt.define(GATHERED, backend="interp").gathered(e, index)[1]
    for threads in (1, 2):
        with omp_threads(threads):
            got_z = planned(e, index)[1]
            assert_agrees(got_z, want_z, 1e-6, f"Z on {threads} threads")
            bad = index.copy()
            bad[n - 3] = v + 7
            with pytest.raises(pt.PolytileError, match="outside its bounds"):
                planned(e, bad)


@pytest.mark.skipif(_GOMP is None, reason="no libgomp to set the thread count with")
@pytest.mark.parametrize("source, barriers", [(INTERLEAVED, 0), (MIRRORED, 1)])
def test_phases_without_barriers_agree_on_one_two_and_three_threads(source: str,
                                                                    barriers: int) -> None:
    planned, ir = compiled(source, "interleaved", {"X": (1001, 67)}, [[0, 1, 2]])
    [block] = stitched_blocks(ir)
    assert block.schedule.stitch is not None
    assert sum(p.barrier for p in block.schedule.stitch.phases) == barriers
    x = np.random.default_rng(2).standard_normal((1001, 67)).astype(np.float32)
    want = pt.define(source, backend="interp").interleaved(x)
    for threads in (1, 2, 3, 2, 2):
        with omp_threads(threads):
            got = planned(x)
        for g, r in zip(got, want):
            assert_agrees(g, r, 1e-6, f"{threads} threads")


def test_a_shared_init_phase_folded_into_a_later_phase_lowers_to_nothing() -> None:
    """A tuner's candidate (perceptron 67x131x66, the fusion plan, dW's init shared out
    among the threads): pass fold, after the phases were decided, folded that init into
    dW's sum, so it lowers to no loop; the region used to refuse it ('does not lower to
    one parallel loop') and the tuner lost the candidate."""
    from polytile.bench.fusion_workloads import PERCEPTRON
    from polytile.tune.options import Options
    module = pt.define(PERCEPTRON)
    assert module.compiler is not None
    lanes = module.compiler.target.vector_bytes // 4
    module.compiler.options = Options.from_json({
        "passes": {"fuse.strategy": "plan", "pack.enabled": False},
        "schedules": {"s4_init": {"lanes": lanes, "parallel": True, "tiles": [["i0", 32]],
                                  "unroll": [], "vector": "i0", "vectors": 2}}}).pass_options()
    rng = np.random.default_rng(1)
    args = [rng.standard_normal(s).astype(np.float32)
            for s in [(67, 131), (66, 131), (66,), (67, 66)]]
    want = pt.define(PERCEPTRON, backend="interp").perceptron(*args)
    got = module.perceptron(*args)
    for name, g, w in zip(("Y", "dW", "dbias", "dX"), got, want):
        assert_agrees(g, w, 1e-5, name)
    (kernel,) = module.perceptron._kernels.values()
    ir = (kernel.source_path.parent / "stage-ir.txt").read_text()
    assert "#stitched" in ir and "folded(s4)" in ir
