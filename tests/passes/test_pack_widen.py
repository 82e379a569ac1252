"""pack (polytile/passes/pack.py) widening narrow floats: a float32 contraction that
reads bfloat16 (or float16) operands only through casts to float32 gets float32 copies
of them, so the fp32 micro-kernel runs it (the widening is exact, `isa.inspect.widens`).
Golden text before and after, and the same results from the IR interpreter."""
from __future__ import annotations

from polytile import dtypes
from polytile.ir import nodes as N
from polytile.passes.fuse import fuse
from polytile.passes.pack import pack, widened

from .helpers import assert_same_meaning, check_pass, lowered, target

BMM = ("def bmm(bfloat16(M,K) A, bfloat16(K,N) B) -> (C) {\n"
       "  C(m,n) +=! float(A(m,k)) * float(B(k,n))\n}\n")
BTMM = ("def btmm(bfloat16(M,K) A, bfloat16(N,K) B) -> (C) {\n"
        "  C(m,n) +=! float(A(m,k)) * float(B(n,k))\n}\n")
BATB = ("def batb(bfloat16(K,M) A, bfloat16(K,N) B) -> (C) {\n"
        "  C(m,n) +=! float(A(k,m)) * float(B(k,n))\n}\n")
HMM = ("def hmm(half(M,K) A, half(K,N) B) -> (C) {\n"
       "  C(m,n) +=! float(A(m,k)) * float(B(k,n))\n}\n")
# the loads feed a bfloat16 multiply, not casts to float32: they are not widened
NARROW = ("def nmm(bfloat16(M,K) A, bfloat16(K,N) B) -> (C) {\n"
          "  C(m,n) +=! float(A(m,k) * B(k,n))\n}\n")
# the widened loads are cast first; what is rounded later is rounded alike
ROUNDED = ("def rmm(bfloat16(M,K) A, bfloat16(K,N) B) -> (C) {\n"
           "  C(m,n) +=! float(bfloat16(float(A(m,k)) * float(B(k,n))))\n}\n")
AVX2 = target("cpu-avx2")
AVX512 = target("cpu-avx512")
SIZES = {"A": (37, 53), "B": (53, 29)}


def copies(fn: N.Function) -> list[N.Block]:
    return [s for s in fn.body.stmts if isinstance(s, N.Block) and "pack" in s.tags]


def contraction(fn: N.Function) -> N.Block:
    return next(s for s in fn.body.stmts if isinstance(s, N.Block) and "contraction" in s.tags)


def test_bf16_operands_are_copied_as_float32() -> None:
    # 37 x 53 x 29: B (vector operand, unit-stride, read in place were it float32) goes
    # into float32 panels of two 8-lane vectors (two, the second cut at 29), A (broadcast) into
    # float32 rows with the reduction innermost; the contraction then reads float32 only.
    before = lowered(BMM, SIZES)
    after = pack(before, AVX2, {"min_reuse": 4})
    assert [s.name for s in after.body.stmts if isinstance(s, N.Block)] == [
        "s0_init", "pack_A_panels0", "pack_B_panels1", "s0"]
    locals_ = {r.into: r.shape for r in after.body.refs if r.dir == "none"}
    assert {k: (v.dtype.name, v.sizes) for k, v in locals_.items()} == {
        "A_panels0": ("float32", (1, 37, 53)), "B_panels1": ("float32", (2, 53, 16))}
    assert all(r.shape.dtype == dtypes.FLOAT32 for r in contraction(after).refs)
    for copy in copies(after):
        assert [type(s).__name__ for s in copy.stmts] == ["Load", "Intrinsic", "Store"]
    check_pass("pack_bmm_widened", before, after)


def test_transposed_operands_are_widened_in_the_copies_they_get_anyway() -> None:
    # B(n, k): panels by a transposing copy; A(k, m) of A^T B: rows with k innermost.
    for source, shapes, name in ((BTMM, {"A": (37, 53), "B": (29, 53)}, "pack_btmm_widened"),
                                 (BATB, {"A": (53, 37), "B": (53, 29)}, "pack_batb_widened")):
        before = lowered(source, shapes)
        after = pack(before, AVX512, {"min_reuse": 4})
        assert len(copies(after)) == 2
        assert all(r.shape.dtype == dtypes.FLOAT32 for r in contraction(after).refs)
        check_pass(name, before, after)


def test_only_loads_read_through_casts_to_float32_are_widened() -> None:
    for source, widens in ((HMM, True), (ROUNDED, True), (NARROW, False)):
        before = lowered(source, SIZES)
        block = contraction(before)
        want = dtypes.FLOAT32 if widens else dtypes.BFLOAT16
        assert [widened(block, r) for r in block.refs if r.dir == "in"] == [want] * 2
        after = pack(before, AVX2, {"min_reuse": 4})
        assert any(r.shape.dtype == dtypes.FLOAT32 for r in after.body.refs
                   if r.dir == "none") == widens
        assert_same_meaning(before, after)


def test_widening_does_not_wait_for_reuse_or_scattered_rows() -> None:
    # One row of A: B is used once per element, and its rows (58 bytes) share no set of
    # L1: a float32 B would be read in place; a bfloat16 one is copied, or no vector code
    # could read it. (A's row, used 29 times, is widened as in any bf16 matmul.)
    before = lowered(BMM, {"A": (1, 53), "B": (53, 29)})
    after = pack(before, AVX2, {"min_reuse": 4})
    assert [s.name for s in copies(after)] == ["pack_A_panels0", "pack_B_panels1"]
    float32 = lowered(BMM.replace("bfloat16", "float"), {"A": (1, 53), "B": (53, 29)})
    assert pack(float32, AVX2, {"min_reuse": 4}) == float32
    assert_same_meaning(before, after)


def test_a_fused_row_reads_one_widened_copy_made_before_the_rows() -> None:
    # After fuse's row loop (small sizes), A's row is widened per row (its slice), but B,
    # the same for every row, is widened once outside the row loop and passed in.
    before = fuse(lowered(BMM, SIZES), AVX2, {"strategy": "rows"})
    assert [s.name for s in before.body.stmts if isinstance(s, N.Block)] == ["fused_0"]
    after = pack(before, AVX2, {"min_reuse": 4})
    outer = [s.name for s in after.body.stmts if isinstance(s, N.Block)]
    assert outer == ["pack_B_widened0", "fused_0"]
    row = next(s for s in after.body.stmts if isinstance(s, N.Block) and s.name == "fused_0")
    assert [s.name for s in row.stmts if isinstance(s, N.Block)] == [
        "s0_init", "pack_A_panels0", "s0"]
    check_pass("pack_bmm_fused_widened", before, after)


def test_a_bf16_output_sums_in_float32_and_so_is_widened_too() -> None:
    # A reduction into a bfloat16 tensor sums in float32 (polytile.sema.widen): the
    # contraction writes a float32 temporary, rounded into C after it, so the float32
    # micro-kernel runs it on widened operands as it does a float32 output.
    source = BMM.replace("-> (C)", "-> (bfloat16(M,N) C)")
    before = lowered(source, SIZES)
    assert contraction(before).refs[0].shape.dtype == dtypes.FLOAT32
    blocks = [s for s in before.body.stmts if isinstance(s, N.Block)]
    assert blocks[-1].refs[0].from_ == "C" and blocks[-1].refs[0].shape.dtype == dtypes.BFLOAT16
    after = pack(before, AVX2, {"min_reuse": 4})
    names = [s.name for s in after.body.stmts if isinstance(s, N.Block)]
    assert names == ["s0_init", "pack_A_panels0", "pack_B_panels1", "s0", "s1"]
