"""The graph level (FusionStitching §4): an op graph from one TC function, candidate
fusion patterns, their scores, and the fusion plan an ILP chooses.

    plan = plan_fusion(spec, target)      # polytile.graph.plan
    print(format_plan(plan))

The plan is data (`FusionPlan.groups`: statement numbers per kernel, in kernel order);
pass `fuse` obeys it when given as the option `fuse.groups` (see docs/fusion.md).
"""
