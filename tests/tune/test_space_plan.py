"""The fusion plan as a variant of the tuning space: the tuner times the graph level's
plan (FusionStitching §4.3-4.4) against the row fusion and no fusion, schedules the
phases of a stitched kernel, and a tuned "plan" entry compiles to the plan's kernels."""
from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from polytile.bench.fusion_workloads import LOGREG, PERCEPTRON
from polytile.compile import Compiler
from polytile.config import Config
from polytile.graph import measure
from polytile.ir import nodes as N
from polytile.ir.lower import lower
from polytile.ir.printer import format_function
from polytile.lang.parser import parse
from polytile.passes.autotile import _kernel_blocks
from polytile.passes.pipeline import run_pipeline
from polytile.sema import reference
from polytile.sema.analyze import analyze
from polytile.sema.canonical import canonical
from polytile.sema.specialize import Specialized, specialize
from polytile.targets.target import Target, select_target
from polytile.tune.options import Options
from polytile.tune.space import Space, build_space
from polytile.tune.tuner import plan_groups

PERCEPTRON_SHAPES = {"X": (130, 67), "W": (45, 67), "bias": (45,), "T": (130, 45)}
LOGREG_SHAPES = {"X": (45, 19), "y": (45,), "w": (19,)}


def _spec(source: str, shapes: dict[str, tuple[int, ...]],
          scalars: dict[str, float] | None = None) -> Specialized:
    fn = analyze(parse(source, "<test>")).functions[0]
    return specialize(fn, shapes, scalars or {})


def _space(spec: Specialized, target: Target, config: Config) -> tuple[Space, list[list[int]]]:
    groups = plan_groups(Compiler(config, target), spec)
    assert groups is not None
    return build_space(lower(canonical(spec)), target, plan=groups), groups


def _host_with_32k_l1() -> Target:
    """This host's target with a 32 KiB L1 (a Cascade Lake's or Zen 3's): there the row
    fusion and the plan build different perceptrons. With a 48 KiB L1 (Zen 5) the rows
    already fuse what the plan does, and the space has no "plan" value to test."""
    target = select_target()
    return replace(target, cache_bytes=tuple(sorted({**dict(target.cache_bytes),
                                                      "L1": 32 << 10}.items())))


def _strategy(options: Options) -> object:
    return dict(options.passes).get("fuse.strategy")


def _check_against_reference(spec: Specialized, config: Config, target: Target,
                             options: Options) -> None:
    inputs, scalars, outputs = measure.random_arguments(spec)
    Compiler(config, target, options=options.pass_options()).compile(spec).run(
        inputs, scalars, outputs)
    expected = {k: np.zeros_like(v) for k, v in outputs.items()}
    reference.run(spec, {**inputs, **scalars}, expected)
    for name in outputs:
        np.testing.assert_allclose(outputs[name], expected[name], rtol=2e-4, atol=2e-4,
                                   err_msg=f"{name} with {options.text()}")


def test_the_plan_is_a_strategy_where_it_builds_another_program(tmp_path: Path) -> None:
    config = Config(cache_dir=tmp_path)
    target = _host_with_32k_l1()
    spec = _spec(PERCEPTRON, PERCEPTRON_SHAPES)
    space, groups = _space(spec, target, config)
    strategies = next(g for g in space.genes if g.name == "fuse.strategy").values
    assert "plan" in strategies
    without = build_space(lower(canonical(spec)), target)
    assert "plan" not in next(g for g in without.genes if g.name == "fuse.strategy").values
    # The heuristics under the plan are one of TC §6.2's predefined starting points,
    # and compile to the program Compiler builds for fuse.strategy "plan".
    seeds = [o for o in map(space.decode, space.predefined()) if o is not None]
    planned = next(o for o in seeds if _strategy(o) == "plan")
    from_space = Compiler(config, target, options=planned.pass_options()).ir(spec)
    direct = Compiler(config, target, options={"fuse.strategy": "plan",
                                               "fuse.groups": groups}).ir(spec)
    assert format_function(from_space) == format_function(direct)
    rows = Compiler(config, target).ir(spec)
    assert format_function(from_space) != format_function(rows)


def test_a_plan_that_builds_what_another_strategy_builds_is_no_new_value(
        tmp_path: Path) -> None:
    # Layer norm, GELU and the residual fuse along the rows either way: "plan" would
    # only add copies of the "rows" candidates.
    from polytile.bench.fusion_workloads import LN_GELU_RESIDUAL
    config = Config(cache_dir=tmp_path)
    target = _host_with_32k_l1()
    spec = _spec(LN_GELU_RESIDUAL, {"X": (33, 67), "gamma": (67,), "beta": (67,),
                                    "R": (33, 67)})
    space, groups = _space(spec, target, config)
    assert groups == [list(range(7))]
    strategies = next((g.values for g in space.genes if g.name == "fuse.strategy"), ())
    assert "plan" not in strategies


def test_the_space_schedules_what_autotile_schedules_in_a_stitched_plan(
        tmp_path: Path) -> None:
    """The phases of a stitched kernel are kernel blocks of the space (genes of their
    own), exactly the blocks autotile would schedule."""
    config = Config(cache_dir=tmp_path)
    target = _host_with_32k_l1()
    spec = _spec(LOGREG, LOGREG_SHAPES, {"b": 0.25, "lr": 0.1})
    space, groups = _space(spec, target, config)
    variant = next(v for v in space.variants if dict(v.passes).get("fuse.strategy") == "plan")
    names = [t for t, _ in target.passes]
    before = run_pipeline(lower(canonical(spec)),
                          replace(target, passes=target.passes[:names.index("autotile")]),
                          {"fuse.strategy": "plan", "fuse.groups": groups})
    stitched = [s for s in before.body.stmts if isinstance(s, N.Block) and "stitched" in s.tags]
    assert stitched, "logreg's plan is expected to be one stitched kernel"
    expected = [k.name for s in before.body.stmts for k in _kernel_blocks(s)]
    assert [kb.name for kb in variant.blocks] == expected
    assert {f"{name}.parallel" for name in expected} <= {g.name for g in space.genes}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_points_of_the_plan_variant_compute_what_the_reference_does(
        tmp_path: Path, seed: int) -> None:
    config = Config(cache_dir=tmp_path)
    target = _host_with_32k_l1()
    spec = _spec(LOGREG, LOGREG_SHAPES, {"b": 0.25, "lr": 0.1})
    space, _ = _space(spec, target, config)
    k = next(i for i, g in enumerate(space.genes) if g.name == "fuse.strategy")
    plan = space.genes[k].values.index("plan")
    rng = random.Random(seed)
    for _ in range(200):
        point = list(space.random_point(rng))
        point[k] = plan
        options = space.decode(point)
        if options is not None:
            break
    assert options is not None and _strategy(options) == "plan"
    assert options.schedules, "the point should schedule the stitched kernel's phases"
    _check_against_reference(spec, config, target, options)
