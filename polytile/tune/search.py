"""Search strategies over a gene space (TC §6.2): the genetic algorithm and random search.

    result = search(space, evaluate, SearchSettings(strategy="genetic", budget_seconds=60))
    result.best, result.best_cost, result.trials

Both are plain functions over two values: a space (how many values each gene has,
and `canonical(point)`: a point's identity, or None when it is pruned) and an
`evaluate(points) -> costs` callback (seconds; math.inf for a rejected candidate,
None for one left unmeasured because the budget ran out). Nothing here compiles or
times anything, so the strategies are tested with a synthetic cost function.

The genetic algorithm, as TC describes it: a population of candidates; fitness
inversely proportional to cost; each child bred from three parents chosen with
probability proportional to fitness, every gene taken from one of the three
(uniform crossover), then each gene replaced by a random value with probability
`mutation_rate`; the `elites` best candidates survive unchanged. The first
population holds the seeds (the heuristics' default, the best options of similar
programs) and random valid points. A point already evaluated costs nothing again:
its cost is remembered, and breeding retries a few times to find a new one.
"""
from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol

Point = tuple[int, ...]
Evaluate = Callable[[list[Point]], Sequence["float | None"]]
STRATEGIES = ("genetic", "random")
_SAMPLE_ATTEMPTS = 200      # random draws to find a valid, new point
_BREED_ATTEMPTS = 10        # children bred to find one not evaluated yet


class SearchSpace(Protocol):
    @property
    def sizes(self) -> tuple[int, ...]: ...

    def canonical(self, point: Point) -> Hashable | None: ...


@dataclass(frozen=True)
class SearchSettings:
    strategy: str = "genetic"
    generations: int = 20
    population: int = 12
    mutation_rate: float = 0.1          # per gene
    elites: int = 2
    budget_seconds: float | None = 60.0  # wall clock, from the call of `search`
    max_candidates: int | None = None    # distinct candidates evaluated
    seed: int = 0

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        if self.population < 1 or self.generations < 1:
            raise ValueError("population and generations must be at least 1")
        if not 0.0 <= self.mutation_rate <= 1.0:
            raise ValueError(f"mutation_rate must be in [0, 1], got {self.mutation_rate}")
        if not 0 <= self.elites < self.population:
            raise ValueError("elites must be at least 0 and fewer than the population")


@dataclass(frozen=True)
class Trial:
    point: Point
    cost: float            # math.inf: rejected
    generation: int


@dataclass(frozen=True)
class SearchResult:
    best: Point | None
    best_cost: float
    trials: tuple[Trial, ...]      # every distinct point evaluated, in order
    generations: int
    stopped: str                   # "generations", "budget", "candidates" or "space"


# Progress callback: (generation, trials so far, best cost so far).
OnGeneration = Callable[[int, Sequence[Trial], float], None]


def search(space: SearchSpace, evaluate: Evaluate, settings: SearchSettings,
           seeds: Sequence[Point] = (), *, clock: Callable[[], float] = time.monotonic,
           on_generation: OnGeneration | None = None) -> SearchResult:
    run = _Run(space, evaluate, settings, clock)
    rng = random.Random(settings.seed)
    if settings.strategy == "genetic":
        generations = _genetic(run, rng, seeds, on_generation)
    else:
        generations = _random(run, rng, seeds, on_generation)
    best = min(run.trials, key=lambda t: t.cost, default=None)
    if best is None or math.isinf(best.cost):
        return SearchResult(None, math.inf, tuple(run.trials), generations, run.stopped)
    return SearchResult(best.point, best.cost, tuple(run.trials), generations, run.stopped)


class _Run:
    """The evaluations of one search: remembered costs and the budgets."""

    def __init__(self, space: SearchSpace, evaluate: Evaluate, settings: SearchSettings,
                 clock: Callable[[], float]):
        self.space, self._evaluate, self.settings, self.clock = space, evaluate, settings, clock
        self.deadline = (clock() + settings.budget_seconds
                         if settings.budget_seconds is not None else math.inf)
        self.costs: dict[Hashable, float] = {}
        self.trials: list[Trial] = []
        self.stopped = "generations"

    def done(self) -> bool:
        if self.clock() >= self.deadline:
            self.stopped = "budget"
        elif (self.settings.max_candidates is not None
              and len(self.trials) >= self.settings.max_candidates):
            self.stopped = "candidates"
        else:
            return False
        return True

    def seen(self, point: Point) -> bool:
        return self.space.canonical(point) in self.costs

    def costs_of(self, points: Sequence[Point], generation: int) -> list[float]:
        """Costs of `points`, evaluating (in one batch) those not evaluated yet."""
        new: dict[Hashable, Point] = {}
        for p in points:
            key = self.space.canonical(p)
            if key is not None and key not in self.costs:
                new.setdefault(key, p)
        batch = list(new.items())
        if self.settings.max_candidates is not None:
            batch = batch[:max(0, self.settings.max_candidates - len(self.trials))]
        if batch and not self.done():
            results = self._evaluate([p for _, p in batch])
            for (key, p), cost in zip(batch, results):
                if cost is None:          # the budget ran out during the batch
                    self.stopped = "budget"
                    continue
                self.costs[key] = float(cost)
                self.trials.append(Trial(p, float(cost), generation))
        return [self.costs.get(self.space.canonical(p), math.inf) for p in points]

    def best_cost(self) -> float:
        return min((t.cost for t in self.trials), default=math.inf)


def _valid_random(run: _Run, rng: random.Random, avoid: set[Hashable]) -> Point | None:
    sizes = run.space.sizes
    for _ in range(_SAMPLE_ATTEMPTS):
        p = tuple(rng.randrange(n) for n in sizes)
        key = run.space.canonical(p)
        if key is not None and key not in avoid and key not in run.costs:
            return p
    return None


def _first_population(run: _Run, rng: random.Random, seeds: Sequence[Point]) -> list[Point]:
    population: list[Point] = []
    keys: set[Hashable] = set()
    for p in seeds:
        key = run.space.canonical(tuple(p))
        if key is not None and key not in keys and len(population) < run.settings.population:
            population.append(tuple(p))
            keys.add(key)
    while len(population) < run.settings.population:
        drawn = _valid_random(run, rng, keys)
        if drawn is None:
            break
        population.append(drawn)
        keys.add(run.space.canonical(drawn))
    return population


def _genetic(run: _Run, rng: random.Random, seeds: Sequence[Point],
             on_generation: OnGeneration | None) -> int:
    settings = run.settings
    population = _first_population(run, rng, seeds)
    if not population:
        run.stopped = "space"
        return 0
    costs = run.costs_of(population, 0)
    generation = 1
    if on_generation:
        on_generation(0, run.trials, run.best_cost())
    while generation < settings.generations and not run.done():
        ranked = sorted(zip(costs, range(len(population))))
        elites = [population[k] for c, k in ranked[:settings.elites] if not math.isinf(c)]
        children = _breed(run, rng, population, costs, settings.population - len(elites))
        if not children:
            run.stopped = "space"
            break
        population = elites + children
        costs = run.costs_of(population, generation)
        if on_generation:
            on_generation(generation, run.trials, run.best_cost())
        generation += 1
        if run.stopped == "budget":
            break
    return generation


def _breed(run: _Run, rng: random.Random, parents: list[Point], costs: list[float],
           count: int) -> list[Point]:
    fitness = [0.0 if math.isinf(c) or c <= 0 else 1.0 / c for c in costs]
    if not any(fitness):
        fitness = [1.0] * len(parents)
    sizes = run.space.sizes
    rate = run.settings.mutation_rate
    children: list[Point] = []
    keys: set[Hashable] = set()
    for _ in range(count):
        child: Point | None = None
        for _ in range(_BREED_ATTEMPTS):
            trio = rng.choices(parents, weights=fitness, k=3)
            genes = [rng.choice(trio)[g] for g in range(len(sizes))]
            genes = [rng.randrange(n) if rng.random() < rate else v
                     for v, n in zip(genes, sizes)]
            candidate = tuple(genes)
            key = run.space.canonical(candidate)
            if key is None:
                continue
            child = candidate
            if key not in run.costs and key not in keys:
                break
        if child is None:
            child = _valid_random(run, rng, keys)
        if child is not None:
            children.append(child)
            keys.add(run.space.canonical(child))
    return children


def _random(run: _Run, rng: random.Random, seeds: Sequence[Point],
            on_generation: OnGeneration | None) -> int:
    """Uniform samples of valid, new points, evaluated a population at a time (so the
    compilation of a batch runs in parallel, as for the genetic search)."""
    batch = _first_population(run, rng, seeds)
    generation = 0
    while batch and generation < run.settings.generations and not run.done():
        run.costs_of(batch, generation)
        if on_generation:
            on_generation(generation, run.trials, run.best_cost())
        generation += 1
        if run.stopped == "budget":
            break
        keys: set[Hashable] = set()
        batch = []
        for _ in range(run.settings.population):
            p = _valid_random(run, rng, keys)
            if p is None:
                break
            batch.append(p)
            keys.add(run.space.canonical(p))
    if not batch and run.stopped == "generations":
        run.stopped = "space"
    return generation
