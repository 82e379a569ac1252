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
"""
from __future__ import annotations

import argparse
import ctypes
import re
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from kernel_ab import _zeros, kernel_c, random_arguments  # noqa: E402
from polytile.backends import backend_named  # noqa: E402
from polytile.config import load_config  # noqa: E402
from polytile.runtime.build import build_shared_object  # noqa: E402
from polytile.runtime.kernel import SYMBOL  # noqa: E402
from polytile.runtime.toolchain import detect_toolchain  # noqa: E402
from polytile.targets.target import select_target  # noqa: E402

_BLOCK = re.compile(r"^    /\* block (\w+)")     # a block of the function's body
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


def instrument(source: str) -> tuple[str, list[str]]:
    """The C with a clock read before each top-level block and before the return, and
    the blocks' names in order."""
    head, sep, body = source.rpartition(f"int32_t {SYMBOL}(")
    if not sep:
        head, sep, body = source.rpartition("int32_t polytile_kernel(")
    if not sep:
        raise SystemExit("no kernel function in the C")
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
    args = parser.parse_args()

    fn, inputs, shapes = random_arguments(args.tc, args.sizes, args.int_high)
    outputs = [_zeros(s, args.out_offset) for s in shapes]

    config = load_config()
    target = select_target(args.target or config.target)
    toolchain = detect_toolchain(config)
    flags = backend_named(target.backend).flags(target, toolchain, ())
    code, names = instrument(kernel_c(args.checkout.resolve(), args.tc.resolve(), args.sizes,
                                      args.target))
    with tempfile.TemporaryDirectory() as tmp:
        so = Path(tmp, "profiled.so")
        build_shared_object(code.replace("int32_t polytile_kernel(", f"int32_t {SYMBOL}("),
                            flags, toolchain, so)
        library = ctypes.CDLL(str(so))
        kernel = getattr(library, SYMBOL)
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


if __name__ == "__main__":
    sys.exit(main())
