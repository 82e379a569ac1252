"""The fusion plan end to end: `polytile show --stage plan` (golden text), compiling with
fuse.strategy "plan" against the reference interpreter, the cost model's storage, and
execution-based scores (cached)."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from polytile import cli
from polytile.api import Module
from polytile.bench.fusion_workloads import LN_GELU_RESIDUAL
from polytile.compile import Compiler
from polytile.config import Config, load_config
from polytile.graph import measure
from polytile.graph.cost import DEFAULT, CostModel, load_cost_model, store_cost_model
from polytile.graph.patterns import Pattern
from polytile.graph.plan import plan_fusion
from polytile.lang.parser import parse
from polytile.sema import reference
from polytile.sema.analyze import analyze
from polytile.targets.target import select_target

from .helpers import spec_of

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "graph"
UPDATE = bool(os.environ.get("POLYTILE_UPDATE_GOLDEN"))


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        GOLDEN.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    assert path.exists(), f"no golden file {path.name}: run with POLYTILE_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{path.name} changed (POLYTILE_UPDATE_GOLDEN=1 to accept)"


def test_show_stage_plan_prints_ops_patterns_and_the_plan(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("POLYTILE_CACHE_DIR", str(tmp_path))    # no probe: the default model
    source = tmp_path / "chain.tc"
    source.write_text(LN_GELU_RESIDUAL)
    assert cli.main(["show", str(source), "--stage", "plan", "--sizes", "N=33,D=67",
                     "--target", "cpu-generic"]) == 0
    out, err = capsys.readouterr()
    check_golden("plan_ln_gelu_residual.txt", out)
    assert "kernel 0: {0,1,2,3,4,5,6}" in out
    assert "ILP solved in" in err


def _module(source: str, options: dict[str, object]) -> Module:
    config = load_config()
    compiler = Compiler(config, select_target(config.target), options=options)
    return Module(source, analyze(parse(source, "<test>")), "c", compiler)


def _strided(a: np.ndarray) -> np.ndarray:
    """The same values in a non-contiguous array (every other element of the last axis)."""
    big = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
    big[..., ::2] = a
    view = big[..., ::2]
    assert not view.flags.c_contiguous
    return view


@pytest.mark.parametrize("n,d", [(33, 67), (5, 129)])
def test_compiled_with_the_plan_agrees_with_the_interpreter(n: int, d: int) -> None:
    rng = np.random.default_rng(n)
    args = (rng.standard_normal((n, d)).astype(np.float32),
            rng.standard_normal(d).astype(np.float32), rng.standard_normal(d).astype(np.float32),
            rng.standard_normal((n, d)).astype(np.float32))
    planned = _module(LN_GELU_RESIDUAL, {"fuse.strategy": "plan"}).ln_gelu_residual
    got = planned(*(_strided(a) for a in args))
    want = _module(LN_GELU_RESIDUAL, {}).ln_gelu_residual
    interp = Module(LN_GELU_RESIDUAL, analyze(parse(LN_GELU_RESIDUAL, "<t>")), "interp")
    expected = interp.ln_gelu_residual(*args)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(want(*args), expected, rtol=1e-4, atol=1e-4)


def test_the_cost_model_is_stored_per_target(tmp_path: Path) -> None:
    config = Config(cache_dir=tmp_path)
    target = select_target("cpu-generic")
    assert load_cost_model(config, target) == DEFAULT
    model = CostModel(((8192, 2e-6), (1 << 20, 60e-6)), 1.5e-6, "measured on a test")
    store_cost_model(config, target, model)
    assert load_cost_model(config, target) == model
    other = select_target(select_target(load_config().target).name)
    if other.identity != target.identity:
        assert load_cost_model(config, other) == DEFAULT


def test_transfer_time_grows_from_zero_without_the_fixed_part() -> None:
    model = CostModel(((8192, 5e-6), (32768, 8e-6), (1 << 20, 60e-6)), 1e-6, "test")
    assert model.intercept == pytest.approx(4e-6)
    values = [model.transfer_seconds(v) for v in (0, 100, 8192, 20000, 1 << 20, 1 << 24)]
    assert values[0] == 0 and values == sorted(values)
    assert model.transfer_seconds(1 << 24) == pytest.approx(60e-6 * 16 - 4e-6)


@pytest.mark.slow
def test_measured_scores_are_timed_once_and_cached(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    config = Config(cache_dir=tmp_path)
    target = select_target(load_config().target)
    spec = spec_of(LN_GELU_RESIDUAL, {"X": (33, 67), "gamma": (67,), "beta": (67,),
                                      "R": (33, 67)})
    pattern = Pattern(frozenset({0, 1, 2}), "test")
    first = measure.measured_score(spec, target, config, pattern)
    assert np.isfinite(first)

    def untimed(*args: object) -> float:
        raise AssertionError("a cached score was timed again")
    monkeypatch.setattr(measure, "_time_pattern", untimed)
    assert measure.measured_score(spec, target, config, pattern) == first


@pytest.mark.slow
def test_plan_with_measured_scores_for_complex_patterns(tmp_path: Path) -> None:
    config = Config(cache_dir=tmp_path)
    target = select_target(load_config().target)
    spec = spec_of("""
def colrow(float(N,D) X) -> (Y, c) {
  r(n) +=! X(n,d)
  Y(n,d) = X(n,d) - r(n)
  c(d) +=! Y(n,d)
}""", {"X": (37, 21)})
    plan = plan_fusion(spec, target, config, measured=True)
    assert any(s.basis == "measured" for s in plan.scored)
    inputs, scalars, outputs = measure.random_arguments(spec)
    compiled = Compiler(config, target, options={"fuse.groups": plan.option}).compile(spec)
    compiled.run(inputs, scalars, outputs)
    expected = {k: np.zeros_like(v) for k, v in outputs.items()}
    reference.run(spec, {**inputs, **scalars}, expected)
    for name in outputs:
        np.testing.assert_allclose(outputs[name], expected[name], rtol=1e-4, atol=1e-4)


def test_a_plan_over_empty_ranges_compiles_and_runs() -> None:
    config = load_config()
    target = select_target(config.target)
    spec = spec_of("""
def empty(float(N,D) X) -> (A, c) {
  A(n,d) = X(n,d) * 2
  c(d) +=! X(n,d)
}""", {"X": (0, 5)})
    compiled = Compiler(config, target, options={"fuse.strategy": "plan"}).compile(spec)
    outputs = {"A": np.ones((0, 5), np.float32), "c": np.full(5, np.nan, np.float32)}
    compiled.run({"X": np.zeros((0, 5), np.float32)}, {}, outputs)
    assert np.array_equal(outputs["c"], np.zeros(5, np.float32))
