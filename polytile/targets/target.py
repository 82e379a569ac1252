"""Targets are data (Stripe §1.3): a JSON file per machine kind, shipped in the package.

A target names the machine's parameters (vector width, registers, caches,
instruction sets, compiler flags), the backend that prints its code, and the ordered
pass pipeline. The host's features are read at run time; `select_target` picks the
most capable shipped target the host supports, unless POLYTILE_TARGET or `target=`
names one. `inspection_target` gives any target on any host, for printing code
(Stripe's co-design point: inspect the code for a machine you do not have); only
running it needs the hardware.
"""
from __future__ import annotations

import ctypes
import json
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass, field, replace
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
    backend: str = "c-x86"    # the backend that prints and builds its code
    features: frozenset[str] = field(default_factory=frozenset)   # host features in use
    # Features every machine of this kind has, whatever the host (a GPU target's: the
    # host's CPU features say nothing about the device; sm_80 always has Tensor Cores).
    provides: tuple[str, ...] = ()
    # How many L1 sizes a micro-kernel's reduction tile may stream of its inputs before
    # its accumulators go back to memory (pass autotile's kc): half of L1 keeps the
    # stream in L1, as BLIS sizes kc; more lets it come from L2 and loads and stores the
    # accumulators less often. On an AVX-512 Xeon (Cascade Lake, L1 32 KiB, L2 1 MiB),
    # cpu-avx512's 4 ran tmm 1024^3 0.66x, gconv 0.63x, MLP1 0.60x the time of 0.5
    # (benchmarks/option_ab.py); AVX2's 0.5 is what the Zen 3 EPYC was tuned with.
    reduction_stream: float = 0.5

    def has(self, feature: str) -> bool:
        """Whether code for this target may use `feature`: one the target declares
        (required or optional) that the host has, or one it provides. A host feature the
        target does not declare is not in use: cpu-avx2 on an AVX-512 VNNI host runs AVX2
        code, not vpdpbusd on zmm registers."""
        return feature in self.in_use

    @property
    def in_use(self) -> frozenset[str]:
        """The host features the target declares, and the ones it provides."""
        return (self.features & frozenset(self.requires + self.optional)) | frozenset(
            self.provides)

    def cache_size(self, level: str) -> int:
        return dict(self.cache_bytes)[level]

    @property
    def identity(self) -> str:
        """Name, the features in use and the cache sizes: part of every cache key (the
        sizes come from the host when it tells them, and the tiles follow them)."""
        used = sorted(self.in_use)
        caches = ",".join(f"{level}={size // 1024}K" for level, size in self.cache_bytes)
        return f"{self.name}[{','.join(used)}]({caches})"


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
                            hint="shipped targets: " + ", ".join(
                                PREFERENCE + ("cpu-arm64-dot", "opencl", "cuda-sm80",
                                              "cuda-sm90"))
                            ) from None
    data = json.loads(text)
    stream = float(data.get("reduction_stream", 0.5))
    if not stream > 0:
        raise ArgumentError(f"target {name}: reduction_stream must be positive, got {stream}")
    passes = tuple((p["pass"], _freeze({k: v for k, v in p.items() if k != "pass"}))
                   for p in data.get("passes", []))
    return Target(data["name"], data.get("description", ""), tuple(data["requires"]),
                  tuple(data.get("optional", [])), int(data["vector_bytes"]),
                  int(data["vector_registers"]), _freeze(data["cache_bytes"]),
                  int(data["cache_line_bytes"]), tuple(data["cflags"]), bool(data["openmp"]),
                  passes, str(data.get("backend", "c-x86")),
                  provides=tuple(data.get("provides", [])),
                  reduction_stream=stream)


@lru_cache(maxsize=1)
def host_features() -> frozenset[str]:
    """CPU feature flags of this machine that a kernel may use (Linux /proc/cpuinfo;
    empty elsewhere): without AMX's where Linux does not give this process the tile data
    (`usable`)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return usable(frozenset(line.split(":", 1)[1].split()), amx_permitted)
    except OSError:
        pass
    return frozenset()


# Linux x86-64: arch_prctl's number and its request for permission to use an extended
# state component, the AMX tile data's (XFEATURE_XTILEDATA).
SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA = 158, 0x1023, 18


def usable(flags: frozenset[str], permitted: Callable[[], bool]) -> frozenset[str]:
    """`flags` without the AMX features when the CPU has AMX but `permitted()` says Linux
    refuses this process its tile data (a kernel before 5.16, or a signal stack too small
    for it): an AMX instruction would then fault, so no kernel may choose one."""
    if "amx_tile" in flags and not permitted():
        return frozenset(f for f in flags if not f.startswith("amx_"))
    return flags


def amx_permitted() -> bool:
    """Ask Linux for the AMX tile data for this process (once is enough; the kernels'
    setup asks again, harmlessly): whether it granted it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


_CACHE_DIR = "/sys/devices/system/cpu/cpu0/cache"


@lru_cache(maxsize=1)
def host_caches() -> dict[str, int]:
    """Sizes in bytes of this machine's data caches by level ("L1", "L2", "L3"), as Linux
    reports them for the first CPU; empty where it does not."""
    caches: dict[str, int] = {}
    try:
        for entry in sorted(os.listdir(_CACHE_DIR)):
            if not entry.startswith("index"):
                continue
            def read(name: str, entry: str = entry) -> str:
                with open(os.path.join(_CACHE_DIR, entry, name), encoding="utf-8") as f:
                    return f.read().strip()
            if read("type") == "Instruction":
                continue
            size = read("size")
            scale = {"K": 1024, "M": 1 << 20}.get(size[-1:], 1)
            caches[f"L{int(read('level'))}"] = int(size.rstrip("KM")) * scale
    except (OSError, ValueError):
        return {}
    return caches


def with_host_caches(target: Target, caches: dict[str, int] | None = None) -> Target:
    """`target` with the cache sizes this machine reports in place of the file's (the
    file's stand where the host tells nothing)."""
    caches = host_caches() if caches is None else caches
    merged = dict(target.cache_bytes)
    merged.update({level: size for level, size in caches.items() if level in merged})
    return replace(target, cache_bytes=tuple(sorted(merged.items())))


def supports(target: Target, features: frozenset[str]) -> bool:
    return not missing_features(target, features)


GPU_BACKENDS = ("opencl", "cuda")      # what the `gpu` extra installs
# Backends whose kernels run on an emulated machine of another architecture: the host's
# CPU features and cache sizes say nothing about it (the target file's stand).
EMULATED_BACKENDS = ("c-arm64",)


def missing_features(target: Target, features: frozenset[str]) -> list[str]:
    """What a machine with `features` lacks to run `target` (an empty list: it runs it).
    An OpenCL target needs a working OpenCL device (pyopencl and a driver such as PoCL)
    instead of CPU flags; what is missing is said in words. A CUDA target needs NVRTC
    only: its kernels compile anywhere, and running one without a device is refused when
    it is loaded (polytile.backends.cuda). An emulated target (cpu-arm64-dot) needs its
    cross compiler and emulator (polytile.runtime.emulated)."""
    if target.backend == "opencl":
        from polytile.runtime.opencl import device_problem
        problem = device_problem()
        return [problem] if problem else []
    if target.backend == "cuda":
        from polytile.runtime.cuda import nvrtc_problem
        problem = nvrtc_problem()
        return [problem] if problem else []
    if target.backend in EMULATED_BACKENDS:
        from polytile.runtime.emulated import cross_problem
        problem = cross_problem()
        return [problem] if problem else []
    if target.requires and platform.machine().lower() not in ("x86_64", "amd64"):
        return ["x86-64"]
    return [f for f in target.requires if f not in features]


def shipped_targets() -> tuple[Target, ...]:
    """Every target shipped with the package, most capable first."""
    names = sorted(p.name[:-5] for p in resources.files("polytile.targets").iterdir()
                   if p.name.endswith(".json"))
    ordered = [n for n in PREFERENCE if n in names] + [n for n in names if n not in PREFERENCE]
    return tuple(load_target(n) for n in ordered)


def inspection_target(name: str | None, features: frozenset[str] | None = None) -> Target:
    """The target to print code for: like `select_target`, but a named target the host
    cannot run is still given, as a machine of that kind with every feature the target
    file declares (required and optional), so its code can be inspected anywhere."""
    features = host_features() if features is None else features
    if name:
        target = load_target(name)
        if missing_features(target, features):
            return replace(target, features=frozenset(target.requires + target.optional))
    return select_target(name, features)


def select_target(requested: str | None = None,
                  features: frozenset[str] | None = None) -> Target:
    """The target to compile for: `requested` (from `target=` or $POLYTILE_TARGET via
    polytile.config), else the best the host supports. A requested target the host cannot
    run is an error, not a crash later (to print its code, use `inspection_target`)."""
    features = host_features() if features is None else features
    name = requested
    if name:
        target = load_target(name)
        missing = missing_features(target, features)
        if missing:
            raise ArgumentError(f"target {name} needs {', '.join(missing)}, which this machine "
                                "lacks", hint=("install the gpu extra: pip install "
                                               "'polytile[gpu]'" if target.backend in GPU_BACKENDS
                                               else "use cpu-generic") + " or unset "
                                "POLYTILE_TARGET; `polytile show --target` prints its code on "
                                "any host")
        if target.backend in EMULATED_BACKENDS:
            return target
        return with_host_caches(replace(target, features=features))
    for candidate in PREFERENCE:
        target = load_target(candidate)
        if supports(target, features):
            return with_host_caches(replace(target, features=features))
    return with_host_caches(replace(load_target("cpu-generic"), features=features))
