"""apply_schedule (polytile/passes/schedule.py): cache tiles, then register tiles, with
the leaf tagged for the vector code generator; golden text before and after, and the
same results from the IR interpreter on random data at sizes the tiles do not divide."""
from __future__ import annotations

from polytile.dtypes import FLOAT32
from polytile.ir import nodes as N
from polytile.passes.schedule import Schedule, apply_schedule

from .helpers import block, check_pass, lowered, with_block

MM = """
def mm(float(M,K) A, float(K,N) B) -> (C) {
  C(m,n) +=! A(m,k) * B(k,n)
}
"""
TMM = """
def tmm(float(M,K) A, float(N,K) B) -> (C) {
  C(m,n) +=! A(m,kk) * B(n,kk)
}
"""


def scheduled(fn: N.Function, name: str, schedule: Schedule) -> N.Function:
    return with_block(fn, name, apply_schedule(block(fn, name), schedule, fn.body))


def leaves(b: N.Block) -> list[N.Block]:
    inner = [s for s in b.stmts if isinstance(s, N.Block)]
    return [b] if not inner else [leaf for s in inner for leaf in leaves(s)]


def test_outer_product_schedule_for_matmul() -> None:
    """Vector index n (parallel, unit stride in C and B), two vectors of 8 lanes, m
    unrolled by 4; cache tiles on m, n and the reduction k, none dividing 19x37x23."""
    before = lowered(MM, {"A": (19, 23), "B": (23, 37)})
    schedule = Schedule(vector="n", lanes=8, unroll=(("m", 4),), vectors=2,
                        tiles=(("k", 8), ("m", 8), ("n", 32)), parallel=True)
    after = scheduled(before, "s0", schedule)
    outer = block(after, "s0")
    assert "tiled" in outer.tags and outer.schedule.parallel
    (leaf,) = leaves(outer)
    # 19 rows and 37 columns leave remainders of m's 4 and n's 16: one version each.
    assert leaf.schedule == N.BlockSchedule(micro=True, vector=N.VectorLoop("n", FLOAT32, 8),
                                            boundary="remainders", unroll=("m",))
    assert {i.name: i.range for i in leaf.idxs if i.affine is None} == {"m": 4, "n": 16, "k": 8}
    check_pass("schedule_mm_outer_product", before, after)


def test_cache_tile_loop_order() -> None:
    """order puts the reduction's tile loop k_c outermost, then n_c; m_c follows. The
    OpenMP loop stays a parallel one (the code generator picks the first loop whose
    iterations write disjoint elements)."""
    before = lowered(MM, {"A": (19, 23), "B": (23, 37)})
    schedule = Schedule(vector="n", lanes=8, unroll=(("m", 4),), vectors=2,
                        tiles=(("k", 8), ("m", 8), ("n", 32)), parallel=True,
                        order=("k", "n"))
    assert schedule.text().endswith("parallel=1 order=k,n")
    after = scheduled(before, "s0", schedule)
    assert [i.name for i in block(after, "s0").idxs] == ["k_c", "n_c", "m_c"]
    check_pass("schedule_mm_loop_order", before, after)


def test_dot_product_schedule_for_tmm() -> None:
    """Vector index kk is a reduction (unit stride in both inputs): a dot-product kernel
    with a 2x2 register tile of accumulators; only kk has a cache tile."""
    before = lowered(TMM, {"A": (11, 37), "B": (13, 37)})
    schedule = Schedule(vector="kk", lanes=8, unroll=(("m", 2), ("n", 2)),
                        tiles=(("kk", 16),), parallel=False)
    after = scheduled(before, "s0", schedule)
    assert not block(after, "s0").schedule.parallel
    (leaf,) = leaves(block(after, "s0"))
    assert leaf.schedule.vector is not None and leaf.schedule.vector.index == "kk"
    assert leaf.schedule.unroll == ("m", "n")
    check_pass("schedule_tmm_dot_product", before, after)


def test_register_tiles_only() -> None:
    """No cache tiles: the register tiling is the outer block, and nothing is parallel."""
    before = lowered("def act(float(M,N) X) -> (Y) {\n  Y(i,j) = tanh(X(i,j)) * 0.5\n}\n",
                     {"X": (7, 45)})
    after = scheduled(before, "s0", Schedule(vector="j", lanes=16, unroll=(("i", 2),)))
    outer = block(after, "s0")
    assert "regtiles" in outer.tags and not outer.schedule.parallel
    check_pass("schedule_register_tiles_only", before, after)


def test_scalar_schedule_with_cache_tiles() -> None:
    """No vector index: cache tiles only, the leaf a register tile for the scalar code."""
    before = lowered("def rowmax(float(M,N) X) -> (Y) {\n  Y(i) max=! X(i,j)\n}\n",
                     {"X": (10, 11)})
    after = scheduled(before, "s0", Schedule(tiles=(("i", 4), ("j", 5)), parallel=True))
    outer = block(after, "s0")
    assert outer.schedule.parallel
    (leaf,) = leaves(outer)
    assert leaf.schedule.micro and leaf.schedule.vector is None
    check_pass("schedule_scalar_cache_tiles", before, after)


def test_schedule_of_a_block_inside_a_fused_row_loop() -> None:
    """A member of a fused block has the row passed in; its schedule tiles the rest."""
    from polytile.passes.fuse import fuse

    from .helpers import target
    softmax = """
def softmax(float(N,C) X) -> (Y) {
  mx(n) max=! X(n,c)
  e(n,c) = exp(X(n,c) - mx(n))
  s(n) +=! e(n,c)
  Y(n,c) = e(n,c) / s(n)
}
"""
    before = fuse(lowered(softmax, {"X": (3, 21)}), target("cpu-generic"), {})
    fused = before.body.stmts[0]
    assert isinstance(fused, N.Block) and "fused" in fused.tags
    members = []
    for m in fused.stmts:
        assert isinstance(m, N.Block)
        if "init" not in m.tags:
            m = apply_schedule(m, Schedule(vector="c", lanes=4, tiles=(("c", 8),),
                                           parallel=False), fused)
        members.append(m)
    after = with_block(before, fused.name, N.Block(
        fused.name, fused.idxs, fused.constraints, fused.refs, tuple(members), fused.tags))
    check_pass("schedule_fused_members", before, after)


def test_register_tiles_of_a_panel_split_vector_index_come_first() -> None:
    """After packing, the vector index n is split into panels n_o (pack.split_index);
    the register tiles still iterate the vector operand's panels outermost, so the row
    tiles inside reuse one panel from L1."""
    from polytile.passes.pack import split_index

    before = lowered(MM, {"A": (19, 23), "B": (23, 70)})
    split = with_block(before, "s0", split_index(block(before, "s0"), "n", 16))
    schedule = Schedule(vector="n", lanes=16, unroll=(("m", 4), ("n_o", 2)),
                        tiles=(("m", 8),), parallel=False)
    after = scheduled(split, "s0", schedule)
    (register,) = [s for s in block(after, "s0").stmts if isinstance(s, N.Block)]
    assert [i.name for i in register.idxs if i.affine is None][:2] == ["n_o_r", "m_r"]
    check_pass("schedule_panel_register_tiles", split, after)


MM64 = """
def mm64(double(M,K) A, double(K,N) B) -> (C) {
  C(m,n) +=! A(m,k) * B(k,n)
}
"""
GATHER = """
def rows(float(N,D) E, int32(B) I) -> (O) {
  O(b,d) = E(I(b), d)
}
"""


def test_no_vector_is_recorded_where_the_generator_could_not_print_one() -> None:
    """The schedule pass decides vector code once (analysis.vectorizable): a double
    matmul asked for vectors along n gets a scalar register tile (the C generator only
    prints float32 vectors), and its golden IR says so; float32 keeps the vector."""
    schedule = Schedule(vector="n", lanes=8, unroll=(("m", 4),), vectors=1, tiles=(),
                        parallel=False)
    before = lowered(MM64, {"A": (9, 5), "B": (5, 11)})
    after = scheduled(before, "s0", schedule)
    (leaf,) = leaves(block(after, "s0"))
    assert leaf.schedule == N.BlockSchedule(micro=True)
    check_pass("schedule_mm_float64_scalar", before, after)
    (leaf32,) = leaves(block(scheduled(lowered(MM, {"A": (9, 5), "B": (5, 11)}), "s0",
                                       schedule), "s0"))
    assert leaf32.schedule.vector == N.VectorLoop("n", FLOAT32, 8)


def test_why_not_vector_names_the_reason() -> None:
    from polytile.analysis.vectorizable import why_not_vector

    mm64 = block(lowered(MM64, {"A": (9, 5), "B": (5, 11)}), "s0")
    assert why_not_vector(mm64, "n") == "load $B is not float32"
    mm = block(lowered(MM, {"A": (9, 5), "B": (5, 11)}), "s0")
    assert why_not_vector(mm, "n") is None
    assert why_not_vector(mm, "m") == "view C does not move by one element along m"
    assert why_not_vector(mm, "k") == "view B does not move by one element along k"
    gather = block(lowered(GATHER, {"E": (7, 16), "I": (5,)}), "s0")
    assert why_not_vector(gather, "d") is None      # the gathered row is contiguous
    assert why_not_vector(gather, "b") == "view O does not move by one element along b"
