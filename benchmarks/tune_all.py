"""Issue 5's evaluation: tune every `polytile bench` workload and time it against the
untuned default and NumPy; writes the `tuning` section of benchmarks/RESULTS.md.

    python benchmarks/tune_all.py --budget 2m --strategy both      # the full evaluation
    python benchmarks/tune_all.py --quick --only tmm,softmax --budget 10s

Run it from the repository root (RESULTS.md is found relative to the current
directory). The logic lives in polytile.bench.tuning.
"""
import sys

from polytile.bench.tuning import main

if __name__ == "__main__":
    sys.exit(main())
