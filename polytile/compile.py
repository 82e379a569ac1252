"""The compilation pipeline for one specialized function, every step named:

    specialized Program
      -> canonical      alpha-rename tensors and indices (cache hits survive renaming)
      -> lower          Stripe blocks, one per statement
      -> passes         the target's pipeline (polytile.passes)
      -> key            hash of the printed IR + signature + target + flags + compiler
                        (pass options: the caller's, else the tuned ones for the TuningKey)
      -> backend        the target's backend (polytile.backends): its stages' texts
                        (C source) and its build, only on a cache miss; its loader
"""
from __future__ import annotations

import hashlib
import json
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from polytile.config import Config
from polytile.dtypes import overflow_limit, scalar_problem
from polytile.analysis.overwrite import overwritten_first
from polytile.backends import Backend, Generated, backend_for
from polytile.codegen.cabi import ERR_INDEX, ERR_NOMEM
from polytile.errors import (ArgumentError, BuildError, KernelError, OutOfBoundsError,
                             PolytileError, TuningEntryWarning, UnsupportedError)
from polytile.ir import nodes as N
from polytile.ir.lower import lower
from polytile.ir.printer import format_function
from polytile.runtime.cache import KernelCache, LoadedLibrary
from polytile.runtime.cuda import Device
from polytile.runtime.cuda_memory import DeviceBuffer, pointer_device
from polytile.runtime.files import sha256_text
from polytile.runtime.kernel import KernelFailure, Runnable
from polytile.runtime.key import CacheKey
from polytile.runtime.pool import OutputPool, output_pool
from polytile.runtime.sanitize import missing_runtime
from polytile.sema.canonical import canonical
from polytile.sema.specialize import Specialized
from polytile.targets.target import Target

_CACHES: dict[Config, KernelCache] = {}


def kernel_cache(config: Config) -> KernelCache:
    """One cache per configuration and process, made on first use."""
    cache = _CACHES.get(config)
    if cache is None:
        cache = _CACHES.setdefault(config, KernelCache(config))
    return cache


@dataclass(frozen=True)
class TuningKey:
    """What a tuning result is valid for (TC §6.1): the compilation-cache key minus the
    options. Neither flags (the target decides them) nor polytile's own source hash are
    part of it: tuned options are decisions replayed through the current passes, not
    binaries, so they outlive a change of the compiler's source."""

    program: str      # sha256 of the lowered IR, before the passes that options steer
    signature: str    # shapes, dtypes and integer scalars
    target: str       # Target.identity
    compiler: str     # Toolchain.identity

    def parts(self) -> dict[str, str]:
        return asdict(self)

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.parts(), sort_keys=True).encode()).hexdigest()


# Tuned pass options for a key (polytile.tune.database.lookup), or None.
TunedLookup = Callable[[TuningKey], dict[str, Any] | None]


@dataclass(frozen=True)
class Built:
    """One specialized function through the pipeline and the build cache."""

    fn: N.Function        # the optimized IR
    key: CacheKey
    library: LoadedLibrary


@dataclass
class Compiler:
    config: Config
    target: Target
    options: dict[str, Any] = field(default_factory=dict)
    # Consulted when `options` is empty: the best options the tuner stored for the
    # function's TuningKey. None: the heuristics only.
    tuned: TunedLookup | None = None

    def optimize(self, fn: N.Function, options: dict[str, Any] | None = None) -> N.Function:
        from polytile.passes.pipeline import run_pipeline
        return run_pipeline(fn, self.target, self.options if options is None else options)

    def ir(self, spec: Specialized) -> N.Function:
        return self.optimized(spec, lower(canonical(spec)))[0]

    def tuning_key(self, spec: Specialized, lowered: N.Function | None = None) -> TuningKey:
        lowered = lowered if lowered is not None else lower(canonical(spec))
        return TuningKey(sha256_text(format_function(lowered)), _signature(spec),
                         self.target.identity, kernel_cache(self.config).toolchain.identity)

    def optimized(self, spec: Specialized, lowered: N.Function
                  ) -> tuple[N.Function, dict[str, Any]]:
        """The optimized IR and the options it was made with: the caller's (an error in
        them is raised), else the tuned ones, else none (the heuristics). A stored entry
        that cannot be applied is reported once, as a TuningEntryWarning, and the
        heuristics are used: one bad row must not break every call of its shapes."""
        if self.options or self.tuned is None:
            options = self.planned(spec, self.options)
            optimized = self.optimize(lowered, options)
            return (_verified(optimized) if self.options else optimized), options
        key = self.tuning_key(spec, lowered)
        tuned = self.tuned(key) or {}
        if tuned:
            try:
                tuned = self.planned(spec, tuned)
                return _verified(self.optimize(lowered, tuned)), tuned
            except PolytileError as e:
                _warn_unusable_entry(key, tuned, e, spec.fn.name)
        options = self.planned(spec, {})
        return self.optimize(lowered, options), options

    def planned(self, spec: Specialized, options: dict[str, Any]) -> dict[str, Any]:
        """`options` with the fusion plan's groups (polytile.graph) when pass fuse's
        strategy is "plan": the graph level decides which statements share a kernel."""
        from polytile.graph.plan import with_plan
        return with_plan(spec, self.target, self.config, options)

    @property
    def backend(self) -> Backend:
        return backend_for(self.target)

    def flags(self) -> tuple[str, ...]:
        return self.backend.flags(self.target, kernel_cache(self.config).toolchain,
                                  self.config.sanitize)

    def build(self, spec: Specialized) -> Built:
        """Optimize, then find or build the binary (generating code only on a miss); the
        cache entry keeps the optimized IR and every stage's text beside it."""
        cache = kernel_cache(self.config)
        backend = self.backend
        fn, options = self.optimized(spec, lower(canonical(spec)))
        text = format_function(fn)
        key = CacheKey(program=sha256_text(text), signature=_signature(spec),
                       target=self.target.identity, options=_options_text(options),
                       flags=self.flags(), compiler=cache.toolchain.identity)

        def generate() -> Generated:
            below = backend.generate(fn, self.target)
            return replace(below, stages=(("ir", text),) + below.stages)

        library = cache.get_or_build(key, generate, backend.build)
        return Built(fn, key, library)

    def compile(self, spec: Specialized) -> "CompiledFunction":
        missing = missing_runtime(self.config.sanitize)
        if missing:
            raise BuildError(missing, hint="run the program with `polytile sanitize -- python "
                                           "SCRIPT.py` (it sets LD_PRELOAD and ASAN_OPTIONS)")
        built = self.build(spec)
        kernel = self.backend.load(built.library.so_path, built.fn)
        params = built.fn.params
        written = overwritten_first(built.fn.body, ("out", "inout"))
        unfilled = tuple(p in written for p in params[len(params) - len(spec.fn.outputs):])
        return CompiledFunction(spec, kernel, built.library.source_path, built.key, unfilled,
                                output_pool(self.config.output_pool_bytes))


def _verified(fn: N.Function) -> N.Function:
    """`fn`, optimized with options from outside the heuristics (the caller's, a tuner's
    candidate, the tuning database's), once the IR verifier accepts it. Such options
    build schedules no test built; where a pass mishandles one, the compile fails here
    (IRError: the tuner rejects the candidate, a stored entry falls back to the
    heuristics) instead of running a kernel that computes something else. The tuner's
    gconv candidate that pass sink split under pass fold's first stores, 2026-11-28, is
    what the verifier refuses and the tuner had only caught by its output check. The
    heuristics' IR is not checked per compile: the tests verify it (verify costs about
    one to three times the passes' time: 36-463 ms on the bench's largest kernels)."""
    from polytile.ir.verify import verify
    verify(fn)
    return fn


_WARNED: set[tuple[str, str]] = set()     # (key, entry) reported unusable in this process


def _warn_unusable_entry(key: TuningKey, options: dict[str, Any], error: PolytileError,
                         function: str) -> None:
    seen = (key.digest(), _options_text(options))
    if seen in _WARNED:
        return
    _WARNED.add(seen)
    why = f"{error.message} ({error.hint})" if error.hint else error.message
    warnings.warn(TuningEntryWarning(
        f"the tuning database's entry for {function} at {key.signature} ({key.target}) "
        "cannot be applied, "
        f"so the heuristics are used: {why}. Replace it by tuning again, or remove "
        "every entry with `polytile cache clear --tuning`"), stacklevel=4)


def _signature(spec: Specialized) -> str:
    fn = spec.fn
    parts = [f"{t.dtype}{list(spec.shape(t.name))}" for t in fn.params + fn.outputs]
    # Positional, without names: renaming a size or a scalar must hit the same entry.
    # Sizes are in the shapes; integer scalars (which may steer subscripts) by value.
    env = spec.sizes
    scalars = [str(env[p.name]) for p in fn.params if p.kind == "scalar" and p.name in env]
    return " ".join(parts) + " | " + ",".join(scalars)


def _options_text(options: dict[str, Any]) -> str:
    return ";".join(f"{k}={_option_text(options[k])}" for k in sorted(options))


def _option_text(value: Any) -> str:
    """Canonical text of one option value: values that have a `text()` (Schedule) use
    it, mappings are sorted, anything else is its repr."""
    if hasattr(value, "text"):
        return str(value.text())
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_option_text(value[k])}" for k in sorted(value)) + "}"
    return repr(value)


def _scalar_buffer(value: Any, dtype: np.dtype, dt: Any, limit: float) -> np.ndarray | None:
    """A scalar argument as the 0-d array the kernel reads, or None when it needs the
    checked path (which raises the error). A Python float for a float parameter is only
    range-checked (the common case, kept cheap); anything else is checked in full."""
    if type(value) is float and dtype.kind == "f":
        if limit <= abs(value) < math.inf:
            return None
    elif scalar_problem(dt, value) is not None:
        return None
    return np.array(value, dtype=dtype)


def _uncleared(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An output the kernel writes in full before reading it (tests fill it with garbage)."""
    return np.empty(shape, dtype)


_NATIVE_EMPTY = _uncleared      # the native dispatcher allocates these itself


class CompiledFunction:
    """A native kernel for one shape set; `run` takes bound, checked arguments and
    `run_fast` raw call arguments (returning None when they need the checked path)."""

    def __init__(self, spec: Specialized, kernel: Runnable, source_path: Any,
                 key: CacheKey | None = None, unfilled: tuple[bool, ...] = (),
                 pool: OutputPool | None = None):
        self.fn = spec.fn
        self.kernel = kernel
        self.source_path = source_path
        self.key = key
        params = spec.fn.params
        self._dtypes = tuple(p.dtype.numpy for p in params)
        self._types = tuple(p.dtype for p in params)
        self._scalar = tuple(p.kind == "scalar" for p in params)
        self._limits = tuple(overflow_limit(p.dtype) if p.dtype.is_float else math.inf
                             for p in params)
        self.output_types = tuple((spec.shape(o.name), o.dtype.numpy) for o in spec.fn.outputs)
        # Outputs whose every element the kernel writes before reading it are allocated
        # without clearing (np.zeros of 16 MB costs 0.12 ms, np.empty nothing), from
        # the output pool where there is one (no page faults on memory used before).
        # Each output's allocator, chosen once: uncleared where the kernel writes every
        # element before reading it (from the pool where it would keep the size), else
        # np.zeros.
        def uncleared(shape: tuple[int, ...], dtype: np.dtype) -> Callable[..., np.ndarray]:
            if pool is not None and pool.keeps(math.prod(shape) * dtype.itemsize):
                return pool.empty
            return _uncleared
        self._allocate = tuple((uncleared(shape, np.dtype(dtype))
                                if k < len(unfilled) and unfilled[k] else np.zeros, shape, dtype)
                               for k, (shape, dtype) in enumerate(self.output_types))
        self.cleared = tuple(a is np.zeros for a, _, _ in self._allocate)
        self._fast_ok = not spec.fn.inout
        self._input_shapes = tuple(spec.shape(p.name) if p.kind == "input" else None
                                   for p in params)

    def dispatch_entry(self, ints: Sequence[int]) -> tuple[Any, ...] | None:
        """The arguments of `Dispatcher.add` (polytile.runtime.dispatch) for this kernel,
        whose integer scalars are `ints` in order; None for kernels the C side does not
        call: not native, in/out outputs, scalars of a dtype it does not convert."""
        address = getattr(self.kernel, "address", None)
        if not self._fast_ok or address is None:
            return None
        values = iter(ints)
        params: list[tuple[int, np.dtype, Any]] = []
        for p, dtype, shape, limit in zip(self.fn.params, self._dtypes, self._input_shapes,
                                          self._limits):
            if p.kind != "scalar":
                params.append((0, dtype, shape))
            elif p.dtype.is_integral:
                params.append((2, dtype, next(values)))
            elif dtype in (np.float32, np.float64):
                params.append((1, dtype, limit))
            else:
                return None
        outputs = tuple((dtype, shape, None if allocate is _NATIVE_EMPTY
                         else True if allocate is np.zeros else allocate)
                        for allocate, shape, dtype in self._allocate)
        return address, tuple(params), outputs, self._fail, self

    def _fail(self, code: int, param: int, dim: int, index: int) -> None:
        self._check(KernelFailure(code, param, dim, index))

    def run(self, inputs: dict[str, np.ndarray], scalars: dict[str, Any],
            outputs: dict[str, np.ndarray]) -> None:
        buffers: list[np.ndarray] = []
        for p in self.fn.params:
            if p.kind == "scalar":
                buffers.append(np.array(scalars[p.name], dtype=p.dtype.numpy))
            else:
                buffers.append(np.ascontiguousarray(inputs[p.name]))
        copies: list[tuple[np.ndarray, np.ndarray]] = []
        for o in self.fn.outputs:
            target = outputs[o.name]
            if not target.flags.c_contiguous or not target.flags.writeable:
                contiguous = np.ascontiguousarray(target)
                copies.append((target, contiguous))
                target = contiguous
            buffers.append(target)
        # The kernel's pointers are `restrict`: an input that overlaps an output (the same
        # array passed as input and as out=) is read from a copy.
        n_in = len(self.fn.params)
        for k in range(n_in):
            if any(np.may_share_memory(buffers[k], o) for o in buffers[n_in:]):
                buffers[k] = buffers[k].copy()
        self._check(self.kernel(buffers))
        for original, contiguous in copies:
            original[...] = contiguous

    @property
    def device(self) -> Device | None:
        """The CUDA device the kernel was loaded on, or None: a kernel that runs on
        host memory only."""
        device = getattr(self.kernel, "device", None)
        return device if isinstance(device, Device) else None

    def run_device(self, inputs: dict[str, DeviceBuffer], scalars: dict[str, Any],
                   outputs: dict[str, DeviceBuffer]) -> None:
        """Run on device memory, passed by pointer with no copy: `inputs` and `outputs`
        hold C-contiguous memory of each tensor's shape and dtype (checked by the
        caller, polytile.interop.device); here, that it is on the kernel's device and
        that no input overlaps an output (the kernel's pointers are `restrict`)."""
        device = self.device
        if device is None:
            raise UnsupportedError(f"{self.fn.name}'s kernel runs on host memory only",
                                   self.fn.loc, "define the module with a cuda target")
        named = {**inputs, **outputs}
        for name, buffer in named.items():
            if not buffer.nbytes:
                continue            # an empty array's pointer may be null: nothing to read
            ordinal = (buffer.device if buffer.device is not None
                       else pointer_device(device, buffer.pointer))
            if ordinal != device.ordinal:
                raise ArgumentError(f"{name} is on cuda:{ordinal}, but {self.fn.name}'s "
                                    f"kernel is loaded on cuda:{device.ordinal} "
                                    f"({device.name})", self.fn.loc,
                                    f"move {name} to cuda:{device.ordinal}")
        for i, a in inputs.items():
            for o, b in outputs.items():
                if a.nbytes and b.nbytes and a.pointer < b.pointer + b.nbytes \
                        and b.pointer < a.pointer + a.nbytes:
                    raise ArgumentError(f"input {i} and output {o} share device memory",
                                        self.fn.loc, f"pass a copy of {i}, or another out=")
        buffers: list[Any] = [np.array(scalars[p.name], dtype=p.dtype.numpy)
                              if p.kind == "scalar" else inputs[p.name] for p in self.fn.params]
        self._check(self.kernel(buffers + [outputs[o.name] for o in self.fn.outputs]))

    def run_fast(self, args: tuple[Any, ...], out: Any = None) -> Any:
        if not self._fast_ok:
            return None
        if out is not None:
            outs = [out] if isinstance(out, np.ndarray) else list(out)
            if len(outs) != len(self.output_types):
                return None
            for o, (shape, dtype) in zip(outs, self.output_types):
                if (type(o) is not np.ndarray or o.shape != shape or o.dtype != dtype
                        or not o.flags.c_contiguous or not o.flags.writeable
                        or any(isinstance(a, np.ndarray) and np.may_share_memory(a, o)
                               for a in args)):
                    return None
        buffers = self._buffers(args, addresses=False)
        if buffers is None:
            return None
        if out is None:
            outs = self.new_outputs()
        self._check(self.kernel(buffers + outs))
        return outs[0] if len(outs) == 1 else tuple(outs)

    def new_outputs(self) -> list[np.ndarray]:
        """The outputs of a call without out=: from the pool where the kernel writes
        every element before reading it, else cleared."""
        return [allocate(shape, dtype) for allocate, shape, dtype in self._allocate]

    @property
    def takes_addresses(self) -> bool:
        """Whether `run_addresses` may be used (a native kernel, no in/out outputs)."""
        return self._fast_ok and self.kernel.takes_addresses

    def run_addresses(self, args: Sequence[Any], outputs: Sequence[int]) -> bool:
        """Run on trusted data addresses, for callers whose tensors have no buffer
        protocol (polytile.torch): `args` holds, for each tensor parameter, the address
        (an int) of C-contiguous memory of exactly its shape and dtype, checked by the
        caller, and the raw scalars; `outputs` the outputs' addresses, memory that
        overlaps no input. False (nothing run) when a scalar needs the checked path."""
        buffers = self._buffers(args, addresses=True)
        if buffers is None:
            return False
        self._check(self.kernel(buffers + list(outputs)))
        return True

    def _buffers(self, args: Sequence[Any], addresses: bool) -> list[Any] | None:
        """What the kernel reads for `args`: scalars as 0-d arrays, tensors as they are
        (C-contiguous arrays of the parameter's dtype, checked here; or, with
        `addresses`, data addresses the caller checked). None: the checked path."""
        buffers: list[Any] = []
        for a, dtype, scalar, dt, limit in zip(args, self._dtypes, self._scalar, self._types,
                                               self._limits):
            if scalar:
                a = _scalar_buffer(a, dtype, dt, limit)
                if a is None:
                    return None
            elif not addresses and (type(a) is not np.ndarray or a.dtype != dtype
                                    or not a.flags.c_contiguous):
                return None
            buffers.append(a)
        return buffers

    def _check(self, failure: Any) -> None:
        if failure is None:
            return
        if failure.code == ERR_NOMEM:
            raise KernelError(f"{self.fn.name}: out of memory allocating a {failure.index}-byte "
                              "temporary buffer", self.fn.loc,
                              "free memory, or make the temporaries smaller")
        if failure.code != ERR_INDEX:
            raise KernelError(f"{self.fn.name}: the kernel failed with code {failure.code}",
                              self.fn.loc)
        names = [t.name for t in self.fn.params + self.fn.outputs]
        tensor = names[failure.param] if 0 <= failure.param < len(names) else "?"
        raise OutOfBoundsError(f"{tensor} is indexed at {failure.index} in dimension "
                               f"{failure.dim}, outside its bounds (the index comes from data)",
                               self.fn.loc, "check the values of the index tensor")
