"""Search strategies on synthetic cost functions: no compiler, no clock."""
from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass, field

import pytest

from polytile.tune.search import SearchSettings, search


@dataclass
class Landscape:
    """A separable bowl over 12 genes of 8 values, with a pruned corner and a crashing
    stripe; counts what it was asked to evaluate."""

    target: tuple[int, ...]
    sizes: tuple[int, ...] = (8,) * 12
    evaluated: list[tuple[int, ...]] = field(default_factory=list)

    def canonical(self, point: tuple[int, ...]) -> tuple[int, ...] | None:
        return None if point[0] + point[1] > 12 else point

    def cost(self, point: tuple[int, ...]) -> float:
        if point[2] == 7:
            return math.inf                 # "crashes"
        return 1.0 + sum((a - b) ** 2 for a, b in zip(point, self.target)) / 4

    def evaluate(self, points: list[tuple[int, ...]]) -> list[float]:
        self.evaluated.extend(points)
        return [self.cost(p) for p in points]


def _landscape(seed: int) -> Landscape:
    rng = random.Random(1000 + seed)
    return Landscape(tuple(rng.randrange(7) for _ in range(12)))


def test_genetic_beats_random_at_equal_budget() -> None:
    """A measurement over ten landscapes with fixed seeds, not a property of every run."""
    best: dict[str, list[float]] = {"genetic": [], "random": []}
    for seed in range(10):
        for strategy, costs in best.items():
            land = _landscape(seed)
            settings = SearchSettings(strategy, generations=30, population=12,
                                      budget_seconds=None, max_candidates=200, seed=seed)
            costs.append(search(land, land.evaluate, settings).best_cost)
    assert statistics.mean(best["genetic"]) < 0.7 * statistics.mean(best["random"])


@pytest.mark.parametrize("strategy", ["genetic", "random"])
def test_budgets_dedup_and_pruning(strategy: str) -> None:
    land = _landscape(0)
    settings = SearchSettings(strategy, generations=50, population=10, budget_seconds=None,
                              max_candidates=57, seed=3)
    result = search(land, land.evaluate, settings)
    assert len(land.evaluated) == len(result.trials) == 57
    assert result.stopped == "candidates"
    assert len(set(land.evaluated)) == 57                   # nothing measured twice
    assert all(land.canonical(p) is not None for p in land.evaluated)   # pruned never built
    assert result.best is not None and result.best_cost == min(t.cost for t in result.trials)
    assert not math.isinf(result.best_cost)


@pytest.mark.parametrize("strategy", ["genetic", "random"])
def test_seeds_are_in_the_first_batch(strategy: str) -> None:
    land = _landscape(1)
    seeds = [land.target, (0,) * 12, land.target]           # a duplicate is dropped
    batches: list[list[tuple[int, ...]]] = []

    def evaluate(points: list[tuple[int, ...]]) -> list[float]:
        batches.append(points)
        return land.evaluate(points)

    settings = SearchSettings(strategy, generations=3, population=6, budget_seconds=None)
    result = search(land, evaluate, settings, seeds)
    assert batches[0][:2] == [land.target, (0,) * 12]
    assert len(batches[0]) == 6
    assert result.best == land.target


def test_wall_clock_budget_and_unmeasured_candidates() -> None:
    now = [0.0]
    land = _landscape(2)

    def evaluate(points: list[tuple[int, ...]]) -> list[float | None]:
        now[0] += 10.0                                   # each batch takes 10 "seconds"
        costs: list[float | None] = list(land.evaluate(points))
        if now[0] > 25:                                  # the budget ran out mid-batch
            costs[-2:] = [None, None]
        return costs

    settings = SearchSettings("genetic", generations=100, population=8, budget_seconds=25.0)
    result = search(land, evaluate, settings, clock=lambda: now[0])
    assert result.stopped == "budget"
    assert result.generations == 3
    assert len(result.trials) == 3 * 8 - 2 - 2 * 2      # elites are not measured again


def test_a_space_where_everything_fails() -> None:
    land = _landscape(3)
    settings = SearchSettings("genetic", generations=3, population=4, budget_seconds=None)
    result = search(land, lambda ps: [math.inf] * len(ps), settings)
    assert result.best is None and math.isinf(result.best_cost)
    assert len(result.trials) > 4                        # it kept going


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="strategy"):
        SearchSettings("annealing")
    with pytest.raises(ValueError, match="elites"):
        SearchSettings(population=4, elites=4)
