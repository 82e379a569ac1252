"""`polytile bench --latency`: what a user waits for before and between calls (issue 3).

For each of the TC paper's examples:

- first call, cold: a new process with a new, empty POLYTILE_CACHE_DIR, timing
  `define` (parse + check) and the first call (lower + passes + generate C + compile +
  load + run). The C compiler's one-time probe (version, -march=native, -fopenmp),
  which a cache directory keeps after its first use, is timed on its own.
- first call, cached: another new process on the same, now warm, cache directory; it
  must start no compiler (the count is reported).
- dispatch overhead, in this process: a 16-element add through polytile against
  np.add on the same arrays, with fresh and with preallocated outputs.

Each child process runs `child_main(EXAMPLE)` after timing `import polytile`, and prints
one JSON line.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from polytile.bench.contractions import MLP1, TBMM, TMM, TWO_LUT
from polytile.bench.timing import TimingOptions, time_blocks


@dataclass(frozen=True)
class Example:
    name: str
    tc: str
    function: str
    sizes: str
    make_args: Callable[[np.random.Generator], tuple[Any, ...]]
    make_out: Callable[[np.random.Generator], tuple[np.ndarray, ...]] | None = None


def _f32(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.random(shape, dtype=np.float32)


EXAMPLES: tuple[Example, ...] = (
    Example("mv", """
def mv(float(M,K) A, float(K) x) -> (C) {
  C(i) = 0
  C(i) += A(i,k) * x(k)
}""", "mv", "M=256, K=256", lambda r: (_f32(r, 256, 256), _f32(r, 256))),
    Example("sgemm", """
def sgemm(float a, float b, float(N,M) A, float(M,K) B) -> (C) {
  C(i,j) = b * C(i,j)
  C(i,j) += a * A(i,k) * B(k,j)
}""", "sgemm", "N=M=K=128", lambda r: (np.float32(1.5), np.float32(0.5), _f32(r, 128, 128),
                                      _f32(r, 128, 128)),
        lambda r: (_f32(r, 128, 128),)),
    Example("fcrelu", """
def fcrelu(float(B,I) in, float(O,I) weight, float(I) bias) -> (out) {
  out(i,j) = bias(j)
  out(b,o) += in(b,i) * weight(o,i)
  out(i,j) = fmaxf(out(i,j), 0)
}""", "fcrelu", "B=32, I=O=128", lambda r: (_f32(r, 32, 128), _f32(r, 128, 128),
                                              _f32(r, 128))),
    Example("conv2d", """
def conv2d(float(B,IP,H,W) in, float(OP,IP,KH,KW) weight) -> (out) {
  out(b,op,h,w) +=! in(b,ip, h + kh, w + kw) * weight(op,ip,kh,kw)
}""", "conv2d", "B=4, IP=8, H=W=16, OP=8, KH=KW=3",
        lambda r: (_f32(r, 4, 8, 16, 16), _f32(r, 8, 8, 3, 3))),
    Example("maxpool", """
def maxpool2x2(float(B,C,H,W) in) -> (out) {
  out(b,c,i,j) max=! in(b,c, 2 * i + kw, 2 * j + kh)
  where kw in 0:2, kh in 0:2
}""", "maxpool2x2", "B=4, C=8, H=W=32", lambda r: (_f32(r, 4, 8, 32, 32),)),
    Example("gather", """
def gather(float(N) X, int(A,B) I) -> (Z) {
  Z(i,j) = X(I(i,j))
}""", "gather", "N=1000, A=B=32",
        lambda r: (_f32(r, 1000), r.integers(0, 1000, (32, 32), dtype=np.int32))),
    Example("tmm", TMM, "tmm", "M=64, K=32, N=48", lambda r: (_f32(r, 64, 32), _f32(r, 48, 32))),
    Example("tbmm", TBMM, "tbmm", "B=8, N=16, M=24, K=16",
            lambda r: (_f32(r, 8, 16, 24), _f32(r, 8, 16, 24))),
    Example("2LUT", TWO_LUT, "2LUT", "E1=E2=1000, D=16, B=8, L1=L2=10",
            lambda r: (_f32(r, 1000, 16), r.integers(0, 1000, (8, 10), dtype=np.int32),
                       _f32(r, 1000, 16), r.integers(0, 1000, (8, 10), dtype=np.int32))),
    Example("MLP1", MLP1, "MLP1", "B=16, M=128, N=32",
            lambda r: (_f32(r, 16, 128), _f32(r, 32, 128), _f32(r, 32))),
)

ADD = """
def add(float(N) a, float(N) b) -> (c) {
  c(i) = a(i) + b(i)
}
"""


@dataclass(frozen=True)
class LatencyRow:
    example: Example
    cold: list[dict[str, Any]] = field(default_factory=list)    # one dict per child process
    warm: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""


@dataclass(frozen=True)
class DispatchResult:
    seconds: dict[str, float]          # "polytile", "np.add", "polytile out=", "np.add out="
    spread: dict[str, tuple[float, float]]
    error: str = ""


def select_examples(only: Sequence[str] | None) -> list[Example]:
    if not only:
        return list(EXAMPLES)
    wanted = {o.lower() for o in only}
    return [e for e in EXAMPLES if e.name.lower() in wanted]


def measure_latency(examples: Sequence[Example], *, samples: int = 3,
                    progress: Callable[[str], None] = lambda _: None) -> list[LatencyRow]:
    rows = []
    for i, example in enumerate(examples, 1):
        progress(f"[{i}/{len(examples)}] {example.name}")
        row = LatencyRow(example)
        for _ in range(samples):
            with tempfile.TemporaryDirectory(prefix="polytile-latency-") as cache:
                cold = _run_child(example.name, cache)
                if "error" in cold:
                    row = LatencyRow(example, row.cold, row.warm, cold["error"])
                    break
                row.cold.append(cold)
                warm = _run_child(example.name, cache)
                if "error" in warm:
                    row = LatencyRow(example, row.cold, row.warm, warm["error"])
                    break
                row.warm.append(warm)
        rows.append(row)
    return rows


def _run_child(name: str, cache_dir: str) -> dict[str, Any]:
    env = {**os.environ, "POLYTILE_CACHE_DIR": cache_dir}
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-c", _CHILD, name],
                              check=False, capture_output=True, text=True, env=env, timeout=600,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"error": "child process did not finish within 600 s"}
    wall = time.perf_counter() - start
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        return {"error": f"child exited with {proc.returncode}: " + " / ".join(tail)}
    result: dict[str, Any] = json.loads(lines[-1])
    result["process_s"] = wall
    return result


# `python -m polytile.bench.latency` would import polytile before any of our code runs.
_CHILD = """
import sys, time
start = time.perf_counter()
import polytile
from polytile.bench.latency import child_main
sys.exit(child_main(sys.argv[1], import_seconds=time.perf_counter() - start))
"""


def child_main(name: str, import_seconds: float | None = None) -> int:
    """In a fresh process: time the compiler probe, define and the first two calls."""
    import polytile
    from polytile.config import load_config
    from polytile.runtime.toolchain import compiler_invocations, detect_toolchain
    result: dict[str, Any] = {}
    if import_seconds is not None:
        result["import_s"] = import_seconds
    try:
        example = next(e for e in EXAMPLES if e.name == name)
        rng = np.random.default_rng(0)
        args = example.make_args(rng)
        t = time.perf_counter()
        detect_toolchain(load_config())
        result["probe_s"] = time.perf_counter() - t
        result["probe_compiles"] = compiler_invocations()
        t = time.perf_counter()
        fn = polytile.define(example.tc)[example.function]
        result["define_s"] = time.perf_counter() - t
        out = example.make_out(rng) if example.make_out else None
        before = compiler_invocations()
        t = time.perf_counter()
        fn(*args, out=out)
        result["first_call_s"] = time.perf_counter() - t
        result["call_compiles"] = compiler_invocations() - before
        t = time.perf_counter()
        fn(*args, out=out)
        result["second_call_s"] = time.perf_counter() - t
    except Exception as e:  # noqa: BLE001 - reported by the parent as FAILED
        from polytile.bench.harness import error_text
        result["error"] = error_text(e)
    print(json.dumps(result), flush=True)
    return 0


def measure_dispatch(options: TimingOptions, n: int = 16) -> DispatchResult:
    """Per-call time of a tiny polytile op against np.add, in this process."""
    from dataclasses import replace

    import polytile
    from polytile.bench.harness import error_text
    from polytile.config import load_config

    a = np.arange(n, dtype=np.float32)
    b = np.ones(n, dtype=np.float32)
    c = np.empty(n, dtype=np.float32)
    with tempfile.TemporaryDirectory(prefix="polytile-dispatch-") as cache:
        try:
            config = replace(load_config(), cache_dir=Path(cache))
            add = polytile.define(ADD, config=config).add
            if not np.array_equal(add(a, b), a + b):
                return DispatchResult({}, {}, "polytile add gave a wrong result")
        except Exception as e:  # noqa: BLE001
            return DispatchResult({}, {}, error_text(e))
        timings = time_blocks({
            "polytile": lambda: add(a, b), "np.add": lambda: np.add(a, b),
            "polytile out=": lambda: add(a, b, out=c), "np.add out=": lambda: np.add(a, b, out=c),
        }, replace(options, min_sample_seconds=200e-6))
    return DispatchResult({k: t.median for k, t in timings.items()},
                          {k: (t.p10, t.p90) for k, t in timings.items()})


def median_of(records: Sequence[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in records if key in r]
    return statistics.median(values) if values else None

