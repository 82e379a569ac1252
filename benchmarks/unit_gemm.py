"""UNIT's GEMM rows (issue 14): int8 and bf16 1024^3 through polytile (tensorized: vpdpbusd
where the host has VNNI, vpmaddwd on operands widened to int16 on an AVX2 host without
it; vdpbf16ps where it has AVX-512 BF16, else the fp32 FMA micro-kernel on operands
widened to fp32 when packed) against torch._int_mm, torch's bf16 matmul and polytile's
fp32 GEMM, in one process, in blocks of 7 calls per kernel (after a warm-up call), three
rounds; prints a markdown table of medians and GOP/s, the int8/fp32 and bf16/fp32 ratios
of the same run, the instruction the int8 and bf16 kernels run on and the load average.

    python benchmarks/unit_gemm.py [--cpu-time] [--only polytile] [--rounds 3]
    OMP_NUM_THREADS=1 python benchmarks/unit_gemm.py --cpu-time --only "int8 (u8,polytile fp32"
    OMP_NUM_THREADS=1 python benchmarks/unit_gemm.py --cpu-time --only "polytile fp32,polytile bf16"

Blocks, not call-by-call alternation: OpenMP's threads spin for a while after a parallel
loop, and interleaving them with torch's pool call by call doubled both sides' times.
`--cpu-time` times with the process's CPU clock, so that time spent preempted by other
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
args = parser.parse_args()
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
used = sorted(set(re.findall(r"_mm\d*_(?:madd_epi16|dpbusd\w*|dpbf16_ps)", kernel.source_path.read_text())))
Ab1 = rng.standard_normal((64, 64), dtype=np.float32).astype(ml_dtypes.bfloat16)
bf(Ab1, Ab1.T.copy())       # a small call names the bf16 path (the large one's C is the same kind)
bf_text = "\n".join(k.source_path.read_text() for k in bf._kernels.values())
bf_ir = "\n".join((k.source_path.parent / "stage-ir.txt").read_text() for k in bf._kernels.values())
bf_used = ("vdpbf16ps" if "_mm512_dpbf16_ps" in bf_text else
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
