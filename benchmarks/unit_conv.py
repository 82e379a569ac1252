"""UNIT's Table I (issue 14): the 16 quantized convolution layers (batch 1, no padding)
through polytile (u8 x s8 -> s32, tensorized: vpdpbusd where the host has VNNI, vpmaddwd
on operands widened to int16 on an AVX2 host without it) against torch's quantized conv
(fbgemm engine) and polytile's fp32 conv of the same shape, in one process; prints a
markdown table of medians, GOP/s and ratios, their geomeans, the instruction the int8
kernels run on and the load average.

    OMP_NUM_THREADS=1 python benchmarks/unit_conv.py --cpu-time
    OMP_NUM_THREADS=2 python benchmarks/unit_conv.py --threads 2 [--stat min]
    python benchmarks/unit_conv.py --layers 1,5,15 --rounds 5

Two torch baselines: `torch.ops.quantized.conv2d` with the weight prepacked once before
timing (fbgemm's best case; it also requantizes the int32 sums to uint8), and
`torch.ao.nn.quantized.functional.conv2d`, which prepacks the weight on every call, as
polytile packs its operands on every call. Each kernel runs in blocks of 7 calls after a
warm-up call, three rounds (blocks, not call-by-call alternation: see
benchmarks/unit_gemm.py). `--cpu-time` times with the process's CPU clock, so that time
spent preempted by other processes on a shared host is not counted (use it with one
thread: idle OpenMP threads' spinning would count). Every polytile int8 result is checked
against a float64 conv of the same integers (exact below 2^53) before timing.
"""
import argparse
import math
import os
import re
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import polytile as pt

# UNIT Table I: C, input H=W, K, R=S, stride (output H=W follows, no padding)
TABLE_I = [(288, 35, 384, 3, 2), (160, 9, 224, 3, 1), (1056, 7, 192, 1, 1),
           (80, 73, 192, 3, 1), (128, 16, 128, 3, 1), (192, 16, 192, 3, 1),
           (256, 16, 256, 3, 1), (1024, 14, 512, 1, 1), (128, 16, 160, 3, 1),
           (576, 14, 192, 1, 1), (96, 16, 128, 3, 1), (1024, 14, 256, 1, 1),
           (576, 14, 128, 1, 1), (64, 29, 96, 3, 1), (64, 56, 128, 1, 2), (608, 14, 192, 1, 1)]

parser = argparse.ArgumentParser()
parser.add_argument("--cpu-time", action="store_true")
parser.add_argument("--threads", type=int, default=1)
parser.add_argument("--rounds", type=int, default=3)
parser.add_argument("--layers", default="", help="comma-separated 1-based layer numbers")
parser.add_argument("--stat", choices=("median", "min"), default="median",
                    help="of each kernel's calls (min: the fastest, the least preempted one "
                         "on a loaded host)")
args = parser.parse_args()
clock = time.process_time if args.cpu_time else time.perf_counter
torch.set_num_threads(args.threads)
torch.backends.quantized.engine = "fbgemm"
warnings.filterwarnings("ignore", message=".*quantiz.*deprecated")
layers = [int(k) for k in args.layers.split(",")] if args.layers else range(1, 17)


def source(stride: int, dtype: str) -> str:
    h, o = ("h", "o") if stride == 1 else (f"{stride}*h", f"{stride}*o")
    cast = (lambda v: f"int32({v})") if dtype == "int8" else (lambda v: v)
    x_t, w_t = ("uint8", "int8") if dtype == "int8" else ("float", "float")
    return (f"def conv({x_t}(N,C,H,W) x, {w_t}(K,C,R,S) w) -> (y) {{\n"
            f"  y(n,k,h,o) +=! {cast(f'x(n,c,{h}+r,{o}+s)')} * {cast('w(k,c,r,s)')}\n}}")


modules = {(stride, dtype): pt.define(source(stride, dtype)).conv
           for stride in (1, 2) for dtype in ("int8", "float")}


def timed(f) -> list[float]:  # type: ignore[no-untyped-def]
    f()
    times = []
    for _ in range(7):
        s = clock()
        f()
        times.append(clock() - s)
    return times


rng = np.random.default_rng(0)
used: set[str] = set()


def measure(number: int) -> tuple:  # type: ignore[type-arg]
    """One layer: check polytile's int8 result, then time every kernel; its table row."""
    c, hw, k, rs, stride = TABLE_I[number - 1]
    x = rng.integers(0, 256, (1, c, hw, hw), dtype=np.uint8)
    w = rng.integers(-128, 128, (k, c, rs, rs), dtype=np.int8)
    xf, wf = x.astype(np.float32), w.astype(np.float32)
    i8, f32 = modules[(stride, "int8")], modules[(stride, "float")]
    want = torch.nn.functional.conv2d(torch.from_numpy(x.astype(np.float64)),
                                      torch.from_numpy(w.astype(np.float64)), stride=stride)
    got = i8(x, w)
    assert np.array_equal(got, want.numpy().astype(np.int64).astype(np.int32)), number
    for kernel in i8._kernels.values():
        used.update(re.findall(r"_mm\d*_(?:madd_epi16|dpbusd\w*)|_tile_dp\w+",
                               kernel.source_path.read_text()))
    qx = torch.quantize_per_tensor(torch.from_numpy(xf), 1.0, 0, torch.quint8)
    qw = torch.quantize_per_tensor(torch.from_numpy(wf), 1.0, 0, torch.qint8)
    packed = torch.ops.quantized.conv2d_prepack(qw, None, [stride, stride], [0, 0], [1, 1], 1)
    scale = float(np.abs(want.numpy()).max()) / 127 or 1.0    # the int32 sums into uint8
    fns = {"polytile int8": lambda: i8(x, w),
           "fbgemm prepacked": lambda: torch.ops.quantized.conv2d(qx, packed, scale, 0),
           "fbgemm functional": lambda: torch.ao.nn.quantized.functional.conv2d(
               qx, qw, None, stride=stride, scale=scale, zero_point=0),
           "polytile fp32": lambda: f32(xf, wf)}
    assert fns["fbgemm prepacked"]().shape == got.shape
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(args.rounds):
        for name, f in fns.items():
            times[name] += timed(f)
    ops = 2 * k * c * rs * rs * got.shape[2] * got.shape[3]
    return (number, c, hw, k, rs, stride, ops,
            {name: (min(v) if args.stat == "min" else statistics.median(v))
             for name, v in times.items()})


load = os.getloadavg()
rows = [measure(number) for number in layers]
after = os.getloadavg()
print(f"threads: {args.threads} (OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}), "
      f"clock: {'process CPU time' if args.cpu_time else 'wall'}, {args.stat} of "
      f"{7 * args.rounds} calls; int8 kernels: "
      f"{', '.join(sorted(used)) or 'scalar'}; load average before "
      f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, after {after[0]:.2f} {after[1]:.2f} {after[2]:.2f}")
names = list(rows[0][7])
print("| # | C | HW | K | RS | stride | polytile int8 ms | GOP/s | fbgemm prepacked ms | "
      "fbgemm functional ms | polytile fp32 ms | vs prepacked | vs functional | vs fp32 |")
print("| ---: " * 14 + "|")
ratios: dict[str, list[float]] = {name: [] for name in names[1:]}
for number, c, hw, k, rs, stride, ops, m in rows:
    mine = m["polytile int8"]
    for name in names[1:]:
        ratios[name].append(m[name] / mine)
    print(f"| {number} | {c} | {hw} | {k} | {rs} | {stride} | {mine * 1e3:.3f} | "
          f"{ops / mine / 1e9:.0f} | " + " | ".join(f"{m[n] * 1e3:.3f}" for n in names[1:])
          + " | " + " | ".join(f"{m[n] / mine:.2f}x" for n in names[1:]) + " |")
print("\ngeomean speedup of polytile int8 (time of the other / time of polytile int8): "
      + ", ".join(f"vs {name} {math.exp(statistics.mean(map(math.log, r))):.2f}x"
                  for name, r in ratios.items()))
