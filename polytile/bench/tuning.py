"""The tuning evaluation of issue 5: every bench workload tuned, then timed against its
untuned default and NumPy in the same run (`benchmarks/tune_all.py` runs this).

    python benchmarks/tune_all.py --budget 2m --strategy both [--quick] [--only tmm,tbmm]

For each workload: the default kernel (heuristics only) and, for each strategy, a
kernel tuned for `--budget` in a tuning database of its own (a fresh cache directory
per workload and strategy, so no run seeds another and each starts from the
default); every kernel's first call is checked against NumPy, then the default,
the tuned kernels and NumPy are timed together with the bench's rotated blocks
(polytile.bench.timing). The evaluation measures what the tuner optimized: as in
the tuner's profiling process, every kernel writes into preallocated outputs
(`out=`), and consecutive calls cycle through copies of the inputs and outputs
(64 MiB in all), so a small kernel does not find its operands in cache from the
previous call. (This matters: on a 2-core AMD EPYC VM, tmm 128x32x256's default
kernel, OpenMP over rows, ran 45 µs with the same buffers every call and 80-90 µs
rotating through 4 MiB of copies, while a serial schedule ran 36-48 µs either way.)
NumPy gets the same rotation, with `out=` where the workload has it.
With both strategies the one that tunes first alternates from workload to workload.
The table goes to the terminal and to the `tuning` section of benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from polytile.bench.harness import as_tuple, compare, error_text
from polytile.bench.machine import BLAS_ENV_VARS, load_average, machine_facts
from polytile.bench.report import format_markdown, format_text, milliseconds, write_section
from polytile.bench.timing import TimingOptions, time_blocks
from polytile.bench.workload import Arrays, Workload
from polytile.config import Config, load_config
from polytile.tune.runner import RunSettings, rotation_copies

RESULTS_PATH = Path("benchmarks") / "RESULTS.md"   # relative to the current directory
STRATEGIES = ("genetic", "random")
DEFAULT, NUMPY = "default", "numpy"
ROTATE_BYTES = RunSettings().rotate_bytes     # as the tuner's profiling process
# One set of a workload's arguments and its output buffers.
ArgumentSet = tuple[Arrays, Arrays]
# Two strategies' results closer than this are a tie: the tuner's own confirmation
# margin (TuneSettings.min_gain). The timing noise floor can be larger (on a 2-core
# AMD EPYC VM, identical kernels timed up to 1.18x apart in noisy minutes:
# benchmarks/identical_copies.py), so read the table beside that measurement.
TIE = 0.03
# Issue 4's targets stated as a ratio to NumPy's speed (issue 5: the tuned kernel
# should reach them on tmm 1024³ and tbmm).
NUMPY_TARGETS = {"tmm 1024x1024x1024": 0.6, "tbmm 500x26x72x26": 1.0, "tmm 128x32x256": 1.0}


@dataclass(frozen=True)
class Tuned:
    """One strategy's result on one workload."""

    strategy: str
    status: str                    # "ok", "WRONG" or "FAILED" (the check against NumPy)
    detail: str = ""
    seconds: float | None = None   # the tuned kernel's median in the shared timing
    candidates: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    options: str = ""              # the best options' text ("" if the default won)
    tuner_speedup: float | None = None   # the tuner's own confirmation measurement


@dataclass(frozen=True)
class TuningRow:
    name: str
    default: float | None          # seconds per call
    numpy: float | None
    tuned: dict[str, Tuned]
    default_status: str = "ok"
    default_detail: str = ""

    def speedup(self, strategy: str) -> float | None:
        t = self.tuned.get(strategy)
        if t is None or not t.seconds or not self.default:
            return None
        return self.default / t.seconds

    def vs_numpy(self, seconds: float | None) -> float | None:
        return self.numpy / seconds if self.numpy and seconds else None


# ------------------------------------------------------------------ tables
def _ratio(value: float | None) -> str:
    return f"{value:.2f}x" if value else ""


def tuning_table(rows: Sequence[TuningRow], strategies: Sequence[str]
                 ) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """Header and cells: times, speedups over the default, ratios to NumPy (NumPy's time
    over ours: above 1 polytile is faster), candidates measured, and the check."""
    header = ("workload", "default ms", *(f"{s} ms" for s in strategies),
              *(f"{s} speedup" for s in strategies), "NumPy ms", "default vs NumPy",
              *(f"{s} vs NumPy" for s in strategies), *(f"{s} candidates" for s in strategies),
              "check")
    lines = []
    for row in rows:
        tuned = [row.tuned.get(s) for s in strategies]
        lines.append((
            row.name, milliseconds(row.default) or row.default_status,
            *(milliseconds(t.seconds) or t.status if t else "" for t in tuned),
            *(_ratio(row.speedup(s)) for s in strategies),
            milliseconds(row.numpy), _ratio(row.vs_numpy(row.default)),
            *(_ratio(row.vs_numpy(t.seconds)) if t else "" for t in tuned),
            *(str(t.candidates) if t else "" for t in tuned),
            _check(row, strategies)))
    return header, lines


def _check(row: TuningRow, strategies: Sequence[str]) -> str:
    bad = [] if row.default_status == "ok" else [f"default {row.default_status}"]
    bad += [f"{s} {row.tuned[s].status}" for s in strategies
            if s in row.tuned and row.tuned[s].status != "ok"]
    return ", ".join(bad) or "ok"


def summary(rows: Sequence[TuningRow], strategies: Sequence[str]) -> list[str]:
    """The median speedup of each strategy, genetic against random, and issue 4's
    NumPy targets."""
    out = []
    for s in strategies:
        speedups = [x for x in (r.speedup(s) for r in rows) if x]
        if speedups:
            out.append(f"{s}: median speedup over the default {statistics.median(speedups):.2f}x"
                       f" over {len(speedups)} workload(s) (min {min(speedups):.2f}x, max "
                       f"{max(speedups):.2f}x)")
        else:
            out.append(f"{s}: no workload tuned and timed")
    if set(STRATEGIES) <= set(strategies):
        both = [r for r in rows if r.speedup("genetic") and r.speedup("random")]
        ratios = [(r.speedup("genetic") or 0) / (r.speedup("random") or 1) for r in both]
        wins = sum(1 for x in ratios if x > 1 + TIE)
        losses = sum(1 for x in ratios if x < 1 - TIE)
        out.append(f"genetic against random at equal budget, {len(both)} workload(s): faster "
                   f"on {wins}, within {TIE:.0%} on {len(both) - wins - losses}, slower on "
                   f"{losses}")
        found = {s: sum(1 for r in rows if s in r.tuned and r.tuned[s].options)
                 for s in STRATEGIES}
        out.append("options other than the default won the tuner's confirmation: "
                   + ", ".join(f"{s} on {n}" for s, n in found.items()))
    for row in rows:
        target = NUMPY_TARGETS.get(row.name)
        ratios = [x for x in (row.vs_numpy(row.tuned[s].seconds) for s in strategies
                              if s in row.tuned) if x]
        if target is not None and ratios:
            best = max(ratios)
            out.append(f"{row.name}: best tuned kernel {best:.2f}x NumPy's speed, target "
                       f">= {target:g}x: {'met' if best >= target else 'missed'}")
    return out


def tuning_markdown(rows: Sequence[TuningRow], strategies: Sequence[str], *, budget: str,
                    facts: dict[str, str], command: str, date: str, title: str,
                    notes: Sequence[str] = ()) -> str:
    out = [f"## {title}", "", f"- date: {date}", f"- command: `{command}`",
           f"- budget: {budget} per workload and strategy; strategies: {', '.join(strategies)}"]
    out += [f"- {note}" for note in notes]
    out += ["", "### Machine", ""] + [f"- {k}: {v}" for k, v in facts.items()]
    out += ["", "### Summary", ""] + [f"- {line}" for line in summary(rows, strategies)]
    out += ["", "### Results", "", format_markdown(*tuning_table(rows, strategies)), "",
            ("Times are same-run medians of the bench's rotated blocks: the untuned default, "
             "each tuned kernel and NumPy timed together after tuning, as the tuner times "
             "candidates: each call writes into preallocated outputs and uses the next of "
             "several copies of inputs and outputs (64 MiB in all), so caches do not flatter "
             "small kernels. Speedup is the "
             "default's time over the tuned kernel's; `vs NumPy` is NumPy's time over "
             "polytile's (above 1: polytile is faster). Candidates are the distinct "
             "candidates the tuner measured. `check` compares every kernel's output with "
             "NumPy within the workload's tolerances."), ""]
    out += ["### Best options", ""]
    for row in rows:
        for s in strategies:
            t = row.tuned.get(s)
            if t is None:
                continue
            rejected = ", ".join(f"{k} {v}" for k, v in sorted(t.rejected.items())) or "none"
            confirmed = f"; tuner's confirmation {t.tuner_speedup:.2f}x" if t.tuner_speedup else ""
            what = f"`{t.options}`" if t.options else "the default"
            out.append(f"- {row.name}, {s}: {what} ({t.candidates} candidates, rejected: "
                       f"{rejected}{confirmed})")
    failures = [(row.name, DEFAULT, row.default_detail) for row in rows if row.default_detail]
    failures += [(row.name, s, row.tuned[s].detail) for row in rows for s in strategies
                 if s in row.tuned and row.tuned[s].detail]
    if failures:
        out += ["", "### Failures in full", ""]
        for name, who, detail in failures:
            out += [f"{name} ({who}):", "", "```", detail.rstrip(), "```", ""]
    return "\n".join(out).rstrip() + "\n"


# ------------------------------------------------------------------ measuring
@dataclass(frozen=True)
class Settings:
    strategies: tuple[str, ...]
    budget: str                         # as TuneSettings.of takes it: "2m", "90s", 30
    timing: TimingOptions
    seed: int = 0
    progress: bool = True


Log = Callable[[str], None]


def tune_workload(workload: Workload, settings: Settings, base: Config, log: Log,
                  first: int = 0) -> TuningRow:
    """Tune `workload` with each strategy (starting with strategies[first]), then check
    and time the default, the tuned kernels and NumPy together."""
    args = workload.make_inputs(np.random.default_rng(settings.seed))
    expected = as_tuple(workload.numpy(*args))
    sets = rotating_sets(args, expected)
    calls: dict[str, Callable[[], Any]] = {}
    tuned: dict[str, Tuned] = {}
    with tempfile.TemporaryDirectory(prefix="polytile-tune-") as tmp:
        base = replace(base, disable_disk_cache=False, ignore_tuned=False)
        default = _function(workload, replace(base, cache_dir=Path(tmp) / DEFAULT,
                                              ignore_tuned=True))
        call, status, detail = checked_call(default, sets, expected, workload)
        if call is not None:
            calls[DEFAULT] = call
        default_status, default_detail = status, detail
        order = settings.strategies[first:] + settings.strategies[:first]
        for strategy in order:
            log(f"  tuning with {strategy} for {settings.budget}")
            fn = _function(workload, replace(base, cache_dir=Path(tmp) / strategy))
            try:
                result = fn.tune(*args, budget=settings.budget, strategy=strategy,
                                 seed=settings.seed, progress=settings.progress)
            except Exception as e:  # noqa: BLE001 - one failed tuning is a FAILED cell
                tuned[strategy] = Tuned(strategy, "FAILED", error_text(e))
                continue
            call, status, detail = checked_call(fn, sets, expected, workload)
            if call is not None:
                calls[strategy] = call
            won = result.best is not None and result.best != result.default
            tuned[strategy] = Tuned(strategy, status, detail, None, result.candidates,
                                    dict(result.rejected),
                                    result.best.text() if won and result.best else "",
                                    result.speedup)
        calls[NUMPY] = _numpy_call(workload, sets)
        log(f"  timing {', '.join(calls)}")
        try:
            seconds = {name: t.median for name, t in time_blocks(calls, settings.timing).items()}
        except Exception as e:  # noqa: BLE001 - the checks are still worth reporting
            log(f"  timing failed: {error_text(e)}")
            seconds = {}
    tuned = {s: replace(tuned[s], seconds=seconds.get(s)) for s in settings.strategies
             if s in tuned}
    del args, expected, calls, sets
    gc.collect()
    return TuningRow(workload.name, seconds.get(DEFAULT), seconds.get(NUMPY), tuned,
                     default_status, default_detail)


def _function(workload: Workload, config: Config) -> Any:
    from polytile.api import define
    return define(workload.tc, config=config)[workload.function]


def rotating_sets(args: Arrays, outputs: Arrays) -> list[ArgumentSet]:
    """`args` and buffers shaped like `outputs`, and copies of both, ROTATE_BYTES in
    all (as many sets as the tuner's profiling process), to cycle through from call
    to call."""
    copies = rotation_copies(sum(a.nbytes for a in args + outputs), ROTATE_BYTES)

    def buffers() -> Arrays:
        return tuple(np.empty_like(o) for o in outputs)
    return [(args, buffers())] + [(tuple(a.copy() for a in args), buffers())
                                  for _ in range(copies - 1)]


def _cycle(sets: Sequence[ArgumentSet], call: Callable[[Arrays, Arrays], Any]
           ) -> Callable[[], Any]:
    """A call that takes the next set each time, starting with the first."""
    following = itertools.cycle(sets)
    return lambda: call(*next(following))


def checked_call(fn: Any, sets: Sequence[ArgumentSet], expected: Arrays, workload: Workload
             ) -> tuple[Callable[[], Any] | None, str, str]:
    """The timed call and the check of its first call (the compile) against NumPy."""
    # NaN in the first set's buffers, so an element the kernel never writes is caught.
    first = sets[0][1]
    for b in first:
        b.fill(np.nan)
    call = _cycle(sets, lambda a, out: fn(*a, out=out))
    try:
        call()
    except Exception as e:  # noqa: BLE001 - a kernel that fails is a FAILED cell
        return None, "FAILED", error_text(e)
    got = first
    outcome = compare(got, expected, workload.rtol, workload.atol)
    # A wrong kernel is still timed (as the bench does); its row says WRONG.
    return call, outcome.status, outcome.detail


def _numpy_call(workload: Workload, sets: Sequence[ArgumentSet]) -> Callable[[], Any]:
    numpy_out = workload.numpy_out
    if numpy_out is not None:
        return _cycle(sets, lambda a, out: numpy_out(*a, out=out))
    return _cycle(sets, lambda a, out: workload.numpy(*a))


# ------------------------------------------------------------------ the command
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="benchmarks/tune_all.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budget", default="2m", help="tuning time per workload and strategy "
                   "(seconds, or e.g. 90s, 2m; default 2m)")
    p.add_argument("--strategy", choices=(*STRATEGIES, "both"), default="both")
    p.add_argument("--quick", action="store_true", help="the bench's small sizes")
    p.add_argument("--only", type=lambda s: [x.strip() for x in s.split(",") if x.strip()],
                   help="workload families or full names, comma-separated")
    p.add_argument("--repeats", type=int, help="timing rounds (default 5, quick 3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true", help="no tuner progress line")
    p.add_argument("--no-write", action="store_true", help="do not write RESULTS.md")
    p.add_argument("--blas-env-removed", default="", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def command_text(args: argparse.Namespace) -> str:
    argv = ["python", "benchmarks/tune_all.py", f"--budget={args.budget}",
            f"--strategy={args.strategy}"]
    argv += ["--quick"] if args.quick else []
    argv += [f"--only={','.join(args.only)}"] if args.only else []
    argv += [f"--repeats={args.repeats}"] if args.repeats is not None else []
    argv += [f"--seed={args.seed}"] if args.seed else []
    argv += ["--no-write"] if args.no_write else []
    return " ".join(argv)


def main(argv: Sequence[str] | None = None) -> int:
    from polytile.bench.workloads import families, select
    from polytile.tune.tuner import parse_budget
    args = parse_args(argv)
    present = [v for v in BLAS_ENV_VARS if v in os.environ]
    if present:
        return _rerun_without(present, argv)
    parse_budget(args.budget)     # a bad budget fails before any work
    workloads = select(args.quick, args.only)
    if not workloads:
        print(f"no workload matches --only {','.join(args.only or [])}; families: "
              f"{', '.join(families())}", file=sys.stderr)
        return 2
    strategies = STRATEGIES if args.strategy == "both" else (args.strategy,)
    timing = TimingOptions.for_run(args.quick, args.repeats)
    settings = Settings(strategies, args.budget, timing, args.seed, not args.quiet)
    date = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    facts = machine_facts()
    busy = os.getloadavg()[0] >= 0.5
    if busy:
        print(f"warning: load average {facts['load average']} before starting: other "
              "processes share the cores, so times are inflated", file=sys.stderr)
    print(f"polytile tuning evaluation ({date}): {len(workloads)} workload(s), "
          f"{', '.join(strategies)}, {args.budget} each")

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)
    rows: list[TuningRow] = []
    start = time.perf_counter()

    def write(done: bool) -> None:
        title = "Tuning" + (" (quick smoke run, small sizes)" if args.quick else "") + (
            f" (only {', '.join(args.only)})" if args.only else "")
        notes = [f"{args.blas_env_removed} unset for this run (NumPy's BLAS reads them at "
                 "import)"] if args.blas_env_removed else []
        if busy:
            notes.append("warning: load average at least 0.5 before starting (see Machine): "
                         "other processes shared the cores")
        if not done:
            notes.append(f"INCOMPLETE: {len(rows)} of {len(workloads)} workloads so far "
                         "(written after each workload; the run has not finished)")
        end = {"load average": f"{facts['load average']} at start, {load_average()} "
                               f"{'at end' if done else 'now'}"}
        section = "tuning" + ("-quick" if args.quick else "") + ("-partial" if args.only else "")
        write_section(RESULTS_PATH, section,
                      tuning_markdown(rows, strategies, budget=args.budget,
                                      facts={**facts, **end}, command=command_text(args),
                                      date=date, title=title, notes=notes))

    for k, w in enumerate(workloads):
        log(f"[{k + 1}/{len(workloads)}] {w.name} ({time.perf_counter() - start:.0f} s)")
        rows.append(tune_workload(w, settings, load_config(), log, first=k % len(strategies)))
        if not args.no_write and k + 1 < len(workloads):
            write(done=False)
    print()
    print(format_text(*tuning_table(rows, strategies)))
    print()
    print("\n".join(summary(rows, strategies)))
    if not args.no_write:
        write(done=True)
        print(f"\nwrote {RESULTS_PATH}")
    wrong = [r.name for r in rows
             if "WRONG" in (r.default_status, *(t.status for t in r.tuned.values()))]
    if wrong:
        print(f"!!! WRONG RESULTS on {', '.join(wrong)} !!!", file=sys.stderr)
    return 1 if wrong else 0


def _rerun_without(present: Sequence[str], argv: Sequence[str] | None) -> int:
    """As `polytile bench` does: OpenBLAS reads these at NumPy's import and a current
    NumPy runs slower with them, so run again in a child without them."""
    removed = " ".join(f"{v}={os.environ[v]}" for v in present)
    print(f"re-running without {removed} so NumPy's BLAS picks its own kernel",
          file=sys.stderr, flush=True)
    env = {k: v for k, v in os.environ.items() if k not in BLAS_ENV_VARS}
    script = "import sys; from polytile.bench.tuning import main; sys.exit(main())"
    child = [sys.executable, "-c", script, *(sys.argv[1:] if argv is None else argv),
             f"--blas-env-removed={removed}"]
    return subprocess.run(child, env=env, check=False).returncode
