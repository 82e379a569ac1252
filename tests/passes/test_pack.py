"""pack (polytile/passes/pack.py): an operand that a contraction reads with a non-unit
stride along the vector index, and reuses across another index, is copied once into
panels as wide as the micro-kernel's vector tile, with that index innermost. Golden
text before and after, and the same results from the IR interpreter."""
from __future__ import annotations

from polytile.ir import nodes as N
from polytile.passes.pack import pack

from .helpers import check_pass, lowered, target

TMM = "def tmm(float(M,K) A, float(N,K) B) -> (C) {\n  C(m,n) +=! A(m,kk) * B(n,kk)\n}\n"
MM = "def mm(float(M,K) A, float(K,N) B) -> (C) {\n  C(m,n) +=! A(m,kk) * B(kk,n)\n}\n"
AVX512 = target("cpu-avx512")


def test_tmm_reads_b_in_panels() -> None:
    # N = 29 < 32: one panel of 16 lanes is full, the second has 13; the contraction's
    # n splits into (n_o, n) with a constraint that removes the overflow.
    before = lowered(TMM, {"A": (37, 53), "B": (29, 53)})
    after = pack(before, AVX512, {"min_reuse": 4})
    names = [s.name for s in after.body.stmts if isinstance(s, N.Block)]
    assert names == ["s0_init", "pack_B_panels0", "s0"]
    (packed,) = [r for r in after.body.refs if r.dir == "none"]
    assert packed.shape.sizes == (2, 53, 16)
    check_pass("pack_tmm", before, after)


def test_wide_panels_take_two_vectors() -> None:
    before = lowered(TMM, {"A": (37, 53), "B": (70, 53)})
    after = pack(before, AVX512, {"min_reuse": 4})
    (packed,) = [r for r in after.body.refs if r.dir == "none"]
    assert packed.shape.sizes == (3, 53, 32)
    check_pass("pack_tmm_wide", before, after)


def test_nothing_to_pack() -> None:
    # mm: B is already unit-stride along n.
    mm = lowered(MM, {"A": (37, 53), "B": (53, 29)})
    assert pack(mm, AVX512, {"min_reuse": 4}) == mm
    # tmm with two rows: B would be read twice per element, less than min_reuse.
    tmm = lowered(TMM, {"A": (2, 53), "B": (29, 53)})
    assert pack(tmm, AVX512, {"min_reuse": 4}) == tmm
    # N below the vector width: no outer-product kernel to feed.
    narrow = lowered(TMM, {"A": (37, 53), "B": (7, 53)})
    assert pack(narrow, AVX512, {"min_reuse": 4}) == narrow
    assert pack(tmm, AVX512, {"enabled": False}) is tmm


ATB = "def atb(float(K,M) A, float(K,N) B) -> (C) {\n  C(m,n) +=! A(kk,m) * B(kk,n)\n}\n"


def test_atb_transposes_the_broadcast_operand() -> None:
    # C = A^T B (dW = dY^T X of a dense layer): the reduction runs over the outer index
    # of both operands. B is read along n in vectors as it is; A's rows (37 floats) are
    # a new cache line per step of kk, so A is copied once with kk innermost.
    before = lowered(ATB, {"A": (53, 37), "B": (53, 29)})
    after = pack(before, AVX512, {"min_reuse": 4})
    names = [s.name for s in after.body.stmts if isinstance(s, N.Block)]
    assert names == ["s0_init", "pack_A_panels0", "s0"]
    (packed,) = [r for r in after.body.refs if r.dir == "none"]
    assert packed.shape.sizes == (1, 37, 53)
    check_pass("pack_atb", before, after)


def test_atb_rows_within_a_line_stay() -> None:
    # Rows of 12 floats: a step of kk reads within the line the last one did.
    narrow = lowered(ATB, {"A": (53, 12), "B": (53, 29)})
    assert pack(narrow, AVX512, {"min_reuse": 4}) == narrow
    # Used by fewer than min_reuse columns of C: the copy would not pay.
    few = lowered(ATB, {"A": (53, 37), "B": (53, 2)})
    assert pack(few, AVX512, {"min_reuse": 4}) == few


def test_rows_in_one_set_of_l1_are_packed() -> None:
    # mm with B's rows 4 KiB apart (a 1024-wide layer's W in dX = dY W): unit-stride
    # along n already, but the rows a micro-kernel steps through share one set of L1
    # (8 lines), so B is copied into panels as tmm's B is.
    before = lowered(MM, {"A": (5, 20), "B": (20, 1024)})
    after = pack(before, AVX512, {"min_reuse": 4})
    (packed,) = [r for r in after.body.refs if r.dir == "none"]
    assert packed.shape.sizes == (32, 20, 32)
    (copy,) = [s for s in after.body.stmts if isinstance(s, N.Block) and "pack" in s.tags]
    assert copy.schedule.transpose == 0          # a plain copy, vectorized by autotile
    check_pass("pack_mm_aliased_rows", before, after)
    # Rows 4000 bytes apart spread over the sets; 12 rows fit one set's 12 ways (the
    # target's L1 is 48 KiB).
    spread = lowered(MM, {"A": (5, 20), "B": (20, 1000)})
    assert pack(spread, AVX512, {"min_reuse": 4}) == spread
    few = lowered(MM, {"A": (5, 12), "B": (12, 1024)})
    assert pack(few, AVX512, {"min_reuse": 4}) == few


def test_rows_a_page_apart_are_packed_when_reused_enough() -> None:
    # B's rows 4400 bytes apart: every step of the reduction on another page. Read by 70
    # rows of A the copy pays; by 5 it does not.
    reused = lowered(MM, {"A": (70, 20), "B": (20, 1100)})
    (packed,) = [r for r in pack(reused, AVX512, {"min_reuse": 4}).body.refs
                 if r.dir == "none"]
    assert packed.shape.sizes == (35, 20, 32)
    rarely = lowered(MM, {"A": (5, 20), "B": (20, 1100)})
    assert pack(rarely, AVX512, {"min_reuse": 4}) == rarely


def test_panels_are_one_register_tile_wide() -> None:
    # One decision (autotile.register_vectors) sizes both the panels and the register
    # tile: where the output rows a tile spans lie a page apart (tmm with N = 1024
    # floats) an AVX2 tile holds one vector per panel, so the panels are one vector
    # wide and the micro-kernel reads each whole; elsewhere two vectors, panels of 16.
    from polytile.passes.autotile import autotile, register_vectors

    from .helpers import assert_same_meaning, block
    avx2 = target("cpu-avx2")
    for n, width in ((1024, 8), (70, 16)):
        before = lowered(TMM, {"A": (13, 19), "B": (n, 19)})
        after = pack(before, avx2, {"min_reuse": 4})
        (packed,) = [r for r in after.body.refs if r.dir == "none"]
        assert packed.shape.sizes == (-(-n // width), 19, width)
        assert register_vectors(block(after, "s0"), avx2) == ("n", width // 8)
        assert_same_meaning(before, autotile(after, avx2, {}), tolerance=1e-4,
                            sum_of_products=True)


def test_a_given_schedule_sizes_the_panels() -> None:
    # The tuner's schedule (autotile.schedules, which the pipeline passes to pack as
    # well) decides the register tile, so it decides the panels too: 1 to 4 vectors of
    # 8 lanes, panels 8 to 32 wide, each result the reference's.
    import numpy as np

    from polytile.api import Module
    from polytile.compile import Compiler
    from polytile.config import load_config
    from polytile.lang.parser import parse
    from polytile.passes.schedule import Schedule
    from polytile.sema.analyze import analyze
    from polytile.sema.specialize import specialize

    program = analyze(parse(TMM))
    rng = np.random.default_rng(0)
    a = rng.standard_normal((13, 19)).astype(np.float32)
    b = rng.standard_normal((1024, 19)).astype(np.float32)
    for vectors in (1, 2, 3, 4):
        options = {"autotile.schedules": {"s0": Schedule(
            vector="i1", lanes=8, vectors=vectors, unroll=(("i0", 4),))}}
        compiler = Compiler(load_config(), target("cpu-avx2"), options=options)
        fn = compiler.ir(specialize(program.functions[0], {"A": a.shape, "B": b.shape}, {}))
        (packed,) = [r for r in fn.body.refs if r.dir == "none"]
        assert packed.shape.sizes[-1] == 8 * vectors
        got = Module(TMM, program, "c", compiler).tmm(a, b)
        np.testing.assert_allclose(got, a @ b.T, rtol=1e-5, atol=1e-4)


def test_a_micro_kernel_runs_over_one_panel() -> None:
    # A given schedule that names only the rows' unroll still runs each micro-kernel
    # over one panel: the panel index is a register tile loop, not the micro-kernel's.
    # (Before, the micro-kernel ran every panel of its cache tile, and all of them as
    # scalar code where the tile held the partial last panel: tmm 1024^3 with 24-wide
    # panels in tiles of 11 took 266 ms, not 35 ms, one thread on a Zen 3 EPYC.)
    import numpy as np

    from polytile.api import Module
    from polytile.compile import Compiler
    from polytile.config import load_config
    from polytile.lang.parser import parse
    from polytile.passes.schedule import Schedule
    from polytile.sema.analyze import analyze
    from polytile.sema.specialize import specialize

    def micro_kernels(b: N.Block) -> list[N.Block]:
        inner = [s for s in b.stmts if isinstance(s, N.Block)]
        return [b] if b.schedule.micro else [m for s in inner for m in micro_kernels(s)]

    program = analyze(parse(TMM))
    rng = np.random.default_rng(1)
    a = rng.standard_normal((29, 37)).astype(np.float32)
    b = rng.standard_normal((200, 37)).astype(np.float32)     # 8 panels of 24 and one of 8
    options = {"autotile.schedules": {"s0": Schedule(
        vector="i1", lanes=8, vectors=3, unroll=(("i0", 4),),
        tiles=(("i0", 12), ("i1_o", 4), ("i2", 16)))}}
    compiler = Compiler(load_config(), target("cpu-avx2"), options=options)
    fn = compiler.ir(specialize(program.functions[0], {"A": a.shape, "B": b.shape}, {}))
    (micro,) = micro_kernels(next(s for s in fn.body.stmts
                                  if isinstance(s, N.Block) and s.name == "s0"))
    loops = {i.name: i.range for i in micro.idxs if i.affine is None and i.range > 1}
    assert loops == {"i0": 4, "i1": 24, "i2": 16}
    got = Module(TMM, program, "c", compiler).tmm(a, b)
    np.testing.assert_allclose(got, a @ b.T, rtol=1e-5, atol=1e-4)
