"""A tiny kernel and its cache key, shared by the runtime tests."""
from __future__ import annotations

import ctypes
import shutil
from pathlib import Path

from polytile.backends import Generated
from polytile.runtime.cache import KernelCache, LoadedLibrary
from polytile.runtime.key import CacheKey
from polytile.runtime.toolchain import BuildOptions, Toolchain, flags_for

ADD_SOURCE = """\
#include <stdint.h>
int64_t add(int64_t a, int64_t b) { return a + b; }
"""


def c_only(source: str) -> Generated:
    """A C source as a backend's only stage."""
    return Generated((("c", source),), "kernel.c")


def make_key(toolchain: Toolchain, program: str = "add") -> CacheKey:
    # OpenMP off: the kernel does not use it, and it keeps each compile short.
    return CacheKey(program=program, signature="int64,int64", target="test-host", options="",
                    flags=flags_for(toolchain, BuildOptions(openmp=False)),
                    compiler=toolchain.identity)


def call_add(lib: LoadedLibrary, a: int, b: int) -> int:
    fn = lib.cdll.add
    fn.restype = ctypes.c_int64
    fn.argtypes = [ctypes.c_int64, ctypes.c_int64]
    return int(fn(a, b))


def get_add(cache: KernelCache, program: str = "add") -> LoadedLibrary:
    return cache.get_or_build(make_key(cache.toolchain, program), lambda: c_only(ADD_SOURCE))


def logging_compiler(directory: Path) -> tuple[Path, Path] | None:
    """A POLYTILE_CC wrapper script in `directory` that appends its arguments to a log,
    then runs the real cc; (wrapper, log), or None when there is no C compiler."""
    real = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if real is None:
        return None
    log = directory / "cc.log"
    log.touch()
    wrapper = directory / "logging-cc"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> "{log}"\nexec "{real}" "$@"\n')
    wrapper.chmod(0o755)
    return wrapper, log
