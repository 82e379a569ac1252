"""Targets are data (Stripe §1.3): a JSON file per machine kind, shipped in the package.

A target names the machine's parameters (vector width, registers, caches,
instruction sets, compiler flags) and the ordered pass pipeline. The host's
features are read at run time; `select_target` picks the most capable shipped
target the host supports, unless POLYTILE_TARGET or `target=` names one.
"""
from __future__ import annotations

import json
import platform
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

from polytile.errors import ArgumentError

# Most capable first: the first one the host supports wins.
PREFERENCE = ("cpu-avx512", "cpu-avx2", "cpu-generic")


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    requires: tuple[str, ...]
    optional: tuple[str, ...]
    vector_bytes: int
    vector_registers: int
    cache_bytes: tuple[tuple[str, int], ...]
    cache_line_bytes: int
    cflags: tuple[str, ...]
    openmp: bool
    passes: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...]
    features: frozenset[str] = field(default_factory=frozenset)   # host features in use

    def has(self, feature: str) -> bool:
        return feature in self.features

    def cache_size(self, level: str) -> int:
        return dict(self.cache_bytes)[level]

    @property
    def identity(self) -> str:
        """Name plus the optional features the host has: part of every cache key."""
        used = sorted(self.features & (set(self.optional) | set(self.requires)))
        return f"{self.name}[{','.join(used)}]"


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


@lru_cache(maxsize=None)
def load_target(name: str) -> Target:
    """The shipped target called `name` (without host features)."""
    try:
        text = resources.files("polytile.targets").joinpath(f"{name}.json").read_text()
    except FileNotFoundError:
        raise ArgumentError(f"unknown target {name!r}",
                            hint=f"shipped targets: {', '.join(PREFERENCE)}") from None
    data = json.loads(text)
    passes = tuple((p["pass"], _freeze({k: v for k, v in p.items() if k != "pass"}))
                   for p in data.get("passes", []))
    return Target(data["name"], data.get("description", ""), tuple(data["requires"]),
                  tuple(data.get("optional", [])), int(data["vector_bytes"]),
                  int(data["vector_registers"]), _freeze(data["cache_bytes"]),
                  int(data["cache_line_bytes"]), tuple(data["cflags"]), bool(data["openmp"]),
                  passes)


@lru_cache(maxsize=1)
def host_features() -> frozenset[str]:
    """CPU feature flags of this machine (Linux /proc/cpuinfo; empty elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def supports(target: Target, features: frozenset[str]) -> bool:
    if target.requires and platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    return all(f in features for f in target.requires)


def select_target(requested: str | None = None,
                  features: frozenset[str] | None = None) -> Target:
    """The target to compile for: `requested` (from `target=` or $POLYTILE_TARGET via
    polytile.config), else the best the host supports. A requested target the host cannot run is an error, not a crash later."""
    from dataclasses import replace
    features = host_features() if features is None else features
    name = requested
    if name:
        target = load_target(name)
        if not supports(target, features):
            missing = [f for f in target.requires if f not in features]
            raise ArgumentError(f"target {name} needs {', '.join(missing) or 'x86-64'}, which "
                                "this machine lacks", hint="use cpu-generic or unset "
                                "POLYTILE_TARGET")
        return replace(target, features=features)
    for candidate in PREFERENCE:
        target = load_target(candidate)
        if supports(target, features):
            return replace(target, features=features)
    return replace(load_target("cpu-generic"), features=features)
