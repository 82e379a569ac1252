"""Runs the CUDA C++ polytile prints on the CPU, through the real launcher (CUDAKernel),
with the CUDA driver API replaced by an emulation: the test of CUDA semantics this
project can make without a GPU.

The printed source is compiled by g++ as it is, after a small header that gives CUDA's
names a CPU meaning:

    __shared__ float l0[272];   static: one array shared by the threads of the block
    __syncthreads();            an OpenMP barrier of the block's team
    threadIdx.x / blockIdx.y    a thread's (thread_local) and the block's coordinates
    atomicCAS, __int_as_float   GCC's __sync compare-and-swap, a bit copy
    __shfl_xor_sync             a post and a take between two barriers of the block

Blocks run one after another; the threads of a block are an OpenMP team of exactly
that many threads, so every barrier waits for all of them, as on a GPU (a kernel whose
barriers some threads skip hangs here: it is wrong on a GPU too). Each launch gets an
`emu_<name>(grid, block, void **params)` entry that reads its arguments the way
cuLaunchKernel passes them (params[i] is the address of argument i).

`EmulatedDriver` implements the driver calls CUDAKernel makes over host memory:
cuMemAlloc hands out addresses of NumPy buffers (the emulation's "device pointers"),
copies are memmoves, cuModuleLoadData takes the path of the shared object built here
instead of a CUBIN, and cuLaunchKernel calls the launch's entry. It records what a test
checks: the launches, the device pointers each launch was given, the destinations of
host-to-device copies and the streams waited for; `events` lists launches, copies (with
their sizes) and context synchronizes in the order they happened.
"""
from __future__ import annotations

import ctypes
import enum
import re
import subprocess
from pathlib import Path
from typing import Any

import numpy as np

from polytile.runtime.cuda import Device

HEADER = r"""
#include <cmath>
#include <cstring>
#include <omp.h>
#undef NAN
#undef INFINITY
#undef INT64_C
#undef UINT64_C
#undef INT64_MIN
#undef INT32_MIN
/* the printed header defines the fixed-width types as NVRTC has none; here the system
   has its own, so the printed ones get names of their own */
#define int8_t pt_emu_int8
#define int16_t pt_emu_int16
#define int32_t pt_emu_int32
#define int64_t pt_emu_int64
#define uint8_t pt_emu_uint8
#define uint16_t pt_emu_uint16
#define uint32_t pt_emu_uint32
#define uint64_t pt_emu_uint64
struct pt_emu_dim3 { long long x, y, z; };
static pt_emu_dim3 blockIdx;
static thread_local pt_emu_dim3 threadIdx;
#define __global__
#define __device__
#define __shared__ static
#define __syncthreads() _Pragma("omp barrier")
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline int atomicCAS(int *p, int expected, int value)
{
    return __sync_val_compare_and_swap(p, expected, value);
}
/* A warp shuffle: every thread of the block posts its value, then takes the value of
   the thread at its place xor mask (the lowering has all threads of a block shuffle
   together, so the block's barriers stand for the warp's lock-step). */
template <typename T> static T __shfl_xor_sync(unsigned, T value, int mask)
{
    static T posted[1024];
    int me = omp_get_thread_num();
    posted[me] = value;
    _Pragma("omp barrier")
    T got = posted[me ^ mask];
    _Pragma("omp barrier")
    return got;
}
"""


_KERNEL = re.compile(r'extern "C" __global__ void (\w+)\((.*?)\)\n\{', re.DOTALL)


def kernels(source: str) -> list[tuple[str, list[str]]]:
    """(name, argument types) of each kernel the source defines, read from its text."""
    found = []
    for name, params in _KERNEL.findall(source):
        types = [re.sub(r"\s*\w+$", "", p.strip()).replace("__restrict__", "").strip()
                 for p in params.split(",")]
        found.append((name, types))
    return found


def entry(name: str, types: list[str]) -> str:
    """The emulated launch of kernel `name`: its grid's blocks in turn, each a team."""
    args = ", ".join(f"*({t} const *)params[{i}]" for i, t in enumerate(types))
    return f"""
extern "C" void emu_{name}(long long gx, long long gy, long long gz, long long bx,
                          long long by, long long bz, void **params)
{{
    omp_set_dynamic(0);
    for (long long z = 0; z < gz; z++)
        for (long long y = 0; y < gy; y++)
            for (long long x = 0; x < gx; x++) {{
                blockIdx = pt_emu_dim3{{x, y, z}};
                #pragma omp parallel num_threads(bx * by * bz)
                {{
                    long long t = omp_get_thread_num();
                    threadIdx = pt_emu_dim3{{t % bx, t / bx % by, t / (bx * by)}};
                    {name}({args});
                }}
            }}
}}
"""


def build(source: str, out: Path) -> Path:
    """The printed CUDA source with the emulation header and the launch entries, as a
    shared object."""
    text = HEADER + source + "".join(entry(name, types) for name, types in kernels(source))
    cpp = out.with_suffix(".cpp")
    cpp.write_text(text)
    done = subprocess.run(["g++", "-std=c++17", "-O1", "-fopenmp", "-shared", "-fPIC",
                           "-w", "-o", str(out), str(cpp)], capture_output=True, text=True,
                          check=False)
    if done.returncode:
        raise AssertionError(f"g++ refused the printed CUDA:\n{done.stderr[-3000:]}")
    return out


class CUresult(enum.Enum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_NO_BINARY_FOR_GPU = 209


class CUpointer_attribute(enum.Enum):
    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9


_OK = (CUresult.CUDA_SUCCESS,)
_LONG = ctypes.c_longlong


class EmulatedDriver:
    """The driver calls CUDAKernel makes, over host memory (see the module docstring)."""

    CUresult = CUresult
    CUpointer_attribute = CUpointer_attribute

    def __init__(self, cache_dir: Path, work_dir: Path) -> None:
        self.cache_dir = cache_dir          # where the kernel cache keeps CUBINs and sources
        self.work_dir = work_dir
        self.memory: dict[int, np.ndarray] = {}
        self.launched: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = []
        self.arguments: list[tuple[int, ...]] = []     # each launch's pointer arguments
        self.copied_to: list[int] = []                 # cuMemcpyHtoD's destinations
        self.synchronized: list[int] = []              # cuStreamSynchronize's streams
        self.events: list[tuple[str, int]] = []        # ("launch" | "sync", 0), ("htod" |
        #                                                "dtoh", bytes), in call order

    def cuCtxSetCurrent(self, context: Any) -> tuple:
        return _OK

    def cuModuleLoadData(self, image: bytes) -> tuple:
        """The CUBIN's source, from its cache entry, built for the CPU."""
        for binary in sorted(self.cache_dir.glob("kernels/*/kernel-*.bin")):
            if binary.read_bytes() == image:
                source = (binary.parent / "kernel.cu").read_text()
                out = self.work_dir / f"{binary.parent.name}.so"
                library = ctypes.CDLL(str(build(source, out)))
                arity = {name: len(types) for name, types in kernels(source)}
                return (CUresult.CUDA_SUCCESS, (library, arity))
        raise AssertionError("a CUBIN that is in no cache entry")

    def cuModuleGetFunction(self, module: Any, name: bytes) -> tuple:
        library, arity = module
        function = getattr(library, f"emu_{name.decode()}")
        function.argtypes = [_LONG] * 6 + [ctypes.c_void_p]
        return (CUresult.CUDA_SUCCESS, (name.decode(), function, arity[name.decode()]))

    def cuMemAlloc(self, nbytes: int) -> tuple:
        block = np.full(nbytes, 0xA5, np.uint8)       # not zeroed, like device memory
        self.memory[block.ctypes.data] = block
        return (CUresult.CUDA_SUCCESS, block.ctypes.data)

    def cuMemFree(self, pointer: int) -> tuple:
        del self.memory[int(pointer)]
        return _OK

    def cuMemcpyHtoD(self, device: int, host: int, nbytes: int) -> tuple:
        self.copied_to.append(int(device))
        self.events.append(("htod", nbytes))
        ctypes.memmove(int(device), host, nbytes)
        return _OK

    def cuMemsetD8(self, device: int, value: int, nbytes: int) -> tuple:
        ctypes.memset(int(device), value, nbytes)
        return _OK

    def cuPointerGetAttribute(self, attribute: CUpointer_attribute, pointer: int) -> tuple:
        """The device ordinal of memory handed out here (0); anything else is not device
        memory, as the driver says of a host pointer."""
        assert attribute is CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
        if any(base <= pointer < base + block.nbytes for base, block in self.memory.items()):
            return (CUresult.CUDA_SUCCESS, 0)
        return (CUresult.CUDA_ERROR_INVALID_VALUE, None)

    def cuGetErrorString(self, err: CUresult) -> tuple:
        return (CUresult.CUDA_SUCCESS, err.name.encode())

    def cuMemcpyDtoH(self, host: int, device: int, nbytes: int) -> tuple:
        self.events.append(("dtoh", nbytes))
        ctypes.memmove(host, int(device), nbytes)
        return _OK

    def cuLaunchKernel(self, function: Any, gx: int, gy: int, gz: int, bx: int, by: int,
                       bz: int, shared: int, stream: int, params: int, extra: int) -> tuple:
        name, call, arity = function
        self.launched.append((name, (gx, gy, gz), (bx, by, bz)))
        self.events.append(("launch", 0))
        # params[i] is the address of argument i, itself a device pointer.
        slots = (ctypes.c_void_p * arity).from_address(params)
        self.arguments.append(tuple(ctypes.c_void_p.from_address(s).value or 0
                                    for s in slots))
        call(gx, gy, gz, bx, by, bz, ctypes.c_void_p(params))
        return _OK

    def cuStreamSynchronize(self, stream: int) -> tuple:
        self.synchronized.append(int(stream))
        return _OK

    def cuCtxSynchronize(self) -> tuple:
        self.events.append(("sync", 0))
        return _OK


def emulated_device(cache_dir: Path, work_dir: Path) -> Device:
    return Device(EmulatedDriver(cache_dir, work_dir), 0, None, "CPU emulation", (9, 0),
                  (2**31 - 1, 65535, 65535))
