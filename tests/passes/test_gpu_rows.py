"""Pass gpu's row groups (polytile/passes/gpu_rows.py, polytile/ir/rows.py): which fused
row blocks run a row per work-group, with what phases, barriers and intermediates in
local memory, and where the pass falls back to a row per work-item: golden IR text, the
verifier, and the same results from the IR interpreter. The loop IR and the OpenCL and
CUDA kernels are checked in tests/gpu/test_row_groups.py."""
from __future__ import annotations

from dataclasses import replace

import pytest

from polytile.errors import IRError
from polytile.ir import nodes as N
from polytile.ir.verify import verify
from polytile.passes.fuse import fuse
from polytile.passes.gpu import gpu

from .helpers import block, check_pass, lowered, target, with_block

SOFTMAX = ("def softmax(float(N,M) X) -> (Y) {\n  mx(n) max=! X(n,m)\n"
           "  e(n,m) = exp(X(n,m) - mx(n))\n  s(n) +=! e(n,m)\n  Y(n,m) = e(n,m) / s(n)\n}\n")
LAYERNORM = ("def layernorm(float(N,D) X, float(D) gamma, float(D) beta) -> (Y) {\n"
             "  mean(n) +=! X(n,d)\n  Z(n,d) = X(n,d) - mean(n) / D\n"
             "  var(n) +=! Z(n,d) * Z(n,d)\n"
             "  Y(n,d) = Z(n,d) / sqrt(var(n) / D + 1e-5) * gamma(d) + beta(d)\n}\n")
# The row's mean is an output here: written by two members and read by a third, in
# global memory.
MEAN_OUT = ("def centre(float(N,D) X) -> (Y, mean) {\n  mean(n) +=! X(n,d)\n"
            "  Y(n,d) = X(n,d) - mean(n) / D\n}\n")


def fused(source: str, **shapes: tuple[int, ...]) -> N.Function:
    return fuse(lowered(source, shapes), target("opencl"), {"strategy": "rows"})


def test_softmax_runs_a_row_per_work_group_with_its_intermediates_in_local_memory() -> None:
    before = fused(SOFTMAX, X=(13, 70))
    after = gpu(before, target("opencl"), {})
    check_pass("gpu_rows_softmax", before, after)
    rows = block(after, "fused_0")
    assert rows.schedule.gpu == (("r", "grid"),)
    assert rows.schedule.rows == N.RowGroup("r", 64, (
        N.RowPhase("single", True), N.RowPhase("across", True), N.RowPhase("spread", False),
        N.RowPhase("single", True), N.RowPhase("across", True), N.RowPhase("spread", False)))
    assert {r.into: r.location for r in rows.refs if not r.from_} == {
        "mx": "shared", "e": "shared", "s": "shared"}


def test_layernorm_is_a_row_group_and_a_short_row_takes_a_smaller_group() -> None:
    after = gpu(fused(LAYERNORM, X=(5, 37), gamma=(37,), beta=(37,)), target("opencl"), {})
    check_pass("gpu_rows_layernorm", fused(LAYERNORM, X=(5, 37), gamma=(37,), beta=(37,)),
               after)
    group = block(after, "fused_0").schedule.rows
    assert group is not None and group.threads == 32          # a row of 37: 32 work-items
    assert [p.kind for p in group.phases] == ["single", "across", "spread", "single",
                                              "across", "spread"]


def test_rows_that_do_not_fit_local_memory_run_a_row_per_work_item() -> None:
    before = fused(SOFTMAX, X=(13, 70))
    # e's row (280 bytes), mx and s (8) and two trees of 64 floats (512) need 800 bytes
    small = gpu(before, target("opencl"), {"shared_bytes": 799})
    grid = block(small, "fused_0")     # 13 rows: one group of 13 work-items, a row each
    assert grid.schedule.rows is None and grid.schedule.gpu == (("r", "thread"),)
    assert not any(r.location == "shared" for r in grid.refs)
    verify(small)
    fits = gpu(before, target("opencl"), {"shared_bytes": 800})
    assert block(fits, "fused_0").schedule.rows is not None
    off = gpu(before, target("opencl"), {"rows": 0})
    assert block(off, "fused_0").schedule.rows is None


def test_a_row_passed_between_members_through_global_memory_is_not_a_row_group() -> None:
    before = fused(MEAN_OUT, X=(5, 37))
    after = gpu(before, target("opencl"), {})
    assert block(after, "fused_0").schedule.rows is None
    verify(after)


def test_the_verifier_refuses_a_missing_barrier_and_a_wrong_phase() -> None:
    fn = gpu(fused(SOFTMAX, X=(13, 70)), target("opencl"), {})
    rows = block(fn, "fused_0")
    group = rows.schedule.rows
    assert group is not None
    phases = list(group.phases)
    phases[1] = N.RowPhase("across", False)         # s1 would read mx before the tree ends
    racy = replace(rows, schedule=replace(rows.schedule, rows=replace(group,
                                                                     phases=tuple(phases))))
    with pytest.raises(IRError, match="no barrier after it"):
        verify(with_block(fn, "fused_0", racy))
    phases = list(group.phases)
    phases[2] = N.RowPhase("across", True)          # s1 is elementwise
    wrong = replace(rows, schedule=replace(rows.schedule, rows=replace(group,
                                                                      phases=tuple(phases))))
    with pytest.raises(IRError, match="phase kind is spread, not across"):
        verify(with_block(fn, "fused_0", wrong))
    odd = replace(rows, schedule=replace(rows.schedule, rows=replace(group, threads=48)))
    with pytest.raises(IRError, match="power-of-two"):
        verify(with_block(fn, "fused_0", odd))
