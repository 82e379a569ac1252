"""The op graph: one node per statement, kinds, parallel shapes, bytes, and edges."""
from __future__ import annotations

from polytile.bench.memorybound import LAYERNORM, SOFTMAX
from polytile.graph.ops import op_graph

from .helpers import spec_of

GEMM_BIAS = """
def f(float(M,K) A, float(K,N) B, float(N) b, int32(M) I, float(M,K) T) -> (C, G, s) {
  C(m,n) +=! A(m,k) * B(k,n)
  C(m,n) = C(m,n) + b(n)
  G(m,k) = T(I(m),k)
  s +=! A(m,k)
  t(k) +=! A(m,k)
}
"""


def test_layernorm_ops_kinds_shapes_and_edges() -> None:
    g = op_graph(spec_of(LAYERNORM, {"X": (5, 7), "gamma": (7,), "beta": (7,)}))
    assert [op.kind for op in g.ops] == ["row-reduction", "elementwise", "row-reduction",
                                         "elementwise", "elementwise"]
    assert [op.shape for op in g.ops] == [(5,), (5,), (5,), (5,), (5, 7)]
    # mean reads all of X (5*7 floats) and writes 5 floats.
    assert g.ops[0].read_bytes == (5 * 7 * 4,) and g.ops[0].write_bytes == 5 * 4
    assert [sorted(d) for d in g.data] == [[], [0], [1], [2], [1, 3]]
    assert g.temps == {"mean", "var", "rstd"} and g.outputs == {"Y"}


def test_in_place_statements_order_reads_before_the_next_write() -> None:
    g = op_graph(spec_of(SOFTMAX, {"X": (3, 4)}))
    # Y(n,d) = exp(...) (op 1) is read by s (op 2) and rewritten by op 3.
    assert sorted(g.data[3]) == [1, 2]
    assert sorted(g.order[3]) == [1, 2]
    assert g.successors(1) == {2, 3}


def test_kinds_contraction_gather_scalar_and_column_reductions() -> None:
    spec = spec_of(GEMM_BIAS, {"A": (6, 5), "B": (5, 4), "b": (4,), "I": (6,),
                               "T": (6, 5)})
    g = op_graph(spec)
    assert [op.kind for op in g.ops] == ["contraction", "elementwise", "gather",
                                         "scalar-reduction", "column-reduction"]
    assert g.ops[0].reduced == 5 and not g.ops[0].batched
    assert g.ops[4].shape == (5,)


def test_convex_refuses_a_set_that_a_path_leaves_and_reenters() -> None:
    g = op_graph(spec_of(LAYERNORM, {"X": (5, 7), "gamma": (7,), "beta": (7,)}))
    assert g.convex(frozenset({0, 1}))
    assert not g.convex(frozenset({0, 2}))      # 0 -> 1 -> 2 with 1 outside
    assert g.convex(frozenset({1, 2, 3, 4}))
