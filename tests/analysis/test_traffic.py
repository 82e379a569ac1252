"""analysis.traffic: the bytes each kernel of an optimized function moves, counted by
hand on tiny programs (float32: 4 bytes an element)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from passes.helpers import target
from passes.test_stitch import TWO_SHAPES

from polytile.analysis.traffic import format_traffic, kernel_traffic, kernels, largest
from polytile.compile import Compiler
from polytile.config import load_config
from polytile.ir import nodes as N
from polytile.lang.parser import parse
from polytile.sema.analyze import analyze
from polytile.sema.specialize import specialize


def optimized(source: str, shapes: Mapping[str, tuple[int, ...]],
              options: dict[str, Any]) -> N.Function:
    fn = analyze(parse(source, "<test>")).functions[0]
    compiler = Compiler(load_config(), target("cpu-generic"), options=options)
    return compiler.ir(specialize(fn, shapes, {}))


# Z is read only by the next statement: fused by rows, it becomes a one-row local.
CHAIN = """
def chain(float(N,D) X, float(N,D) R) -> (Y) {
  Z(n,d) = X(n,d) + R(n,d)
  Y(n,d) = Z(n,d) * Z(n,d)
}"""
CHAIN_SHAPES = {"X": (8, 16), "R": (8, 16)}
TENSOR = 8 * 16 * 4


def test_a_row_loop_with_a_row_local_moves_its_inputs_and_outputs() -> None:
    fn = optimized(CHAIN, CHAIN_SHAPES, {"fuse.strategy": "rows"})
    [kernel] = kernel_traffic(fn)
    assert kernel.name == "fused_0"
    assert dict(kernel.buffers) == {"p0": TENSOR, "p1": TENSOR, "o0": TENSOR}
    assert (kernel.moved, kernel.compulsory, kernel.ratio) == (3 * TENSOR, 3 * TENSOR, 1.0)


def test_unfused_the_intermediate_is_written_and_read_back() -> None:
    fn = optimized(CHAIN, CHAIN_SHAPES, {"fuse.strategy": "none"})
    first, second = kernel_traffic(fn)
    # Each kernel moves only its own inputs and outputs (Z is one of each) ...
    assert (first.moved, first.compulsory) == (3 * TENSOR, 3 * TENSOR)
    assert (second.moved, second.compulsory) == (2 * TENSOR, 2 * TENSOR)
    # ... and the function moves Z twice more than the fused row loop.
    assert first.moved + second.moved == 3 * TENSOR + 2 * TENSOR


def test_a_stitched_kernel_counts_each_phase_and_its_shared_temporary() -> None:
    # TWO_SHAPES: row sums s (rows n), then T, a transpose (rows d) reading every row's
    # sum, and T's row sums c; s passes between the phases in a shared buffer.
    fn = optimized(TWO_SHAPES, {"X": (6, 5), "b": (5,)}, {"fuse.groups": [[0, 1, 2]]})
    [kernel] = kernel_traffic(fn)
    assert "stitched" in fn.body.stmts[0].tags            # type: ignore[union-attr]
    x, b, s, t, c = 6 * 5 * 4, 5 * 4, 6 * 4, 5 * 6 * 4, 5 * 4
    # Phase 1 reads X, writes s; phase 2, a row loop over d, reads X again, s and b and
    # writes T and c; c's member reads the row of T the member before it wrote in the
    # same row: from cache, not counted.
    assert dict(kernel.buffers) == {"p0": 2 * x, "t0": 2 * s, "p1": b, "o0": t, "o1": c}
    assert kernel.moved == 2 * x + 2 * s + b + t + c == 448
    # s is made and used inside the kernel: not compulsory. X and T count once.
    assert kernel.compulsory == x + b + t + c == 280


def test_a_strided_access_counts_the_elements_it_touches() -> None:
    source = """
    def evens(float(N) X) -> (Y) {
      Y(i) = X(2*i) + X(2*i + 6) where i in 0:8
    }"""
    [kernel] = kernel_traffic(optimized(source, {"X": (24,)}, {}))
    # X(0), X(2), ..., X(20): 11 elements of the 21 between the first and the last.
    assert dict(kernel.buffers) == {"p0": 11 * 4, "o0": 8 * 4}
    assert kernel.compulsory == kernel.moved == 76


def test_the_printout_and_the_largest_ratio() -> None:
    fn = optimized(TWO_SHAPES, {"X": (6, 5), "b": (5,)}, {"fuse.groups": [[0], [1, 2]]})
    traffic = kernel_traffic(fn)
    heaviest = largest(traffic)
    assert heaviest is not None and heaviest.ratio == max(k.ratio for k in traffic)
    text = format_traffic(traffic)
    assert f"{heaviest.name:<16} {heaviest.moved} / {heaviest.compulsory} B" in text
    assert largest(()) is None


def test_an_init_folded_into_a_contraction_is_no_kernel() -> None:
    source = "def mm(float(M,K) A, float(N,K) B) -> (C) {\n  C(m,n) +=! A(m,k) * B(n,k)\n}\n"
    fn = analyze(parse(source, "<test>")).functions[0]
    compiler = Compiler(load_config(), target("cpu-avx2"))
    ir = compiler.ir(specialize(fn, {"A": (37, 700), "B": (45, 700)}, {}))
    assert [b.name for b in kernels(ir)] == ["pack_p1_panels0", "s0"]
    assert [k.name for k in kernel_traffic(ir)] == ["pack_p1_panels0", "s0"]
    assert "s0_init" in [b.name for b in ir.body.stmts if isinstance(b, N.Block)]
