"""Loop IR -> CUDA C++ for NVRTC: one `extern "C" __global__` function per launch
(polytile.loops.launch), printed by the GPU printer the OpenCL backend uses
(polytile.codegen.gpu_c); this module gives CUDA's spellings. It decides nothing: the
mapping, the staged tiles and the barriers are pass `gpu`'s, the same as OpenCL's.

    /* pt_k1: 2 x 3 blocks of 8 x 8 threads */
    extern "C" __global__ void pt_k1(const float *__restrict__ b0, ...,
        int *pt_flag, int64_t *pt_err)
    {
        __shared__ float l0[272];  /* A: staged 16x16 (rows of 17) */
        ...
        const int64_t i2 = 0 + (int64_t)blockIdx.y * 16;
        ...
        __syncthreads();

Kernel arguments are OpenCL's (polytile.codegen.gpu_c): the parameters' device pointers,
the top-level locals', then the failure flag and record. Grid dimension d is blockIdx's
x, y, z, a group's threadIdx's. NVRTC has no C library headers: the header below defines
the C99 names the statements use (fixed-width integers, NAN, INFINITY, INT64_MIN) over
CUDA's own, and the C helpers (polytile.codegen.cprelude) compile as device functions
because the backend passes NVRTC `-default-device`. `__syncthreads()` orders shared and
global memory within a block, which is what every kind of Barrier asks.
"""
from __future__ import annotations

from polytile.codegen.cabi import ERR_INDEX
from polytile.codegen.gpu_c import Dialect, GPUSource, print_gpu
from polytile.loops import nodes as L

HEADER = "\n".join([
    "typedef signed char int8_t;",
    "typedef short int16_t;",
    "typedef int int32_t;",
    "typedef long long int64_t;",
    "typedef unsigned char uint8_t;",
    "typedef unsigned short uint16_t;",
    "typedef unsigned int uint32_t;",
    "typedef unsigned long long uint64_t;",
    "#define INT64_C(c) c##LL",
    "#define UINT64_C(c) c##ULL",
    "#define INT64_MIN (-INT64_C(9223372036854775807) - 1)",
    "#define INT32_MIN (-2147483647 - 1)",
    "#define NAN __int_as_float(0x7fc00000)",
    "#define INFINITY __int_as_float(0x7f800000)",
    f"#define PT_ERR_INDEX {ERR_INDEX}",
    "",
    "static __device__ void pt_fail(int *flag, int64_t *err, int code, int64_t buffer,",
    "                               int64_t dim, int64_t value)",
    "{",
    "    if (atomicCAS(flag, 0, code) == 0) {",
    "        err[0] = code;",
    "        err[1] = buffer;",
    "        err[2] = dim;",
    "        err[3] = value;",
    "    }",
    "}",
    "",
])

CUDA = Dialect(
    name="CUDA", language="CUDA C++", header=HEADER, kernel='extern "C" __global__ void',
    address="", restrict="__restrict__", int64="int64_t",
    group_id="blockIdx.{axis}", local_id="threadIdx.{axis}", shared="__shared__",
    barrier=(("shared", "__syncthreads();"), ("group", "__syncthreads();"),
             ("global", "__syncthreads();")),
    units=("blocks", "threads"), form="cuda",
    shuffle_xor="__shfl_xor_sync(0xffffffffu, {value}, {mask})")


def print_cuda(kernel: L.Kernel) -> GPUSource:
    """The CUDA C++ program of `kernel` and the launches that run it."""
    return print_gpu(kernel, CUDA)
