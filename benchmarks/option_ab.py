"""A/B of pipeline options on `polytile bench`'s workloads, timed in one process.

    python benchmarks/option_ab.py --only shiftconv-einsum,gconv --after fold.enabled=false
    python benchmarks/option_ab.py --only tmm --before autotile.xyz=1 --after '' --rounds 9

Each workload's TC function is compiled twice, with the `--before` and `--after` pipeline
options (`pass.param=value`, comma-separated; empty: the defaults), and both kernels are
timed the way `polytile bench` times implementations (polytile.bench.timing.time_blocks:
blocks of calls, settled between, their order rotating), called through the Python API
as a user calls them (outputs from the pool, arguments checked). Both see the same
machine state, so the ratio holds on a shared host where two `polytile bench` runs do
not compare; `benchmarks/kernel_ab.py` compares two checkouts' C instead, but alternates
single calls, and there the two sides evict each other's outputs from the caches.
Prints each side's median and the ratio, and whether the outputs agree.

An option naming a module constant of a pass (`autotile.PANEL_THREADS_MARGIN=0`: an
upper-case name after the pass) sets that constant of `polytile.passes.<pass>` while
that side compiles, to compare a heuristic with its threshold moved:

    python benchmarks/option_ab.py --only MLP1,tmm --before autotile.PANEL_THREADS_MARGIN=0
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from polytile.api import Module
from polytile.bench.fusion_workloads import fusion_set
from polytile.bench.timing import TimingOptions, time_blocks
from polytile.bench.training import training_set
from polytile.bench.workloads import full_set
from polytile.compile import Compiler
from polytile.config import load_config
from polytile.lang.parser import parse
from polytile.sema.analyze import analyze
from polytile.targets.target import select_target


def options(text: str) -> dict[str, Any]:
    """`fold.enabled=false,pack.enabled=true` as pipeline options (values as JSON)."""
    out: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise SystemExit(f"option {item!r} is not pass.param=value")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


@contextlib.contextmanager
def constants(opts: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The pipeline options of `opts`; meanwhile its `pass.CONSTANT` entries are set."""
    saved = []
    pipeline = {}
    for key, value in opts.items():
        name, _, attr = key.partition(".")
        if not attr.isupper():
            pipeline[key] = value
            continue
        module = importlib.import_module(f"polytile.passes.{name}")
        if not hasattr(module, attr):
            raise SystemExit(f"polytile.passes.{name} has no constant {attr}")
        saved.append((module, attr, getattr(module, attr)))
        setattr(module, attr, value)
    try:
        yield pipeline
    finally:
        for module, attr, value in saved:
            setattr(module, attr, value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", required=True,
                        help="workload families or full names, as polytile bench --only")
    parser.add_argument("--before", default="", help="pipeline options of side A")
    parser.add_argument("--after", default="", help="pipeline options of side B")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    wanted = {w.strip() for w in args.only.split(",")}
    workloads = [w for w in full_set() + fusion_set(False) + training_set(False)
                 if w.key in wanted or w.name in wanted]
    if not workloads:
        raise SystemExit(f"no workload named {sorted(wanted)}")
    config = load_config()
    target = select_target(config.target)
    sides = {"before": options(args.before), "after": options(args.after)}
    print(f"target {target.name}; before {sides['before'] or 'defaults'}, "
          f"after {sides['after'] or 'defaults'}")
    for w in workloads:
        rng = np.random.default_rng(0)
        call_args = w.tc_arguments(w.make_inputs(rng))
        program = analyze(parse(w.tc, w.key))
        fns, results = {}, {}
        for side, opts in sides.items():        # each side compiles at its first call
            with constants(opts) as pipeline:
                fns[side] = getattr(Module(w.tc, program, "c",
                                           Compiler(config, target, pipeline)), w.function)
                results[side] = fns[side](*call_args)
        agree = all(np.allclose(a, b, rtol=w.rtol, atol=w.atol) for a, b in zip(
            *(r if isinstance(r, tuple) else (r,) for r in results.values())))
        calls = {side: (lambda f=fn, a=call_args: f(*a)) for side, fn in fns.items()}
        timings = time_blocks(calls, TimingOptions(rounds=args.rounds))
        a, b = timings["before"].median, timings["after"].median
        print(f"{w.name:36s} before {a * 1e3:9.3f} ms  after {b * 1e3:9.3f} ms  "
              f"after/before {b / a:5.2f}  outputs agree: {agree}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
