"""A/B of one kernel as two checkouts of polytile generate it, timed in one process.

    python benchmarks/kernel_ab.py tests/paper/tmm.tc --sizes M=1024,K=1024,N=1024 \
        --before /path/to/old/checkout --after . [--target cpu-avx512] [--rounds 40]

Each checkout prints the kernel's C (`polytile show --stage c`, with the host's caches and
cores as a call would use them); both are built with the target's flags and called
alternately on the same random inputs, so machine noise (another process, the clock)
hits both alike, which separate `polytile bench` runs on a shared host do not. Prints the
median and minimum per side and whether the outputs agree. A side given as a `.c` file
(the output of `polytile show --stage c`, edited by hand) is used as it is. Float32 outputs; integer
inputs (gather indices) are drawn in [0, --int-high), scalar arguments taken from --sizes
(1 where not given); the first function of the file.
`--out-offset B` places the outputs B bytes past a 64-byte boundary (0: as polytile's
output pool does; NumPy's own large arrays lie 16 bytes past one), which decides where
streaming stores apply.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import polytile as pt  # noqa: E402
from polytile.backends import backend_named  # noqa: E402
from polytile.config import load_config  # noqa: E402
from polytile.runtime.build import build_shared_object  # noqa: E402
from polytile.runtime.kernel import SYMBOL  # noqa: E402
from polytile.runtime.toolchain import Toolchain, detect_toolchain  # noqa: E402
from polytile.sema.specialize import specialize  # noqa: E402
from polytile.targets.target import select_target  # noqa: E402


def kernel_c(checkout: Path, tc: Path, sizes: str, target: str | None) -> str:
    if checkout.suffix == ".c":          # a hand-edited kernel, for an experiment
        return checkout.read_text()
    command = [sys.executable, "-m", "polytile", "show", str(tc), "--stage", "c",
               "--sizes", sizes] + (["--target", target] if target else [])
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    return subprocess.run(command, env=env, cwd=checkout, check=True, capture_output=True,
                          text=True).stdout


def load_kernel(source: str, flags: tuple[str, ...], toolchain: Toolchain,
                so_path: Path) -> tuple[ctypes.CDLL, Any]:
    """Build `source` into `so_path`; the library and its kernel function."""
    build_shared_object(source, flags, toolchain, so_path)
    library = ctypes.CDLL(str(so_path))
    return library, getattr(library, SYMBOL)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tc", type=Path)
    parser.add_argument("--sizes", required=True)
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, required=True)
    parser.add_argument("--target")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--int-high", type=int, default=1)
    parser.add_argument("--out-offset", type=int, default=None,
                        help="outputs start this many bytes past a 64-byte boundary "
                        "(default: wherever np.zeros puts them)")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time with the process's CPU clock, not the wall clock: on a "
                        "loaded host, time spent preempted is not counted (run with "
                        "OMP_NUM_THREADS=1, or idle OpenMP threads' spinning counts)")
    args = parser.parse_args()
    clock = time.process_time if args.cpu_time else time.perf_counter

    fn, inputs, outputs_shapes = random_arguments(args.tc, args.sizes, args.int_high)

    config = load_config()
    target = select_target(args.target or config.target)
    toolchain = detect_toolchain(config)
    flags = backend_named(target.backend).flags(target, toolchain, ())
    kernels, outputs = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for side, checkout in (("before", args.before), ("after", args.after)):
            source = kernel_c(checkout.resolve(), args.tc.resolve(), args.sizes, args.target)
            _, kernels[side] = load_kernel(source, flags, toolchain, Path(tmp, f"{side}.so"))
            outputs[side] = [_zeros(s, args.out_offset) for s in outputs_shapes]
        err = (ctypes.c_int64 * 4)()
        times: dict[str, list[float]] = {side: [] for side in kernels}
        for _ in range(args.rounds):
            for side, kernel in kernels.items():
                arrays = inputs + outputs[side]
                pointers = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
                start = clock()
                status = kernel(pointers, err)
                times[side].append(clock() - start)
                if status != 0:
                    raise SystemExit(f"{side}: the kernel failed with code {status}")
    for side, t in times.items():
        print(f"{side}: median {statistics.median(t) * 1e6:.1f} us, min {min(t) * 1e6:.1f} us "
              f"({args.rounds} calls)")
    # NaN on both sides agrees (random inputs can make them: rsqrt of a negative
    # variance given as an argument).
    same = all(np.allclose(a, b, rtol=1e-4, atol=1e-4, equal_nan=True)
               for a, b in zip(outputs["before"], outputs["after"]))
    print(f"outputs agree: {same}")
    return 0 if same else 1


def random_arguments(tc: Path, sizes_text: str, int_high: int
                     ) -> tuple[Any, list[np.ndarray], list[tuple[int, ...]]]:
    """The first function of file `tc`, random arguments at `--sizes` (integers in [0,
    int_high), scalars from the sizes), and its outputs' shapes."""
    source = tc.read_text()
    name = re.search(r"def\s+(\w+)\s*\(", source)
    if name is None:
        raise SystemExit(f"{tc} defines no function")
    fn = pt.define(source, backend="interp")[name.group(1)].fn
    sizes = {k: int(v) for k, v in (p.split("=") for p in sizes_text.split(","))}
    scalars = {t.name: sizes.get(t.name, 1) for t in fn.params if t.kind == "scalar"}
    spec = specialize(fn, {t.name: tuple(d.evaluate(sizes) for d in t.shape)
                           for t in fn.params if t.kind != "scalar"}, scalars)
    rng = np.random.default_rng(0)
    inputs = [np.array(scalars[t.name], t.dtype.numpy) if t.kind == "scalar"
              else rng.integers(0, int_high, spec.shape(t.name)).astype(t.dtype.numpy)
              if t.dtype.is_integral
              else rng.standard_normal(spec.shape(t.name)).astype(t.dtype.numpy)
              for t in fn.params]
    return fn, inputs, [spec.shape(t.name) for t in fn.outputs]


def _zeros(shape: tuple[int, ...], offset: int | None) -> np.ndarray:
    """float32 zeros, starting `offset` bytes past a 64-byte boundary when given."""
    if offset is None:
        return np.zeros(shape, np.float32)
    nbytes = int(np.prod(shape)) * 4
    raw = np.zeros(nbytes + 128, np.uint8)
    start = (offset - raw.ctypes.data) % 64
    return raw[start:start + nbytes].view(np.float32).reshape(shape)


if __name__ == "__main__":
    sys.exit(main())
