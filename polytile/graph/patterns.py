"""Candidate fusion patterns (FusionStitching §4.2): sets of ops that might share a kernel.

    patterns = candidate_patterns(graph)     # [Pattern(ops=frozenset({1, 2, 3}), how=...)]

Three generators, each a set of rules from the paper:

* substitution fusion (Alg. 1): with a set of partition ops that never fuse, collapse
  all ops between two adjacent partition ops (in topological order) into one pattern.
  The partition set starts with the large GEMMs and grows step by step (all
  contractions, then column reductions, then scalar reductions), one run per step.
  Gathers and scatters are always partition ops here.
* exploratory fusion (Alg. 2): from a seed op, add one fusible producer or consumer at
  a time, keeping the set free of cycles (`OpGraph.convex`), each step a pattern, and
  explore from it recursively. Seeds (the paper's heuristics): elementwise, reduction
  or batched-contraction ops with at most 10 operands and large tensors
  (`LARGE_BYTES`). The exploration gives up after `EXPLORE_LIMIT` patterns per seed.
* kernel packing: ops with no path between them and the same row extent, packed into
  one kernel (no data flows; shared inputs are read once).
* intervals: every run of consecutive statements (at most `MAX_INTERVAL` long) without a
  gather, scatter or large GEMM. These are the groups pass fuse's own heuristic ("rows") can form,
  so the plan can always choose what fusion without a plan would do.

Every pattern here is only a candidate: the cost model (polytile.graph.cost) scores it,
and a pattern the code generator cannot build gets no score.
"""
from __future__ import annotations

from dataclasses import dataclass

from polytile.graph.ops import Op, OpGraph

FUSIBLE = ("elementwise", "row-reduction", "column-reduction", "scalar-reduction",
           "contraction")
# A large GEMM: a contraction without a batch index, with this many multiply-adds and
# this many per byte it must move (a matrix-vector product is memory-bound, not a GEMM).
LARGE_GEMM_MACS = 1 << 20
GEMM_INTENSITY = 8
LARGE_BYTES = 16 << 10           # a seed of exploratory fusion moves at least this
MAX_OPERANDS = 10
EXPLORE_LIMIT = 256
MAX_INTERVAL = 32

# Substitution fusion's partition steps, in order; each adds ops to the previous set.
STEPS = ("large-gemm", "contraction", "column-reduction", "scalar-reduction")


@dataclass(frozen=True)
class Pattern:
    ops: frozenset[int]
    how: str                     # "substitution(step)", "exploratory", "packing"

    @property
    def key(self) -> tuple[int, ...]:
        return tuple(sorted(self.ops))


def large_gemm(op: Op) -> bool:
    macs = op.reduced
    for s in op.shape:
        macs *= s
    return (op.kind == "contraction" and not op.batched and macs >= LARGE_GEMM_MACS
            and macs >= GEMM_INTENSITY * op.bytes)


def candidate_patterns(graph: OpGraph) -> list[Pattern]:
    """Every generator's patterns of two or more ops, each op set once (the first
    generator that found it names it), in a deterministic order."""
    found: dict[tuple[int, ...], Pattern] = {}
    for p in (substitution_patterns(graph) + exploratory_patterns(graph)
              + packing_patterns(graph) + interval_patterns(graph)):
        if len(p.ops) >= 2 and graph.convex(p.ops):
            found.setdefault(p.key, p)
    return sorted(found.values(), key=lambda p: (len(p.ops), p.key))


def substitution_patterns(graph: OpGraph) -> list[Pattern]:
    patterns = []
    always = {op.index for op in graph.ops if op.kind in ("gather", "scatter")}
    partition = set(always)
    for step in STEPS:
        partition |= {op.index for op in graph.ops if _in_step(op, step)}
        run: list[int] = []
        for op in graph.ops:          # statement order is a topological order
            if op.index in partition:
                patterns.extend(_run_pattern(run, step))
                run = []
            else:
                run.append(op.index)
        patterns.extend(_run_pattern(run, step))
    return patterns


def _in_step(op: Op, step: str) -> bool:
    if step == "large-gemm":
        return large_gemm(op)
    return op.kind == step


def _run_pattern(run: list[int], step: str) -> list[Pattern]:
    return [Pattern(frozenset(run), f"substitution({step})")] if len(run) >= 2 else []


def exploratory_patterns(graph: OpGraph) -> list[Pattern]:
    patterns: list[Pattern] = []
    seen: set[frozenset[int]] = set()
    for op in graph.ops:
        if _seed(op):
            budget = [EXPLORE_LIMIT]
            _explore(graph, frozenset({op.index}), seen, patterns, budget)
    return patterns


def _seed(op: Op) -> bool:
    return (op.kind in FUSIBLE and not large_gemm(op) and len(op.reads) <= MAX_OPERANDS
            and op.bytes >= LARGE_BYTES)


def _explore(graph: OpGraph, seed: frozenset[int], seen: set[frozenset[int]],
             patterns: list[Pattern], budget: list[int]) -> None:
    candidates = sorted({j for k in seed for j in graph.producers(k) | graph.consumers(k)}
                        - seed)
    for p in candidates:
        op = graph.ops[p]
        if op.kind not in FUSIBLE or large_gemm(op):
            continue
        fusion = seed | {p}
        if fusion in seen or not graph.convex(fusion):
            continue
        if budget[0] <= 0:
            return                    # the paper: give up further exploration
        budget[0] -= 1
        seen.add(fusion)
        patterns.append(Pattern(fusion, "exploratory"))
        _explore(graph, fusion, seen, patterns, budget)


def packing_patterns(graph: OpGraph) -> list[Pattern]:
    """For each fusible op, the ops after it with its row extent that are independent
    of it and of each other, taken greedily in order."""
    patterns = []
    reach = [_reachable(graph, k) for k in range(len(graph.ops))]
    for a in graph.ops:
        if a.kind not in FUSIBLE or large_gemm(a):
            continue
        pack = [a.index]
        for b in graph.ops[a.index + 1:]:
            if (b.kind in FUSIBLE and not large_gemm(b) and b.rows == a.rows and all(
                    b.index not in reach[k] and k not in reach[b.index] for k in pack)):
                pack.append(b.index)
        if len(pack) >= 2:
            patterns.append(Pattern(frozenset(pack), "packing"))
    return patterns


def _reachable(graph: OpGraph, k: int) -> frozenset[int]:
    stack, seen = list(graph.successors(k)), set()
    while stack:
        j = stack.pop()
        if j not in seen:
            seen.add(j)
            stack.extend(graph.successors(j))
    return frozenset(seen)


def interval_patterns(graph: OpGraph) -> list[Pattern]:
    patterns = []
    for i in range(len(graph.ops)):
        for j in range(i + 1, min(len(graph.ops), i + MAX_INTERVAL)):
            if _alone(graph.ops[i]) or _alone(graph.ops[j]):
                break
            patterns.append(Pattern(frozenset(range(i, j + 1)), "interval"))
    return patterns


def _alone(op: Op) -> bool:
    """Ops that are partition ops at every step: they never share a kernel."""
    return op.kind in ("gather", "scatter") or large_gemm(op)
