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
micro-kernels) is not printed: pass `gpu` does not make any. The printer is the one the
CUDA backend uses too (polytile.codegen.gpu_c); this module gives OpenCL's spellings.
"""
from __future__ import annotations

from polytile.codegen.cabi import ERR_INDEX
from polytile.codegen.gpu_c import Dialect, GPUSource, print_gpu
from polytile.loops import nodes as L

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


OPENCL = Dialect(
    name="OpenCL", language="OpenCL C", header=HEADER, kernel="__kernel void",
    address="__global ", restrict="restrict", int64="long",
    group_id="get_group_id({dim})", local_id="get_local_id({dim})", shared="__local",
    barrier=(("shared", "barrier(CLK_LOCAL_MEM_FENCE);"),
             ("group", "barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);"),
             ("global", "barrier(CLK_GLOBAL_MEM_FENCE);")),
    units=("work-groups", "work-items"))

OpenCLSource = GPUSource     # the printed program and its launches


def print_opencl(kernel: L.Kernel) -> GPUSource:
    """The OpenCL C program of `kernel` and the launches that run it."""
    return print_gpu(kernel, OPENCL)
