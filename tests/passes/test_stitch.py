"""Stitched kernels (issue 17 item 5, FusionStitching §5 on a CPU): a plan's group that is
not one row loop becomes one block whose phases share one parallel region. Golden IR,
loop IR and C text of a small example; the phases' schedule (which phase is shared out,
where the threads wait) from polytile.ir.phases; the verifier refusing a missing
barrier; and the loop IR interpreter, which runs a region as threads taking turns,
showing the wrong result a missing barrier would give."""
from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import polytile.passes.autotile as autotile_module
from polytile.codegen.c import print_c
from polytile.errors import IRError
from polytile.ir import nodes as N
from polytile.ir.phases import depends, required_barriers
from polytile.ir.verify import verify
from polytile.loops import interp as loop_interp
from polytile.loops import nodes as L
from polytile.loops.interp import static_share
from polytile.loops.lower import lower as lower_loops
from polytile.loops.text import kernel_text
from polytile.passes.autotile import autotile
from polytile.passes.fuse import fuse

from .helpers import (
    assert_same_meaning,
    check_pass,
    lowered,
    random_buffers,
    run,
    target,
)

GENERIC = target("cpu-generic")

# Row sums of X (rows n), then a transposed copy that reads every row's sum (rows d):
# two parallel shapes, and the second reads what other threads wrote in the first.
TWO_SHAPES = """
def two_shapes(float(N,D) X, float(D) b) -> (T, c) {
  s(n) +=! X(n,d)
  T(d,n) = X(n,d) - s(n) / D + b(d)
  c(d) +=! T(d,n)
}
"""
SIZES = {"X": (300, 130), "b": (130,)}


@pytest.fixture(autouse=True)
def two_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(autotile_module, "_cores", lambda: 2)


GOLDEN_DIR = Path(__file__).resolve().parents[1] / "golden"


def golden_text(path: Path, text: str) -> None:
    """To accept a deliberate change, run with POLYTILE_UPDATE_GOLDEN=1 and review the diff."""
    if os.environ.get("POLYTILE_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{path.name} changed; see golden_text's docstring"


def stitched_ir() -> tuple[N.Function, N.Function]:
    before = lowered(TWO_SHAPES, SIZES)
    fused = fuse(before, GENERIC, {"groups": [[0, 1, 2]]})
    return before, autotile(fused, GENERIC, {})


def stitched_block(fn: N.Function) -> N.Block:
    [block] = [s for s in fn.body.stmts if isinstance(s, N.Block) and "stitched" in s.tags]
    return block


def test_a_group_of_two_parallel_shapes_is_one_stitched_block() -> None:
    before, after = stitched_ir()
    check_pass("stitch_two_shapes", before, after)
    block = stitched_block(after)
    assert len(after.body.stmts) == 1
    # s(n) is a row loop over n, T(d,n) and c(d) one over d: two phases, in order.
    assert [p.name for p in block.stmts] == ["stitched_0_rows0", "stitched_0_rows1"]
    assert [m.name for m in block.stmts[1].stmts] == ["s1", "s2_init", "s2"]
    assert block.schedule.stitch is not None
    phases = block.schedule.stitch.phases
    assert [p.shared for p in phases] == [True, True]
    # The second reads the row sums s, which other threads wrote in the first.
    assert [p.barrier for p in phases] == [True, False]
    # s passes between the phases: a whole buffer of the function, shared by the threads.
    assert any(r.into == "s" and r.dir == "none" for r in after.body.refs)


def test_the_loop_ir_and_c_of_a_stitched_kernel() -> None:
    _, after = stitched_ir()
    kernel = lower_loops(after)
    golden_text(GOLDEN_DIR / "loops" / "stitch_two_shapes.loops", kernel_text(kernel))
    golden_text(GOLDEN_DIR / "c" / "stitch_two_shapes.c", print_c(kernel).text)
    [region] = [s for s in kernel.body if isinstance(s, L.Region)]
    kinds = [type(s).__name__ if not isinstance(s, L.Loop) else s.kind for s in region.body
             if not isinstance(s, L.Comment)]
    assert kinds == ["workshare", "Barrier", "workshare"]
    text = print_c(kernel).text
    assert text.count("#pragma omp parallel\n") == 1
    assert text.count("#pragma omp for schedule(static) nowait") == 2
    assert text.count("#pragma omp barrier") == 1


def test_barriers_only_where_a_later_phase_depends_on_an_earlier_one() -> None:
    fn = lowered("""
def independent(float(N) x, float(M) y) -> (a, b, c) {
  a(n) = x(n) * 2
  b(m) = y(m) + 1
  c(n) = a(n) + 1
}""", {"x": (9,), "y": (5,)})
    a, b, c = (s for s in fn.body.stmts if isinstance(s, N.Block))
    assert not depends(a, b) and depends(a, c) and not depends(b, c)
    # a and b run without waiting; c waits for a (and so for b, which ran before it).
    assert required_barriers([a, b, c]) == (False, True, False)
    # Write after read: a phase overwriting what an earlier one reads waits too.
    assert depends(c, replace(a, refs=tuple(replace(r, dir="out") if r.from_ == "a" else r
                                            for r in a.refs)))


def test_the_verifier_refuses_a_missing_barrier() -> None:
    _, after = stitched_ir()
    block = stitched_block(after)
    assert block.schedule.stitch is not None
    phases = list(block.schedule.stitch.phases)
    phases[0] = replace(phases[0], barrier=False)
    broken = replace(block, schedule=replace(block.schedule,
                                             stitch=N.Stitched(tuple(phases))))
    fn = replace(after, body=replace(after.body, stmts=(broken,)))
    with pytest.raises(IRError, match="no barrier after it"):
        verify(fn)


def test_the_interpreter_runs_threads_in_turns_and_shows_a_missing_barrier() -> None:
    before, after = stitched_ir()
    buffers = random_buffers(before, np.random.default_rng(3))
    want = run(before, buffers)
    kernel = lower_loops(after)
    for threads in (1, 2, 3):
        got = {k: v.copy() for k, v in buffers.items()}
        loop_interp.run(after, got, kernel, threads=threads)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4)
    # Without the barrier after the row sums, thread 1 reads sums thread 0 has not
    # written yet (NaN: the local starts as NaN).
    region = next(s for s in kernel.body if isinstance(s, L.Region))
    body = list(region.body)
    first_shared = next(k for k, s in enumerate(body)
                        if isinstance(s, L.Loop) and s.kind == "workshare")
    assert body[first_shared + 1] == L.Barrier("global")
    del body[first_shared + 1]
    broken = replace(kernel, body=tuple(replace(region, body=tuple(body)) if s is region
                                        else s for s in kernel.body))
    got = {k: v.copy() for k, v in buffers.items()}
    loop_interp.run(after, got, broken, threads=2)
    assert not np.allclose(got["T"], want["T"], equal_nan=False)


def test_static_share_splits_like_openmp() -> None:
    values = range(10)
    parts = [list(static_share(values, t, 3)) for t in range(3)]
    assert parts == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert list(static_share(range(2), 2, 3)) == []


def test_a_region_holds_only_phases() -> None:
    bad = L.Kernel("bad", (), (), (L.Region((L.Comment("x"), L.Barrier("global"),
                                             L.Loop("i0", N.Affine.constant(0),
                                                    N.Affine.constant(2), ()))),))
    with pytest.raises(IRError, match="parallel region holds a Loop"):
        loop_interp.run_kernel(bad, [])
    with pytest.raises(IRError, match="parallel region holds a Loop"):
        print_c(bad)


def test_meaning_is_kept_for_sizes_that_do_not_divide() -> None:
    for sizes in ({"X": (7, 5), "b": (5,)}, {"X": (301, 67), "b": (67,)}):
        before = lowered(TWO_SHAPES, sizes)
        after = autotile(fuse(before, GENERIC, {"groups": [[0, 1, 2]]}), GENERIC, {})
        verify(after)
        assert_same_meaning(before, after, seeds=(0, 1), tolerance=1e-4)


def test_workshare_loops_and_singles_only_in_a_region() -> None:
    loop = L.Loop("i0", N.Affine.constant(0), N.Affine.constant(2), (), kind="workshare")
    for stmt in (loop, L.Single(()), L.Barrier("global")):
        kernel = L.Kernel("bad", (), (), (stmt,))
        with pytest.raises(IRError, match="outside a parallel region"):
            print_c(kernel)
        if not isinstance(stmt, L.Barrier):
            with pytest.raises(IRError, match="outside a parallel region"):
                loop_interp.run_kernel(kernel, [])


# Y by rows, a transpose that needs nothing of Y, then Z by rows from Y's same row
# (INTERLEAVED) or from the mirrored row (MIRRORED), which another thread made.
INTERLEAVED = """
def interleaved(float(N,D) X) -> (Y, T, Z) {
  Y(n,d) = X(n,d) * 2
  T(d,n) = X(n,d) + 1
  Z(n,d) = Y(n,d) + X(n,d)
}
"""
MIRRORED = INTERLEAVED.replace("Y(n,d) + X(n,d)", "Y(N - 1 - n,d) + X(n,d)")


@pytest.mark.parametrize("source, waits", [(INTERLEAVED, False), (MIRRORED, True)])
def test_phases_over_the_same_rows_need_no_barrier_for_their_own_rows(
        source: str, waits: bool) -> None:
    before = lowered(source, {"X": (1001, 67)})
    after = autotile(fuse(before, GENERIC, {"groups": [[0, 1, 2]]}), GENERIC, {})
    verify(after)
    block = stitched_block(after)
    assert block.schedule.stitch is not None
    phases = block.schedule.stitch.phases
    assert [p.shared for p in phases] == [True, True, True]
    # Y -> T: independent. Y -> Z: the same thread made the row, unless mirrored.
    assert [p.barrier for p in phases] == [False, waits, False]
    buffers = random_buffers(before, np.random.default_rng(4))
    want = run(before, buffers)
    kernel = lower_loops(after)
    for threads in (2, 3):
        got = {k: v.copy() for k, v in buffers.items()}
        loop_interp.run(after, got, kernel, threads=threads)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5)
