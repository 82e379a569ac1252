"""Issue 18's measurement: tuning throughput (candidates measured per minute) of the local
tuner and of Dask LocalClusters of 1 and 2 workers on this machine, and where the time
goes.

    PYTHONPATH=. python benchmarks/tune_cluster.py --budget 60 [--sizes M=96,K=96,N=96]

Each run tunes the same tmm from an empty cache (its own directory, so no run finds
another's kernels), with the same search settings and no confirmation phase, and counts
the candidates measured within the budget. Time is split into:

- setup: from the call to the first candidate submitted (space, reference output; for a
  cluster also starting it and asking every worker what it runs);
- compile: seconds spent compiling candidates (summed over the workers);
- check+time: the rest of a candidate's time where it runs (summed);
- busy (cluster): the workers' task time (compile + check + time, summed) over the
  workers' time during the search (workers x search seconds); the rest is Dask's
  scheduling and transfers, a generation waiting for its slowest candidate, and the
  client's own work between generations;
- per task: the median of a candidate's time on its worker, and of its submit-to-result
  time on the client minus that (its queueing behind the other candidates of its worker
  and Dask's overhead).

On a machine of 2 cores shared with other work, a cluster of 2 local workers competes
with itself for the cores; the numbers say what the machinery costs, not what a cluster
of real machines gains (there, compile and measurement scale with the workers).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import polytile
from polytile.config import Config
from polytile.tune import cluster as cluster_module
from polytile.tune import tuner

TMM = """
def tmm(float(M,K) A, float(N,K) B) -> (C) {
  C(m,n) +=! A(m,kk) * B(n,kk)
}
"""


class Stopwatch:
    """Wraps the tuner's steps to see where a run's time goes."""

    def __init__(self) -> None:
        self.reset()
        self.install()

    def reset(self) -> None:
        self.first_submit: float | None = None
        self.compile = 0.0
        self.measure = 0.0
        self.measurers: list[Any] = []

    def install(self) -> None:
        real_build_all, real_measure = tuner.build_all, tuner.measure_build
        real_cluster_measure = cluster_module.ClusterMeasurer.measure

        def build_all(job: Any, candidates: Any, settings: Any) -> Any:
            self.first_submit = self.first_submit or time.monotonic()
            builds = real_build_all(job, candidates, settings)
            self.compile += sum(b.seconds for b in builds)
            return builds

        def measure_build(runner: Any, build: Any, prune: Any = None) -> Any:
            start = time.monotonic()
            try:
                return real_measure(runner, build, prune)
            finally:
                self.measure += time.monotonic() - start

        def cluster_measure(measurer: Any, candidates: Any, prune: Any, deadline: Any) -> Any:
            self.first_submit = self.first_submit or time.monotonic()
            if measurer not in self.measurers:
                self.measurers.append(measurer)
            return real_cluster_measure(measurer, candidates, prune, deadline)

        tuner.build_all = build_all  # type: ignore[assignment]
        tuner.measure_build = measure_build  # type: ignore[assignment]
        cluster_module.ClusterMeasurer.measure = cluster_measure  # type: ignore[method-assign]


def run(kind: str, args: argparse.Namespace, inputs: tuple[np.ndarray, ...],
        watch: Stopwatch) -> dict[str, Any]:
    watch.reset()
    cache = Path(tempfile.mkdtemp(prefix="tune-cluster-")) / "cache"
    mod = polytile.define(TMM, config=Config(cache_dir=cache))
    settings: dict[str, Any] = {"budget": args.budget, "population": args.population,
                                "generations": 1000, "confirm": 0, "progress": False,
                                "seed": args.seed}
    if kind != "local":
        settings["cluster"] = kind
    start = time.monotonic()
    result = polytile.tune(mod.tmm, *inputs, **settings)
    wall = time.monotonic() - start
    row: dict[str, Any] = {"kind": kind, "candidates": result.candidates, "wall": wall,
                           "setup": (watch.first_submit or start) - start,
                           "best_us": (result.best_seconds or 0.0) * 1e6}
    if watch.measurers:
        timings = [t for m in watch.measurers for t in m.timings]
        row["compile"] = sum(t[0] for t in timings)
        row["measure"] = sum(t[1] - t[0] for t in timings)
        workers = int(kind.split(":")[1])
        searching = max(1e-9, wall - row["setup"])
        row["busy"] = f"{100 * sum(t[1] for t in timings) / (workers * searching):.0f}%"
        row["task"] = statistics.median(t[1] for t in timings) if timings else 0.0
        row["wait"] = statistics.median(t[2] - t[1] for t in timings) if timings else 0.0
    else:
        row["compile"], row["measure"] = watch.compile, watch.measure
        row["busy"], row["task"], row["wait"] = "-", None, None
    # Candidates per minute of the search itself (after setup) and of the whole call.
    searching = max(1e-9, wall - row["setup"])
    row["per_minute"] = 60.0 * result.candidates / searching
    row["per_minute_total"] = 60.0 * result.candidates / wall
    return row


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| tuner | candidates | per min (search) | per min (call) | setup s | compile s "
            "| check+time s | workers busy | per task s | queue+Dask per task s | best µs |")
    lines = [head, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]

    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"
    for r in rows:
        lines.append(f"| {r['kind']} | {r['candidates']} | {r['per_minute']:.1f} | "
                     f"{r['per_minute_total']:.1f} | {r['setup']:.1f} | {r['compile']:.1f} | "
                     f"{r['measure']:.1f} | {r['busy']} | {seconds(r['task'])} | "
                     f"{seconds(r['wait'])} | {r['best_us']:.1f} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=60.0, help="seconds per tuner")
    parser.add_argument("--sizes", default="M=96,K=96,N=96")
    parser.add_argument("--population", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default="local,local:1,local:2")
    args = parser.parse_args()
    sizes = {k: int(v) for k, v in (p.split("=") for p in args.sizes.split(","))}
    rng = np.random.default_rng(0)
    inputs = ((rng.random((sizes["M"], sizes["K"]), dtype=np.float32) * 2 - 1),
              (rng.random((sizes["N"], sizes["K"]), dtype=np.float32) * 2 - 1))
    print(f"tmm {args.sizes}, budget {args.budget:g} s per tuner, population "
          f"{args.population}; load average {os.getloadavg()[0]:.2f} at the start",
          flush=True)
    rows = []
    watch = Stopwatch()
    for kind in args.only.split(","):
        rows.append(run(kind, args, inputs, watch))
        print(f"{kind}: {rows[-1]['candidates']} candidates", file=sys.stderr, flush=True)
    print(table(rows))
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
