"""Kernels for another architecture, run under a user-mode emulator (qemu-aarch64).

A cross target's kernel cannot be loaded into this process: it is linked statically,
with a small runner (RUNNER), into an executable of its architecture, and each call runs
that executable under the emulator:

    parameters' bytes -> call.in -> qemu-aarch64 kernel.exe call.in call.out -> call.out
    call.in:  int64 n, then per parameter: int64 size in bytes, the bytes
    call.out: int32 status, int64 err[4] (the kernel's return and error record), then the
              bytes of every parameter after the call

The runner copies each parameter into memory aligned to 64 bytes, calls
`polytile_kernel(args, err)` as the in-process launcher would, and writes everything back;
the caller copies back only the parameters the kernel writes. A call costs an emulator
start (tens of milliseconds): this runs tests of code for a machine one does not have, it
does not measure it.
"""
from __future__ import annotations

import functools
import shutil
import struct
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from polytile.errors import KernelError
from polytile.ir import nodes as N
from polytile.runtime.kernel import SYMBOL, KernelFailure

CROSS_CC = "aarch64-linux-gnu-gcc"
EMULATOR = "qemu-aarch64"
_LIBC_HEADER = Path("/usr/aarch64-linux-gnu/include/stdio.h")
_INSTALL = ("Debian: apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user "
            "(.ci/run installs them)")
CALL_TIMEOUT = 600.0      # seconds one emulated call may take

RUNNER = f"""\
/* Runs {SYMBOL} on parameters read from a file; see polytile/runtime/emulated.py. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int32_t {SYMBOL}(void **args, int64_t *err);

static void fail(const char *what)
{{
    fprintf(stderr, "polytile runner: %s\\n", what);
    exit(2);
}}

int main(int argc, char **argv)
{{
    if (argc != 3)
        fail("usage: kernel.exe CALL.in CALL.out");
    FILE *in = fopen(argv[1], "rb");
    if (in == NULL)
        fail("cannot open the parameters");
    int64_t n;
    if (fread(&n, sizeof n, 1, in) != 1 || n < 0 || n > 4096)
        fail("bad parameter count");
    void **args = calloc((size_t)n + 1, sizeof(void *));
    int64_t *sizes = calloc((size_t)n + 1, sizeof(int64_t));
    if (args == NULL || sizes == NULL)
        fail("out of memory");
    for (int64_t p = 0; p < n; p++) {{
        if (fread(&sizes[p], sizeof sizes[p], 1, in) != 1 || sizes[p] < 0)
            fail("bad parameter size");
        size_t rounded = ((size_t)sizes[p] + 63) / 64 * 64 + 64;
        args[p] = aligned_alloc(64, rounded);
        if (args[p] == NULL)
            fail("out of memory");
        if (fread(args[p], 1, (size_t)sizes[p], in) != (size_t)sizes[p])
            fail("short parameter data");
    }}
    fclose(in);
    int64_t err[4] = {{0, 0, 0, 0}};
    int32_t status = {SYMBOL}(args, err);
    FILE *out = fopen(argv[2], "wb");
    if (out == NULL)
        fail("cannot write the results");
    int ok = fwrite(&status, sizeof status, 1, out) == 1 && fwrite(err, sizeof err[0], 4, out) == 4;
    for (int64_t p = 0; ok && p < n; p++)
        ok = fwrite(args[p], 1, (size_t)sizes[p], out) == (size_t)sizes[p];
    if (fclose(out) != 0 || !ok)
        fail("cannot write the results");
    return 0;
}}
"""


def cross_problem() -> str | None:
    """What this machine lacks to build and run AArch64 kernels, in words; None if nothing."""
    missing = [tool for tool in (CROSS_CC, EMULATOR) if shutil.which(tool) is None]
    if CROSS_CC not in missing and not _LIBC_HEADER.exists():
        missing.append("the AArch64 C library (libc6-dev-arm64-cross)")
    if missing:
        return f"{' and '.join(missing)} ({_INSTALL})"
    return None


@functools.cache
def cross_compiler_version() -> str:
    """The cross compiler's version (`-dumpfullversion`), for cache keys; asked once."""
    done = subprocess.run([CROSS_CC, "-dumpfullversion"], capture_output=True, text=True,
                          check=False, stdin=subprocess.DEVNULL)
    return done.stdout.strip() or "unknown"


def written_params(fn: N.Function) -> tuple[int, ...]:
    """Positions of the parameters the kernel writes (outputs, in/out tensors)."""
    dirs = {r.into: r.dir for r in fn.body.refs}
    return tuple(p for p, name in enumerate(fn.params) if dirs.get(name) in ("out", "inout"))


class EmulatedKernel:
    """A Runnable (polytile.runtime.kernel) whose calls run `executable` under the emulator."""

    takes_addresses = False

    def __init__(self, executable: Path, fn: N.Function):
        self.executable = executable
        self.n_params = len(fn.params)
        self.written = frozenset(written_params(fn))

    def __call__(self, buffers: Sequence[Any]) -> KernelFailure | None:
        # Bytes of each (contiguous) parameter, writable views of the outputs; through
        # NumPy, which also views dtypes the buffer protocol lacks (bfloat16).
        views = [np.asarray(b).reshape(-1).view(np.uint8) for b in buffers]
        with tempfile.TemporaryDirectory(prefix="polytile-call-") as tmp:
            request, reply = Path(tmp, "call.in"), Path(tmp, "call.out")
            with open(request, "wb") as f:
                f.write(struct.pack("<q", len(views)))
                for v in views:
                    f.write(struct.pack("<q", v.nbytes))
                    f.write(v.tobytes())
            try:
                done = subprocess.run([EMULATOR, str(self.executable), str(request), str(reply)],
                                      capture_output=True, text=True, errors="replace",
                                      timeout=CALL_TIMEOUT, stdin=subprocess.DEVNULL,
                                      check=False)
            except subprocess.TimeoutExpired:
                raise KernelError(f"the emulated kernel {self.executable.name} did not "
                                  f"finish within {CALL_TIMEOUT:g} s") from None
            if done.returncode != 0:
                raise KernelError(f"the emulated kernel {self.executable.name} failed "
                                  f"(exit {done.returncode}): {done.stderr.strip()[-500:]}")
            data = reply.read_bytes()
        status, *err = struct.unpack_from("<i4q", data)
        at = struct.calcsize("<i4q")
        for p, v in enumerate(views):
            if p in self.written:
                v[:] = np.frombuffer(data, np.uint8, v.nbytes, at)
            at += v.nbytes
        if status == 0:
            return None
        return KernelFailure(int(status), int(err[1]), int(err[2]), int(err[3]))
