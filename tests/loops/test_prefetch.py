"""Prefetching gathered rows (schedule `prefetch(d)`): the heuristics ask for it where
the table outgrows L2, the loop IR prefetches every line of the row the gather reads d
lookups ahead, and the kernel's results and index errors are those without it."""
from __future__ import annotations

import numpy as np
import pytest

import polytile as pt
from polytile.errors import IRError, OutOfBoundsError
from polytile.ir.parser import parse_function
from polytile.ir.printer import format_function
from polytile.ir.verify import verify
from polytile.loops import interp
from polytile.loops import nodes as L
from polytile.loops.lower import lower
from polytile.passes.schedule import Schedule

from .test_lowering import compiled_ir

BAG = "def bag(float(E,D) T, int(B,L) I) -> (O) {\n  O(b,d) +=! T(I(b,l), d)\n}\n"


def micro_schedules(fn) -> list:
    out = []

    def walk(block) -> None:
        if block.schedule.micro:
            out.append(block.schedule)
        for st in block.stmts:
            if hasattr(st, "stmts"):
                walk(st)
    walk(fn.body)
    return out


def prefetch_ifs(kernel: L.Kernel) -> list[L.If]:
    """The conditional read prefetches (a folded init's micro-kernel also prefetches the
    lines it stores, for writing, unconditionally)."""
    found: list[L.If] = []

    def walk(stmts) -> None:
        for st in stmts:
            if isinstance(st, L.If) and any(isinstance(s, L.Prefetch) and not s.write
                                            for s in st.then):
                found.append(st)
            for part in ("body", "then", "else_"):
                walk(getattr(st, part, ()))
            for _, body in getattr(st, "cases", ()):
                walk(body)
    walk(kernel.body)
    return found


def test_a_gather_from_a_table_bigger_than_l2_is_prefetched() -> None:
    fn = compiled_ir(BAG, "cpu-avx512", T=(200_000, 64), I=(13, 11))
    (schedule,) = [s for s in micro_schedules(fn) if s.unroll]
    assert schedule.prefetch == 8
    ifs = prefetch_ifs(lower(fn))
    assert ifs
    # Every 64-byte line of a 64-float row, and the row's last element.
    first = [s.offset for s in ifs[0].then if isinstance(s, L.Prefetch)][:5]
    assert [(o - first[0]).const for o in first] == [0, 16, 32, 48, 63]
    assert all(not (o - first[0]).terms for o in first)


def test_a_small_table_is_not_prefetched() -> None:
    fn = compiled_ir(BAG, "cpu-avx512", T=(1000, 64), I=(13, 11))
    assert all(s.prefetch == 0 for s in micro_schedules(fn))
    assert not prefetch_ifs(lower(fn))


@pytest.mark.parametrize("lookups", [11, 5])      # more and fewer than the distance
def test_prefetching_kernels_agree_with_numpy(lookups: int) -> None:
    rng = np.random.default_rng(lookups)
    table = rng.standard_normal((200_000, 64)).astype(np.float32)
    index = rng.integers(0, len(table), (13, lookups)).astype(np.int32)
    bag = pt.define(BAG).bag
    for _ in range(2):            # the checked path, then the fast path
        np.testing.assert_allclose(bag(table, index), table[index].sum(axis=1),
                                   rtol=1e-5, atol=1e-4)
    # A bad index among the last lookups (reached by prefetch only after the loads
    # before it) is reported as without prefetching.
    index[7, -1] = len(table) + 3
    with pytest.raises(OutOfBoundsError, match="T is indexed at 200003 in dimension 0"):
        bag(table, index)


def test_the_loop_ir_interpreter_skips_prefetches() -> None:
    # b, d, l are i0, i1, i2 in the IR.
    options = {"fuse.strategy": "none",
               "autotile.schedules": {"s0": Schedule("i1", 16, (("i0", 2),), 2, prefetch=2)}}
    fn = compiled_ir(BAG, "cpu-avx512", options, T=(9, 40), I=(5, 6))
    kernel = lower(fn)
    assert prefetch_ifs(kernel)
    rng = np.random.default_rng(0)
    table = rng.standard_normal((9, 40)).astype(np.float32)
    index = rng.integers(0, 9, (5, 6)).astype(np.int32)
    buffers = {"p0": table, "p1": index, "o0": np.zeros((5, 40), np.float32)}
    interp.run(fn, buffers, kernel)
    np.testing.assert_allclose(buffers["o0"], table[index].sum(axis=1), rtol=1e-5, atol=1e-5)


def test_prefetch_round_trips_through_the_ir_text_and_needs_a_gather() -> None:
    fn = compiled_ir(BAG, "cpu-avx512", T=(200_000, 64), I=(13, 11))
    text = format_function(fn)
    assert "prefetch(8)" in text
    assert format_function(parse_function(text)) == text
    plain = text.replace("$p0 = load(p0[$p1, _])", "$p0 = load(p0)")
    assert plain != text
    with pytest.raises(IRError, match="prefetch"):
        verify(parse_function(plain))
