"""Run one workload: check every implementation against NumPy, then time them together.

    rows = run_workload(workload, backend="c", options=TimingOptions())
    rows[0].outcomes["polytile"].status      # "ok", "WRONG", "FAILED" or "n/a"

A memory-bound workload gives two rows: fresh outputs, and preallocated `out=` buffers
(filled with NaN before the checking call, so an element the kernel never writes is
caught). Nothing here raises for a broken implementation: a compile error or an
exception becomes FAILED with the error text, a result off by more than the stated
tolerance becomes WRONG, and the other implementations are still timed.

"torch.compile" is the workload's PyTorch version through `torch.compile` (inductor),
compiled once per workload by its first call, whose time is kept apart from the timing
as the outcome's `compile_seconds`. When compiling fails (no C++ compiler, an inductor
error) the implementation is n/a with the error as the reason, not FAILED: the compiler
of the comparison is missing, not an implementation broken.

On a cuda target (a GPU run, polytile.bench.device) the inputs are placed on the device
once, polytile and torch eager are called on them and every timed group ends with a
device synchronize; the outputs of the checking call are copied back and compared with
the NumPy reference, which is not timed; torch.compile is not run.
"""
from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from polytile.bench.device import Placed, host_arrays, on_cuda, place_inputs
from polytile.bench.timing import Timing, TimingOptions, time_blocks
from polytile.bench.workload import Arrays, Workload

COMPILED = "torch.compile"
IMPLS = ("polytile", "numpy", "torch", COMPILED)
FRESH, PREALLOCATED = "fresh", "out="


@dataclass(frozen=True)
class Outcome:
    """What one implementation did in one row."""

    status: str                 # "ok", "WRONG", "FAILED", "n/a"
    detail: str = ""            # error text, mismatch summary, or why n/a
    timing: Timing | None = None
    compile_seconds: float | None = None    # torch.compile's first call, kept out of timing


@dataclass(frozen=True)
class Row:
    workload: Workload
    variant: str                # FRESH or PREALLOCATED
    outcomes: dict[str, Outcome]

    @property
    def label(self) -> str:
        return self.workload.name + (" out=" if self.variant == PREALLOCATED else "")

    def seconds(self, impl: str) -> float | None:
        outcome = self.outcomes.get(impl)
        return outcome.timing.median if outcome and outcome.timing else None


@dataclass
class _Impl:
    call: Callable[[], Any]
    results: Callable[[Any], Arrays]      # the call's return value -> NumPy arrays
    reset: Callable[[], None] = lambda: None   # before the checking call (NaN-fill out=)
    compile_seconds: float | None = None


@dataclass(frozen=True)
class _Compiled:
    """torch.compile's version after its first (compiling) call, or why there is none."""

    call: Callable[..., Any] | None
    seconds: float | None = None
    error: str = ""


def run_workload(workload: Workload, *, backend: str = "c", target: str | None = None,
                 options: TimingOptions | None = None, use_torch: bool = True,
                 use_compile: bool = True, seed: int = 0,
                 clock: Callable[[], float] | None = None,
                 sleep: Callable[[float], None] | None = None) -> list[Row]:
    """Check and time `workload`; one row per variant."""
    args = workload.make_inputs(np.random.default_rng(seed))
    expected = as_tuple(workload.numpy(*args))
    function, compile_error = polytile_function(workload, backend, target)
    placed = place_inputs(args, use_torch) if on_cuda(target) else None
    torch_args = (_torch_inputs(args) if placed is None and use_torch
                  and workload.torch is not None else None)
    compiled = (_compile_torch(workload.torch, torch_args)
                if use_compile and torch_args is not None and workload.torch is not None
                else None)
    # A GPU run has no out= rows: its outputs are allocated on the device per call.
    variants = (FRESH, PREALLOCATED) if workload.memory_bound and not placed else (FRESH,)
    options = options or TimingOptions()
    timing_kw: dict[str, Any] = {k: v for k, v in (("clock", clock), ("sleep", sleep)) if v}
    if placed is not None:
        timing_kw["synchronize"] = placed.synchronize
    rows = []
    for variant in variants:
        if placed is not None:
            impls, outcomes = _device_impls(workload, placed, function)
        else:
            impls, outcomes = _impls(workload, variant, args, expected, function, torch_args,
                                     compiled)
            outcomes.update(_unused(workload, torch_args, use_torch, impls, outcomes))
        if compile_error is not None:
            outcomes["polytile"] = Outcome("FAILED", compile_error)
        for name, impl in impls.items():
            outcomes[name] = _check(impl, expected, workload)
        runnable = {n: impls[n].call for n in IMPLS
                    if n in impls and outcomes[n].status in ("ok", "WRONG")}
        for name, timing in _time(runnable, options, outcomes, timing_kw).items():
            outcomes[name] = replace(outcomes[name], timing=timing)
        rows.append(Row(workload, variant, {n: outcomes[n] for n in IMPLS}))
    del args, expected, torch_args, compiled, placed
    gc.collect()
    return rows


def as_tuple(value: Any) -> Arrays:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def compare(got: Arrays, expected: Arrays, rtol: float, atol: float) -> Outcome:
    """ok, or WRONG with how many elements are off and by how much."""
    if len(got) != len(expected):
        return Outcome("WRONG", f"{len(got)} outputs, expected {len(expected)}")
    for i, (g, e) in enumerate(zip(got, expected)):
        g = np.asarray(g)
        if g.shape != e.shape:
            return Outcome("WRONG", f"output {i} has shape {g.shape}, expected {e.shape}")
        close = np.isclose(g, e, rtol=rtol, atol=atol)
        if not close.all():
            bad = int(close.size - np.count_nonzero(close))
            with np.errstate(invalid="ignore"):
                diff = np.abs(g.astype(np.float64) - e)
            finite = diff[np.isfinite(diff)]
            err = float(finite.max()) if finite.size else float("nan")
            nans = int(np.count_nonzero(np.isnan(g) & ~np.isnan(e)))
            what = f", {nans} NaN" if nans else ""
            return Outcome("WRONG", f"output {i}: {bad} of {close.size} elements off{what}, "
                           f"max |err| {err:.3g} (rtol {rtol:g}, atol {atol:g})")
    return Outcome("ok")


def error_text(error: BaseException) -> str:
    from polytile.errors import PolytileError
    if isinstance(error, PolytileError):
        return error.render()
    return f"{type(error).__name__}: {error}"


# ------------------------------------------------------------------ building the impls
def polytile_function(workload: Workload, backend: str, target: str | None = None
                      ) -> tuple[Any, str | None]:
    """What the polytile column calls with the workload's inputs, or why there is none."""
    try:
        import polytile
        if workload.einsum:
            if target is not None:
                return None, f"pt.einsum runs on the configured target, not {target}"
            return _einsum(workload, backend), None
        return polytile.define(workload.tc, backend=backend,
                               target=target)[workload.function], None
    except Exception as e:  # noqa: BLE001 - any failure is a FAILED row, never a crash
        return None, error_text(e)


def _einsum(workload: Workload, backend: str) -> Any:
    """The workload through pt.einsum (its per-call work included), called as the TC
    function would be: the last inputs are the tables."""
    from polytile.einsum import compile_einsum, einsum

    n = len(workload.tables)
    if backend != "c":
        def interpreted(*inputs: Any) -> Any:
            operands = inputs[:len(inputs) - n]
            program = compile_einsum(workload.einsum, tuple(str(a.dtype) for a in operands),
                                     tuple((t, str(a.dtype)) for t, a in
                                           zip(workload.tables, inputs[len(inputs) - n:])),
                                     backend)
            return program(*operands, **dict(zip(workload.tables, inputs[len(inputs) - n:])))
        return interpreted

    def run(*inputs: Any) -> Any:
        return einsum(workload.einsum, *inputs[:len(inputs) - n],
                      **dict(zip(workload.tables, inputs[len(inputs) - n:])))
    return run


def _torch_inputs(args: Arrays) -> tuple[Any, ...] | None:
    try:
        import torch
    except ImportError:
        return None
    return tuple(torch.from_numpy(a) for a in args)


def _compile_torch(fn: Callable[..., Any], torch_args: tuple[Any, ...]) -> _Compiled:
    """torch.compile(fn), compiled by one call on the workload's inputs."""
    try:
        import torch._dynamo
        # Workloads of one family share their lambdas' code objects; without a reset,
        # dynamo would see a second size of the same code and recompile it for dynamic
        # shapes, a slower kernel than the first size got.
        torch._dynamo.reset()
        compiled = torch.compile(fn)
        start = time.perf_counter()
        compiled(*torch_args)
        return _Compiled(compiled, time.perf_counter() - start)
    except Exception as e:  # noqa: BLE001 - a missing compiler is n/a, never a crash
        return _Compiled(None, error="failed to compile: " + error_text(e))


def _impls(workload: Workload, variant: str, args: Arrays, expected: Arrays, function: Any,
           torch_args: tuple[Any, ...] | None, compiled: _Compiled | None
           ) -> tuple[dict[str, _Impl], dict[str, Outcome]]:
    impls: dict[str, _Impl] = {}
    missing: dict[str, Outcome] = {}
    if variant == FRESH:
        if function is not None:
            impls["polytile"] = _Impl(lambda: function(*args), as_tuple)
        impls["numpy"] = _Impl(lambda: workload.numpy(*args), as_tuple)
        torch_fn = workload.torch
        if torch_args is not None and torch_fn is not None:
            impls["torch"] = _Impl(lambda: torch_fn(*torch_args), host_arrays)
            if compiled is not None and compiled.call is not None:
                compiled_fn = compiled.call
                impls[COMPILED] = _Impl(lambda: compiled_fn(*torch_args), host_arrays,
                                        compile_seconds=compiled.seconds)
            elif compiled is not None:
                missing[COMPILED] = Outcome("n/a", compiled.error)
    else:
        if function is not None:
            impls["polytile"] = _preallocated(lambda out: function(*args, out=out), expected)
        numpy_out = workload.numpy_out
        if numpy_out is not None:
            impls["numpy"] = _preallocated(lambda out: numpy_out(*args, out=out), expected)
        else:
            missing["numpy"] = Outcome("n/a", "no out= version")
        if torch_args is not None and workload.torch_out is not None:
            impls["torch"] = _torch_preallocated(workload, torch_args, expected)
        elif torch_args is not None:
            missing["torch"] = Outcome("n/a", "no out= version in torch eager")
        if compiled is not None:
            missing[COMPILED] = Outcome("n/a", "no out= version")
    return impls, missing


def _device_impls(workload: Workload, placed: Placed, function: Any
                  ) -> tuple[dict[str, _Impl], dict[str, Outcome]]:
    """A GPU run's implementations (polytile.bench.device): polytile and torch eager on the
    same device inputs; NumPy only checks, torch.compile is not run."""
    impls: dict[str, _Impl] = {}
    missing = {"numpy": Outcome("n/a", "not timed in a GPU run (the reference only checks)"),
               COMPILED: Outcome("n/a", "not run in a GPU run: the baseline is torch eager "
                                        "(cuBLAS, cuDNN)")}
    if function is not None:
        impls["polytile"] = _Impl(lambda: function(*placed.inputs), host_arrays)
    torch_fn, torch_args = workload.torch, placed.torch_inputs
    if torch_fn is not None and torch_args is not None:
        impls["torch"] = _Impl(lambda: torch_fn(*torch_args), host_arrays)
    else:
        missing["torch"] = Outcome("n/a", "no torch version" if torch_fn is None
                                   else placed.torch_missing)
    return impls, missing


def _unused(workload: Workload, torch_args: tuple[Any, ...] | None, use_torch: bool,
            impls: dict[str, _Impl], outcomes: dict[str, Outcome]) -> dict[str, Outcome]:
    """n/a, with the reason, for the torch implementations that took no part."""
    # The last reason can only be torch.compile's: eager takes part once its inputs exist.
    reason = ("torch not used" if not use_torch else "no torch version" if workload.torch is None
              else "torch not installed" if torch_args is None else "not used")
    return {name: Outcome("n/a", reason) for name in ("torch", COMPILED)
            if name not in impls and name not in outcomes}


def _preallocated(call: Callable[[Arrays], Any], expected: Arrays) -> _Impl:
    buffers = tuple(np.empty_like(e) for e in expected)

    def reset() -> None:
        for b in buffers:
            b.fill(np.nan)
    return _Impl(lambda: call(buffers), lambda _: buffers, reset)


def _torch_preallocated(workload: Workload, torch_args: tuple[Any, ...],
                        expected: Arrays) -> _Impl:
    import torch
    buffers = tuple(torch.empty(e.shape, dtype=torch.from_numpy(e).dtype) for e in expected)
    assert workload.torch_out is not None
    torch_out = workload.torch_out

    def reset() -> None:
        for b in buffers:
            b.fill_(float("nan"))
    return _Impl(lambda: torch_out(*torch_args, out=buffers),
                 lambda _: tuple(b.numpy() for b in buffers), reset)


# ------------------------------------------------------------------ checking and timing
def _check(impl: _Impl, expected: Arrays, workload: Workload) -> Outcome:
    """The first call (for polytile: the compile) and its comparison with NumPy."""
    try:
        impl.reset()
        got = impl.results(impl.call())
    except Exception as e:  # noqa: BLE001
        return Outcome("FAILED", error_text(e), compile_seconds=impl.compile_seconds)
    return replace(compare(got, expected, workload.rtol, workload.atol),
                   compile_seconds=impl.compile_seconds)


def _time(runnable: dict[str, Callable[[], Any]], options: TimingOptions,
          outcomes: dict[str, Outcome], timing_kw: dict[str, Any]) -> dict[str, Timing]:
    """time_blocks over the runnable impls; one that raises is FAILED and the rest retried."""
    while runnable:
        failed: list[tuple[str, BaseException]] = []

        def guarded(name: str, fn: Callable[[], Any],
                    failed: list[tuple[str, BaseException]] = failed) -> Callable[[], Any]:
            def call() -> Any:
                try:
                    return fn()
                except Exception as e:
                    failed.append((name, e))
                    raise
            return call
        try:
            return time_blocks({n: guarded(n, f) for n, f in runnable.items()}, options,
                               **timing_kw)
        except Exception as e:  # noqa: BLE001
            name, error = failed[0] if failed else (next(iter(runnable)), e)
            outcomes[name] = Outcome("FAILED", "raised while timed: " + error_text(error))
            runnable = {n: f for n, f in runnable.items() if n != name}
    return {}
