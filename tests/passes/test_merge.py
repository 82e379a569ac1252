"""Pass merge: consecutive elementwise members of a row loop become one block. Golden IR
of layernorm -> GELU -> residual, the members it leaves apart (a value another member
also reads, an output of the function, another element, a write of what the first
reads), and the meaning kept on random chains."""
from __future__ import annotations

from hypothesis import given

from polytile.bench.fusion_workloads import LN_GELU_RESIDUAL as LN_GELU
from polytile.ir import nodes as N
from polytile.passes.fuse import fuse
from polytile.passes.merge import merge

from .helpers import check_pass, lowered, target
from .test_properties import SETTINGS, chains, check

GENERIC = target("cpu-generic")


def _fused(source: str, shapes: dict[str, tuple[int, ...]]) -> N.Function:
    return fuse(lowered(source, shapes), GENERIC, {})


def _members(fn: N.Function) -> list[list[str]]:
    """Each row loop's members, by the buffers they write."""
    return [[",".join(sorted(r.from_ for r in m.refs if r.dir in ("out", "inout")))
             for m in row.stmts if isinstance(m, N.Block)]
            for row in fn.body.stmts if isinstance(row, N.Block) and "fused" in row.tags]


def test_layernorm_gelu_residual_runs_its_last_three_statements_as_one() -> None:
    before = _fused(LN_GELU, {"X": (5, 37), "gamma": (37,), "beta": (37,), "R": (5, 37)})
    after = merge(before, GENERIC, {})
    check_pass("merge_ln_gelu", before, after)
    assert _members(after) == [["mean", "mean", "mean", "var", "var", "rstd", "Y"]]
    (row,) = [s for s in after.body.stmts if isinstance(s, N.Block)]
    assert {r.into for r in row.refs if r.dir == "none"} == {"mean", "var", "rstd"}


def test_members_that_share_a_value_or_write_outputs_stay_apart() -> None:
    # t1 is read by two members: its member stays; t2 passes to t3 alone and merges.
    source = ("def f(float(N,M) X) -> (t3) {\n  t1(i,j) = X(i,j) * 2\n"
              "  t2(i,j) = t1(i,j) + 1\n  t3(i,j) = t1(i,j) * t2(i,j)\n}\n")
    assert _members(merge(_fused(source, {"X": (3, 7)}), GENERIC, {})) == [["t1", "t3"]]
    # t1 is an output of the function: written where the caller sees it, not passed.
    source = ("def f(float(N,M) X) -> (t1, t2) {\n  t1(i,j) = X(i,j) * 2\n"
              "  t2(i,j) = t1(i,j) + 1\n}\n")
    assert _members(merge(_fused(source, {"X": (3, 7)}), GENERIC, {})) == [["t1", "t2"]]
    # The second rewrites t0, which the first reads: their order matters.
    source = ("def f(float(N,M) X) -> (t0, t2) {\n  t0(i,j) = X(i,j) + 1\n"
              "  t1(i,j) = t0(i,j) * 2\n  t0(i,j) = t1(i,j) + 3\n  t2(i,j) = t0(i,j) - 1\n}\n")
    fused = _fused(source, {"X": (3, 7)})
    assert _members(fused) == [["t0", "t1", "t0", "t2"]]
    assert _members(merge(fused, GENERIC, {})) == [["t0", "t1", "t0", "t2"]]


def test_a_value_read_at_another_element_stays_in_its_buffer() -> None:
    source = ("def f(float(N,M) X) -> (t2) {\n  t1(i,j) = X(i,j) * 2\n"
              "  t2(i,j) = t1(i, M - 1 - j) + X(i,j)\n}\n")
    fused = _fused(source, {"X": (3, 7)})
    assert _members(fused) == [["t1", "t2"]]
    assert merge(fused, GENERIC, {}) == fused


@SETTINGS
@given(program=chains())
def test_merge_keeps_the_meaning_of_random_chains(program: tuple[str, dict]) -> None:
    source, shapes = program
    fused = fuse(lowered(source, shapes), GENERIC, {})
    check(fused, merge(fused, GENERIC, {}))


def test_merge_is_off_when_disabled() -> None:
    fused = _fused(LN_GELU, {"X": (2, 3), "gamma": (3,), "beta": (3,), "R": (2, 3)})
    assert merge(fused, GENERIC, {"enabled": False}) == fused
