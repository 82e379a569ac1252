"""Pass gpu (polytile/passes/gpu.py): which indices go to the grid and to threads, with
what sizes, and which reductions are staged through local memory: golden IR text, the
verifier's acceptance, and the same results from the IR interpreter at sizes no tile
divides. The backend-independent half of the GPU backends; the OpenCL runs are in
tests/conformance/test_opencl.py."""
from __future__ import annotations

from dataclasses import replace

import pytest

from polytile.errors import ArgumentError, IRError
from polytile.ir import nodes as N
from polytile.ir.verify import verify
from polytile.passes.fuse import fuse
from polytile.passes.gpu import gpu, mappable, thread_sizes
from polytile.passes.pipeline import check_pass_options

from .helpers import block, check_pass, lowered, target, with_block

Shapes = dict[str, tuple[int, ...]]
PROGRAMS: dict[str, tuple[str, Shapes]] = {
    "tmm": ("def tmm(float(M,K) A, float(N,K) B) -> (C) {\n  C(m,n) +=! A(m,k) * B(n,k)\n}\n",
            {"A": (37, 53), "B": (29, 53)}),
    "tbmm": ("def tbmm(float(B,N,M) X, float(B,K,M) Y) -> (Z) {\n"
             "  Z(b,n,k) +=! X(b,n,m) * Y(b,k,m)\n}\n",
             {"X": (3, 19, 21), "Y": (3, 13, 21)}),
    "gconv": (("def gconv(float(N,G,C,H,W) I, float(G,F,C,KH,KW) W1, float(F) B) -> (O) {\n"
               "  O(n,g,o,h,w) +=! I(n,g,i, h + kh, w + kw) * W1(g,o,i,kh,kw)\n"
               "  O(n,g,o,h,w) = O(n,g,o,h,w) + B(o)\n}\n"),
              {"I": (2, 2, 3, 11, 10), "W1": (2, 5, 3, 3, 3), "B": (5,)}),
    "softmax": (("def softmax(float(N,M) X) -> (Y) {\n  mx(n) max=! X(n,m)\n"
                 "  e(n,m) = exp(X(n,m) - mx(n))\n  s(n) +=! e(n,m)\n  Y(n,m) = e(n,m) / s(n)\n}\n"),
                {"X": (13, 70)}),
    "dot": ("def dot(float(N) x, float(N) y) -> (d) {\n  d +=! x(i) * y(i)\n}\n",
            {"x": (77,), "y": (77,)}),
    "gather": ("def lut(float(E,D) T, int(B,L) I) -> (O) {\n  O(i,j) +=! T(I(i,k), j)\n}\n",
               {"T": (11, 37), "I": (7, 3)}),
}


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_gpu(program: str) -> None:
    source, shapes = PROGRAMS[program]
    before = lowered(source, shapes)
    after = gpu(before, target("opencl"), {})
    check_pass(f"gpu_{program}", before, after, int_high={"I": 11})


def test_without_row_groups_a_fused_kernel_maps_its_rows_and_keeps_its_temporaries_private(
        ) -> None:
    source, shapes = PROGRAMS["softmax"]
    before = fuse(lowered(source, shapes), target("opencl"), {"strategy": "rows"})
    after = gpu(before, target("opencl"), {"threads": 4, "rows": 0})
    check_pass("gpu_softmax_fused", before, after)
    grid = block(after, "fused_0")
    assert grid.schedule.gpu == (("r_g", "grid"),) and grid.index("r_g").range == 4
    (tile,) = [s for s in grid.stmts if isinstance(s, N.Block)]
    assert tile.schedule.gpu == (("r", "thread"),)
    assert {r.into for r in tile.refs if r.dir == "none"} == {"mx", "e", "s"}
    assert not any(r.dir == "none" for r in grid.refs)


def test_the_staged_inputs_are_those_the_group_shares() -> None:
    source, shapes = PROGRAMS["tmm"]
    after = gpu(lowered(source, shapes), target("opencl"), {})
    (tile,) = [s for s in block(after, "s0").stmts if isinstance(s, N.Block)]
    assert tile.schedule.gpu == (("m", "thread"), ("n", "thread"))
    assert tile.schedule.stage == N.Staged("k", 16, ("A", "B"), pad=1)
    # 8 x 8 work-items, each computing a 2 x 2 register tile: m + 8*m_r of the group's 16
    assert tile.schedule.unroll == ("m_r", "n_r")
    assert [(i.name, i.range) for i in tile.idxs if i.affine is None] == [
        ("m", 8), ("n", 8), ("k", 53), ("m_r", 2), ("n_r", 2)]
    assert str(tile.ref("C").access[0]) == "m + 16*m_g + 8*m_r"


def test_without_register_tiles_a_work_item_computes_one_point() -> None:
    source, shapes = PROGRAMS["tmm"]
    after = gpu(lowered(source, shapes), target("opencl"), {"unroll": 1})
    (tile,) = [s for s in block(after, "s0").stmts if isinstance(s, N.Block)]
    assert tile.schedule.unroll == () and tile.schedule.stage is not None
    assert block(after, "s0").index("m_g").range == 5       # 37 rows in groups of 8
    verify(after)


def test_options_steer_sizes_and_turn_staging_off() -> None:
    source, shapes = PROGRAMS["tmm"]
    after = gpu(lowered(source, shapes), target("opencl"),
                {"threads": 128, "dims": 1, "tile_k": 0})
    kernel = block(after, "s0")      # the whole row of 29 in one group: no grid
    assert kernel.schedule.gpu == (("n", "thread"),) and kernel.schedule.stage is None
    assert kernel.index("n").range == 29
    verify(after)


def test_a_budget_too_small_for_the_tiles_stages_nothing() -> None:
    source, shapes = PROGRAMS["tmm"]
    after = gpu(lowered(source, shapes), target("opencl"), {"shared_bytes": 64})
    (tile,) = [s for s in block(after, "s0").stmts if isinstance(s, N.Block)]
    assert tile.schedule.stage is None


def test_row_reductions_run_across_the_work_items_of_a_group() -> None:
    source, shapes = PROGRAMS["softmax"]
    after = gpu(lowered(source, shapes), target("opencl"), {})
    for name in ("s0", "s2"):          # mx(n) max=! X(n,m); s(n) +=! e(n,m)
        grid = block(after, name)
        assert grid.schedule.gpu == (("n_g", "grid"),) and grid.index("n_g").range == 13
        (tile,) = [s for s in grid.stmts if isinstance(s, N.Block)]
        assert tile.schedule.across == N.Across("m", 64)
    assert block(after, "s1").schedule.across is None           # elementwise
    short = gpu(lowered(source, {"X": (13, 9)}), target("opencl"), {})
    assert block(short, "s0").schedule == N.BlockSchedule(gpu=(("n", "thread"),))
    off = gpu(lowered(source, shapes), target("opencl"), {"reduce": 0})
    assert block(off, "s0").schedule == N.BlockSchedule(gpu=(("n", "thread"),))


def test_the_verifier_refuses_a_reduction_across_a_written_index() -> None:
    source, shapes = PROGRAMS["softmax"]
    fn = lowered(source, {"X": (13, 1)})
    kernel = block(fn, "s1")          # e(n,m) = ...: m is written, and assigned
    bad = replace(kernel, schedule=N.BlockSchedule(across=N.Across("n", 8)))
    with pytest.raises(IRError, match="across"):
        verify(with_block(fn, "s1", bad))


def test_only_indices_that_write_disjoint_elements_are_mappable() -> None:
    source, shapes = PROGRAMS["tmm"]
    fn = lowered(source, shapes)
    assert mappable(block(fn, "s0")) == ["m", "n"]          # not the reduction k
    source, shapes = PROGRAMS["dot"]
    assert mappable(block(lowered(source, shapes), "s0")) == []


def test_work_group_sizes_double_in_turn_within_the_budget() -> None:
    source, shapes = PROGRAMS["tmm"]
    kernel = block(lowered(source, shapes), "s0")
    assert thread_sizes(kernel, ["m", "n"], 64) == {"m": 8, "n": 8}
    assert thread_sizes(kernel, ["m", "n"], 128) == {"m": 8, "n": 16}
    assert thread_sizes(kernel, ["n"], 64) == {"n": 29}


def test_the_verifier_refuses_a_reduction_index_on_threads() -> None:
    source, shapes = PROGRAMS["tmm"]
    fn = lowered(source, shapes)
    kernel = block(fn, "s0")
    bad = replace(kernel, schedule=N.BlockSchedule(gpu=(("k", "thread"),)))
    with pytest.raises(IRError, match="may write the same element"):
        verify(with_block(fn, "s0", bad))


def test_the_verifier_refuses_staging_a_non_reduction() -> None:
    source, shapes = PROGRAMS["softmax"]
    fn = lowered(source, shapes)
    kernel = block(fn, "s0")          # mx(n) max=! X(n,m)
    bad = replace(kernel, schedule=N.BlockSchedule(gpu=(("n", "thread"),),
                                                   stage=N.Staged("m", 8, ("X",))))
    with pytest.raises(IRError, match="one store, adding"):
        verify(with_block(fn, "s0", bad))


@pytest.mark.parametrize("option", [{"gpu.threads": 0}, {"gpu.dims": 4},
                                    {"gpu.tile_k": 1000}, {"gpu.shared_bytes": -1},
                                    {"gpu.unroll": 0}, {"gpu.pad": 99}])
def test_out_of_range_options_are_refused(option: dict) -> None:
    with pytest.raises(ArgumentError, match="gpu"):
        check_pass_options(option, target("opencl"))


@pytest.mark.parametrize("program, shapes", [
    ("tbmm", {"X": (8, 64, 64), "Y": (8, 64, 64)}),
    ("gconv", {"I": (4, 4, 16, 32, 32), "W1": (4, 16, 16, 3, 3), "B": (16,)})])
def test_contractions_at_full_size_are_staged_with_register_tiles(program: str,
                                                                 shapes: Shapes) -> None:
    """The staged boxes are one work-group's, not the whole tensors': the output indices
    no work-item runs (gconv's batch and group) are uniform loops, outside the boxes."""
    source, _ = PROGRAMS[program]
    after = gpu(lowered(source, shapes), target("opencl"), {})
    (tile,) = [s for s in block(after, "s0").stmts if isinstance(s, N.Block)]
    assert tile.schedule.stage is not None and len(tile.schedule.unroll) == 3
    assert tile.schedule.across is None
    verify(after)
