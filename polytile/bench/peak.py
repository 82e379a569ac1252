"""This machine's peak, measured once per bench run with small C probes.

    peak = measure_peak()          # Peak(isa="avx512", fma_gflops={1: 131.0, 2: 262.0}, ...)
    peak.flops_peak                # GFLOP/s with all cores: what compute-bound rates are held to
    peak.bandwidth_peak            # best STREAM figure in GB/s: what memory-bound rates are held to

FMA: every thread runs independent chains of fused multiply-adds on full vector
registers (AVX-512 when the host has it, else AVX2+FMA, else scalar), enough chains
to hide the FMA latency on two ports. Bandwidth: STREAM's copy and triad with one and
with all threads, and triad with streaming (non-temporal) stores where the ISA has
them, on arrays several times the last-level cache. Threads are pthreads, started
together at a barrier. Each figure is the median of repeated runs.

The ISA is chosen from the host's CPU flags at run time and passed to the compiler
explicitly (-mavx512f / -mavx2 -mfma), so the probe never assumes the build machine.
"""
from __future__ import annotations

import ctypes
import os
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

_SOURCE = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#if PROBE_ISA > 1
#include <immintrin.h>
#endif

#if PROBE_ISA == 512
typedef __m512 vec;
#define LANES 16
#define CHAINS 20
#define VSET(x) _mm512_set1_ps(x)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VSTREAM(p, v) _mm512_stream_ps(p, v)
#define VLOAD(p) _mm512_load_ps(p)
#define VSUM(v) _mm512_reduce_add_ps(v)
#elif PROBE_ISA == 256
typedef __m256 vec;
#define LANES 8
#define CHAINS 12
#define VSET(x) _mm256_set1_ps(x)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VSTREAM(p, v) _mm256_stream_ps(p, v)
#define VLOAD(p) _mm256_load_ps(p)
static float VSUM(vec v) { float t[8]; _mm256_storeu_ps(t, v); float s = 0;
                           for (int i = 0; i < 8; ++i) s += t[i]; return s; }
#else
typedef float vec;
#define LANES 1
#define CHAINS 8
#define VSET(x) (x)
#define VFMA(a, b, c) ((a) * (b) + (c))
#define VSUM(v) (v)
#endif

#define MAX_THREADS 256

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int pt_lanes(void) { return LANES; }
int pt_chains(void) { return CHAINS; }

/* ---------------------------------------------------------------- FMA */
typedef struct {
  long iters;
  pthread_barrier_t *start;
  double t0, t1;
  float sink;
} fma_arg;

static void *fma_thread(void *p) {
  fma_arg *a = (fma_arg *)p;
  vec acc[CHAINS];
  vec b = VSET(0.9999999f), c = VSET(1e-7f);
  for (int j = 0; j < CHAINS; ++j) acc[j] = VSET(1.0f + 0.001f * (float)j);
  pthread_barrier_wait(a->start);
  a->t0 = now();
  for (long i = 0; i < a->iters; ++i) {
#pragma GCC unroll 32
    for (int j = 0; j < CHAINS; ++j) acc[j] = VFMA(acc[j], b, c);
  }
  a->t1 = now();
  vec s = acc[0];
  for (int j = 1; j < CHAINS; ++j) s = s + acc[j];
  a->sink = VSUM(s);
  return NULL;
}

/* Seconds from the first thread's start to the last thread's end; <0 on error. */
double pt_fma(int threads, long iters, float *sink) {
  if (threads < 1 || threads > MAX_THREADS) return -1.0;
  pthread_t tid[MAX_THREADS];
  fma_arg arg[MAX_THREADS];
  pthread_barrier_t start;
  pthread_barrier_init(&start, NULL, (unsigned)threads);
  for (int t = 0; t < threads; ++t) {
    arg[t].iters = iters;
    arg[t].start = &start;
    if (pthread_create(&tid[t], NULL, fma_thread, &arg[t]) != 0) return -1.0;
  }
  double first = 1e300, last = 0.0;
  *sink = 0.0f;
  for (int t = 0; t < threads; ++t) {
    pthread_join(tid[t], NULL);
    if (arg[t].t0 < first) first = arg[t].t0;
    if (arg[t].t1 > last) last = arg[t].t1;
    *sink += arg[t].sink;
  }
  pthread_barrier_destroy(&start);
  return last - first;
}

/* ---------------------------------------------------------------- STREAM */
enum { COPY = 0, TRIAD = 1, TRIAD_NT = 2 };

typedef struct {
  float *a, *b, *c;
  long lo, hi;
  int kind, reps, id;
  pthread_barrier_t *bar;
  double *seconds;
} stream_arg;

static void stream_kernel(int kind, float *restrict a, const float *restrict b,
                          const float *restrict c, long lo, long hi) {
  const float s = 3.0f;
  if (kind == COPY) {
    for (long i = lo; i < hi; ++i) a[i] = c[i];
  } else if (kind == TRIAD) {
    for (long i = lo; i < hi; ++i) a[i] = b[i] + s * c[i];
  } else {
#if PROBE_ISA > 1
    vec vs = VSET(s);
    for (long i = lo; i < hi; i += LANES) VSTREAM(a + i, VFMA(vs, VLOAD(c + i), VLOAD(b + i)));
    _mm_sfence();
#endif
  }
}

static void *stream_thread(void *p) {
  stream_arg *x = (stream_arg *)p;
  for (long i = x->lo; i < x->hi; ++i) {   /* first touch by the thread that uses the pages */
    x->a[i] = 0.0f; x->b[i] = 1.0f; x->c[i] = 2.0f;
  }
  for (int r = 0; r < x->reps; ++r) {
    pthread_barrier_wait(x->bar);
    double t0 = now();
    stream_kernel(x->kind, x->a, x->b, x->c, x->lo, x->hi);
    pthread_barrier_wait(x->bar);
    if (x->id == 0) x->seconds[r] = now() - t0;
  }
  return NULL;
}

/* Fills seconds[0..reps) with the time of each pass over n floats; 0 on success. */
int pt_stream(int kind, int threads, long n, int reps, double *seconds) {
#if PROBE_ISA <= 1
  if (kind == TRIAD_NT) return 2;
#endif
  if (threads < 1 || threads > MAX_THREADS) return 1;
  n -= n % (LANES * threads * 16);
  size_t bytes = (size_t)n * sizeof(float);
  float *a = aligned_alloc(64, bytes), *b = aligned_alloc(64, bytes), *c = aligned_alloc(64, bytes);
  if (!a || !b || !c) { free(a); free(b); free(c); return 3; }
  pthread_t tid[MAX_THREADS];
  stream_arg arg[MAX_THREADS];
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, (unsigned)threads);
  long chunk = n / threads;
  int status = 0;
  for (int t = 0; t < threads; ++t) {
    arg[t] = (stream_arg){a, b, c, t * chunk, (t + 1) * chunk, kind, reps, t, &bar, seconds};
    if (pthread_create(&tid[t], NULL, stream_thread, &arg[t]) != 0) { status = 4; threads = t; break; }
  }
  for (int t = 0; t < threads; ++t) pthread_join(tid[t], NULL);
  pthread_barrier_destroy(&bar);
  free(a); free(b); free(c);
  return status;
}
"""

# Bytes STREAM counts per element and pass (no write-allocate traffic).
_STREAM_BYTES = {"copy": 8, "triad": 12, "triad_nt": 12}
_STREAM_KIND = {"copy": 0, "triad": 1, "triad_nt": 2}


@dataclass(frozen=True)
class Peak:
    isa: str                          # "avx512", "avx2" or "scalar"
    threads: int                      # cores used for the all-core figures
    fma_gflops: dict[int, float]      # threads -> median GFLOP/s (fp32, FMA = 2 flops)
    bandwidth: dict[str, float]       # "copy", "triad", "triad_nt", "triad_1t" -> median GB/s
    array_mib: float                  # size of each STREAM array
    spread: dict[str, tuple[float, float]] = field(default_factory=dict)  # name -> (min, max)

    @property
    def flops_peak(self) -> float:
        """The highest FMA rate: all cores, unless another process held one of them."""
        return max(self.fma_gflops.values())

    @property
    def bandwidth_peak(self) -> float:
        return max(self.bandwidth.values())

    def lines(self) -> list[str]:
        """Human-readable summary, one fact per line."""
        out = [f"FMA fp32 ({self.isa}): " + ", ".join(
            f"{v:.1f} GFLOP/s with {t} thread{'s' if t > 1 else ''}{self._range(f'fma_{t}t')}"
            for t, v in sorted(self.fma_gflops.items()))]
        names = {"copy": f"copy ({self.threads} threads)", "triad": f"triad ({self.threads} threads)",
                 "triad_nt": f"triad with streaming stores ({self.threads} threads)",
                 "triad_1t": "triad (1 thread)"}
        out.append("bandwidth: " + ", ".join(f"{names[k]} {v:.1f} GB/s{self._range(k)}"
                                             for k, v in self.bandwidth.items())
                   + f"; arrays of {self.array_mib:.0f} MiB")
        return out

    def _range(self, name: str) -> str:
        if name not in self.spread:
            return ""
        lo, hi = self.spread[name]
        return f" (runs {lo:.1f}–{hi:.1f})"


def host_isa(features: frozenset[str]) -> str:
    if {"avx512f", "fma"} <= features:
        return "avx512"
    if {"avx2", "fma"} <= features:
        return "avx2"
    return "scalar"


_ISA_FLAGS = {"avx512": ("-DPROBE_ISA=512", "-mavx512f", "-mfma"),
              "avx2": ("-DPROBE_ISA=256", "-mavx2", "-mfma"),
              "scalar": ("-DPROBE_ISA=1",)}


def last_level_cache_bytes() -> int:
    """The largest cache of CPU 0 per sysfs; 32 MiB where sysfs does not say."""
    best = 0
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for index in base.glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            best = max(best, int(digits) * scale)
    return best or 32 << 20


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def measure_peak(*, repeats: int = 5, fma_seconds: float = 0.2,
                 array_bytes: int | None = None) -> Peak:
    """Compile the probes and run them; raises BuildError/OSError when they cannot run."""
    from polytile.config import load_config
    from polytile.runtime.build import build_shared_object
    from polytile.runtime.toolchain import detect_toolchain
    from polytile.targets.target import host_features

    isa = host_isa(host_features())
    toolchain = detect_toolchain(load_config())
    # -fno-tree-loop-distribute-patterns: keep the copy loop a loop, not a memcpy call
    # whose large-size path uses streaming stores. -fno-tree-vectorize only matters for
    # the scalar probe, which must stay scalar.
    flags = ("-O2", "-pthread", "-fno-tree-loop-distribute-patterns", *_ISA_FLAGS[isa],
             *(("-fno-tree-vectorize",) if isa == "scalar" else ()))
    threads = usable_cores()
    with tempfile.TemporaryDirectory(prefix="polytile-peak-") as tmp:
        lib = ctypes.CDLL(str(build_shared_object(_SOURCE, flags, toolchain,
                                                  Path(tmp, "peak.so")).so_path))
    lib.pt_fma.restype = ctypes.c_double
    lib.pt_fma.argtypes = (ctypes.c_int, ctypes.c_long, ctypes.POINTER(ctypes.c_float))
    lib.pt_stream.restype = ctypes.c_int
    lib.pt_stream.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_int,
                              ctypes.POINTER(ctypes.c_double))
    lanes, chains = lib.pt_lanes(), lib.pt_chains()
    spread: dict[str, tuple[float, float]] = {}
    fma: dict[int, float] = {}
    for t in sorted({1, threads}):
        rates = _fma_rates(lib, t, lanes * chains * 2, repeats, fma_seconds)
        fma[t] = statistics.median(rates)
        spread[f"fma_{t}t"] = (min(rates), max(rates))
    if array_bytes is None:
        array_bytes = min(1 << 30, max(64 << 20, 4 * last_level_cache_bytes()))
    n = array_bytes // 4
    bandwidth: dict[str, float] = {}
    for name, t in (("copy", threads), ("triad", threads), ("triad_nt", threads),
                    ("triad_1t", 1)):
        kind = name.removesuffix("_1t")
        seconds = (ctypes.c_double * repeats)()
        status = lib.pt_stream(_STREAM_KIND[kind], t, n, repeats, seconds)
        if status == 2:   # no streaming stores in the scalar probe
            continue
        if status != 0:
            raise OSError(f"STREAM probe failed (status {status}; out of memory?)")
        rates = [_STREAM_BYTES[kind] * n / s / 1e9 for s in seconds]
        bandwidth[name] = statistics.median(rates)
        spread[name] = (min(rates), max(rates))
    return Peak(isa, threads, fma, bandwidth, array_bytes / (1 << 20), spread)


def _fma_rates(lib: ctypes.CDLL, threads: int, flops_per_iter: int, repeats: int,
               seconds: float) -> list[float]:
    sink = ctypes.c_float()
    iters = 1 << 16
    while True:   # calibrate so one run lasts about `seconds`
        elapsed = lib.pt_fma(threads, iters, ctypes.byref(sink))
        if elapsed < 0:
            raise OSError("FMA probe could not start its threads")
        if elapsed >= seconds / 4 or iters >= 1 << 40:
            break
        iters *= 4
    iters = max(1, int(iters * seconds / max(elapsed, 1e-9)))
    rates = []
    for _ in range(repeats):
        elapsed = lib.pt_fma(threads, iters, ctypes.byref(sink))
        rates.append(threads * iters * flops_per_iter / elapsed / 1e9)
    return rates
