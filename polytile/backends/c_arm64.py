"""The C backend for AArch64, cross-compiled on an x86-64 host and run under qemu-aarch64.

The same loop IR and C printer as c-x86 (GCC's vector types become NEON registers), with
the instructions' "c-arm64" forms (`vdotq_s32` for sdot: polytile/isa). The source is
linked statically with a runner into an executable (polytile.runtime.emulated), and each
call runs it under the emulator: this checks code for an Arm machine on any host with
the cross compiler and qemu-user; it measures nothing.
"""
from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

from polytile.backends import Generated, register
from polytile.codegen.c import print_c
from polytile.errors import BuildError, UnsupportedError
from polytile.ir import nodes as N
from polytile.loops.lower import lower
from polytile.loops.text import kernel_text
from polytile.runtime import emulated
from polytile.runtime.build import BuildResult
from polytile.runtime.kernel import SYMBOL
from polytile.runtime.toolchain import Toolchain, run_compiler
from polytile.targets.target import Target


class CArm64Backend:
    name: str = "c-arm64"
    stages: tuple[str, ...] = ("loops", "c")

    def generate(self, fn: N.Function, target: Target) -> Generated:
        kernel = lower(fn)
        return Generated((("loops", kernel_text(kernel)),
                          ("c", print_c(kernel, SYMBOL, forms=self.name).text)), "kernel.c")

    def flags(self, target: Target, toolchain: Toolchain,
              sanitize: Sequence[str]) -> tuple[str, ...]:
        """The target's cflags, the flags of the instructions it has, -fopenmp where the
        target runs threads, and the cross compiler's version as a define (so a cache key
        names the compiler: the host's toolchain is not the one that builds)."""
        from polytile.isa import descriptions
        if sanitize:
            raise UnsupportedError(f"target {target.name} has no sanitizers (its kernels run "
                                   "under an emulator)")
        problem = emulated.cross_problem()
        if problem:
            raise UnsupportedError(f"target {target.name} builds with {problem}",
                                   hint="`polytile show --stage c` prints its source without them")
        flags = list(target.cflags)
        for d in descriptions():
            if self.name in d.definition.forms and target.has(d.feature):
                flags += [f for f in d.cflags if f not in flags]
        if target.openmp:
            flags.append("-fopenmp")
        version = emulated.cross_compiler_version().replace(".", "_")
        return (*flags, f"-DPOLYTILE_CROSS_GCC_{version}")

    def build(self, source: str, flags: Sequence[str], toolchain: Toolchain, out_path: Path,
              *, source_path: Path) -> BuildResult:
        """A static executable of the kernel and the runner (`toolchain`, the host's, is
        not used)."""
        source_path.write_text(source, encoding="utf-8")
        runner = source_path.with_name("runner.c")
        runner.write_text(emulated.RUNNER, encoding="utf-8")
        path = out_path.with_suffix(".exe")
        temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        command = (emulated.CROSS_CC, *flags, "-static", "-o", str(temp), str(source_path),
                   str(runner), "-lm")
        start = time.perf_counter()
        done = run_compiler(command[0], command[1:], timeout=600.0)
        output = (done.stdout + done.stderr).strip()
        if done.returncode != 0:
            temp.unlink(missing_ok=True)
            raise BuildError(f"{emulated.CROSS_CC} failed (exit code {done.returncode}) on "
                             f"generated code:\n  " + "\n  ".join(output.splitlines()[:5]),
                             source, output)
        os.replace(temp, path)
        return BuildResult(path, source_path, command, output, time.perf_counter() - start)

    def load(self, binary: Path, fn: N.Function) -> emulated.EmulatedKernel:
        return emulated.EmulatedKernel(binary, fn)


register(CArm64Backend())
