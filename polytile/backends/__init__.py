"""Backends: what turns optimized Stripe IR into a kernel one can call, chosen by the target.

A target file names its backend (`"backend": "c-x86"`); `backend_for(target)` gives it.
A backend makes no scheduling decision (the passes did, in `Block.schedule`); it is

    name       the name target files use
    stages     the texts it prints below the IR, in order; the last is the source it
               compiles (`polytile show --stage NAME` prints any of them)
    generate   optimized IR + target -> Generated: every stage's text
    flags      the compile flags for a target (part of the cache key)
    build      source -> binary, into a cache entry (called on a cache miss only)
    load       binary -> a kernel.Runnable, what the launcher (polytile.compile) runs

A new backend is a module in this package that calls `register` when imported (every
module here is imported when a backend is looked up) and a target file that names it;
nothing else changes.
"""
from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from polytile.errors import ArgumentError
from polytile.ir import nodes as N
from polytile.runtime.build import BuildResult
from polytile.runtime.kernel import Runnable
from polytile.runtime.toolchain import Toolchain
from polytile.targets.target import Target


@dataclass(frozen=True)
class Generated:
    """The stages below the IR of one kernel, in order; the last is the compiled source."""

    stages: tuple[tuple[str, str], ...]    # (stage name, text)
    source_name: str                       # the source's file name in a cache entry

    @property
    def source(self) -> str:
        return self.stages[-1][1]

    def text(self, stage: str) -> str:
        return dict(self.stages)[stage]


class Backend(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def stages(self) -> tuple[str, ...]: ...

    def generate(self, fn: N.Function, target: Target) -> Generated: ...

    def flags(self, target: Target, toolchain: Toolchain,
              sanitize: Sequence[str]) -> tuple[str, ...]: ...

    def build(self, source: str, flags: Sequence[str], toolchain: Toolchain, out_path: Path,
              *, source_path: Path) -> BuildResult: ...

    def load(self, binary: Path, fn: N.Function) -> Runnable: ...


_REGISTRY: dict[str, Backend] = {}


def register(backend: Backend) -> Backend:
    """Make `backend` available to target files under `backend.name`."""
    if backend.name in _REGISTRY and _REGISTRY[backend.name] is not backend:
        raise ValueError(f"a backend called {backend.name!r} is registered already")
    _REGISTRY[backend.name] = backend
    return backend


def backends() -> tuple[Backend, ...]:
    """Every registered backend; the modules of this package register theirs on import."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    return tuple(_REGISTRY.values())


def backend_for(target: Target) -> Backend:
    """The backend `target` names; an ArgumentError for a name no module registers."""
    return backend_named(target.backend, f"target {target.name} names")


def backend_named(name: str, who: str | None = None) -> Backend:
    """The backend registered as `name` (`who` names it, for the error)."""
    known = {b.name: b for b in backends()}
    try:
        return known[name]
    except KeyError:
        what = f"{who} backend {name!r}, which polytile does not have" if who \
            else f"unknown backend {name!r}"
        raise ArgumentError(what, hint=f"known backends: {', '.join(sorted(known))}") from None
