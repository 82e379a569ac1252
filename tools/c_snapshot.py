"""Print the generated C of a corpus into a directory: the oracle for refactors of the
passes and the C backend that must not change any kernel.

    python tools/c_snapshot.py OUT_DIR

One file per (program, sizes, target): every conformance-corpus case at its first
drawn sizes, and every `polytile bench` workload, for cpu-avx512, cpu-avx2 and
cpu-generic (printing needs no hardware). Compare two snapshots with `diff -r`.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from conformance.programs import CASES  # noqa: E402

import polytile as pt  # noqa: E402
from polytile.bench.workloads import full_set, quick_set  # noqa: E402
from polytile.codegen.c import generate_c  # noqa: E402
from polytile.compile import Compiler  # noqa: E402
from polytile.config import load_config  # noqa: E402
from polytile.sema.specialize import specialize  # noqa: E402
from polytile.targets.target import inspection_target  # noqa: E402

TARGETS = ("cpu-avx512", "cpu-avx2", "cpu-generic")


def snapshot(source: str, function: str, args: tuple, out: Path) -> None:
    module = pt.define(source, backend="interp")
    fn = module[function].fn
    shapes = {p.name: np.shape(a) for p, a in zip(fn.params, args) if p.kind == "input"}
    scalars = {p.name: a for p, a in zip(fn.params, args) if p.kind == "scalar"}
    spec = specialize(fn, shapes, scalars)
    for target in TARGETS:
        compiler = Compiler(load_config(), inspection_target(target))
        out.with_name(f"{out.name}.{target}.c").write_text(generate_c(compiler.ir(spec)).text)


def main(out_dir: str) -> int:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for case in CASES:
        args = case.make_inputs(np.random.default_rng(0))
        snapshot(case.source, case.function, args, out / re.sub(r"\W+", "_", case.name))
    for w in full_set() + quick_set():
        args = w.tc_arguments(w.make_inputs(np.random.default_rng(0)))
        snapshot(w.tc, w.function, args, out / re.sub(r"\W+", "_", "bench " + w.name))
    print(f"wrote {len(list(out.iterdir()))} files to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
