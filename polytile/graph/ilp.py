"""The fusion plan as an integer program (FusionStitching §4.1), solved by HiGHS through
scipy.optimize.milp:

    maximize   sum_j X_j * f(P_j)
    subject to sum_{j : op in P_j} X_j = 1      for every op (singletons score 0)
               X_j in {0, 1}

Fusing patterns that are each free of cycles can still make the kernel graph cyclic
(Fig. 3: A -> B -> C with A and C fused, B not). After each solve the chosen kernels'
graph is checked; a cycle through kernels P_1..P_m adds the cut
sum X_{P_i} <= m - 1 (the fused ones on it) and the problem is solved again.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from polytile.errors import PolytileError
from polytile.graph.ops import OpGraph

MAX_ROUNDS = 100


@dataclass(frozen=True)
class Solution:
    chosen: tuple[frozenset[int], ...]      # kernels: each op in exactly one
    objective: float                        # summed scores, seconds
    seconds: float                          # wall time of every solve and check
    rounds: int                             # solves (1 + cycle cuts)
    cuts: tuple[tuple[int, ...], ...]       # each cut: the fused patterns on a cycle


def solve_plan(graph: OpGraph, patterns: Sequence[frozenset[int]],
               scores: Sequence[float]) -> Solution:
    """Choose disjoint patterns covering every op, maximizing the summed score.
    `patterns` are the candidates with a score >= 0; singletons are added here."""
    # Imported here: every compile consults the planner's options, few solve a plan.
    from scipy.optimize import Bounds, LinearConstraint, milp  # type: ignore[import-untyped]

    start = time.perf_counter()
    n = len(graph.ops)
    candidates = [frozenset({k}) for k in range(n)] + list(patterns)
    gains = np.array([0.0] * n + [float(s) for s in scores])
    cover = np.zeros((n, len(candidates)))
    for j, p in enumerate(candidates):
        for k in p:
            cover[k, j] = 1.0
    constraints = [LinearConstraint(cover, 1.0, 1.0)]
    cuts: list[tuple[int, ...]] = []
    for rounds in range(1, MAX_ROUNDS + 1):
        result = milp(-gains, constraints=constraints, integrality=np.ones(len(candidates)),
                      bounds=Bounds(0, 1))
        if not result.success:
            raise PolytileError(f"the fusion ILP has no solution: {result.message}")
        picked = [j for j, x in enumerate(result.x) if x > 0.5]
        cycle = _kernel_cycle(graph, [candidates[j] for j in picked])
        if cycle is None:
            chosen = tuple(sorted((candidates[j] for j in picked), key=min))
            return Solution(chosen, float(gains[picked].sum()), time.perf_counter() - start,
                            rounds, tuple(cuts))
        fused = [picked[i] for i in cycle if len(candidates[picked[i]]) > 1]
        row = np.zeros(len(candidates))
        row[fused] = 1.0
        constraints.append(LinearConstraint(row[None, :], -np.inf, len(fused) - 1))
        cuts.append(tuple(fused))
    raise PolytileError(f"the fusion ILP still has a cycle after {MAX_ROUNDS} cuts")


def _kernel_cycle(graph: OpGraph, kernels: list[frozenset[int]]) -> list[int] | None:
    """Positions in `kernels` of a cycle in the graph whose nodes are the kernels, or None."""
    owner = {k: i for i, p in enumerate(kernels) for k in p}
    edges = [sorted({owner[j] for k in p for j in graph.successors(k)} - {i})
             for i, p in enumerate(kernels)]
    state = [0] * len(kernels)            # 0 new, 1 on the stack, 2 done
    for root in range(len(kernels)):
        if state[root]:
            continue
        path: list[int] = []
        stack: list[tuple[int, int]] = [(root, 0)]
        while stack:
            node, nxt = stack.pop()
            if nxt == 0:
                state[node] = 1
                path.append(node)
            if nxt < len(edges[node]):
                stack.append((node, nxt + 1))
                child = edges[node][nxt]
                if state[child] == 1:
                    return path[path.index(child):]
                if state[child] == 0:
                    stack.append((child, 0))
            else:
                state[node] = 2
                path.pop()
    return None


def kernel_order(graph: OpGraph, kernels: Sequence[frozenset[int]]) -> list[frozenset[int]]:
    """The kernels in a topological order of their graph (ties: lowest statement first)."""
    owner = {k: i for i, p in enumerate(kernels) for k in p}
    preds = [{owner[j] for k in p for j in graph.order[k]} - {i} for i, p in enumerate(kernels)]
    done: list[int] = []
    left = set(range(len(kernels)))
    while left:
        ready = [i for i in left if preds[i] <= set(done)]
        if not ready:
            raise PolytileError("the fusion plan's kernels form a cycle")
        i = min(ready, key=lambda i: min(kernels[i]))
        done.append(i)
        left.remove(i)
    return [kernels[i] for i in done]
