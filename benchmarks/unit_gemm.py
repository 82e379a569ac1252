"""UNIT's GEMM rows (issue 14): int8 and bf16 1024^3 through polytile (tensorized where the
host has VNNI / AVX-512 BF16) against torch._int_mm, torch's bf16 matmul and polytile's
fp32 GEMM, in one process, in blocks of 7 calls per kernel (after a warm-up call), three
rounds; prints a markdown table of medians and GOP/s.

    python benchmarks/unit_gemm.py

Blocks, not call-by-call alternation: OpenMP's threads spin for a while after a parallel
loop, and interleaving them with torch's pool call by call doubled both sides' times.
"""
import statistics
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import polytile as pt

i8 = pt.define((Path(__file__).resolve().parents[1] / "tests/isa/i8mm.tc").read_text()).i8mm
f32 = pt.define("def mm(float(M,K) A, float(K,N) B) -> (C) {\n  C(m,n) +=! A(m,k) * B(k,n)\n}").mm
bf = pt.define("def bmm(bfloat16(M,K) A, bfloat16(K,N) B) -> (C) {\n  C(m,n) +=! float(A(m,k)) * float(B(k,n))\n}").bmm
rng = np.random.default_rng(0)
n = 1024
A = rng.integers(0, 256, (n, n), dtype=np.uint8); B = rng.integers(-128, 128, (n, n), dtype=np.int8)
Af, Bf = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
Ab, Bb = Af.astype(ml_dtypes.bfloat16), Bf.astype(ml_dtypes.bfloat16)
assert np.array_equal(i8(A, B), (A.astype(np.int64) @ B.astype(np.int64)).astype(np.int32))
# torch._int_mm takes s8 x s8: the same bytes, A shifted into the signed range
At, Bt = torch.from_numpy((A.astype(np.int16) - 128).astype(np.int8)), torch.from_numpy(B)
Atb, Btb = torch.from_numpy(Af).to(torch.bfloat16), torch.from_numpy(Bf).to(torch.bfloat16)
fns = {"polytile int8 (u8 x s8 -> s32)": lambda: i8(A, B), "torch._int_mm (s8 x s8 -> s32)": lambda: torch._int_mm(At, Bt),
       "polytile fp32": lambda: f32(Af, Bf), "polytile bf16 -> fp32": lambda: bf(Ab, Bb),
       "torch bf16 matmul": lambda: Atb @ Btb}
for f in fns.values(): f(); f()
times = {k: [] for k in fns}
for _ in range(3):                 # blocks: one runtime's threads at a time
    for k, f in fns.items():
        f()
        for _ in range(7):
            s = time.perf_counter(); f(); times[k].append(time.perf_counter() - s)
print("| kernel | ms | GOP/s |\n| --- | ---: | ---: |")
for k, v in times.items():
    m = statistics.median(v)
    print(f"| {k} | {m*1e3:.2f} | {2*n**3/m/1e9:.0f} |")
