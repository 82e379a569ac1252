"""The profiling process: loads candidate kernels one at a time, checks each one's
output once, and times it. It runs apart from the tuner (polytile.tune.measure
starts it), so a candidate that crashes or hangs takes only this process down.

Protocol on stdin / a private copy of stdout: length-prefixed pickles. First a
RunnerSetup, answered by "ready"; then one (backend, so_path, fn, prune_seconds) per
candidate, answered by a RunReport; None ends the process. Anything the kernels
print goes to stderr: stdout is moved away before any kernel is loaded.

Timing: the inputs and outputs are copied into enough sets to cover
`RunSettings.rotate_bytes`, and consecutive calls use consecutive sets, so a
small kernel does not find its operands in cache from the previous call. After
`warmup` calls, each sample times as many calls as last `min_sample_seconds`;
the result is the median of the samples, with p90 - p10 as the spread.
"""
from __future__ import annotations

import math
import os
import pickle
import struct
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from polytile.tune.lifetime import die_with_parent

if TYPE_CHECKING:
    from polytile.ir import nodes as N

_HEADER = struct.Struct("<Q")
PRUNE_MIN_SECONDS = 0.01     # below this, timing a candidate fully costs little anyway


@dataclass(frozen=True)
class RunSettings:
    timeout: float = 20.0          # seconds for one candidate's check and timing
    warmup: int = 2
    repeats: int = 7               # samples; the median of these is the candidate's time
    min_sample_seconds: float = 2e-3
    max_seconds: float = 1.0       # timing stops after this (with at least 3 samples)
    prune_factor: float = 20.0     # a check call this much slower than the best: not timed
    rtol: float = 1e-3
    atol: float = 1e-4             # times the largest |expected| value
    rotate_bytes: int = 64 << 20


@dataclass(frozen=True)
class RunnerSetup:
    params: tuple[np.ndarray, ...]      # inputs and scalars (0-d arrays), kernel order
    initial: tuple[np.ndarray, ...]     # outputs before the call
    inout: tuple[bool, ...]             # per output: read before written
    expected: tuple[np.ndarray, ...]    # per output, from the reference interpreter
    settings: RunSettings


@dataclass(frozen=True)
class RunReport:
    status: str                 # "ok", "wrong" or "error" (crash and timeout: the parent)
    median: float | None = None
    spread: float | None = None
    samples: int = 0
    detail: str = ""


def send(fd: int, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def recv(stream: BinaryIO) -> Any:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError
    (size,) = _HEADER.unpack(header)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError
    return pickle.loads(data)


def main(parent: int | None = None) -> None:
    if parent is not None:
        die_with_parent(parent)
    out = os.dup(1)
    os.dup2(2, 1)
    stdin = sys.stdin.buffer
    setup: RunnerSetup = recv(stdin)
    sets = _rotating_sets(setup)
    send(out, "ready")
    while True:
        try:
            job = recv(stdin)
        except EOFError:
            return
        if job is None:
            return
        backend, so_path, fn, prune_seconds = job
        send(out, measure(backend, so_path, fn, prune_seconds, setup, sets))


def rotation_copies(one_set_bytes: int, rotate_bytes: int) -> int:
    """How many sets of a call's buffers cover `rotate_bytes` (at least 1, at most 256)."""
    return max(1, min(256, math.ceil(rotate_bytes / max(one_set_bytes, 1))))


def _rotating_sets(setup: RunnerSetup) -> list[list[np.ndarray]]:
    one = sum(a.nbytes for a in setup.params + setup.initial)
    copies = rotation_copies(one, setup.settings.rotate_bytes)
    return [[a.copy() for a in setup.params] + [o.copy() for o in setup.initial]
            for _ in range(copies)]


def measure(backend: str, so_path: str, fn: N.Function, prune_seconds: float | None,
            setup: RunnerSetup, sets: list[list[np.ndarray]]) -> RunReport:
    from pathlib import Path

    from polytile.backends import backend_named
    kernel = backend_named(backend).load(Path(so_path), fn)
    settings = setup.settings
    first = sets[0]
    outputs = first[len(setup.params):]
    for out, init, inout in zip(outputs, setup.initial, setup.inout):
        if inout:
            out[...] = init
        else:
            _poison(out)
    start = time.perf_counter()
    failure = kernel(first)
    check_seconds = time.perf_counter() - start
    if failure is not None:
        return RunReport("error", detail=f"the kernel reported a failed run-time check: "
                                         f"{failure}")
    for k, (out, expected) in enumerate(zip(outputs, setup.expected)):
        problem = _mismatch(out, expected, settings)
        if problem:
            return RunReport("wrong", detail=f"output {k}: {problem}")
    if prune_seconds is not None and check_seconds > max(prune_seconds, PRUNE_MIN_SECONDS):
        # The check call was cold (page faults, thread start): judge by a warm one.
        start = time.perf_counter()
        kernel(sets[1 % len(sets)])
        warm = time.perf_counter() - start
        if warm > max(prune_seconds, PRUNE_MIN_SECONDS):
            return RunReport("ok", warm, None, 1, f"one call took {warm:.3g} s: too slow to "
                                                  f"time further")
    return _time(kernel, sets, settings, check_seconds)


def _time(kernel: Any, sets: list[list[np.ndarray]], settings: RunSettings,
          estimate: float) -> RunReport:
    calls = 0
    warm_start = time.perf_counter()
    for _ in range(settings.warmup):
        kernel(sets[calls % len(sets)])
        calls += 1
    if settings.warmup:
        estimate = (time.perf_counter() - warm_start) / settings.warmup
    group = max(1, math.ceil(settings.min_sample_seconds / max(estimate, 1e-9)))
    samples: list[float] = []
    begin = time.perf_counter()
    while len(samples) < settings.repeats:
        start = time.perf_counter()
        for _ in range(group):
            kernel(sets[calls % len(sets)])
            calls += 1
        end = time.perf_counter()
        samples.append((end - start) / group)
        if len(samples) >= 3 and end - begin > settings.max_seconds:
            break
    ordered = sorted(samples)
    median = _percentile(ordered, 50)
    return RunReport("ok", median, _percentile(ordered, 90) - _percentile(ordered, 10),
                     len(samples))


def _percentile(ordered: list[float], q: float) -> float:
    position = (len(ordered) - 1) * q / 100.0
    lo = math.floor(position)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (position - lo)


def _poison(out: np.ndarray) -> None:
    """Fill an output so an element the kernel never writes shows up as wrong."""
    if out.dtype.kind == "f":
        out.fill(np.nan)
    elif out.dtype.kind in "iu":
        out.fill(np.iinfo(out.dtype).max)
    elif out.dtype.kind == "b":
        out.fill(True)
    else:
        out.fill(0)


def _mismatch(out: np.ndarray, expected: np.ndarray, settings: RunSettings) -> str:
    if out.dtype.kind not in "fc":
        bad = out != expected
        return f"{int(bad.sum())} elements differ from the reference" if bad.any() else ""
    actual = out.astype(np.float64)
    want = expected.astype(np.float64)
    finite = np.isfinite(want)
    scale = float(np.abs(want[finite]).max()) if finite.any() else 1.0
    close = np.isclose(actual, want, rtol=settings.rtol, atol=settings.atol * max(scale, 1.0),
                       equal_nan=True)
    if close.all():
        return ""
    k = int(np.argmin(close.reshape(-1)))
    return (f"{int((~close).sum())} of {close.size} elements differ from the reference, "
            f"e.g. {float(actual.reshape(-1)[k]):.6g} instead of {float(want.reshape(-1)[k]):.6g}")


if __name__ == "__main__":
    main()
