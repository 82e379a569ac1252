"""The fusion plan of one specialized TC function: graph, patterns, scores, ILP.

    plan = plan_fusion(spec, target, config)
    plan.groups              # ((0, 1, 2, 3, 4),): statement numbers per kernel, in order
    print(format_plan(plan)) # what `polytile show --stage plan` prints

A pattern scores f(P) = sum of M'(v) + (N - 1) * phi (the cost model), or, with `measured=True`
and for the paper's complex patterns, the time the compiled kernel saves (execution-based,
cached). A pattern the code generator cannot build as one kernel gets no score and is
listed as such. A pattern whose ops do not share one row loop is built as a stitched
kernel (its row loops and statements are the phases of one OpenMP region, pass fuse's
`stitched`) on targets with OpenMP threads, and listed as "stitched"; on the others
(GPU compositions are not built) it is "not built (no single row loop)".

The plan is the one decision of which statements share a kernel; pass `fuse` builds it
from the option `fuse.groups` (Compiler does this when `fuse.strategy` is "plan").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from polytile.config import Config
from polytile.graph.cost import (
    CostModel,
    complex_pattern,
    load_cost_model,
    model_score,
    saved_bytes,
)
from polytile.graph.ilp import kernel_order, solve_plan
from polytile.graph.ops import OpGraph, op_graph
from polytile.graph.patterns import Pattern, candidate_patterns
from polytile.ir import nodes as N
from polytile.sema.specialize import Specialized
from polytile.targets.target import Target


@dataclass(frozen=True)
class Scored:
    pattern: Pattern
    score: float | None         # seconds saved; None: cannot be built as one kernel
    saved: int                  # bytes the model counts as saved
    basis: str                  # "model" or "measured"
    stitched: bool = False      # built as phases of one parallel region, not one row loop


@dataclass(frozen=True)
class FusionPlan:
    graph: OpGraph
    scored: tuple[Scored, ...]
    groups: tuple[tuple[int, ...], ...]     # statement numbers per kernel, in kernel order
    objective: float
    solve_seconds: float
    rounds: int
    model: CostModel

    @property
    def option(self) -> list[list[int]]:
        """The plan as pass fuse's option `fuse.groups`."""
        return [list(g) for g in self.groups]


def plan_fusion(spec: Specialized, target: Target, config: Config,
                model: CostModel | None = None, measured: bool = False) -> FusionPlan:
    graph = op_graph(spec)
    model = model or load_cost_model(config, target)
    before = ir_before_fuse(spec, target)
    scored = []
    from polytile.passes.fuse import fusible_group, row_loop
    for p in candidate_patterns(graph):
        if not fusible_group(before, target, sorted(p.ops)):
            scored.append(Scored(p, None, saved_bytes(graph, p), "model"))
            continue
        stitched = not row_loop(before, target, sorted(p.ops))
        if measured and complex_pattern(graph, p):
            from polytile.graph.measure import measured_score
            score = measured_score(spec, target, config, p)
            scored.append(Scored(p, score, saved_bytes(graph, p), "measured", stitched))
            continue
        scored.append(Scored(p, model_score(graph, p, model), saved_bytes(graph, p), "model",
                             stitched))
    usable = [s for s in scored if s.score is not None and s.score >= 0]
    solution = solve_plan(graph, [s.pattern.ops for s in usable],
                          [s.score or 0.0 for s in usable])
    groups = tuple(tuple(sorted(k)) for k in kernel_order(graph, solution.chosen))
    return FusionPlan(graph, tuple(scored), groups, solution.objective, solution.seconds,
                      solution.rounds, model)


def ir_before_fuse(spec: Specialized, target: Target) -> N.Function:
    """The IR pass fuse receives: lowered, then every pass in front of fuse."""
    from polytile.ir.lower import lower
    from polytile.passes.pipeline import PASSES, _load_passes
    from polytile.sema.canonical import canonical

    _load_passes()
    fn = lower(canonical(spec))
    for name, params in target.passes:
        if name == "fuse":
            break
        fn = PASSES[name](fn, target, dict(params))
    return fn


def with_plan(spec: Specialized, target: Target, config: Config,
              options: dict[str, Any]) -> dict[str, Any]:
    """`options` with the plan's groups added when fuse's strategy (the options', else
    the target's) is "plan" and no groups are given."""
    default = dict(dict(target.passes).get("fuse", ())).get("strategy")
    strategy = options.get("fuse.strategy", default)
    if strategy != "plan" or "fuse.groups" in options:
        return options
    return {**options, "fuse.groups": plan_fusion(spec, target, config).option}


def format_plan(plan: FusionPlan) -> str:
    g = plan.graph
    lines = [f"fusion plan of {g.function}",
             f"  cost model: {plan.model.source}; phi {plan.model.phi * 1e6:.2f} us",
             "  ops:"]
    for op in g.ops:
        after = ",".join(str(k) for k in sorted(g.data[op.index])) or "-"
        shape = "x".join(str(s) for s in op.shape) or "scalar"
        lines.append(f"    {op.index}  {op.kind:<16} [{shape}] {op.bytes} B  from {after}:  "
                     f"{op.text}")
    lines.append("  patterns:")
    for s in plan.scored:
        ops = "{" + ",".join(str(k) for k in s.pattern.key) + "}"
        score = ("not built (no single row loop)" if s.score is None
                 else f"score {s.score * 1e6:.2f} us ({s.basis})"
                 + (", stitched" if s.stitched else ""))
        lines.append(f"    {ops:<16} {s.pattern.how:<32} saves {s.saved} B  {score}")
    lines.append(f"  plan: {len(plan.groups)} kernels for {len(g.ops)} ops, objective "
                 f"{plan.objective * 1e6:.2f} us, ILP {plan.rounds} solve(s)")
    stitched = {s.pattern.key for s in plan.scored if s.stitched}
    for k, group in enumerate(plan.groups):
        how = ("  stitched: phases in one parallel region" if group in stitched
               else f"  {_row_bytes(g, group)} B per row" if len(group) > 1 else "")
        lines.append(f"    kernel {k}: " + "{" + ",".join(str(i) for i in group) + "}" + how)
    return "\n".join(lines) + "\n"


def _row_bytes(graph: OpGraph, group: tuple[int, ...]) -> int:
    """What one row of a fused kernel touches (every tensor's bytes over the rows): the
    model's saving assumes this stays in cache between the members."""
    rows = max(1, graph.ops[group[0]].rows)
    tensors: dict[str, int] = {}
    for k in group:
        op = graph.ops[k]
        for tensor, size in (*zip(op.reads, op.read_bytes), (op.writes, op.write_bytes)):
            tensors[tensor] = max(tensors.get(tensor, 0), size)
    return sum(tensors.values()) // rows
