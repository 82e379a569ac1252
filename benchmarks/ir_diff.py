"""Which bench workloads a change compiles differently: the optimized IR of every workload
of `polytile bench` (throughput, `--fusion`, and `--training`'s forward with its saved
values and its gradient), as two checkouts build it for this host, compared.

    python benchmarks/ir_diff.py --before /path/to/old/checkout --after .

Each checkout runs in a process of its own (its directory first on the path) and prints a
digest of each workload's optimized IR (`Compiler.ir`, the host's best target, no disk
cache); the workloads whose digests differ are listed, so that a change's A/B timings
cover every kernel it touched and no other. Prints "not compared" for a workload that
either checkout cannot specialize here.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def digests() -> dict[str, str]:
    """This process's checkout: workload name -> digest of its optimized IR."""
    import numpy as np

    import polytile as pt
    from polytile.autodiff import backward, forward_saving
    from polytile.bench.fusion import specialized
    from polytile.bench.fusion_workloads import fusion_set
    from polytile.bench.training import training_set
    from polytile.bench.workloads import full_set
    from polytile.compile import Compiler
    from polytile.config import load_config
    from polytile.ir.printer import format_function
    from polytile.sema.specialize import specialize
    from polytile.targets.target import select_target

    config = load_config()
    compiler = Compiler(config, select_target(config.target), options={})

    def digest(spec: Any) -> str:
        return hashlib.sha256(format_function(compiler.ir(spec)).encode()).hexdigest()[:16]

    found: dict[str, str] = {}
    for w in [*full_set(), *fusion_set(False)]:
        try:
            found[w.name] = digest(specialized(w, w.make_inputs(np.random.default_rng(0))))
        except pt.PolytileError as e:
            found[w.name] = f"not compared ({type(e).__name__})"
    for w in training_set(False):
        fn = pt.define(w.tc)[w.function].fn
        args = w.make_inputs(np.random.default_rng(0))
        shapes = {p.name: np.shape(a) for p, a in zip(fn.params, args) if p.kind != "scalar"}
        derived = backward(fn, saved=True)
        saving = pt.define(forward_saving(fn, derived.saved))[w.function].fn
        forward = specialize(saving, shapes, {})
        found[f"{w.name} (training forward)"] = digest(forward)
        gradient = pt.define(derived.source)[derived.name].fn
        seeds = {param: out for out, param in derived.seeds}
        found[f"{w.name} (gradient)"] = digest(specialize(gradient, {
            **shapes, **{v: forward.shape(v) for v in derived.saved},
            **{p: forward.shape(o) for p, o in seeds.items()}}, {}))
    return found


def _run(checkout: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(checkout), "POLYTILE_NO_DISK_CACHE": "1"}
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--digests"],
                         cwd=checkout, env=env, check=True, capture_output=True, text=True)
    return dict(json.loads(out.stdout))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path)
    parser.add_argument("--after", type=Path)
    parser.add_argument("--digests", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.digests:
        print(json.dumps(digests()))
        return 0
    if args.before is None or args.after is None:
        parser.error("--before and --after are required")
    before, after = _run(args.before.resolve()), _run(args.after.resolve())
    changed = 0
    for name in dict.fromkeys([*before, *after]):
        a, b = before.get(name, "missing"), after.get(name, "missing")
        if a.startswith(("not", "missing")) or b.startswith(("not", "missing")):
            print(f"{name}: not compared (before: {a}, after: {b})")
        elif a != b:
            changed += 1
            print(f"{name}: changed")
    print(f"{changed} of {len(after)} workloads compile to other IR")
    return 0


if __name__ == "__main__":
    sys.exit(main())
