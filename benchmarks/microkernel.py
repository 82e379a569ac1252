"""The GEMM micro-kernel alone, against the one-thread FMA peak (issue 13's report).

    python benchmarks/microkernel.py [--sizes M=12,K=256,N=16] [--target cpu-avx2]

polytile compiles `C(m,n) +=! A(m,k) * B(k,n)` at sizes whose operands fit L1 (12 x 256
and 256 x 16 floats: 28 KiB), where its default schedule is the register tile alone (6
rows x 16 lanes on AVX2, no packing: B is read along n as it lies). The kernel's C, as
`polytile show --stage c` prints it, is built with the target's flags together with a
loop that calls it back to back and reads the thread's CPU clock, so neither Python nor
the OpenMP runtime (one thread) is timed. The figure includes what a call does besides
the tile: zeroing C (192 floats) and the function's entry, about 1% at these sizes.
The peak is measured in the same library on the same clock: 12 independent chains of
vector multiply-adds, alternating with the kernel's rounds (about 0.2 s each; medians of
7), so a loaded host slows both alike.
"""
from __future__ import annotations

import os

os.environ["OMP_NUM_THREADS"] = "1"     # before anything loads the OpenMP runtime

import argparse
import ctypes
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import polytile as pt
from polytile.backends import backend_named
from polytile.bench.machine import machine_facts
from polytile.compile import Compiler
from polytile.config import load_config
from polytile.ir.printer import format_function
from polytile.runtime.build import build_shared_object
from polytile.runtime.toolchain import detect_toolchain
from polytile.sema.specialize import specialize
from polytile.targets.target import select_target

MM = "def mm(float(M,K) A, float(K,N) B) -> (C) {\n  C(m,n) +=! A(m,k) * B(k,n)\n}\n"

# pt_time_calls: the CPU seconds of `reps` calls of the kernel. pt_time_fmas: those of
# `reps` steps of CHAINS independent vector multiply-adds (2 * LANES * CHAINS flops a
# step; enough chains to cover the FMA latency on two ports), the peak on the same clock.
DRIVER = r"""
#include <time.h>
static double pt_seconds(struct timespec t0, struct timespec t1) {
    return (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
}
double pt_time_calls(void **args, long reps) {
    int64_t err[4];
    struct timespec t0, t1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    for (long r = 0; r < reps; r++)
        if (polytile_kernel(args, err) != 0) return -1.0;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
    return pt_seconds(t0, t1);
}
typedef float pt_fv __attribute__((vector_size(4 * LANES)));
#define CHAINS 12
double pt_time_fmas(long reps, float *sink) {
    pt_fv acc[CHAINS], x, y;
    for (int l = 0; l < LANES; l++) { x[l] = 0.999f; y[l] = 1e-3f; }
    for (int c = 0; c < CHAINS; c++) acc[c] = x * (float)c;
    struct timespec t0, t1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    for (long r = 0; r < reps; r++) {
        for (int c = 0; c < CHAINS; c++) acc[c] = acc[c] * x + y;
        __asm__("" : "+x"(x));
    }
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
    for (int c = 1; c < CHAINS; c++) acc[0] += acc[c];
    *sink = acc[0][0];
    return pt_seconds(t0, t1);
}
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="M=12,K=256,N=16")
    parser.add_argument("--target", help="default: the host's best")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--source", type=Path,
                        help="a kernel's C to time instead (`polytile show --stage c` of the "
                        "same sizes, edited by hand: an experiment)")
    parser.add_argument("--fuse", default="none",
                        help="fuse.strategy (default none: at these sizes strategy rows "
                        "would fuse the init and the product into a loop over rows)")
    args = parser.parse_args()
    sizes = {k: int(v) for k, v in (p.split("=") for p in args.sizes.split(","))}
    m, k, n = sizes["M"], sizes["K"], sizes["N"]

    config = load_config()
    target = select_target(args.target or config.target)
    compiler = Compiler(config, target, options={"fuse.strategy": args.fuse})
    fn = pt.define(MM, backend="interp")["mm"].fn
    ir = compiler.ir(specialize(fn, {"A": (m, k), "B": (k, n)}, {}))
    lanes = max(1, target.vector_bytes // 4)
    kernel = (args.source.read_text() if args.source
              else compiler.backend.generate(ir, target).text("c"))
    source = kernel + f"#define LANES {lanes}\n" + DRIVER
    toolchain = detect_toolchain(config)
    flags = backend_named(target.backend).flags(target, toolchain, ())
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c = np.zeros((m, n), np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        so = Path(tmp, "microkernel.so")
        build_shared_object(source, flags, toolchain, so)
        timed = ctypes.CDLL(str(so)).pt_time_calls
        timed.restype = ctypes.c_double
        timed.argtypes = [ctypes.c_void_p, ctypes.c_long]
        pointers = (ctypes.c_void_p * 3)(a.ctypes.data, b.ctypes.data, c.ctypes.data)
        if timed(pointers, 1) < 0:
            raise SystemExit("the kernel failed")
        np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-3)
        fmas = ctypes.CDLL(str(so)).pt_time_fmas
        fmas.restype = ctypes.c_double
        fmas.argtypes = [ctypes.c_long, ctypes.POINTER(ctypes.c_float)]
        flops = 2.0 * m * n * k
        reps = max(1, int(0.2 * 60e9 / flops))       # about 0.2 s at 60 GFLOP/s
        steps = int(0.2 * 60e9 / (2 * lanes * 12))
        sink = ctypes.c_float()
        rates, peaks = [], []
        for _ in range(args.rounds):                 # alternating: noise hits both alike
            rates.append(flops * reps / timed(pointers, reps) / 1e9)
            peaks.append(2 * lanes * 12 * steps / fmas(steps, ctypes.byref(sink)) / 1e9)
    rate, peak = statistics.median(rates), statistics.median(peaks)
    tile = [line.strip() for line in format_function(ir).splitlines()
            if "#contraction" in line and "micro" in line]
    facts = machine_facts()
    print(f"host: {facts['CPU']}, {facts['cores']}")
    print(f"mm {m}x{k}x{n} on {target.name}, one thread, thread CPU time, medians of "
          f"{args.rounds} alternating rounds:")
    print(f"  kernel  {rate:6.1f} GFLOP/s (min {min(rates):.1f}, max {max(rates):.1f})")
    print(f"  FMA peak {peak:5.1f} GFLOP/s ({lanes} lanes x 12 chains)")
    print(f"  kernel / peak: {rate / peak:.0%}")
    print(f"  micro-kernel: {tile[0] if tile else 'none (no register tile)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
