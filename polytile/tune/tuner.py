"""One tuning run (TC §6.2): space, search, measurement and database, wired together.

    result = tune_spec(compiler, spec, inputs, scalars, outputs, TuneSettings.of(budget="60s"))
    result.best, result.speedup, print(result.table())

The run: build the space of the lowered program; seed the first population with
the heuristics' default, this key's stored best and the best options of the same
program tuned at other sizes (its family), re-encoded onto this space (each gene
takes the nearest value this space has, a gene the options say nothing about takes
the default's; tile sizes stay absolute: they are about cache capacity, not the
extent), then the space's predefined points (the heuristics under the other pipeline
choices and at half width); both strategies get the same seeds. Let the search
strategy propose batches; compile each batch in parallel, profile it one candidate
at a time, check each candidate's output once against the reference interpreter,
and record the batch in the tuning database (one transaction per batch, so an
interrupted run keeps what it measured). Later compilations of the same key pick
the best entry up through Compiler(tuned=...).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import re
import secrets
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polytile.compile import Compiler, TuningKey
from polytile.errors import ArgumentError, UnsupportedError
from polytile.ir.lower import lower
from polytile.passes.pipeline import check_pass_options
from polytile.runtime.files import sha256_text
from polytile.sema import reference
from polytile.sema.canonical import alpha_rename, canonical
from polytile.sema.printer import format_function
from polytile.sema.specialize import Specialized
from polytile.targets.target import EMULATED_BACKENDS
from polytile.tune.database import Measurement, TuningDatabase
from polytile.tune.measure import (
    Build,
    BuildJob,
    BuildSettings,
    Outcome,
    Runner,
    build_all,
    build_one,
    measure_build,
    measure_rounds,
)
from polytile.tune.options import Options
from polytile.tune.progress import Progress, format_seconds
from polytile.tune.runner import RunnerSetup, RunReport, RunSettings
from polytile.tune.search import Point, SearchSettings, search
from polytile.tune.space import Space, build_space

_RUN_FIELDS = {f.name for f in dataclasses.fields(RunSettings)}


@dataclass(frozen=True)
class TuneSettings:
    strategy: str = "genetic"          # or "random"
    budget_seconds: float = 60.0       # wall clock for the whole run
    max_candidates: int | None = None  # distinct candidates measured
    generations: int = 20
    population: int = 12
    mutation_rate: float = 0.1
    elites: int = 2
    seed: int = 0
    similar: int = 4                   # best entries of similar programs used as seeds
    start: tuple[Options, ...] = ()    # more starting points (TC §6.2: predefined strategies)
    workers: int = 0                   # compile processes; 0: one per core
    build_timeout: float = 120.0
    run: RunSettings = field(default_factory=RunSettings)
    confirm: int = 3                   # best candidates measured again beside the default
    confirm_rounds: int = 5
    confirm_share: float = 0.15        # of the budget, kept for the confirmation
    min_gain: float = 0.03             # a winner must beat the default by this, confirmed
    progress: bool = True
    # Where candidates run: None (this machine), "local:N" (a Dask LocalCluster of N
    # worker processes), a scheduler address "tcp://host:8786", or a distributed.Client.
    cluster: Any = None

    @staticmethod
    def of(budget: Any = None, candidates: int | None = None, **kw: Any) -> TuneSettings:
        """Settings from keywords: `budget` as seconds or "90s" / "2m" / "1h",
        `candidates` for max_candidates, RunSettings fields (timeout, repeats, ...)
        by name, or `run_timeout` for RunSettings.timeout."""
        run_kw = {k: kw.pop(k) for k in list(kw) if k in _RUN_FIELDS}
        if "run_timeout" in kw:
            run_kw["timeout"] = kw.pop("run_timeout")
        names = {f.name for f in dataclasses.fields(TuneSettings)}
        unknown = set(kw) - names
        if unknown:
            raise ArgumentError(f"unknown tuning settings {sorted(unknown)}",
                                hint=f"known: budget, candidates, {', '.join(sorted(names))}, "
                                     f"{', '.join(sorted(_RUN_FIELDS))}")
        if budget is not None:
            kw["budget_seconds"] = parse_budget(budget)
        if candidates is not None:
            kw["max_candidates"] = int(candidates)
        if "start" in kw:
            kw["start"] = tuple(o if isinstance(o, Options) else Options.from_json(o)
                                for o in kw["start"])
        settings = TuneSettings(**kw)
        if run_kw:
            settings = dataclasses.replace(settings,
                                           run=dataclasses.replace(settings.run, **run_kw))
        settings.search()     # validates
        return settings

    def search(self, budget_seconds: float | None = None) -> SearchSettings:
        try:
            return SearchSettings(self.strategy, self.generations, self.population,
                                  self.mutation_rate, self.elites,
                                  self.budget_seconds if budget_seconds is None
                                  else budget_seconds, self.max_candidates, self.seed)
        except ValueError as e:
            raise ArgumentError(f"invalid tuning settings: {e}") from None


def parse_budget(value: Any) -> float:
    """Seconds from 90, 90.0, "90", "90s", "2m", "1.5h"."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([smh]?)\s*", str(value))
    if not match or float(match.group(1)) <= 0:
        raise ArgumentError(f"budget {value!r} is not a duration",
                            hint="give seconds, or e.g. '90s', '2m', '1h'")
    return float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]


@dataclass(frozen=True)
class TuneResult:
    key: TuningKey
    function: str
    best: Options | None
    best_seconds: float | None
    default: Options
    default_seconds: float | None
    candidates: int
    rejected: dict[str, int]           # status -> count
    generations: int
    seconds: float
    stopped: str
    notes: tuple[str, ...] = ()        # e.g. cluster workers skipped for their hardware

    @property
    def speedup(self) -> float | None:
        if not self.best_seconds or not self.default_seconds:
            return None
        return self.default_seconds / self.best_seconds

    def table(self) -> str:
        rejected = ", ".join(f"{k} {v}" for k, v in sorted(self.rejected.items())) or "none"
        speedup = f"{self.speedup:.2f}x" if self.speedup else "-"
        rows = [("function", "default", "tuned", "speedup", "candidates", "rejected",
                 "generations", "seconds"),
                (self.function, format_seconds(self.default_seconds),
                 format_seconds(self.best_seconds), speedup, str(self.candidates), rejected,
                 str(self.generations), f"{self.seconds:.0f}")]
        widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()
                         for r in rows)


def tune_spec(compiler: Compiler, spec: Specialized, inputs: dict[str, np.ndarray],
              scalars: dict[str, Any], outputs: dict[str, np.ndarray],
              settings: TuneSettings, label: str | None = None) -> TuneResult:
    """Tune one specialized function; `outputs` hold the initial values of in/out outputs
    (others may be anything). The results are in the database when this returns."""
    start = time.monotonic()
    deadline = start + settings.budget_seconds
    config = compiler.config
    if config.disable_disk_cache:
        raise ArgumentError("tuning needs the disk cache (candidates are built by worker "
                            "processes)", hint="unset POLYTILE_NO_DISK_CACHE")
    if compiler.target.backend in EMULATED_BACKENDS:
        raise UnsupportedError(f"target {compiler.target.name} runs under an emulator: "
                               "timing it would tune the emulator, not the machine",
                               hint="tune on the machine itself, or for a host target")
    if compiler.target.backend == "cuda":
        # A cuda target compiles on any host (select_target allows it) but times nothing
        # without a device: refuse now rather than reject every candidate.
        from polytile.runtime.cuda import cuda_device
        cuda_device()
    for options in settings.start:
        # The caller's pass options are checked before they seed anything: the space
        # keeps only the choices that change this program, so a misspelt option or value
        # would vanish in the encoding. Their schedules are hints, encoded onto the
        # space like a stored entry of another size (a vector wider than this host's
        # takes its full width).
        check_pass_options(dict(options.passes), compiler.target)
    db = TuningDatabase.of(config)
    lowered = lower(canonical(spec))
    key = compiler.tuning_key(spec, lowered)
    family = program_family(spec)
    exact, similar = starting_options(db, key, family, settings)
    # Only options for these very sizes add their values to the genes; another size's
    # tile sizes would be noise in this space.
    space = build_space(lowered, compiler.target, exact, plan_groups(compiler, spec))
    seeds = ([space.default_point] + [space.encode(o) for o in exact + similar]
             + space.predefined())
    name = spec.fn.name
    progress = Progress(label or name, deadline, settings.progress)
    progress.note(space.summary())
    session = _Session(
        space=space, key=key, function=name, db=db, deadline=deadline,
        job=BuildJob(config, compiler.target, spec),
        build=BuildSettings(settings.workers, settings.build_timeout),
        progress=progress, run_id=secrets.token_hex(8), run_settings=settings.run, family=family)
    setup = _runner_setup(spec, inputs, scalars, outputs, settings.run)
    with contextlib.ExitStack() as stack:
        if settings.cluster is not None:
            from polytile.tune.cluster import ClusterMeasurer
            session.cluster = stack.enter_context(ClusterMeasurer.start(
                settings.cluster, session.job, setup, key, session.run_id,
                settings.build_timeout))
            # The measurer adds to this list when a worker is skipped later on.
            session.notes = session.cluster.notes
            for note in session.cluster.notes:
                session.progress.note(note)
        else:
            session.runner = stack.enter_context(Runner(setup))
        left = deadline - time.monotonic()
        if settings.confirm:
            left *= 1.0 - settings.confirm_share
        result = search(space, session.evaluate, settings.search(left), seeds,
                        on_generation=lambda g, trials, best: session.progress.end_generation(g))
        if settings.confirm:
            session.confirm(settings.confirm, settings.confirm_rounds, settings.min_gain)
    best = session.best_options
    if best is not None and session.cluster is not None:
        # The winner was built on a worker; build it here too, so the next call finds it.
        built = build_one(session.job, best, settings.build_timeout)
        if built.status != "ok":
            session.notes.append(f"the best options do not build here: {built.detail}")
    return TuneResult(key, name, best, session.best_seconds if best else None, space.default,
                      session.default_seconds, session.progress.candidates,
                      dict(session.rejected), result.generations, time.monotonic() - start,
                      result.stopped, tuple(session.notes))


def plan_groups(compiler: Compiler, spec: Specialized) -> list[list[int]] | None:
    """The fusion plan's groups (polytile.graph) where the target runs pass fuse, for
    the space's "plan" variant; the same groups Compiler.planned gives a candidate."""
    if "fuse" not in {name for name, _ in compiler.target.passes}:
        return None
    from polytile.graph.plan import plan_fusion
    return plan_fusion(spec, compiler.target, compiler.config).option


def program_family(spec: Specialized) -> str:
    """The program whatever its sizes: a hash of the alpha-renamed function with
    symbolic shapes (TuningKey.program hashes the lowered IR, so it changes with them)."""
    return sha256_text(format_function(alpha_rename(spec.fn)))


def starting_options(db: TuningDatabase, key: TuningKey, family: str,
                     settings: TuneSettings) -> tuple[list[Options], list[Options]]:
    """Seeds besides the default: (for these sizes: the caller's starting points and
    the stored best; for other sizes of the same program: their best entries)."""
    own = db.best(key)
    exact = list(settings.start) + ([own.options] if own else [])
    return exact, [e.options for e in db.similar(key, family, settings.similar)]


def _runner_setup(spec: Specialized, inputs: dict[str, np.ndarray], scalars: dict[str, Any],
                  outputs: dict[str, np.ndarray], settings: RunSettings) -> RunnerSetup:
    fn = spec.fn
    params = tuple(np.array(scalars[p.name], dtype=p.dtype.numpy) if p.kind == "scalar"
                   else np.ascontiguousarray(inputs[p.name]) for p in fn.params)
    initial = tuple(np.ascontiguousarray(outputs[o.name]).copy() for o in fn.outputs)
    expected = {o.name: outputs[o.name].copy() for o in fn.outputs}
    reference.run(spec, {**inputs, **scalars}, expected)
    return RunnerSetup(params, initial, tuple(o.name in fn.inout for o in fn.outputs),
                       tuple(expected[o.name] for o in fn.outputs), settings)


@dataclass
class _Session:
    """The evaluation callback of one run and what it has learned so far."""

    space: Space
    key: TuningKey
    function: str
    db: TuningDatabase
    deadline: float
    job: BuildJob
    build: BuildSettings
    progress: Progress
    run_id: str
    runner: Runner | None = None
    cluster: Any = None                # a ClusterMeasurer, when workers measure
    run_settings: RunSettings = field(default_factory=RunSettings)
    family: str = ""
    by_program: dict[str, tuple[Build, RunReport]] = field(default_factory=dict)
    rejected: Counter[str] = field(default_factory=Counter)
    best_options: Options | None = None
    best_seconds: float = math.inf
    default_seconds: float | None = None
    notes: list[str] = field(default_factory=list)

    def evaluate(self, points: list[Point]) -> Sequence[float | None]:
        decoded = [self.space.decode(p) for p in points]
        assert all(c is not None for c in decoded), "the search proposed a pruned point"
        candidates = [c for c in decoded if c is not None]
        outcomes = (self.cluster.measure(candidates, self._prune_seconds(), self.deadline)
                    if self.cluster is not None else self._measure_here(candidates))
        costs: list[float | None] = []
        records: list[Measurement] = []
        for outcome in outcomes:
            if outcome is None:             # the budget ran out first
                costs.append(None)
                continue
            b, report = outcome.build, outcome.report
            records.append(Measurement(b.options, report.status, report.median,
                                       report.spread, report.detail, outcome.host))
            if b.program and report.status == "ok":
                self.by_program.setdefault(b.program, (b, report))
            ok = report.status == "ok" and report.median is not None
            if b.options == self.space.default and ok:
                self.default_seconds = report.median
                self.progress.default = report.median
            if ok and report.median is not None and report.median < self.best_seconds:
                self.best_seconds, self.best_options = report.median, b.options
            if not ok:
                self.rejected[report.status] += 1
            self.progress.candidate(report.median if ok else None)
            costs.append(report.median if ok and report.median is not None else math.inf)
        if records:
            self.db.record(self.key, self.function, records, self.run_id, self.default_seconds,
                           family=self.family)
        return costs

    def _measure_here(self, candidates: list[Options]) -> list[Outcome | None]:
        """Build in parallel worker processes, then measure one at a time here."""
        outcomes: list[Outcome | None] = []
        for b in build_all(self.job, candidates, self.build):
            if time.monotonic() >= self.deadline:
                outcomes.append(None)
            else:
                outcomes.append(Outcome(b, self._report(b)))
        return outcomes

    def _prune_seconds(self) -> float | None:
        """A candidate whose check call takes this long is not timed further."""
        if math.isinf(self.best_seconds):
            return None
        return self.best_seconds * self.run_settings.prune_factor

    def _report(self, b: Build) -> RunReport:
        known = self.by_program.get(b.program) if b.status == "ok" else None
        if known is not None:
            return dataclasses.replace(known[1], detail="same kernel as an earlier candidate")
        assert self.runner is not None
        report = measure_build(self.runner, b, self._prune_seconds())
        if b.status == "ok":
            self.by_program[b.program] = (b, report)
        return report

    def confirm(self, count: int, rounds: int, min_gain: float) -> None:
        """Measure the `count` fastest candidates and the default again, in turns, and
        keep the fastest by that measurement (the default unless another beats it by
        `min_gain`): the search's best is the minimum of many noisy medians, which
        flatters it. TC validates its cache entries the same way. At least one round
        runs; more while the budget lasts."""
        timed = [(r.median, b) for b, r in self.by_program.values()
                 if r.status == "ok" and r.median is not None and r.samples > 1]
        timed.sort(key=lambda t: t[0])
        contenders = [b for _, b in timed[:count]]
        default = next((b for b, _ in self.by_program.values()
                        if b.options == self.space.default), None)
        if default is not None and default not in contenders:
            contenders.append(default)
        if len(contenders) < 2:
            return
        seconds = self.deadline - time.monotonic()
        if self.cluster is not None:
            reports = self.cluster.measure_rounds(contenders, rounds, seconds)
        else:
            assert self.runner is not None
            reports = measure_rounds(self.runner, contenders, rounds, seconds)
        medians = {p: [r.median for r in rs if r.median is not None]
                   for p, rs in reports.items()}
        spreads = {p: rs[-1].spread for p, rs in reports.items() if rs}
        # The minimum over rounds: interference from other work only ever slows a round.
        records = {b.program: Measurement(b.options, "ok", min(medians[b.program]),
                                          spreads.get(b.program),
                                          f"confirmation, best of {len(medians[b.program])}")
                   for b in contenders if medians[b.program]}
        if not records:
            return
        best = min(records.values(), key=lambda m: m.median or math.inf)
        if default is not None and default.program in records:
            baseline = records[default.program]
            self.default_seconds = baseline.median
            if (best.median or 0.0) > (baseline.median or 0.0) * (1.0 - min_gain):
                best = baseline
        self.best_options, self.best_seconds = best.options, best.median or math.inf
        self.db.record(self.key, self.function, list(records.values()), self.run_id,
                       self.default_seconds, best=best, family=self.family)
