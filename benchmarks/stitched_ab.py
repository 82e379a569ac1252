"""A/B of a fusion workload's plan with and without a stitched kernel, in one process.

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/stitched_ab.py [--calls 200]

logreg 8192x256 (polytile.bench.fusion_workloads) compiled twice: its statements split
as the plan was before stitching ({0..5} {6} {7}: a row loop and two small kernels) and
as one stitched kernel ({0..7}). The two are called alternately on the same inputs, so
the noise of a shared host hits both alike; prints the minimum, the first quartile and
the median of each. Both are checked against NumPy first.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from polytile.bench.fusion import compiled_call, specialized
from polytile.bench.fusion_workloads import logreg

VARIANTS = (("split", [[0, 1, 2, 3, 4, 5], [6], [7]]), ("stitched", [list(range(8))]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    calls = parser.parse_args().calls
    w = logreg(8192, 256)
    args = w.make_inputs(np.random.default_rng(0))
    spec = specialized(w, args)
    expected = w.numpy(*args)
    run = {name: compiled_call(spec, {"fuse.groups": groups})[0] for name, groups in VARIANTS}
    for name, call in run.items():
        for got, want in zip(call(*args), expected):
            assert np.allclose(got, want, rtol=w.rtol, atol=w.atol), name
    times: dict[str, list[float]] = {name: [] for name in run}
    for _ in range(calls):
        for name, call in run.items():
            start = time.perf_counter()
            call(*args)
            times[name].append(time.perf_counter() - start)
    for name, seconds in times.items():
        ms = np.array(seconds) * 1e3
        print(f"{name:9s} min {ms.min():.3f} ms  p25 {np.percentile(ms, 25):.3f}  "
              f"median {np.median(ms):.3f}")


if __name__ == "__main__":
    main()
