"""The timing noise floor of the tuning evaluation: one workload's default kernel,
compiled into N separate caches (N identical kernels), timed together exactly as
benchmarks/tune_all.py times a workload (rotating inputs and outputs, the bench's
rotated blocks). The spread between the copies is what no tuned speedup can be
trusted below.

    python benchmarks/identical_copies.py "tmm 1024x1024x1024" --copies 3
"""
from __future__ import annotations

import argparse
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

from polytile.api import define
from polytile.bench import tuning
from polytile.bench.timing import TimingOptions, time_blocks
from polytile.bench.workloads import full_set, quick_set
from polytile.config import load_config


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workload", help="a full name, e.g. 'tmm 1024x1024x1024'")
    p.add_argument("--copies", type=int, default=3)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    workload = next((w for w in full_set() + quick_set() if w.name == args.workload), None)
    if workload is None:
        raise SystemExit(f"no workload {args.workload!r}")
    inputs = workload.make_inputs(np.random.default_rng(0))
    expected = tuning.as_tuple(workload.numpy(*inputs))
    sets = tuning.rotating_sets(inputs, expected)
    calls = {}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.copies):
            config = replace(load_config(), cache_dir=Path(tmp) / str(k), ignore_tuned=True)
            fn = define(workload.tc, config=config)[workload.function]
            call, status, detail = tuning.checked_call(fn, sets, expected, workload)
            if call is None or status != "ok":
                raise SystemExit(f"copy {k}: {status} {detail}")
            calls[f"copy {k}"] = call
        timings = time_blocks(calls, TimingOptions(rounds=args.rounds))
    for name, t in timings.items():
        print(f"{name}: median {t.median * 1e3:.3f} ms (p10 {t.p10 * 1e3:.3f}, "
              f"p90 {t.p90 * 1e3:.3f})")
    medians = [t.median for t in timings.values()]
    print(f"spread of the medians: {max(medians) / min(medians):.3f}x")


if __name__ == "__main__":
    main()
