"""Loop IR -> OpenCL C: one `__kernel` per launch (polytile.loops.launch); it prints, every
decision (which loops run on the grid and on threads, their sizes) was made before.

Kernel arguments, the same for every launch of a kernel:

    __global T *b0, ...      the function's parameters in order (scalars as 1-element buffers)
    __global T *l0, ...      the top-level local buffers (they outlive a launch)
    __global int *pt_flag    nonzero once a run-time check failed
    __global long *pt_err    (code, parameter, dimension, value) of the first failure

A grid loop is this work-item's group along its dimension, a thread loop its local id:
`const long i0 = lo + get_group_id(d) * step; if (i0 < hi) { ... }`. The statements inside
print as C does (polytile.codegen.c: one printer for the scalar language; OpenCL C is C99
with address spaces), over a header that maps C's names onto OpenCL's (`int64_t` is
`long`, `expf` is the overloaded `exp`, ...). A failed check records the first failure
(an atomic flag) and ends the work-item; later launches see the flag and do nothing.
Nested local buffers are private arrays of each work-item. Vector code (the CPU
micro-kernels) is not printed: pass `gpu` does not make any.
"""
from __future__ import annotations

from dataclasses import dataclass

from polytile.codegen import cexpr, cprelude
from polytile.codegen.c import _comment, _indent, _Printer, _Target
from polytile.codegen.cabi import ERR_INDEX
from polytile.errors import UnsupportedError
from polytile.loops import nodes as L
from polytile.loops.launch import Launch, launches

_MATH = ("exp", "log", "tanh", "erf", "sqrt", "floor", "ceil", "trunc", "round", "exp2",
         "expm1", "log2", "log10", "log1p", "cbrt", "sin", "cos", "tan", "asin", "acos",
         "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "erfc", "atan2", "pow", "fmod",
         "hypot", "copysign", "fabs", "fmax", "fmin", "fma")

HEADER = "\n".join([
    "#ifdef cl_khr_fp64",
    "#pragma OPENCL EXTENSION cl_khr_fp64 : enable",
    "#endif",
    "typedef char int8_t;",
    "typedef short int16_t;",
    "typedef int int32_t;",
    "typedef long int64_t;",
    "typedef uchar uint8_t;",
    "typedef ushort uint16_t;",
    "typedef uint uint32_t;",
    "typedef ulong uint64_t;",
    "#define INT64_C(c) c##L",
    "#define UINT64_C(c) c##UL",
    "#define INT64_MIN LONG_MIN",
    "#define INT32_MIN INT_MIN",
    "#define memcpy __builtin_memcpy",
    "#define half pt_half  /* a type in OpenCL C, a variable name in the C helpers */",
    f"#define PT_ERR_INDEX {ERR_INDEX}",
    "/* C's float spellings of the math functions are OpenCL's overloaded ones */",
    *(f"#define {name}f {name}" for name in _MATH),
    "",
    "static void pt_fail(__global int *flag, __global long *err, int code, long buffer,",
    "                    long dim, long value)",
    "{",
    "    if (atomic_cmpxchg(flag, 0, code) == 0) {",
    "        err[0] = code;",
    "        err[1] = buffer;",
    "        err[2] = dim;",
    "        err[3] = value;",
    "    }",
    "}",
    "",
])


@dataclass(frozen=True)
class OpenCLSource:
    text: str
    launches: tuple[Launch, ...]


class _KernelPrinter(_Printer):
    """The C printer with GPU loops, OpenCL failure handling and no vector code."""

    def __init__(self, kernel: L.Kernel, launch: Launch, needs: cexpr.Needs):
        super().__init__(kernel)
        self.launch = launch
        self.needs = needs
        self.buffers.update({b.name: b for b in kernel.locals})

    def fail(self, target: _Target, code: str, param: int, dim: int, value: str) -> list[str]:
        return [f"pt_fail(pt_flag, pt_err, {code}, {param}, {dim}, {value});", "return;"]

    def use_vector(self, t: L.VType) -> None:
        raise UnsupportedError(f"the OpenCL backend prints no vector code ({t})",
                               hint="the opencl target's passes make none")

    def typed(self, t: L.VType) -> bool:
        if t.lanes > 1:
            self.use_vector(t)
        return False

    def locals(self, buffers: tuple[L.Buffer, ...], fail: _Target, top_level: bool = False
               ) -> tuple[list[str], list[str]]:
        """A work-item's private arrays (the lowering placed every nested local on the
        stack); filled as the C printer fills them. Shared buffers are the work-group's
        `__local` arrays, declared at the kernel's top (OpenCL allows them nowhere else)."""
        lines = []
        for b in buffers:
            self.buffers[b.name] = b
            if b.space == "shared":
                continue
            if b.placement != "stack":
                raise UnsupportedError(f"local buffer {b.name} ({b.placement}, {b.space}) has "
                                       "no OpenCL form yet")
            self.buffers[b.name] = b
            init = " = {0}" if b.init == "zero" else ""
            lines.append(f"{b.dtype.c_name} {b.name}[{b.size}]{init};  /* {_comment(b.label)} */")
            if b.init == "nan":
                lines.append(f"for (long pt_j = 0; pt_j < {b.size}; pt_j++) "
                             f"{b.name}[pt_j] = {cexpr.nan_storage(b.dtype)};")
        return lines, []

    def stmt(self, st: L.Stmt, fail: _Target) -> list[str]:
        if isinstance(st, L.Barrier):
            fence = "CLK_LOCAL_MEM_FENCE" if st.space == "shared" else "CLK_GLOBAL_MEM_FENCE"
            return [f"barrier({fence});"]
        return super().stmt(st, fail)

    def loop(self, st: L.Loop, fail: _Target) -> list[str]:
        if st.kind == "parallel":
            st = L.Loop(st.var, st.lo, st.hi, st.body, "serial", st.step, st.simd)
        if st.kind not in ("grid", "thread"):
            return super().loop(L.Loop(st.var, st.lo, st.hi, st.body, st.kind, st.step), fail)
        where = self.launch.dimension(st.var)
        if where is None:
            raise UnsupportedError(f"{st.kind} loop {st.var} is not part of launch "
                                   f"{self.launch.name}")
        kind, dim = where
        ident = "get_group_id" if kind == "grid" else "get_local_id"
        step = "" if st.step == 1 else f" * {st.step}"
        head = f"const long {st.var} = {self.iexpr(st.lo)} + (long){ident}({dim}){step};"
        body = self.stmts(st.body, fail)
        return ["{", *_indent([head, f"if ({st.var} < {self.iexpr(st.hi)}) {{",
                               *_indent(body), "}"]), "}"]

    def write_launch(self) -> str:
        k = self.kernel
        args = []
        for b in (*k.params, *k.locals):
            const = "const " if not b.writable else ""
            args.append(f"__global {const}{b.dtype.c_name} *restrict {b.name}")
        args += ["__global int *pt_flag", "__global long *pt_err"]
        body = self.stmts(self.launch.body, _Target("pt_unused"))
        size = " x ".join(map(str, self.launch.groups))
        threads = " x ".join(map(str, self.launch.threads))
        head = (f"/* {self.launch.name}: {size} work-groups of {threads} work-items */\n"
                f"__kernel void {self.launch.name}(" + ",\n    ".join(args) + ")\n{\n")
        shared = [f"__local {b.dtype.c_name} {b.name}[{max(1, b.size)}];  /* {_comment(b.label)} */"
                  for b in _shared(self.launch.body)]
        lines = [*shared, "if (*pt_flag != 0)", "    return;  /* an earlier launch failed */",
                 *body]
        return head + "\n".join(_indent(lines)) + "\n}\n"


def _shared(stmts: tuple[L.Stmt, ...]) -> list[L.Buffer]:
    """The shared (work-group) buffers allocated anywhere in `stmts`."""
    found: list[L.Buffer] = []
    for st in stmts:
        if isinstance(st, L.Alloc):
            found += [b for b in st.buffers if b.space == "shared"]
        for body in _bodies(st):
            found += _shared(body)
    return found


def _bodies(st: L.Stmt) -> list[tuple[L.Stmt, ...]]:
    if isinstance(st, (L.Loop, L.Alloc)):
        return [st.body]
    if isinstance(st, L.If):
        return [st.then, st.else_]
    if isinstance(st, L.Switch):
        return [body for _, body in st.cases]
    return []


def print_opencl(kernel: L.Kernel) -> OpenCLSource:
    """The OpenCL C program of `kernel` and the launches that run it."""
    needs = cexpr.Needs()
    plan = launches(kernel)
    texts = [_KernelPrinter(kernel, launch, needs).write_launch() for launch in plan]
    helpers = cprelude.helpers(needs.names - {"fail", "pool"}, needs.int_types)
    head = (f"/* Generated by polytile from function {kernel.name}; do not edit.\n"
            f" * OpenCL C: {len(plan)} kernel(s), run in order. */\n")
    return OpenCLSource(head + HEADER + (helpers + "\n" if helpers else "") + "\n"
                        + "\n".join(texts), plan)
