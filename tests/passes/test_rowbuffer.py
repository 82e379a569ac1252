"""Pass rowbuffer: a buffer a fused row loop writes and reads again within the row lives
in a one-row local until its last writer, so the buffer is written once. Golden IR, the
cases it must leave alone, and the IR interpreter before and after."""
from __future__ import annotations

from dataclasses import replace

from polytile.bench.memorybound import LAYERNORM, SOFTMAX
from polytile.ir import nodes as N
from polytile.passes.fuse import fuse
from polytile.passes.rowbuffer import rowbuffer

from .helpers import check_pass, lowered, target

GENERIC = target("cpu-generic")
SHAPES = {"X": (7, 13)}


def _fused(source: str, shapes: dict[str, tuple[int, ...]]) -> N.Function:
    return fuse(lowered(source, shapes), GENERIC, {"strategy": "rows"})


def _locals(fn: N.Function) -> list[str]:
    [block] = [s for s in fn.body.stmts if isinstance(s, N.Block) and "fused" in s.tags]
    return [r.into for r in block.refs if r.dir == "none"]


def test_softmax_writes_its_output_once() -> None:
    before = _fused(SOFTMAX, SHAPES)
    after = rowbuffer(before, GENERIC, {})
    check_pass("rowbuffer_softmax", before, after)
    assert "Y_row" in _locals(after)


# The exp values are re-read by the sum, then Y is added into: the last writer does not
# assign, so its writes need the values the row holds in Y itself.
ADDED = """
def added(float(N,D) X) -> (Y) {
  Y(n,d) = exp(X(n,d))
  s(n) +=! Y(n,d)
  Y(n,d) += s(n)
}
"""


def test_a_last_writer_that_adds_keeps_the_buffer() -> None:
    before = _fused(ADDED, SHAPES)
    assert rowbuffer(before, GENERIC, {}) == before


# The last writer writes half of each row: the other half of what the first one wrote
# would stay in the local.
HALF = """
def half(float(N,D) X) -> (Y) {
  Y(n,d) = exp(X(n,d))
  s(n) +=! Y(n,d)
  Y(n,h) = Y(n,h) / s(n) where h in 0:4
}
"""


def test_a_last_writer_that_misses_elements_keeps_the_buffer() -> None:
    before = _fused(HALF, SHAPES)
    assert rowbuffer(before, GENERIC, {}) == before


def test_an_output_written_once_is_left_alone() -> None:
    before = _fused(LAYERNORM, {"X": (7, 13), "gamma": (13,), "beta": (13,)})
    assert rowbuffer(before, GENERIC, {}) == before


def test_a_row_larger_than_half_of_l2_is_left_alone() -> None:
    before = _fused(SOFTMAX, SHAPES)
    caches = {**dict(GENERIC.cache_bytes), "L2": 2 * 13 * 4 - 1}   # half of it: one row less
    small = replace(GENERIC, cache_bytes=tuple(sorted(caches.items())))
    assert rowbuffer(before, small, {}) == before
    assert rowbuffer(before, GENERIC, {"enabled": False}) == before


# The variational encoder's shape: h comes from a contraction of its own (its weights
# exceed half of L1, so it keeps its tiled loop nest), the row loop rewrites it in place
# and reads it back; nothing after the loop reads h, so the loop need not write it.
HIDDEN = """
def hidden(float(N,I) X, float(H,I) W, float(H) b, float(Z,H) V) -> (Y) {
  h(n,j) +=! X(n,i) * W(j,i)
  h(n,j) = fmaxf(h(n,j) + b(j), 0)
  Y(n,z) +=! h(n,j) * V(z,j)
}
"""
HIDDEN_SHAPES = {"X": (5, 80), "W": (64, 80), "b": (64,), "V": (3, 64)}


def _fused_block(fn: N.Function) -> N.Block:
    [block] = [s for s in fn.body.stmts if isinstance(s, N.Block) and "fused" in s.tags]
    return block


def test_a_temporary_dead_after_the_loop_is_not_written_back() -> None:
    before = _fused(HIDDEN, HIDDEN_SHAPES)
    assert _fused_block(before).ref("h").dir == "inout"
    after = rowbuffer(before, GENERIC, {})
    check_pass("rowbuffer_hidden", before, after)
    assert _fused_block(after).ref("h").dir == "in"
    assert "h_row" in _locals(after)


def test_a_temporary_read_after_the_loop_is_written_back() -> None:
    # The same loop, with h read (transposed: no row loop takes it) after it.
    later = HIDDEN.replace("-> (Y) {", "-> (Y, T) {").replace(
        "  Y(n,z) +=! h(n,j) * V(z,j)\n", "  Y(n,z) +=! h(n,j) * V(z,j)\n  T(j,n) = h(n,j)\n")
    before = _fused(later, HIDDEN_SHAPES)
    assert isinstance(before.body.stmts[-1], N.Block) and "fused" not in before.body.stmts[-1].tags
    assert rowbuffer(before, GENERIC, {}) == before
