"""The fusion bench's workloads (polytile.bench.fusion_workloads): each TC against its
NumPy version on the reference interpreter, then compiled with the fusion plan against
the interpreter, at small sizes that divide no tile."""
from __future__ import annotations

import numpy as np
import pytest

from polytile.bench.fusion import compiled_call, specialized
from polytile.bench.fusion_workloads import fusion_set
from polytile.config import load_config
from polytile.graph.plan import plan_fusion
from polytile.sema import reference
from polytile.targets.target import select_target

WORKLOADS = {w.key: w for w in fusion_set(quick=True)}


def _interpreted(spec, args):  # type: ignore[no-untyped-def]
    fn = spec.fn
    values = {p.name: a for p, a in zip(fn.params, args)}
    outs = {o.name: np.zeros(spec.shape(o.name), o.dtype.numpy) for o in fn.outputs}
    reference.run(spec, values, outs)
    return tuple(outs[o.name] for o in fn.outputs)


# attention compiles 14 statements with two batched contractions: the slowest, > 10 s.
@pytest.mark.parametrize("key", [pytest.param(k, marks=pytest.mark.slow) if k == "attention"
                                 else k for k in sorted(WORKLOADS)])
def test_workload_planned_and_compiled_agrees_with_the_interpreter(key: str) -> None:
    w = WORKLOADS[key]
    args = w.make_inputs(np.random.default_rng(3))
    spec = specialized(w, args)
    interpreted = _interpreted(spec, args)
    expected = w.numpy(*args)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for got, want in zip(interpreted, expected):
        np.testing.assert_allclose(got, want, rtol=w.rtol, atol=w.atol)
    config = load_config()
    plan = plan_fusion(spec, select_target(config.target), config)
    assert sorted(k for g in plan.groups for k in g) == list(range(len(spec.fn.statements)))
    assert plan.solve_seconds < 1.0
    call, kernels, _ = compiled_call(w, spec, {"fuse.groups": plan.option})
    assert kernels >= len(plan.groups)
    got = call(*args)
    got = got if isinstance(got, tuple) else (got,)
    for g, want in zip(got, interpreted):
        np.testing.assert_allclose(g, want, rtol=w.rtol, atol=w.atol)
