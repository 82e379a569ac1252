"""Pattern generation (FusionStitching §4.2): substitution fusion's partition steps,
exploratory fusion's seeds and cycle-free growth, kernel packing, intervals."""
from __future__ import annotations

from polytile.graph.ops import op_graph
from polytile.graph.patterns import (
    candidate_patterns,
    exploratory_patterns,
    large_gemm,
    packing_patterns,
    substitution_patterns,
)

from .helpers import spec_of

# A large GEMM in the middle of elementwise ops, then a column sum and a scalar sum.
CHAIN = """
def chain(float(M,K) A, float(K,N) B, float(M,N) R) -> (Y, c, t) {
  X(m,k) = A(m,k) * 2
  P(m,n) +=! X(m,k) * B(k,n)
  Z(m,n) = P(m,n) + R(m,n)
  Y(m,n) = tanh(Z(m,n))
  c(n) +=! Y(m,n)
  u(n) = c(n) * 3
  t +=! u(n)
}
"""
SIZES = {"A": (128, 128), "B": (128, 128), "R": (128, 128)}

# Two independent row chains over the same rows: packing candidates.
TWO = """
def two(float(N,D) X, float(N,D) W) -> (A, B) {
  A(n,d) = X(n,d) * 2
  B(n,d) = W(n,d) + 1
}
"""


def test_substitution_steps_partition_the_gemm_then_the_reductions() -> None:
    g = op_graph(spec_of(CHAIN, SIZES))
    assert large_gemm(g.ops[1])
    found = {(p.how, p.key) for p in substitution_patterns(g)}
    # Step 1 (large GEMMs are partition ops): the runs before and after the GEMM.
    assert ("substitution(large-gemm)", (2, 3, 4, 5, 6)) in found
    # Step 3 adds the column reduction 4: the runs around it.
    assert ("substitution(column-reduction)", (2, 3)) in found
    assert ("substitution(column-reduction)", (5, 6)) in found
    assert all(1 not in key for _, key in found)


def test_exploratory_grows_from_large_seeds_without_cycles_or_gemms() -> None:
    g = op_graph(spec_of(CHAIN, SIZES))
    patterns = exploratory_patterns(g)
    assert patterns
    assert all(g.convex(p.ops) and 1 not in p.ops for p in patterns)
    assert frozenset({2, 3}) in {p.ops for p in patterns}


def test_exploratory_has_no_seed_in_a_small_graph() -> None:
    g = op_graph(spec_of(CHAIN, {"A": (3, 3), "B": (3, 3), "R": (3, 3)}))
    assert exploratory_patterns(g) == []


def test_packing_packs_independent_ops_with_the_same_rows() -> None:
    g = op_graph(spec_of(TWO, {"X": (9, 5), "W": (9, 5)}))
    assert [p.key for p in packing_patterns(g)] == [(0, 1)]


def test_candidates_are_convex_and_unique() -> None:
    g = op_graph(spec_of(CHAIN, SIZES))
    patterns = candidate_patterns(g)
    keys = [p.key for p in patterns]
    assert len(keys) == len(set(keys))
    assert all(len(p.ops) >= 2 and g.convex(p.ops) for p in patterns)
