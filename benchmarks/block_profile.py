"""Where a kernel's time goes: the wall time of each top-level block of its C, one process.

    python benchmarks/block_profile.py tests/paper/gconv.tc \
        --sizes N=32,G=32,F=16,C=16,H=14,W=14,KH=3,KW=3 [--checkout .] [--rounds 30]

The kernel's C (`polytile show --stage c` of the checkout, or a `.c` file) gets a clock
read before each top-level block (the `/* block NAME */` comments at the function
body's indentation) and before its return; the time between two reads is the block's,
its OpenMP region's start and end included. The kernel is called `--rounds` times on
the random inputs of `benchmarks/kernel_ab.py` (its outputs where `--out-offset` puts
them), and the medians per block are printed with their share of the whole. A reading,
not a benchmark: the clock reads cost about 20 ns each, and a block's time depends on
what the blocks before it left in the caches.

With `--members fused_2`, the members of that fused row block (`/* block NAME */` one
level inside its row loop) are timed instead: each thread reads the clock before each
member and after the last, the time of each member is summed over the rows and the
threads, and the mean per thread and call is printed (attention 12x128x64: its P V
product took 47% of the row loop, the GELU 18%).
"""
from __future__ import annotations

import argparse
import ctypes
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from kernel_ab import _zeros, kernel_c, load_kernel, random_arguments  # noqa: E402
from polytile.backends import backend_named  # noqa: E402
from polytile.config import load_config  # noqa: E402
from polytile.runtime.kernel import SYMBOL  # noqa: E402
from polytile.runtime.toolchain import Toolchain, detect_toolchain  # noqa: E402
from polytile.targets.target import select_target  # noqa: E402

_BLOCK = re.compile(r"^    /\* block (\w+)")     # a block of the function's body
_MEMBER = re.compile(r"^        /\* block (\w+)")  # a member of a row loop of the body
_CLOCK = """#include <time.h>
#define PT_MARKS 256
int64_t pt_marks[PT_MARKS];
int32_t pt_nmarks;
static inline void pt_mark(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  if (pt_nmarks < PT_MARKS) pt_marks[pt_nmarks++] = (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}
"""


_MEMBER_CLOCK = """#include <time.h>
double pt_member_ns[256];
static __thread int pt_member_last = -1;
static __thread double pt_member_start;
static inline void pt_member(int k) {   /* k < 0: after the last member */
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  double now = (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
  if (pt_member_last >= 0) {
    #pragma omp atomic
    pt_member_ns[pt_member_last] += now - pt_member_start;
  }
  pt_member_last = k;
  pt_member_start = now;
}
"""


def _split(source: str) -> tuple[str, str, str]:
    """The C before the kernel function, its first words, and the rest."""
    head, sep, body = source.rpartition(f"int32_t {SYMBOL}(")
    if not sep:
        raise SystemExit("no kernel function in the C")
    return head, sep, body


def instrument_members(source: str, block: str) -> tuple[str, list[str]]:
    """The C with a clock read before each member of fused block `block` and at the end
    of its row loop's body, and the members' names in order."""
    head, sep, body = _split(source)
    names: list[str] = []
    lines: list[str] = []
    inside = False
    for line in body.split("\n"):
        top = _BLOCK.match(line)
        if top:
            inside = top.group(1) == block
        elif inside and line == "    }":             # the end of the row loop's body
            lines.append("        pt_member(-1);")
            inside = False
        found = _MEMBER.match(line) if inside else None
        if found:
            lines.append(f"        pt_member({len(names)});")
            names.append(found.group(1))
        lines.append(line)
    if not names:
        raise SystemExit(f"no members of a block {block!r} found in the kernel's C")
    return head + _MEMBER_CLOCK + sep + "\n".join(lines), names


def instrument(source: str) -> tuple[str, list[str]]:
    """The C with a clock read before each top-level block and before the return, and
    the blocks' names in order."""
    head, sep, body = _split(source)
    names: list[str] = []
    lines = []
    for line in body.split("\n"):
        found = _BLOCK.match(line)
        if found and found.group(1) != "main":
            names.append(found.group(1))
            lines.append("    pt_mark();")
        if line.strip() == "return pt_status;" and line.startswith("    ") \
                and not line.startswith("     "):
            lines.append("    pt_mark();")
        lines.append(line)
    if not names:
        raise SystemExit("no top-level blocks found in the kernel's C")
    return head + _CLOCK + sep + "\n".join(lines).replace(
        "int32_t pt_status = 0;", "int32_t pt_status = 0;\n    pt_nmarks = 0;", 1), names


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tc", type=Path)
    parser.add_argument("--sizes", required=True)
    parser.add_argument("--checkout", type=Path, default=ROOT,
                        help="the polytile checkout whose C is profiled, or a .c file")
    parser.add_argument("--target")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--int-high", type=int, default=1)
    parser.add_argument("--out-offset", type=int, default=None)
    parser.add_argument("--members", metavar="BLOCK",
                        help="time the members of this fused row block instead")
    args = parser.parse_args()

    fn, inputs, shapes = random_arguments(args.tc, args.sizes, args.int_high)
    outputs = [_zeros(s, args.out_offset) for s in shapes]

    config = load_config()
    target = select_target(args.target or config.target)
    toolchain = detect_toolchain(config)
    flags = backend_named(target.backend).flags(target, toolchain, ())
    source = kernel_c(args.checkout.resolve(), args.tc.resolve(), args.sizes, args.target)
    if args.members:
        return _profile_members(source, args, inputs + outputs, flags, toolchain,
                                fn.name)
    code, names = instrument(source)
    with tempfile.TemporaryDirectory() as tmp:
        library, kernel = load_kernel(code, flags, toolchain, Path(tmp, "profiled.so"))
        marks = (ctypes.c_int64 * 256).in_dll(library, "pt_marks")
        count = ctypes.c_int32.in_dll(library, "pt_nmarks")
        err = (ctypes.c_int64 * 4)()
        arrays = inputs + outputs
        pointers = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
        times: list[list[float]] = [[] for _ in names]
        totals = []
        for _ in range(args.rounds):
            if kernel(pointers, err) != 0:
                raise SystemExit("the kernel failed")
            if count.value != len(names) + 1:
                raise SystemExit(f"{count.value} clock reads for {len(names)} blocks")
            for k in range(len(names)):
                times[k].append((marks[k + 1] - marks[k]) * 1e-3)
            totals.append((marks[len(names)] - marks[0]) * 1e-3)
    total = statistics.median(totals)
    print(f"{fn.name} at {args.sizes}: {total:.1f} us median over {args.rounds} calls")
    for block, t in zip(names, times):
        median = statistics.median(t)
        print(f"  {block:32s} {median:10.1f} us  {100 * median / total:5.1f}%")
    return 0


def _profile_members(source: str, args: argparse.Namespace, arrays: list[np.ndarray],
                     flags: tuple[str, ...], toolchain: Toolchain, name: str) -> int:
    code, names = instrument_members(source, args.members)
    with tempfile.TemporaryDirectory() as tmp:
        library, kernel = load_kernel(code, flags, toolchain, Path(tmp, "profiled.so"))
        spent = (ctypes.c_double * 256).in_dll(library, "pt_member_ns")
        err = (ctypes.c_int64 * 4)()
        pointers = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
        for _ in range(3):                                  # warm up, then count from 0
            kernel(pointers, err)
        ctypes.memset(spent, 0, ctypes.sizeof(spent))
        for _ in range(args.rounds):
            if kernel(pointers, err) != 0:
                raise SystemExit("the kernel failed")
        threads = _cores()
        total = sum(spent[k] for k in range(len(names)))
    per_call = total / args.rounds / threads * 1e-3
    print(f"{name} at {args.sizes}, members of {args.members}: {per_call:.1f} us per call "
          f"and thread (mean of {args.rounds} calls, {threads} threads)")
    for k, member in enumerate(names):
        print(f"  {member:32s} {spent[k] / args.rounds / threads * 1e-3:10.1f} us  "
              f"{100 * spent[k] / total:5.1f}%")
    return 0


def _cores() -> int:
    return int(os.environ.get("OMP_NUM_THREADS") or 0) or len(os.sched_getaffinity(0))


if __name__ == "__main__":
    sys.exit(main())
