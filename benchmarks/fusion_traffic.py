"""Memory traffic of the fusion plans: the model against cachegrind's cache simulator.

    python benchmarks/fusion_traffic.py [--quick] [--model-only] [--ll BYTES,WAYS,LINE] [WORKLOAD ...]

For each fusion workload (`polytile bench --fusion`'s), the plan's kernels with the bytes
each moves against its inputs + outputs (polytile.analysis.traffic, exact footprints, no
cache between passes). Then, when valgrind is installed, one call of the plan's compiled
function runs under `valgrind --tool=cachegrind --cache-sim=yes` on one thread, the
simulated last level sized like this host's L3 (AMD EPYC Zen 3: 32 MiB, 16-way, 64-byte
lines; `--ll` to change it) and flushed before the call (a 64 MiB array is read first),
and its last-level misses x 64 bytes inside the kernel's C code are set beside the
model's sum over kernels, and per kernel where the C lines map to a top-level
`/* block NAME */` comment (the kernel is compiled with -g in a private cache).

Not the same quantity, by design: cachegrind counts lines missed (a partly used line
counts 64 bytes; a store's miss fetches the line, write-allocate) and no write-backs,
and its last level keeps what one phase of a stitched kernel leaves for the next, which
the model counts again. Lines of the prelude's inlined helpers (vector loads and
stores, exp, erf) count as "other": the per-kernel numbers are lower bounds. This is a
benchmark, not a test: no test runs valgrind. Without valgrind it says so and exits 0.
"""
from __future__ import annotations

import argparse
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from polytile.analysis.traffic import kernel_traffic
from polytile.bench import fusion
from polytile.bench.fusion_workloads import fusion_set
from polytile.compile import Compiler
from polytile.config import load_config
from polytile.graph.plan import plan_fusion
from polytile.targets.target import select_target

HOST_LL = "33554432,16,64"      # this host's L3: 32 MiB, 16-way, 64-byte lines
FLUSH_BYTES = 64 << 20          # read before the call: twice the simulated last level


def model(w: Any) -> tuple[Any, Any, Any]:
    """The plan's compiled build and its per-kernel traffic."""
    args = w.make_inputs(np.random.default_rng(0))
    spec = fusion.specialized(w, args)
    config = load_config()
    target = select_target(config.target)
    plan = plan_fusion(spec, target, config)
    built = Compiler(config, target, options={"fuse.groups": plan.option}).build(spec)
    return plan, built, kernel_traffic(built.fn)


def simulate(w: Any, built: Any, ll: str, quick: bool) -> dict[str, int] | None:
    """Last-level misses x line bytes of one call, per top-level block of the C source
    ("other": lines outside them), or None when cachegrind fails."""
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job.pickle"
        job.write_bytes(pickle.dumps((w.name, quick, str(built.library.so_path),
                                      len(built.fn.params))))
        out = Path(tmp) / "cachegrind.out"
        command = ["valgrind", "--tool=cachegrind", "--cache-sim=yes", f"--LL={ll}",
                   "--D1=32768,8,64", "--I1=32768,8,64", f"--cachegrind-out-file={out}",
                   sys.executable, __file__, "--child", str(job)]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0 or not out.exists():
            print(f"  cachegrind failed: {done.stderr[-400:]}")
            return None
        source = Path(built.library.source_path)
        names = {b.name for b in built.fn.body.stmts if hasattr(b, "idxs")}
        return misses_by_block(out.read_text(), source, names, int(ll.split(",")[2]))


def misses_by_block(profile: str, source: Path, names: set[str], line: int) -> dict[str, int]:
    """Bytes of last-level misses (DLmr + DLmw, times the line size) in `source`'s lines,
    per top-level block: a line belongs to the last `/* block NAME */` above it."""
    owner: dict[int, str] = {}
    current = "other"
    for number, text in enumerate(source.read_text().splitlines(), 1):
        found = re.search(r"/\* block (\w+)", text)
        if found and found.group(1) in names:
            current = found.group(1)
        owner[number] = current
    events: list[str] = []
    in_source = False
    totals: dict[str, int] = {}
    for text in profile.splitlines():
        if text.startswith("events:"):
            events = text.split()[1:]
        elif text.startswith("fl="):
            in_source = Path(text[3:]).name == source.name
        elif in_source and text[:1].isdigit():
            number, *counts = (int(c) for c in text.split())
            values = dict(zip(events, counts))
            missed = values.get("DLmr", 0) + values.get("DLmw", 0)
            block = owner.get(number, "other")
            totals[block] = totals.get(block, 0) + missed * line
    return totals


def child(job: Path) -> None:
    """Runs under valgrind: the inputs, the loaded kernel, a flush, one call."""
    from polytile.runtime.kernel import Kernel

    name, quick, so_path, n_params = pickle.loads(job.read_bytes())
    [w] = [w for w in fusion_set(quick) if w.name == name]
    args = w.make_inputs(np.random.default_rng(0))
    spec = fusion.specialized(w, args)
    buffers = [np.ascontiguousarray(a) if isinstance(a, np.ndarray) else
               np.array(a, dtype=p.dtype.numpy) for p, a in zip(spec.fn.params, args)]
    buffers += [np.zeros(spec.shape(o.name), o.dtype.numpy) for o in spec.fn.outputs]
    assert len(buffers) == n_params
    kernel = Kernel(Path(so_path), n_params)
    float(np.ones(FLUSH_BYTES // 4, np.float32).sum())
    kernel(buffers)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workloads", nargs="*")
    parser.add_argument("--quick", action="store_true", help="the small sizes")
    parser.add_argument("--ll", default=HOST_LL, help="cachegrind's --LL (size,ways,line)")
    parser.add_argument("--model-only", action="store_true", help="no cachegrind run")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child)
        return 0
    valgrind = None if args.model_only else shutil.which("valgrind")
    if valgrind is None and not args.model_only:
        print("valgrind is not installed: the model only, no cachegrind cross-check")
    # A private cache: the kernels are built with -g there (lines for cachegrind).
    cache = tempfile.mkdtemp(prefix="polytile-traffic-")
    os.environ["POLYTILE_CACHE_DIR"] = cache
    os.environ["POLYTILE_CC"] = (os.environ.get("POLYTILE_CC") or "cc") + " -g"
    print(f"LL simulated: {args.ll} (bytes, ways, line); one thread; "
          f"load average {os.getloadavg()[0]:.2f}")
    try:
        for w in fusion_set(args.quick):
            if args.workloads and w.name.split()[0] not in args.workloads:
                continue
            plan, built, traffic = model(w)
            moved = sum(k.moved for k in traffic)
            needed = sum(k.compulsory for k in traffic)
            print(f"{w.name}: plan {plan.groups}; model {moved} B moved, "
                  f"{needed} B inputs + outputs of the kernels")
            measured = simulate(w, built, args.ll, args.quick) if valgrind else None
            for k in traffic:
                seen = f"{measured.get(k.name, 0)} B" if measured is not None else "n/a"
                print(f"  {k.name:<14} model {k.moved} / {k.compulsory} B = {k.ratio:.2f}x; "
                      f"cachegrind LL misses {seen}")
            if measured is not None:
                total = sum(measured.values())
                print(f"  whole call: cachegrind {total} B (other lines "
                      f"{measured.get('other', 0)} B) against the model's {moved} B "
                      f"({total / moved:.2f}x)")
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
