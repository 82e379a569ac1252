"""Training steps (`polytile bench --training`'s) on one thread, timed by CPU time.

    OMP_NUM_THREADS=1 python benchmarks/training_cpu_time.py [--rounds 30] [WORKLOAD ...]

The bench times a step on the wall clock with every core; on a host that other
processes load, those times swing by tens of percent between runs. Here both sides run
on one thread (OpenMP and torch), polytile's step and torch's alternate in one process,
and each step is timed with the process's CPU clock, so time spent preempted is not
counted (caches shared with the other processes still are). Prints the median and the
minimum per side and torch's median over polytile's. The outputs and gradients are
checked against torch's first, as the bench does. WORKLOAD: a key such as MLP1 or
layernorm (all by default).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import polytile as pt
import polytile.torch as ptt
from polytile.bench.training import compare_step, leaf, training_set


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workloads", nargs="*")
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for w in training_set(False):
        if args.workloads and w.key not in args.workloads:
            continue
        inputs = w.make_inputs(np.random.default_rng(0))
        op = ptt.op(pt.define(w.tc)[w.function])
        ours = [leaf(torch, a) for a in inputs]
        theirs = [leaf(torch, a) for a in inputs]
        layer = w.torch
        seed = torch.randn(layer(*[t.detach() for t in theirs]).shape,
                           generator=torch.Generator().manual_seed(1))

        def step(fn: Any, leaves: list[Any], seed: Any = seed) -> Any:
            for t in leaves:
                t.grad = None
            y = fn(*leaves)
            y.backward(seed)
            return y

        got, want = step(op, ours), step(layer, theirs)
        problem = compare_step([got] + [t.grad for t in ours if t.requires_grad],
                               [want] + [t.grad for t in theirs if t.requires_grad], w)
        if problem:
            print(f"{w.key} {w.size_text}: WRONG: {problem}")
            continue
        times: dict[str, list[float]] = {"polytile": [], "torch": []}
        for _ in range(args.rounds):
            for side, fn, leaves in (("polytile", op, ours), ("torch", layer, theirs)):
                start = time.process_time()
                step(fn, leaves)
                times[side].append(time.process_time() - start)
        ours_ms, theirs_ms = (statistics.median(times[s]) * 1e3 for s in ("polytile", "torch"))
        print(f"{w.key} {w.size_text}: polytile {ours_ms:.3f} ms "
              f"(min {min(times['polytile']) * 1e3:.3f}), torch {theirs_ms:.3f} ms "
              f"(min {min(times['torch']) * 1e3:.3f}), vs torch {theirs_ms / ours_ms:.2f}x",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
