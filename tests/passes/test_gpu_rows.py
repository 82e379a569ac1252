"""Pass gpu's row groups (polytile/passes/gpu_rows.py, polytile/ir/rows.py): which fused
row blocks run a row per work-group, with what phases, barriers and intermediates in
local memory, and where the pass falls back to a row per work-item: golden IR text, the
verifier, and the same results from the IR interpreter. The loop IR and the OpenCL and
CUDA kernels are checked in tests/gpu/test_row_groups.py."""
from __future__ import annotations

from dataclasses import replace

import pytest

from polytile.errors import ArgumentError, IRError
from polytile.ir import nodes as N
from polytile.ir.verify import verify
from polytile.passes.fuse import fuse
from polytile.passes.gpu import gpu

from .helpers import assert_same_meaning, block, check_pass, lowered, target, with_block

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

# The multi-interests motif's core per batch row: a small batched GEMM, row maxima, a
# second GEMM. Its members deal out loops of 37, 37 and 19 iterations.
MOTIF = ("def motif(float(B,L,D) X, float(B,K,D) C) -> (O) {\n"
         "  S(b,k,l) +=! C(b,k,d) * X(b,l,d)\n  mx(b,k) max=! S(b,k,l)\n"
         "  O(b,k,d) +=! (S(b,k,l) - mx(b,k)) * X(b,l,d)\n}\n")
# A column sum over the rows (logistic regression's gradient): every row adds into gw.
COLUMN_SUM = ("def colsum(float(N,D) X, float(N) y) -> (gw) {\n"
              "  g(n) = y(n) * 2\n  gw(d) +=! X(n,d) * g(n)\n}\n")


def fused(source: str, **shapes: tuple[int, ...]) -> N.Function:
    return fuse(lowered(source, shapes), target("opencl"), {"strategy": "rows"})


def test_softmax_runs_a_row_per_work_group_with_its_intermediates_in_local_memory() -> None:
    before = fused(SOFTMAX, X=(13, 70))
    after = gpu(before, target("opencl"), {})
    check_pass("gpu_rows_softmax", before, after)
    rows = block(after, "fused_0")
    assert rows.schedule.gpu == (("r", "grid"),)
    assert rows.schedule.rows == N.RowGroup("r", 64, (
        N.RowPhase("single", True), N.RowPhase("across", True, "m"),
        N.RowPhase("spread", False, "m"), N.RowPhase("single", True),
        N.RowPhase("across", True, "m"), N.RowPhase("spread", False, "m")))
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


def test_a_row_passed_between_members_through_global_memory_is_a_row_group() -> None:
    """The barriers then order global memory too (tests/gpu/test_row_groups.py runs it)."""
    before = fused(MEAN_OUT, X=(5, 37))
    after = gpu(before, target("opencl"), {})
    group = block(after, "fused_0").schedule.rows
    assert group is not None and [p.kind for p in group.phases] == ["single", "across",
                                                                    "spread"]
    verify(after)


def test_the_verifier_refuses_a_missing_barrier_and_a_wrong_phase() -> None:
    fn = gpu(fused(SOFTMAX, X=(13, 70)), target("opencl"), {})
    rows = block(fn, "fused_0")
    group = rows.schedule.rows
    assert group is not None
    phases = list(group.phases)
    phases[1] = N.RowPhase("across", False, "m")    # s1 would read mx before the tree ends
    racy = replace(rows, schedule=replace(rows.schedule, rows=replace(group,
                                                                     phases=tuple(phases))))
    with pytest.raises(IRError, match="no barrier after it"):
        verify(with_block(fn, "fused_0", racy))
    phases = list(group.phases)
    for phase in (N.RowPhase("across", True, "m"),        # s1 is elementwise
                  N.RowPhase("spread", True, "n"),         # not a loop of s1
                  N.RowPhase("single", True)):
        phases[2] = phase
        wrong = replace(rows, schedule=replace(rows.schedule, rows=replace(
            group, phases=tuple(phases))))
        with pytest.raises(IRError, match=f"cannot run as phase {phase.kind}"):
            verify(with_block(fn, "fused_0", wrong))
    odd = replace(rows, schedule=replace(rows.schedule, rows=replace(group, threads=48)))
    with pytest.raises(IRError, match="power-of-two"):
        verify(with_block(fn, "fused_0", odd))


def test_members_deal_out_loops_of_different_ranges() -> None:
    """FusionStitching's block composition with different parallel shapes: the GEMM
    spreads l (its k and d loops run in each work-item), the row maxima share l across
    the group once for each of the 3 values of k, the second GEMM spreads d."""
    before = fused(MOTIF, X=(5, 37, 19), C=(5, 3, 19))
    after = gpu(before, target("opencl"), {})
    check_pass("gpu_rows_motif", before, after)
    group = block(after, "fused_0").schedule.rows
    assert group is not None and group.threads == 32
    members = [m for m in block(after, "fused_0").stmts if isinstance(m, N.Block)]
    assert [(p.kind, m.index(p.loop).range if p.loop else 0)
            for m, p in zip(members, group.phases)] == [
        ("spread", 37), ("spread", 37), ("spread", 3), ("across", 37), ("spread", 19),
        ("spread", 19)]
    # work-item t zeroes the sums S(k, t) it then adds into: no barrier between; the
    # maxima read every l of S: one before them
    assert [p.barrier for p in group.phases] == [False, False, True, False, True, False]


def test_the_verifier_refuses_a_phase_that_deals_out_the_wrong_loop() -> None:
    fn = gpu(fused(MOTIF, X=(5, 37, 19), C=(5, 3, 19)), target("opencl"), {})
    rows = block(fn, "fused_0")
    group = rows.schedule.rows
    assert group is not None
    gemm = [m for m in rows.stmts if isinstance(m, N.Block)][1]
    reduction = next(i.name for i in gemm.idxs if i.affine is None and i.range == 19)
    row = next(i.name for i in gemm.idxs if i.affine is None and i.range == 3)
    for phase in (N.RowPhase("spread", True, reduction),   # its terms meet in one element
                  N.RowPhase("across", True, row)):        # the output depends on k
        phases = list(group.phases)
        phases[1] = phase
        wrong = replace(rows, schedule=replace(rows.schedule, rows=replace(
            group, phases=tuple(phases))))
        with pytest.raises(IRError, match="cannot run as phase"):
            verify(with_block(fn, "fused_0", wrong))


def test_an_across_member_with_many_other_iterations_is_spread_instead() -> None:
    """An across member unrolls one reduction per value of its other loops, at most
    ACROSS_REPEATS: with 9 interests the row maxima spread k instead."""
    after = gpu(fused(MOTIF, X=(2, 37, 19), C=(2, 9, 19)), target("opencl"), {})
    group = block(after, "fused_0").schedule.rows
    assert group is not None and group.phases[3].kind == "spread"


def test_rows_summed_into_one_output_are_not_a_row_group() -> None:
    """Every row adds into gw: work-groups would race on it."""
    before = fused(COLUMN_SUM, X=(37, 11), y=(37,))
    after = gpu(before, target("opencl"), {})
    assert block(after, "fused_1").schedule.rows is None
    verify(after)
    assert_same_meaning(before, after)


def test_a_cuda_target_refuses_more_shared_memory_than_a_block_may_declare() -> None:
    with pytest.raises(ArgumentError, match="static shared memory"):
        gpu(fused(SOFTMAX, X=(13, 70)), target("cuda-sm90"), {"shared_bytes": 49153})
    assert block(gpu(fused(SOFTMAX, X=(13, 70)), target("cuda-sm90"), {"shared_bytes": 49152}),
                 "fused_0").schedule.rows is not None
