"""A/B of the native call path (polytile/runtime/dispatch.c) against the Python one, in
one process.

    python benchmarks/dispatch_ab.py [--rounds 9]

Times, with `polytile bench`'s block timing (polytile.bench.timing.time_blocks: blocks
of calls, their order rotating), a 16-float add called from NumPy, and a training step
(forward and derived backward through polytile.torch.op, as `polytile bench --training`
runs it) of each training workload, once through functions with the native call path
and once through the same functions with it switched off (`Config.native_dispatch`:
every call takes the Python path). Both sides share the kernels' shared objects, so the
difference is the call path alone. Prints each side's median and the ratio.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import polytile as pt  # noqa: E402
from polytile.bench.timing import TimingOptions, time_blocks  # noqa: E402
from polytile.bench.training import leaf, training_set  # noqa: E402
from polytile.config import load_config  # noqa: E402

CONFIGS = {"native": load_config(), "python": replace(load_config(), native_dispatch=False)}


def add_calls() -> dict[str, Callable[[], Any]]:
    source = "def add(float(N) a, float(N) b) -> (c) { c(i) = a(i) + b(i) }"
    a, b = np.random.default_rng(0).standard_normal((2, 16), dtype=np.float32)
    native, python = (pt.define(source, config=CONFIGS[side]).add for side in CONFIGS)
    native(a, b), python(a, b)
    return {"native": lambda: native(a, b), "python": lambda: python(a, b)}


def step_calls(w: Any) -> dict[str, Callable[[], Any]]:
    import torch

    import polytile.torch as ptt
    args = w.make_inputs(np.random.default_rng(0))
    calls = {}
    for side, config in CONFIGS.items():
        op = ptt.op(pt.define(w.tc, config=config)[w.function])
        leaves = [leaf(torch, a) for a in args]
        seed = torch.ones(op(*[t.detach() for t in leaves]).shape)

        def step(op: Any = op, leaves: list[Any] = leaves, seed: Any = seed) -> Any:
            for t in leaves:
                t.grad = None
            y = op(*leaves)
            y.backward(seed)
            return y

        step()
        calls[side] = step
    return calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    options = TimingOptions(rounds=args.rounds)
    cases = [("add 16 float32 (NumPy)", add_calls())]
    cases += [(f"{w.name} training step", step_calls(w)) for w in training_set(False)]
    print(f"{'case':55s} {'native':>12s} {'python':>12s}  python/native")
    for name, calls in cases:
        t = time_blocks(calls, options)
        native, python = t["native"].median, t["python"].median
        unit, scale = ("us", 1e6) if python < 1e-3 else ("ms", 1e3)
        print(f"{name:55s} {native * scale:9.2f} {unit} {python * scale:9.2f} {unit}  "
              f"{python / native:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
