"""The compilation pipeline for one specialized function, every step named:

    specialized Program
      -> canonical      alpha-rename tensors and indices (cache hits survive renaming)
      -> lower          Stripe blocks, one per statement
      -> passes         the target's pipeline (polytile.passes)
      -> key            hash of the printed IR + signature + target + flags + compiler
      -> codegen        C source (only on a cache miss)
      -> build/load     shared object from the compilation cache
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polytile.config import Config
from polytile.errors import OutOfBoundsError
from polytile.ir import nodes as N
from polytile.ir.lower import lower
from polytile.ir.printer import format_function
from polytile.runtime.cache import KernelCache
from polytile.runtime.files import sha256_text
from polytile.runtime.kernel import Kernel
from polytile.runtime.key import CacheKey
from polytile.runtime.toolchain import BuildOptions, flags_for
from polytile.sema import program as P
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


@dataclass
class Compiler:
    config: Config
    target: Target
    options: dict[str, Any] = field(default_factory=dict)

    def optimize(self, fn: N.Function) -> N.Function:
        from polytile.passes.pipeline import run_pipeline
        return run_pipeline(fn, self.target, self.options)

    def ir(self, spec: Specialized) -> N.Function:
        return self.optimize(lower(canonical(spec)))

    def flags(self) -> tuple[str, ...]:
        toolchain = kernel_cache(self.config).toolchain
        extra = tuple(f for f in self.target.cflags if not f.startswith("-O"))
        opt = next((int(f[2:]) for f in self.target.cflags if f[:2] == "-O" and f[2:].isdigit()),
                   3)
        return flags_for(toolchain, BuildOptions(opt_level=opt, native=False,
                                                 openmp=self.target.openmp, extra=extra))

    def compile(self, spec: Specialized) -> "CompiledFunction":
        from polytile.codegen.c import generate_c, symbol_for
        cache = kernel_cache(self.config)
        fn = self.ir(spec)
        text = format_function(fn)
        key = CacheKey(program=sha256_text(text), signature=_signature(spec),
                       target=self.target.identity, options=_options_text(self.options),
                       flags=self.flags(), compiler=cache.toolchain.identity)
        library = cache.get_or_build(key, lambda: generate_c(fn).text)
        kernel = Kernel(library.cdll, symbol_for(fn), len(fn.params))
        return CompiledFunction(spec.fn, kernel, library.source_path)


def _signature(spec: Specialized) -> str:
    fn = spec.fn
    parts = [f"{t.dtype}{list(spec.shape(t.name))}" for t in fn.params + fn.outputs]
    return " ".join(parts) + " | " + ",".join(f"{k}={v}" for k, v in spec.env)


def _options_text(options: dict[str, Any]) -> str:
    return ";".join(f"{k}={options[k]!r}" for k in sorted(options))


@dataclass
class CompiledFunction:
    """A native kernel for one shape set; `run` takes bound, checked arguments."""

    fn: P.Function
    kernel: Kernel
    source_path: Any

    def run(self, inputs: dict[str, np.ndarray], scalars: dict[str, Any],
            outputs: dict[str, np.ndarray]) -> None:
        keep: list[np.ndarray] = []
        pointers: list[int] = []
        for p in self.fn.params:
            if p.kind == "scalar":
                array = np.array(scalars[p.name], dtype=p.dtype.numpy)
            else:
                array = np.ascontiguousarray(inputs[p.name])
            keep.append(array)
            pointers.append(array.ctypes.data)
        copies: list[tuple[np.ndarray, np.ndarray]] = []
        for o in self.fn.outputs:
            target = outputs[o.name]
            if not target.flags.c_contiguous:
                contiguous = np.ascontiguousarray(target)
                copies.append((target, contiguous))
                target = contiguous
            keep.append(target)
            pointers.append(target.ctypes.data)
        failure = self.kernel(pointers)
        if failure is not None:
            names = [t.name for t in self.fn.params + self.fn.outputs]
            tensor = names[failure.param] if 0 <= failure.param < len(names) else "?"
            raise OutOfBoundsError(f"{tensor} is indexed at {failure.index} in dimension "
                              f"{failure.dim}, outside its bounds (the index comes from data)",
                              self.fn.loc, "check the values of the index tensor")
        for original, contiguous in copies:
            original[...] = contiguous
