"""The fusion ILP (HiGHS through scipy.optimize.milp): exact cover, maximal score, and
the iterative cycle cuts of Fig. 3."""
from __future__ import annotations

from polytile.graph.ilp import kernel_order, solve_plan
from polytile.graph.ops import op_graph

from .helpers import spec_of

# 0 -> 2 and 1 -> 3: {0, 3} and {1, 2} are each cycle-free, but together each kernel
# waits for the other.
CROSS = """
def cross(float(N) X) -> (C, D) {
  a(i) = X(i) + 1
  b(i) = X(i) * 2
  C(i) = a(i) * 3
  D(i) = b(i) - 1
}
"""


def test_every_op_in_exactly_one_kernel_and_the_best_score_wins() -> None:
    g = op_graph(spec_of(CROSS, {"X": (7,)}))
    patterns = [frozenset({0, 2}), frozenset({1, 3}), frozenset({0, 1, 2, 3})]
    solution = solve_plan(g, patterns, [0.5, 0.5, 1.5])
    assert solution.chosen == (frozenset({0, 1, 2, 3}),)
    assert solution.objective == 1.5 and solution.rounds == 1
    solution = solve_plan(g, patterns, [1.0, 1.0, 0.5])
    assert set(solution.chosen) == {frozenset({0, 2}), frozenset({1, 3})}


def test_a_cycle_between_fused_kernels_is_cut_and_solved_again() -> None:
    g = op_graph(spec_of(CROSS, {"X": (7,)}))
    assert g.convex(frozenset({0, 3})) and g.convex(frozenset({1, 2}))
    solution = solve_plan(g, [frozenset({0, 3}), frozenset({1, 2})], [1.0, 2.0])
    assert solution.rounds == 2 and len(solution.cuts) == 1
    assert frozenset({1, 2}) in solution.chosen and frozenset({0, 3}) not in solution.chosen
    assert solution.objective == 2.0
    order = kernel_order(g, solution.chosen)
    assert order.index(frozenset({0})) < order.index(frozenset({1, 2}))
    assert order.index(frozenset({1, 2})) < order.index(frozenset({3}))


def test_no_patterns_means_one_kernel_per_op() -> None:
    g = op_graph(spec_of(CROSS, {"X": (7,)}))
    solution = solve_plan(g, [], [])
    assert solution.chosen == tuple(frozenset({k}) for k in range(4))
