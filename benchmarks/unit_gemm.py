"""UNIT's GEMM rows (issue 14): int8 and bf16 1024^3 through polytile (tensorized: vpdpbusd
where the host has VNNI, vpmaddwd on operands widened to int16 on an AVX2 host without
it; vdpbf16ps where it has AVX-512 BF16, else the fp32 FMA micro-kernel on operands
widened to fp32 when packed) against torch._int_mm, torch's bf16 matmul and polytile's
fp32 GEMM, in one process, in blocks of 7 calls per kernel (after a warm-up call), three
rounds; prints a markdown table of medians and GOP/s, the int8/fp32 and bf16/fp32 ratios
of the same run, the instruction the int8 and bf16 kernels run on and the load average.

    python benchmarks/unit_gemm.py [--cpu-time] [--only polytile] [--rounds 3] [--peak]
    OMP_NUM_THREADS=1 python benchmarks/unit_gemm.py --cpu-time --only "int8 (u8,polytile fp32"
    OMP_NUM_THREADS=1 python benchmarks/unit_gemm.py --cpu-time --only "polytile fp32,polytile bf16"

Blocks, not call-by-call alternation: OpenMP's threads spin for a while after a parallel
loop, and interleaving them with torch's pool call by call doubled both sides' times.
`--peak` first measures the throughput of each instruction the kernels run on (vpdpbusd,
vdpbf16ps, vfmadd; 24 independent accumulators per thread on zmm, 12 on ymm, one thread
and all), so that
the kernels' GOP/s read against what the core can do. `--cpu-time` times with the process's CPU clock, so that time spent preempted by other
processes on a shared host is not counted (with OMP_NUM_THREADS=1: idle OpenMP threads'
spinning would count); `--only` keeps the kernels whose name contains one of its comma-separated texts (torch's
int8 and bf16 fallbacks on an AVX2 host take seconds per call).
"""
import argparse
import os
import re
import statistics
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import polytile as pt

parser = argparse.ArgumentParser()
parser.add_argument("--cpu-time", action="store_true")
parser.add_argument("--only", default="")
parser.add_argument("--rounds", type=int, default=3)
parser.add_argument("--peak", action="store_true")
args = parser.parse_args()

# name: (accumulator from k, intrinsic on (acc, x, y), operands x and y, ops per
# instruction, gcc flags)
PROBES = {
    "vpdpbusd zmm": ("_mm512_set1_epi32({k})", "_mm512_dpbusd_epi32", "_mm512_set1_epi8(3)",
                     128, "-mavx512f -mavx512vnni"),
    "vpdpbusd ymm (AVX-VNNI)": ("_mm256_set1_epi32({k})", "_mm256_dpbusd_avx_epi32",
                                "_mm256_set1_epi8(3)", 64, "-mavx2 -mavxvnni"),
    "vdpbf16ps zmm": ("_mm512_set1_ps({k})", "_mm512_dpbf16_ps",
                      "(__m512bh)_mm512_set1_epi16(0x3f80)", 64, "-mavx512f -mavx512bf16"),
    "vfmadd zmm": ("_mm512_set1_ps({k})", "_mm512_fmadd_ps", "_mm512_set1_ps(1.0f)", 32,
                   "-mavx512f"),
    "vfmadd ymm": ("_mm256_set1_ps({k})", "_mm256_fmadd_ps", "_mm256_set1_ps(1.0f)", 16,
                   "-mavx2 -mfma"),
}


def instruction_peak(name: str) -> dict[int, float]:
    """GOP/s of instruction `name` on 1 thread and on every core: independent accumulator
    chains per thread (distinct starting values, so the compiler keeps them apart)."""
    import ctypes
    import subprocess
    import tempfile
    init, op, operand, ops, flags = PROBES[name]
    n = 24 if "zmm" in name else 12          # as many chains as registers allow, 2 spare
    chains = " ".join(f"__typeof__({init.format(k=0)}) a{k} = {init.format(k=k + 1)};"
                      for k in range(n))
    steps = " ".join(f"a{k} = {op}(a{k}, x, y);" for k in range(n))
    sums = " ".join(f'__asm__ volatile("" :: "v"(a{k}));' for k in range(n))   # used
    source = f"""#include <immintrin.h>
#include <omp.h>
double probe(long iters, int threads) {{
  double t0 = omp_get_wtime();
  #pragma omp parallel num_threads(threads)
  {{
    __typeof__({operand}) x = {operand}, y = x;
    {chains}
    for (long i = 0; i < iters; i++) {{ {steps} __asm__ volatile("" : "+v"(x)); }}
    {sums}
  }}
  return omp_get_wtime() - t0;
}}"""
    with tempfile.TemporaryDirectory() as tmp:       # a loaded library outlives its file
        folder = Path(tmp)
        (folder / "probe.c").write_text(source)
        subprocess.run(["cc", "-O2", "-fopenmp", "-fPIC", "-shared", *flags.split(),
                        "probe.c", "-o", "probe.so"], cwd=folder, check=True)
        probe = ctypes.CDLL(str(folder / "probe.so")).probe
    probe.restype, probe.argtypes = ctypes.c_double, [ctypes.c_long, ctypes.c_int]
    iters = 20_000_000
    rates = {}
    for threads in sorted({1, os.cpu_count() or 1}):
        probe(iters // 10, threads)
        rates[threads] = max(threads * iters * n * ops / probe(iters, threads) / 1e9
                             for _ in range(3))
    return rates
clock = time.process_time if args.cpu_time else time.perf_counter

i8 = pt.define((Path(__file__).resolve().parents[1] / "tests/isa/i8mm.tc").read_text()).i8mm
f32 = pt.define("def mm(float(M,K) A, float(K,N) B) -> (C) {\n  C(m,n) +=! A(m,k) * B(k,n)\n}").mm
bf = pt.define("def bmm(bfloat16(M,K) A, bfloat16(K,N) B) -> (C) {\n  C(m,n) +=! float(A(m,k)) * float(B(k,n))\n}").bmm
rng = np.random.default_rng(0)
n = 1024
A = rng.integers(0, 256, (n, n), dtype=np.uint8); B = rng.integers(-128, 128, (n, n), dtype=np.int8)
Af, Bf = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
Ab, Bb = Af.astype(ml_dtypes.bfloat16), Bf.astype(ml_dtypes.bfloat16)
assert np.array_equal(i8(A, B), (A.astype(np.int64) @ B.astype(np.int64)).astype(np.int32))
(kernel,) = i8._kernels.values()
used = sorted(set(re.findall(r"_mm\d*_(?:madd_epi16|dpbusd\w*|dpbf16_ps)|_tile_dp\w+",
                             kernel.source_path.read_text())))
Ab1 = rng.standard_normal((64, 64), dtype=np.float32).astype(ml_dtypes.bfloat16)
bf(Ab1, Ab1.T.copy())       # a small call names the bf16 path (the large one's C is the same kind)
bf_text = "\n".join(k.source_path.read_text() for k in bf._kernels.values())
bf_ir = "\n".join((k.source_path.parent / "stage-ir.txt").read_text() for k in bf._kernels.values())
bf_used = ("AMX tdpbf16ps" if "_tile_dpbf16ps" in bf_text else
           "vdpbf16ps" if "_mm512_dpbf16_ps" in bf_text else
           "fp32 FMA on operands widened when packed" if re.search(r"cast\(\$x\) : float32", bf_ir)
           else "not tensorized, not widened")
# torch._int_mm takes s8 x s8: the same bytes, A shifted into the signed range
At, Bt = torch.from_numpy((A.astype(np.int16) - 128).astype(np.int8)), torch.from_numpy(B)
Atb, Btb = torch.from_numpy(Af).to(torch.bfloat16), torch.from_numpy(Bf).to(torch.bfloat16)
fns = {"polytile int8 (u8 x s8 -> s32)": lambda: i8(A, B), "torch._int_mm (s8 x s8 -> s32)": lambda: torch._int_mm(At, Bt),
       "polytile fp32": lambda: f32(Af, Bf), "polytile bf16 -> fp32": lambda: bf(Ab, Bb),
       "torch bf16 matmul": lambda: Atb @ Btb}
fns = {k: f for k, f in fns.items() if any(part in k for part in args.only.split(","))}
for f in fns.values(): f(); f()
times = {k: [] for k in fns}
load = os.getloadavg()
for _ in range(args.rounds):       # blocks: one runtime's threads at a time
    for k, f in fns.items():
        f()
        for _ in range(7):
            s = clock(); f(); times[k].append(clock() - s)
print(f"threads: OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, clock: "
      f"{'process CPU time' if args.cpu_time else 'wall'}; int8 kernel: {', '.join(used) or 'scalar'}; "
      f"bf16 kernel: {bf_used}; "
      f"load average before {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, after "
      + " ".join(f"{x:.2f}" for x in os.getloadavg()))
if args.peak:
    from polytile.targets.target import host_features
    have = host_features()
    needs = {"vpdpbusd zmm": "avx512_vnni", "vpdpbusd ymm (AVX-VNNI)": "avx_vnni",
             "vdpbf16ps zmm": "avx512_bf16", "vfmadd zmm": "avx512f", "vfmadd ymm": "avx2"}
    for name in PROBES:
        if needs[name] in have:
            rates = instruction_peak(name)
            print(f"peak {name}: " + ", ".join(f"{r:.0f} GOP/s with {t} thread{'s' * (t > 1)}"
                                               for t, r in rates.items()))
print("| kernel | ms | GOP/s |\n| --- | ---: | ---: |")
medians = {k: statistics.median(v) for k, v in times.items()}
for k, m in medians.items():
    print(f"| {k} | {m*1e3:.2f} | {2*n**3/m/1e9:.0f} |")
int8, fp32 = "polytile int8 (u8 x s8 -> s32)", "polytile fp32"
if int8 in medians and fp32 in medians:
    print(f"\npolytile int8 GOP/s / polytile fp32 GFLOP/s: {medians[fp32] / medians[int8]:.2f}x")
bf16 = "polytile bf16 -> fp32"
if bf16 in medians and fp32 in medians:
    print(f"\npolytile bf16 GFLOP/s / polytile fp32 GFLOP/s: {medians[fp32] / medians[bf16]:.2f}x")
