"""The fusion workloads (`polytile bench --fusion`'s) on one thread, timed by CPU time.

    OMP_NUM_THREADS=1 python benchmarks/fusion_cpu_time.py [--rounds 30] [WORKLOAD ...]

The bench times on the wall clock with every core; on a host that other processes load,
a two-thread OpenMP region waits for the thread that lost its core and the times swing
by tens of percent. Here every side runs on one thread (OpenMP, torch's intra-op pool,
XLA's Eigen pool), the sides alternate in one process, and each block of calls is timed
with the process's CPU clock (all of its threads), so time spent preempted is not
counted. Sides: polytile without the plan ("rows"), with it, and with one kernel per
statement ("none", the cost model's baseline: the plan's objective is its saving against
it, printed for comparison), torch eager,
torch.compile (inductor) and jax.jit (when installed), each checked against NumPy
first. Prints medians and minima per side and each side's median over the plan's.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# XLA reads its flags when jax loads: one intra-op thread, as for the others.
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false "
                                   "intra_op_parallelism_threads=1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from polytile.bench import fusion
from polytile.bench.fusion_workloads import fusion_set
from polytile.config import load_config
from polytile.graph.plan import plan_fusion
from polytile.targets.target import select_target


def sides(w: Any, args: tuple[Any, ...]) -> dict[str, Callable[[], Any]]:
    """Every implementation of `w` that agrees with NumPy, as a call on `args`."""
    spec = fusion.specialized(w, args)
    config = load_config()
    plan = plan_fusion(spec, select_target(config.target), config)
    expected = fusion._tuple(w.numpy(*args))
    found: dict[str, Callable[[], Any]] = {}
    print(f"{w.name}: plan {plan.groups}, the model saves {plan.objective * 1e3:.3f} ms "
          "against none")
    for name, options in (("rows", {}), ("plan", {"fuse.groups": plan.option}),
                          ("none", {"fuse.strategy": "none"})):
        call = fusion.compiled_call(spec, options)[0]
        found[name] = lambda call=call: call(*args)
    others = {"torch": lambda: fusion._torch_call(w, args, compiled=False),
              "inductor": lambda: fusion._torch_call(w, args, compiled=True),
              "jax": lambda: fusion._jax_call(w, args) if w.jax else None}
    for name, make in others.items():
        call = make()
        if call is not None:
            found[name] = call
    checked = {}
    for name, call in found.items():
        got = fusion._tuple(tuple(np.asarray(fusion._numpy(v))
                                  for v in fusion._as_tuple(call())))
        if all(np.allclose(g, e, rtol=w.rtol, atol=w.atol) for g, e in zip(got, expected)):
            checked[name] = call
        else:
            print(f"  {name}: differs from NumPy, not timed")
    return checked


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workloads", nargs="*")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--block-ms", type=float, default=5.0,
                        help="CPU time per timed block of calls (short calls repeat)")
    args = parser.parse_args()
    import torch
    torch.set_num_threads(1)
    print(f"load average {os.getloadavg()[0]:.2f}; one thread; CPU time per call")
    for w in fusion_set(False):
        if args.workloads and not w.matches(args.workloads):
            continue
        inputs = w.make_inputs(np.random.default_rng(0))
        calls = sides(w, inputs)
        repeats = {}
        for name, call in calls.items():
            start = time.process_time()
            for _ in range(3):
                call()
            per_call = max((time.process_time() - start) / 3, 1e-6)
            repeats[name] = max(1, int(args.block_ms * 1e-3 / per_call))
        times: dict[str, list[float]] = {name: [] for name in calls}
        for _ in range(args.rounds):
            for name, call in calls.items():
                start = time.process_time()
                for _ in range(repeats[name]):
                    call()
                times[name].append((time.process_time() - start) / repeats[name])
        plan_ms = statistics.median(times["plan"]) * 1e3
        cells = []
        for name, seconds in times.items():
            ms = statistics.median(seconds) * 1e3
            cells.append(f"{name} {ms:.3f} (min {min(seconds) * 1e3:.3f}, "
                         f"{ms / plan_ms:.2f}x)")
        print(f"{w.name}: " + "; ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
