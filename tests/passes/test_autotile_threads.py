"""How autotile spreads a kernel over threads and caches: the threaded tile loop splits
evenly among the cores, a gather counts as more work than an affine load, and a gathered
view's footprint is the rows its subscripts reach, not the whole table."""
from __future__ import annotations

import math

import pytest

from polytile.analysis.fold import chain
from polytile.ir import nodes as N
from polytile.passes import autotile as autotile_module
from polytile.passes.autotile import (
    PARALLEL_MIN_WORK,
    _footprint,
    _imbalance,
    choose_schedule,
    work,
)
from polytile.passes.pipeline import run_pipeline

from .helpers import block, lowered, target

TMM = "def tmm(float(M,K) A, float(N,K) B) -> (C) {\n  C(m,n) +=! A(m,kk) * B(n,kk)\n}\n"
LUT = "def lut(float(E,D) LUT, int(B,L) I) -> (O) {\n  O(i,j) +=! LUT(I(i,k), j)\n}\n"


@pytest.fixture(autouse=True)
def two_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(autotile_module, "_cores", lambda: 2)


def test_imbalance_of_contiguous_chunks() -> None:
    loops = {"m": 1024, "n": 64}
    assert _imbalance({"m": 96, "n": 64}, loops, ["m", "n"], 2) == pytest.approx(576 / 512)
    assert _imbalance({"m": 128, "n": 64}, loops, ["m", "n"], 2) == 1.0
    assert _imbalance({"m": 1024, "n": 32}, loops, ["m", "n"], 2) == 1.0   # n is threaded
    assert _imbalance({"m": 1000, "n": 64}, loops, ["m", "n"], 2) == pytest.approx(1000 / 512)
    assert _imbalance({"m": 96, "n": 64}, loops, ["m", "n"], 1) == 1.0


@pytest.mark.parametrize("m", [1024, 1000, 777])
def test_the_threaded_tiles_split_evenly(m: int) -> None:
    kernel = block(lowered(TMM, {"A": (m, 512), "B": (256, 512)}), "s0")
    schedule = choose_schedule(kernel, target("cpu-avx512"))
    assert schedule.parallel
    tiles = dict(schedule.tiles)
    loops = {i.name: i.range for i in kernel.idxs}
    full = {n: tiles.get(n, r) for n, r in loops.items()}
    # The cost model trades balance against cache lines per multiply-add; before it
    # counted balance, M=1024 got 11 tiles of 96 rows (one thread 12.5% over an even split).
    assert _imbalance(full, loops, ["m", "n"], 2) <= 1.06


def test_a_gather_counts_as_more_work() -> None:
    kernel = block(lowered(LUT, {"LUT": (1000, 64), "I": (16, 20)}), "s0")
    iterations = math.prod(i.range for i in kernel.idxs)
    assert iterations < PARALLEL_MIN_WORK <= work(kernel)
    assert choose_schedule(kernel, target("cpu-avx512")).parallel


def test_a_gathered_view_counts_the_rows_its_subscripts_reach() -> None:
    kernel = block(lowered(LUT, {"LUT": (1_000_000, 64), "I": (128, 50)}), "s0")
    tile = {"i": 12, "j": 64, "k": 50}
    size, _ = _footprint(kernel, tile, 64)
    rows = 12 * 50 * 64 * 4                              # one LUT row per (i, k)
    assert rows < size < rows + 2 * 12 * 64 * 4 + 12 * 50 * 4 + 4096
    schedule = choose_schedule(kernel, target("cpu-avx512"))
    assert "j" not in dict(schedule.tiles)               # rows are not cut in halves


@pytest.mark.parametrize("shape", [(128, 2000, 128), (128, 1024, 1024), (1024, 1024, 1024),
                                   (100, 300, 200)])
def test_a_packed_contraction_runs_its_threads_over_the_panels_its_threads_packed(
        shape: tuple[int, int, int]) -> None:
    m, k, n = shape
    fn = run_pipeline(lowered(TMM, {"A": (m, k), "B": (n, k)}), target("cpu-avx2"), {})
    pack = next(b for b in fn.body.stmts if isinstance(b, N.Block) and "pack" in b.tags)
    s0 = block(fn, "s0")
    panels = s0.schedule.parallel
    assert panels is not None and panels.endswith("_o_c"), s0.schedule
    # The pack copy's threads take the panels in contiguous halves (one per iteration);
    # the contraction's take its panel tiles so: thread t reads panels it packed, but for
    # at most a register tile's worth where the tile does not divide the halves.
    count = math.prod(i.range for i in pack.idxs)
    tiles = next(i.range for i in s0.idxs if i.name == panels)
    per_tile = -(-count // tiles)
    first_half = min(count, -(-tiles // 2) * per_tile)
    assert abs(first_half - -(-count // 2)) <= 3


CONV = ("def conv(float(N,C,HR,WS) I, float(K,C,R,S) W) -> (O) {\n"
        "  O(n,k,h,w) +=! I(n,c,h + r,w + s) * W(k,c,r,s)\n}\n")


def test_an_image_read_through_pointer_increments_counts_lines_per_reduction_step() -> None:
    # Each step of the merged (c, r, s) reduction moves the image to another row or
    # channel: a line per row of the register tile (3 x 64 B) beside the weights' 4
    # floats and the step table's offset. Counted as 3 x 32 B, the reduction stayed
    # whole (576 steps, a tile's image rows spilling L1): 2.23 -> 2.04 ms chunked by 64.
    # (With pass outlayout the image is broadcast instead: vectorized along w here.)
    fn = run_pipeline(lowered(CONV, {"I": (1, 64, 58, 58), "W": (64, 64, 3, 3)}),
                      target("cpu-avx2"), {"outlayout.enabled": False})
    leaf = chain(block(fn, "s0"))[-1]
    assert any(isinstance(s, N.Load) and s.offset for s in leaf.stmts)     # ptrinc
    reduction = next(i for i in leaf.idxs if i.affine is None and i.name.count("_") == 2)
    assert reduction.range == 64                                           # of 576


def test_panels_that_do_not_split_evenly_leave_the_threads_on_the_rows() -> None:
    # 45 columns are 3 panels of 16: over panels, one thread would get two of them.
    fn = run_pipeline(lowered(TMM, {"A": (37, 700), "B": (45, 700)}), target("cpu-avx2"), {})
    assert block(fn, "s0").schedule.parallel == "m_c"
