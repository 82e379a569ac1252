"""The C backend for x86-64 (and any machine gcc/clang targets): C99 + OpenMP, built into a
shared object by the system compiler, called through cffi.

Stages: "loops" (the loop IR, polytile.loops: every decision made) and "c" (its print,
polytile.codegen.c). The ISA comes from the target's cflags (`-march=...`); the vector
widths were chosen by the passes for the target.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from polytile.backends import Generated, register
from polytile.codegen.c import print_c
from polytile.ir import nodes as N
from polytile.loops.lower import lower
from polytile.loops.text import kernel_text
from polytile.runtime.build import build_shared_object
from polytile.runtime.kernel import SYMBOL, Kernel
from polytile.runtime.sanitize import sanitizer_flags
from polytile.runtime.toolchain import BuildOptions, Toolchain, flags_for
from polytile.targets.target import Target


class CX86Backend:
    name: str = "c-x86"
    stages: tuple[str, ...] = ("loops", "c")

    def generate(self, fn: N.Function, target: Target) -> Generated:
        kernel = lower(fn)
        return Generated((("loops", kernel_text(kernel)), ("c", print_c(kernel, SYMBOL).text)),
                         "kernel.c")

    def flags(self, target: Target, toolchain: Toolchain,
              sanitize: Sequence[str]) -> tuple[str, ...]:
        """The target's cflags with its -O level, -fopenmp where the compiler has it, the
        flags of the instructions the target has (polytile/isa: a kernel may use them),
        and the sanitizers' flags."""
        from polytile.isa import descriptions
        extra = tuple(f for f in target.cflags if not f.startswith("-O"))
        for d in descriptions():
            if "c-x86" in d.definition.forms and target.has(d.feature):
                extra += tuple(f for f in d.cflags if f not in extra)
        opt = next((int(f[2:]) for f in target.cflags if f[:2] == "-O" and f[2:].isdigit()), 3)
        extra += sanitizer_flags(tuple(sanitize))
        return flags_for(toolchain, BuildOptions(opt_level=opt, native=False,
                                                 openmp=target.openmp, extra=extra))

    build = staticmethod(build_shared_object)

    def load(self, binary: Path, fn: N.Function) -> Kernel:
        return Kernel(binary, len(fn.params))


register(CX86Backend())
