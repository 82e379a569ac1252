"""autotile (polytile/passes/autotile.py) with the cpu-avx512 and cpu-generic targets:
golden text of the chosen schedules, and the same results from the IR interpreter at
sizes that no tile divides. The heuristics count the host's cores; the tests fix them
at 2 so that the golden text does not depend on the machine running the tests."""
from __future__ import annotations

import pytest

from polytile.ir import nodes as N
from polytile.passes import autotile as autotile_module
from polytile.passes.autotile import autotile, choose_schedule
from polytile.passes.fuse import fuse
from polytile.passes.pack import pack
from polytile.passes.ptrinc import ptrinc

from .helpers import assert_same_meaning, block, check_pass, lowered, target

TARGETS = ("cpu-avx512", "cpu-generic")

Shapes = dict[str, tuple[int, ...]]
PROGRAMS: dict[str, tuple[str, Shapes, dict[str, int]]] = {
    "mm": ("def mm(float(M,K) A, float(K,N) B) -> (C) {\n  C(m,n) +=! A(m,k) * B(k,n)\n}\n",
           {"A": (37, 45), "B": (45, 67)}, {}),
    "tmm": ("def tmm(float(M,K) A, float(N,K) B) -> (C) {\n  C(m,n) +=! A(m,kk) * B(n,kk)\n}\n",
            {"A": (37, 53), "B": (29, 53)}, {}),
    "elementwise": (("def act(float(M,N) X, float(N) b) -> (Y) {\n"
                    "  Y(i,j) = tanh(X(i,j) + b(j)) * exp(-X(i,j))\n}\n"),
                    {"X": (23, 45), "b": (45,)}, {}),
    "gather": (("def lut(float(E,D) LUT, int(B,L) I) -> (O) {\n"
               "  O(i,j) +=! LUT(I(i,k), j)\n}\n"),
               {"LUT": (11, 37), "I": (7, 3)}, {"I": 11}),
    "rowmax": ("def rowmax(float(M,N) X) -> (Y) {\n  Y(i) max=! X(i,j)\n}\n",
               {"X": (19, 45)}, {}),
    "gconv": (("def gconv(float(N,G,C,H,W) I, float(G,F,C,KH,KW) W1) -> (O) {\n"
               "  O(n,g,o,h,w) +=! I(n,g,i,h + kh,w + kw) * W1(g,o,i,kh,kw)\n}\n"),
              {"I": (2, 3, 4, 9, 8), "W1": (3, 5, 4, 3, 3)}, {}),
}


@pytest.fixture(autouse=True)
def two_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(autotile_module, "_cores", lambda: 2)


def leaves(b: N.Block) -> list[N.Block]:
    inner = [s for s in b.stmts if isinstance(s, N.Block)]
    return [b] if not inner else [leaf for s in inner for leaf in leaves(s)]


@pytest.mark.parametrize("target_name", TARGETS)
@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_autotile(program: str, target_name: str) -> None:
    source, shapes, int_high = PROGRAMS[program]
    before = lowered(source, shapes)
    after = autotile(before, target(target_name), {})
    check_pass(f"autotile_{program}_{target_name}", before, after, int_high=int_high)


@pytest.mark.parametrize("target_name", TARGETS)
def test_vector_width_follows_the_target(target_name: str) -> None:
    source, shapes, _ = PROGRAMS["mm"]
    kernel = block(lowered(source, shapes), "s0")
    schedule = choose_schedule(kernel, target(target_name))
    lanes = target(target_name).vector_bytes // 4
    assert schedule.vector == "n" and schedule.lanes == lanes
    assert dict(schedule.unroll).get("m", 1) > 1          # A's loads reused across n


def test_a_group_index_is_tiled_by_one_and_a_reduction_that_fits_is_not_split() -> None:
    """gconv: every view reads the group index g, so no two groups share data and g's
    tile is one group; one register tile's inputs over the whole (c, kh, kw) reduction
    (144 steps through pass ptrinc's table) fit the reduction stream, so it is not cut
    into chunks, while a 2304-step one is."""
    avx512 = target("cpu-avx512")
    source, _, _ = PROGRAMS["gconv"]
    shapes = {"I": (4, 6, 16, 14, 14), "W1": (6, 16, 16, 3, 3)}
    kernel = block(ptrinc(lowered(source, shapes), avx512, {}), "s0")
    tiles = dict(choose_schedule(kernel, avx512).tiles)
    assert tiles.get("g") == 1 and "i_kh_kw" not in tiles
    wide = {"I": (4, 2, 256, 14, 14), "W1": (2, 16, 256, 3, 3)}
    kernel = block(ptrinc(lowered(source, wide), avx512, {}), "s0")
    assert dict(choose_schedule(kernel, avx512).tiles).get("i_kh_kw", 2304) < 2304


def test_an_outer_product_weighs_vector_loads_above_broadcasts() -> None:
    """MLP1's gradient d_I = d_O (128x128) by W (128x2000), its W packed into 63 panels
    of 32: 4 broadcasts by 3 panels (6 vector loads a step) divides both ranges, but 6
    broadcasts by 2 panels (4 vector loads) streams a third less of the panels through
    the caches, and ran 1.19x faster (the weight's comment)."""
    source = "def g(float(B,N) D, float(N,M) W) -> (X) {\n  X(b,m) +=! D(b,n) * W(n,m)\n}\n"
    avx512 = target("cpu-avx512")
    packed = pack(lowered(source, {"D": (128, 128), "W": (128, 2000)}), avx512, {})
    kernel = next(s for s in packed.body.stmts if isinstance(s, N.Block) and s.name == "s0")
    assert dict(choose_schedule(kernel, avx512).unroll) == {"b": 6, "m_o": 2}


@pytest.mark.parametrize("target_name", TARGETS)
def test_a_streaming_elementwise_block_sweeps_single_rows(
        target_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bias + activation over views bigger than L2, each contiguous along the vector
    index: cache tiles of one row, swept whole (a tile of rows split every row into
    register-tile pieces). Sizes that fill no vector tile evenly; the same results.
    Views that fit in L2, or one read across its rows (a transpose), keep the tiles the
    footprint model chooses."""
    t = target(target_name)
    source, _, _ = PROGRAMS["elementwise"]
    before = lowered(source, {"X": (301, 1001), "b": (1001,)})
    after = autotile(before, t, {})
    assert dict(choose_schedule(block(before, "s0"), t).tiles) == {"i": 1}
    assert_same_meaning(before, after)
    transpose = "def tr(float(N,M) X, float(N) b) -> (Y) {\n  Y(i,j) = X(j,i) + b(j)\n}\n"
    kept = [block(lowered(source, {"X": (16, 1001), "b": (1001,)}), "s0"),
            block(lowered(transpose, {"X": (1001, 301), "b": (1001,)}), "s0")]
    chosen = [choose_schedule(kernel, t) for kernel in kept]
    monkeypatch.setattr(autotile_module, "_streams", lambda *args: False)
    assert chosen == [choose_schedule(kernel, t) for kernel in kept]


def test_a_streaming_member_of_a_fused_row_sweeps_single_rows() -> None:
    """Group norm's normalization inside the fused loop over images: each image's rows
    (300 of them here, 2.4 MB with the output) are swept one at a time, where the
    member took no tiles and ran each register tile across all of them."""
    t = target("cpu-avx512")
    source = ("def center(float(N,G,D) X) -> (Y) {\n  m(n) +=! X(n,g,d)\n"
              "  Y(n,g,d) = X(n,g,d) - m(n) / (G * D)\n}\n")
    before = fuse(lowered(source, {"X": (2, 300, 1001)}), t, {})
    after = autotile(before, t, {})
    (fused,) = [s for s in after.body.stmts if isinstance(s, N.Block)]
    assert "fused" in fused.tags
    sweep = [leaf for leaf in leaves(fused) if any(r.into == "Y" for r in leaf.refs)]
    assert [leaf.idxs[:2] for leaf in sweep] == [(N.Index("g", 1), N.Index("d", 32))]
    assert_same_meaning(before, after, seeds=(0,))


def test_a_member_whose_rows_lie_pages_apart_sweeps_them_one_at_a_time() -> None:
    """Batchnorm's normalization in the loop over channels: each channel's images lie
    4 KiB apart, so although its rows fit in L2 they are swept one by one; the same
    results at sizes that fill no vector tile."""
    from polytile.passes.collapse import collapse

    t = target("cpu-avx512")
    source = ("def bn(float(N,C,H,W) X, float(C) b) -> (Y) {\n  m(c) +=! X(n,c,h,w)\n"
              "  Y(n,c,h,w) = X(n,c,h,w) - m(c) / (N * H * W) + b(c)\n}\n")
    before = collapse(fuse(lowered(source, {"X": (3, 4, 10, 27), "b": (4,)}), t, {}), t, {})
    after = autotile(before, t, {})
    (fused,) = [s for s in after.body.stmts if isinstance(s, N.Block)]
    (sweep,) = [leaf for leaf in leaves(fused) if any(r.into == "Y" for r in leaf.refs)]
    assert N.Index("n", 1) in sweep.idxs
    assert_same_meaning(before, after, seeds=(0,))


def test_tmm_vectorizes_the_reduction_and_gathers_do_not_vectorize_the_index() -> None:
    generic = target("cpu-generic")
    source, shapes, _ = PROGRAMS["tmm"]
    assert choose_schedule(block(lowered(source, shapes), "s0"), generic).vector == "kk"
    source, shapes, _ = PROGRAMS["gather"]
    schedule = choose_schedule(block(lowered(source, shapes), "s0"), generic)
    assert schedule.vector != "k"                     # k feeds the data-dependent subscript


@pytest.mark.parametrize("target_name", TARGETS)
def test_autotile_after_fuse(target_name: str) -> None:
    """Members of a fused row loop are vectorized in place; the row loop is what runs
    in parallel (here too little work for that)."""
    softmax = """
def softmax(float(N,C) X) -> (Y) {
  mx(n) max=! X(n,c)
  e(n,c) = exp(X(n,c) - mx(n))
  s(n) +=! e(n,c)
  Y(n,c) = e(n,c) / s(n)
}
"""
    t = target(target_name)
    before = fuse(lowered(softmax, {"X": (7, 45)}), t, {})
    after = autotile(before, t, {})
    (fused,) = [s for s in after.body.stmts if isinstance(s, N.Block)]
    assert "fused" in fused.tags and not fused.schedule.parallel
    assert any(leaf.schedule.vector is not None for leaf in leaves(fused))
    check_pass(f"autotile_fused_softmax_{target_name}", before, after)


def test_given_schedules_replace_the_heuristics() -> None:
    from polytile.passes.schedule import Schedule
    source, shapes, _ = PROGRAMS["mm"]
    before = lowered(source, shapes)
    given = Schedule(tiles=(("m", 5),), parallel=False)
    after = autotile(before, target("cpu-generic"), {"schedules": {"s0": given}})
    s0 = block(after, "s0")
    assert [i.name for i in s0.idxs] == ["m_c"] and "parallel" not in s0.tags
    from .helpers import assert_same_meaning
    assert_same_meaning(before, after)


def test_one_broadcast_operand_takes_two_vectors_on_avx2() -> None:
    # mm and A^T B (a weight gradient) unroll one index, the broadcast operand's: with
    # 16 registers the tile is 6 rows of two vectors (12 accumulators, BLIS's 6x16),
    # not 8 rows of one (8 accumulators, too few to hide the FMA latency).
    source, shapes, _ = PROGRAMS["mm"]
    avx2 = target("cpu-avx2")
    schedule = choose_schedule(block(lowered(source, shapes), "s0"), avx2)
    assert (schedule.vector, schedule.vectors, schedule.unroll) == ("n", 2, (("m", 6),))
    atb = "def atb(float(K,M) A, float(K,N) B) -> (C) {\n  C(m,n) +=! A(kk,m) * B(kk,n)\n}\n"
    before = lowered(atb, {"A": (53, 37), "B": (53, 45)})
    after = autotile(before, avx2, {})
    check_pass("autotile_atb_cpu-avx2", before, after)


GCONV = """
def gconv(float(N,G,C,H,W) I, float(G,F,C,KH,KW) W1) -> (O) {
  O(n,g,o,h,w) +=! I(n,g,i, h + kh, w + kw) * W1(g,o,i,kh,kw)
}
"""


def test_rows_shorter_than_a_pair_take_one_pair_on_avx2() -> None:
    # 12-wide convolution rows take two single vectors (8 + 4 lanes) or one pair: the
    # pair is one tile where the singles need a second, masked one (the tuner's find on
    # gconv 32x32x16x16x14x14). The images lie a multiple of a page apart, but the
    # register tile spans output channels and rows, not images.
    shapes = {"I": (2, 3, 4, 14, 14), "W1": (3, 5, 4, 3, 3)}
    before = lowered(GCONV, shapes)
    schedule = choose_schedule(block(before, "s0"), target("cpu-avx2"))
    assert (schedule.vector, schedule.vectors) == ("w", 2)
    assert "n" not in dict(schedule.unroll)
    from .helpers import assert_same_meaning
    assert_same_meaning(before, autotile(before, target("cpu-avx2"), {}), tolerance=1e-4)
    # Output rows a page apart along a tile's rows keep single vectors (tmm, 1024 wide).
    tmm = PROGRAMS["tmm"][0]
    wide = choose_schedule(block(lowered(tmm, {"A": (64, 32), "B": (1024, 32)}), "s0"),
                           target("cpu-avx2"))
    assert wide.vectors == 1


def test_a_batch_index_is_not_unrolled_with_the_broadcast_one() -> None:
    # A 1x1 convolution as a batched GEMM: the image index n and the output channel k
    # each save one input's loads. Unrolling both (3 images x 4 channels, one vector)
    # gave each unrolled image its own stream of pages, and 8 images in tiles of 3 left
    # two threads 2:1 work; one index and two vectors (6x16) run a GEMM per image.
    conv = "def c(float(N,C,P) X, float(C,K) W) -> (O) {\n  O(n,k,p) +=! X(n,c,p) * W(c,k)\n}\n"
    before = lowered(conv, {"X": (8, 64, 784), "W": (64, 64)})
    schedule = choose_schedule(block(before, "s0"), target("cpu-avx2"))
    assert (schedule.vector, schedule.vectors, schedule.unroll) == ("p", 2, (("k", 6),))
    # Rows closer than a page (a convolution's neighbouring output rows) still pair up.
    rows = choose_schedule(block(lowered(GCONV, {"I": (2, 3, 4, 14, 14),
                                                 "W1": (3, 5, 4, 3, 3)}), "s0"),
                           target("cpu-avx2"))
    assert len(rows.unroll) == 2 and "n" not in dict(rows.unroll)
