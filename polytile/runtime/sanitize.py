"""Sanitizer builds: kernels compiled with -fsanitize=address / undefined.

    POLYTILE_SANITIZE=address,undefined polytile sanitize -- python my_script.py

A sanitized kernel reports the first invalid memory access or undefined operation
with the kernel's source file and line (`kernel.c` in its cache entry, built with
-g) and ends the process with a non-zero status: -fno-sanitize-recover=all, so no
report scrolls by unnoticed.

UndefinedBehaviorSanitizer loads into any Python. AddressSanitizer must be the first
library of the process, before Python's own malloc is used, or it cannot see the
NumPy buffers a kernel overruns: the process must start with the compiler's libasan
in LD_PRELOAD. `polytile sanitize -- CMD` runs CMD so (`sanitized_environment`), and a
kernel built with address sanitizing in a process without it is refused with that
command as the hint (`missing_runtime`), rather than loaded blind.
"""
from __future__ import annotations

import ctypes
import os
import subprocess
from collections.abc import Mapping, Sequence

from polytile.errors import BuildError
from polytile.runtime.toolchain import Toolchain



def sanitizer_flags(names: Sequence[str]) -> tuple[str, ...]:
    if not names:
        return ()
    return (f"-fsanitize={','.join(names)}", "-fno-sanitize-recover=all",
            "-fno-omit-frame-pointer", "-g")


def missing_runtime(names: Sequence[str]) -> str | None:
    """Why this process cannot run kernels built with `names`, or None when it can."""
    if "address" not in names:
        return None
    if hasattr(ctypes.CDLL(None), "__asan_init"):
        return None
    return ("kernels built with AddressSanitizer need its runtime loaded first, when the "
            "process starts")


def sanitized_environment(toolchain: Toolchain, names: Sequence[str],
                          environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` for a process that builds and runs kernels sanitized with `names`."""
    env = dict(environ)
    env["POLYTILE_SANITIZE"] = ",".join(names)
    if "address" in names:
        library = _runtime_library(toolchain, "libasan.so")
        env["LD_PRELOAD"] = " ".join(filter(None, [library, environ.get("LD_PRELOAD", "")]))
        # Python itself keeps memory until exit: its "leaks" are not the kernels'.
        env["ASAN_OPTIONS"] = ":".join(filter(None, ["detect_leaks=0",
                                                      environ.get("ASAN_OPTIONS", "")]))
    if "undefined" in names:
        env["UBSAN_OPTIONS"] = ":".join(filter(None, ["print_stacktrace=1",
                                                       environ.get("UBSAN_OPTIONS", "")]))
    return env


def _runtime_library(toolchain: Toolchain, name: str) -> str:
    done = subprocess.run([*toolchain.command, f"-print-file-name={name}"], check=False,
                          capture_output=True, text=True)
    path = done.stdout.strip()
    if done.returncode != 0 or not os.path.isabs(path) or not os.path.exists(path):
        raise BuildError(f"the C compiler {toolchain.path} has no {name}",
                         hint="install the sanitizer runtime (e.g. Debian's libasan8 with gcc "
                              "12), or build with sanitize=undefined only")
    return path
