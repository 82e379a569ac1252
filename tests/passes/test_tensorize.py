"""tensorize (polytile/passes/tensorize.py): on cpu-avx2 without AVX-VNNI, a u8 x s8
matmul is recorded to run on vpmaddwd (no accumulator operand, operands widened to
int16); golden text before and after, and the same results from the IR interpreter.
The kernels themselves are tested in tests/isa/test_tensorize.py."""
from __future__ import annotations

from dataclasses import replace

from polytile.ir import nodes as N
from polytile.passes.tensorize import dense, tensorize
from polytile.targets.target import load_target

from .helpers import check_pass, lowered

I8 = "def mm(uint8(M,K) A, int8(K,N) B) -> (C) {\n  C(m,n) +=! int32(A(m,k)) * int32(B(k,n))\n}\n"
AVX2 = replace(load_target("cpu-avx2"), features=frozenset({"avx2", "fma"}))


def test_an_avx2_target_without_vnni_records_vpmaddwd() -> None:
    before = lowered(I8, {"A": (37, 53), "B": (53, 29)})
    after = tensorize(before, AVX2, {})
    (block,) = [s for s in after.body.stmts if isinstance(s, N.Block) and s.schedule.tensorize]
    assert block.schedule.tensorize == N.Tensorized("vpmaddwd_256", "n", "k", 3, 4, kept=True)
    assert "tensorized" in block.tags and "kernel" not in block.tags
    check_pass("tensorize_i8mm_vpmaddwd", before, after, int_high={"p0": 256, "p1": 128})


def test_the_packed_operand_is_kept_only_from_a_read_only_dense_parameter() -> None:
    """`kept` (the packed B reused across calls while its values are unchanged) needs a
    parameter the kernel only reads, one contiguous run of memory; the pass's `keep`
    parameter turns it off."""
    before = lowered(I8, {"A": (37, 53), "B": (53, 29)})
    off = tensorize(before, AVX2, {"keep": False})
    assert [s.schedule.tensorize.kept for s in off.body.stmts
            if isinstance(s, N.Block) and s.schedule.tensorize] == [False]
    computed = lowered("def mm(uint8(M,K) A, int8(K,N) B) -> (C) {\n"
                       "  T(k,n) = B(k,n) + 1\n"
                       "  C(m,n) +=! int32(A(m,k)) * int32(T(k,n))\n}\n",
                       {"A": (37, 53), "B": (53, 29)})
    after = tensorize(computed, AVX2, {})
    assert [s.schedule.tensorize.kept for s in after.body.stmts
            if isinstance(s, N.Block) and s.schedule.tensorize] == [False]


def test_dense_means_one_run_of_memory_in_any_order() -> None:
    D = N.Dim
    assert dense((D(4, 3), D(3, 1))) and dense((D(3, 1), D(4, 3))) and dense((D(1, 99), D(5, 1)))
    assert not dense((D(4, 4), D(3, 1)))          # a row of 3 in 4: gaps
    assert not dense((D(4, -3), D(3, 1)))         # a reversed dimension
    assert not dense((D(4, 0), D(3, 1)))          # a broadcast: elements repeat


def test_with_vnni_the_instruction_with_more_products_wins() -> None:
    vnni = replace(AVX2, features=AVX2.features | {"avx_vnni"})
    after = tensorize(lowered(I8, {"A": (37, 53), "B": (53, 29)}), vnni, {})
    assert [s.schedule.tensorize.instruction for s in after.body.stmts
            if isinstance(s, N.Block) and s.schedule.tensorize] == ["vpdpbusd_256"]
