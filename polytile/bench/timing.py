"""Timing that holds on a noisy 2-core machine (issue 4).

    timings = time_blocks({"polytile": lambda: f(x), "numpy": lambda: g(x)}, rounds=5)
    timings["numpy"].median, timings["numpy"].p10, timings["numpy"].p90   # seconds per call

Each implementation is timed in blocks, never call by call against another: OpenBLAS
and OpenMP worker threads keep spinning for about 0.1 s after each call and would
steal the other core from whichever implementation runs next. So a block is

    settle (sleep, so the previous block's worker threads go idle)
    -> a few discarded calls (caches, thread wake-up)
    -> timed calls, about `block_seconds` in all

and the order of the implementations rotates from round to round, so none always
runs first or right after a given other one. The calls per block adapt to the
implementation's speed; calls shorter than `min_sample_seconds` are timed in groups
so that the clock's own cost stays out of the samples.

Work that runs asynchronously (GPU kernels) is timed by passing `synchronize`, which
waits for the device: it is called before calibrating, after each calibrating call,
after a block's discarded calls and at the end of every timed group, before the clock
is read, so a sample is the kernels' time, not their launches'.
"""
from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Timing:
    """Seconds per call: one sample per timed call (or per group of very short calls)."""

    samples: tuple[float, ...]
    calls: int            # timed calls in all

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def p10(self) -> float:
        return percentile(self.samples, 10)

    @property
    def p90(self) -> float:
        return percentile(self.samples, 90)


@dataclass(frozen=True)
class TimingOptions:
    rounds: int = 5
    block_seconds: float = 0.2
    settle_seconds: float = 0.15
    discard_calls: int = 2
    min_sample_seconds: float = 50e-6
    max_calls_per_block: int = 200_000
    # Implementations slower than this per call take part in only `slow_rounds` rounds,
    # so a slow kernel cannot make the bench run for minutes.
    slow_call_seconds: float = 1.0
    slow_rounds: int = 3
    # A block that runs this many times longer than planned (the calls got slower than
    # calibrated, e.g. another process took a core) ends early.
    block_limit: float = 4.0

    @staticmethod
    def for_run(quick: bool, repeats: int | None) -> TimingOptions:
        """The bench's options: short blocks for a quick smoke run, `repeats` rounds."""
        if quick:
            return TimingOptions(rounds=repeats or 3, block_seconds=0.05, settle_seconds=0.05,
                                 discard_calls=1)
        return TimingOptions(rounds=repeats or 5)


def percentile(samples: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (NumPy's default method), q in [0, 100]."""
    ordered = sorted(samples)
    if not ordered:
        raise ValueError("no samples")
    position = (len(ordered) - 1) * q / 100.0
    lo = math.floor(position)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (position - lo)


@dataclass(frozen=True)
class _Plan:
    calls_per_sample: int
    samples_per_block: int
    discard: int
    rounds: int


def rotation(names: Sequence[str], round_index: int) -> list[str]:
    """The order of `names` in round `round_index`: rotated left by the round number."""
    if not names:
        return []
    shift = round_index % len(names)
    return [*names[shift:], *names[:shift]]


def time_blocks(impls: Mapping[str, Callable[[], object]],
                options: TimingOptions = TimingOptions(), *,
                clock: Callable[[], float] = time.perf_counter,
                sleep: Callable[[float], None] = time.sleep,
                synchronize: Callable[[], object] = lambda: None) -> dict[str, Timing]:
    """Time every implementation in blocks, rotating their order between rounds.

    Each implementation must already be warm (compiled, first call made); one more
    call here calibrates the block. An exception from an implementation propagates.
    `synchronize` waits for asynchronous work (see the module docstring).
    """
    names = list(impls)
    plans = {name: _calibrate(impls[name], options, clock, synchronize) for name in names}
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(options.rounds):
        for name in rotation(names, r):
            plan = plans[name]
            if r >= plan.rounds:
                continue
            sleep(options.settle_seconds)
            samples[name].extend(_block(impls[name], plan, clock,
                                        options.block_limit * options.block_seconds,
                                        synchronize))
    return {name: Timing(tuple(samples[name]),
                         len(samples[name]) * plans[name].calls_per_sample) for name in names}


def _calibrate(fn: Callable[[], object], options: TimingOptions,
               clock: Callable[[], float], synchronize: Callable[[], object]) -> _Plan:
    """Estimate one call's time: the median of as many calls as fit in a tenth of a block.

    The median, so that one call that lost its core to another process does not make
    every later block of this implementation a few calls long.
    """
    times: list[float] = []
    synchronize()       # work queued before timing (the checking call) ends off the clock
    start = clock()
    while not times or (clock() - start < options.block_seconds / 10 and len(times) < 1000):
        t = clock()
        fn()
        synchronize()
        times.append(clock() - t)
    per_call = max(statistics.median(times), 1e-9)
    per_sample = max(1, math.ceil(options.min_sample_seconds / per_call))
    per_block = min(options.max_calls_per_block,
                    max(1, round(options.block_seconds / per_call)))
    samples = max(1, per_block // per_sample)
    discard = options.discard_calls if per_call * 2 < options.block_seconds else 0
    rounds = options.rounds if per_call < options.slow_call_seconds else min(
        options.rounds, options.slow_rounds)
    return _Plan(per_sample, samples, discard, max(1, rounds))


def _block(fn: Callable[[], object], plan: _Plan, clock: Callable[[], float],
           limit_seconds: float, synchronize: Callable[[], object]) -> list[float]:
    """Discarded calls, then the timed samples; cut short after `limit_seconds`."""
    for _ in range(plan.discard):
        fn()
    synchronize()       # the discarded calls' work must not end inside the first sample
    out = []
    group = range(plan.calls_per_sample)
    begin = clock()
    for _ in range(plan.samples_per_block):
        start = clock()
        for _ in group:
            fn()
        synchronize()
        end = clock()
        out.append((end - start) / plan.calls_per_sample)
        if end - begin > limit_seconds:
            break
    return out
