"""How autotile spreads a kernel over threads and caches: the threaded tile loop splits
evenly among the cores, a gather counts as more work than an affine load, and a gathered
view's footprint is the rows its subscripts reach, not the whole table."""
from __future__ import annotations

import math

import pytest

from polytile.passes import autotile as autotile_module
from polytile.passes.autotile import (PARALLEL_MIN_WORK, _footprint, _imbalance, choose_schedule,
                                      work)

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
