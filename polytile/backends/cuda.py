"""The CUDA backend: the GPU mapping (pass `gpu`, the same as the OpenCL target's) printed
as CUDA C++, compiled by NVRTC to a CUBIN for the target's architecture, and launched
through the CUDA driver API where a device exists.

Stages: "loops" (the loop IR, grid and thread loops included) and "cuda" (its print,
polytile.codegen.cuda). The architecture is the target file's `--gpu-architecture=sm_XY`
flag (targets cuda-sm80, cuda-sm90); NVRTC's version rides along in the flags, so a
cache key names the compiler that made a CUBIN. A cache entry stores the source and the
CUBIN (`kernel-<hex>.bin`).

Compiling needs no GPU: on any host with NVRTC, a call builds and caches the CUBIN, and
only then `load` finds that there is no device and raises an UnsupportedError that says
so. `polytile show --stage cuda` prints the source with no NVRTC at all.

`load` gives a CUDAKernel with the C kernels' calling convention (polytile.runtime.kernel):
called with the parameters' NumPy arrays, it copies them to device memory, runs the
launches in order on the default stream, copies the outputs back and reports a failed
check. A parameter may instead be a DeviceBuffer (polytile.runtime.cuda_memory: memory
already on the device, from polytile.interop.device), passed by its pointer with no
copy either way. It has not run on a GPU yet (this project's machines have none); the
OpenCL backend runs the same mapping, printed by the same printer, on PoCL.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from polytile.backends import Generated, register
from polytile.backends.opencl import lowered
from polytile.codegen.cuda import print_cuda
from polytile.errors import ArgumentError, UnsupportedError
from polytile.ir import nodes as N
from polytile.loops import nodes as L
from polytile.loops.launch import Launch
from polytile.loops.text import kernel_text
from polytile.runtime.build import BuildResult
from polytile.runtime.cuda_memory import DeviceBuffer
from polytile.runtime.kernel import KernelFailure
from polytile.runtime.toolchain import Toolchain
from polytile.targets.target import Target

ARCH_FLAG = "--gpu-architecture="
# -default-device: the C helpers (polytile.codegen.cprelude) are plain C functions, and
# NVRTC makes them device functions; 177: a helper the kernel does not call is no news;
# -minimal: no CUDA runtime declarations (the kernels use none), about 10% faster builds.
NVRTC_FLAGS = ("-default-device", "--diag-suppress=177", "-minimal")


def target_arch(target: Target) -> str:
    """The architecture a cuda target compiles for: `sm_90` from its cflags."""
    for flag in target.cflags:
        if flag.startswith(ARCH_FLAG):
            return flag[len(ARCH_FLAG):]
    raise ArgumentError(f"target {target.name} names no CUDA architecture",
                        hint=f"its cflags need {ARCH_FLAG}sm_XY, as in cuda-sm90.json")


class CUDABackend:
    name: str = "cuda"
    stages: tuple[str, ...] = ("loops", "cuda")

    def generate(self, fn: N.Function, target: Target) -> Generated:
        kernel = lowered(fn)
        return Generated((("loops", kernel_text(kernel)),
                          ("cuda", print_cuda(kernel).text)), "kernel.cu")

    def flags(self, target: Target, toolchain: Toolchain,
              sanitize: Sequence[str]) -> tuple[str, ...]:
        """NVRTC's options: the target's architecture, NVRTC_FLAGS, and NVRTC's version
        as a define (so a cache key names the compiler)."""
        from polytile.runtime.cuda import nvrtc_problem, nvrtc_version
        if sanitize:
            raise UnsupportedError("the cuda targets have no sanitizers")
        problem = nvrtc_problem()
        if problem:
            raise UnsupportedError(f"target {target.name} compiles with {problem}",
                                   hint="`polytile show --stage cuda` prints the source "
                                        "without it")
        return (f"{ARCH_FLAG}{target_arch(target)}", *NVRTC_FLAGS,
                f"-DPOLYTILE_NVRTC={nvrtc_version()}")

    def build(self, source: str, flags: Sequence[str], toolchain: Toolchain, out_path: Path,
              *, source_path: Path) -> BuildResult:
        from polytile.runtime.cuda import compile_cubin
        source_path.write_text(source, encoding="utf-8")
        start = time.perf_counter()
        cubin, said = compile_cubin(source, tuple(flags), source_path.name)
        path = out_path.with_suffix(".bin")
        path.write_bytes(cubin)
        return BuildResult(path, source_path, ("nvrtc", *flags), said,
                           time.perf_counter() - start)

    def load(self, binary: Path, fn: N.Function) -> CUDAKernel:  # a kernel.Runnable
        from polytile.runtime.cuda import cuda_device
        device = cuda_device()          # no device: a clear error, after the build
        kernel = lowered(fn)
        return CUDAKernel(device, binary.read_bytes(), kernel, print_cuda(kernel).launches)


class CUDAKernel:
    """A loaded CUBIN and the launches that run one call of it."""

    takes_addresses = False     # host memory is copied to the device: arrays only

    def __init__(self, device: Any, cubin: bytes, kernel: L.Kernel, plan: tuple[Launch, ...]):
        from polytile.runtime.cuda import check, load_module
        self.device = device
        cu = device.driver
        module = load_module(device, cubin)
        self.kernels = [(check(cu, cu.cuModuleGetFunction(module, launch.name.encode())),
                         launch) for launch in plan]
        self.module = module
        self.params = kernel.params
        self.locals = kernel.locals
        self.n_params = len(kernel.params)
        for _, launch in self.kernels:
            grid = (*launch.groups, 1, 1)[:3]
            over = [f"{g} > {m}" for g, m in zip(grid, device.max_grid) if g > m]
            if over:
                raise UnsupportedError(f"{launch.name} needs a grid of {launch.groups} blocks; "
                                       f"the device allows at most {device.max_grid} "
                                       f"({', '.join(over)})",
                                       hint="lower gpu.dims, so the long index runs along x")

    def __call__(self, buffers: Sequence[Any]) -> KernelFailure | None:
        """Run on the parameters' buffers: C-contiguous host arrays, copied to the device
        and (outputs) back; or DeviceBuffers, device memory passed by its pointer with no
        copy (the caller checked its shape, dtype, layout and device)."""
        from polytile.runtime.cuda import check
        cu = self.device.driver
        self.device.make_current()
        given = [b if isinstance(b, DeviceBuffer) else np.asarray(b) for b in buffers]
        if not all(isinstance(a, DeviceBuffer) or a.flags.c_contiguous for a in given):
            raise ArgumentError("a CUDA kernel takes contiguous arrays (the launcher copies "
                                "strided ones first)")
        pointers: list[Any] = []        # every argument's device pointer, in order
        allocated: list[Any] = []       # those made here, freed at the end
        try:
            def device_copy(host: np.ndarray, copy: bool) -> None:
                pointer = check(cu, cu.cuMemAlloc(max(1, host.nbytes)))
                allocated.append(pointer)
                pointers.append(pointer)
                if copy and host.nbytes:
                    check(cu, cu.cuMemcpyHtoD(pointer, host.ctypes.data, host.nbytes))

            for a in given:
                if isinstance(a, DeviceBuffer):
                    pointers.append(a.pointer)
                else:
                    device_copy(a, True)
            for b in self.locals:
                device_copy(np.full(max(1, b.size), np.nan if b.init == "nan" else 0,
                                    b.dtype.numpy), bool(b.init))
            status = np.zeros(1, np.int32)
            err = np.zeros(4, np.int64)
            for host in (status, err):
                device_copy(host, True)
            # Work the callers queued for their device arrays on other streams is done
            # before the launches (the legacy default stream waits only for blocking ones).
            for stream in sorted({a.pending for a in given if isinstance(a, DeviceBuffer)
                                  and a.pending is not None}):
                check(cu, cu.cuStreamSynchronize(stream))
            # cuLaunchKernel takes the address of an array of the arguments' addresses.
            values = [np.array([int(p)], np.uint64) for p in pointers]
            args = np.array([v.ctypes.data for v in values], np.uint64)
            for function, launch in self.kernels:
                grid = (*launch.groups, 1, 1)[:3]
                block = (*launch.threads, 1, 1)[:3]
                if 0 not in grid:
                    check(cu, cu.cuLaunchKernel(function, *grid, *block, 0, 0,
                                                args.ctypes.data, 0))
            check(cu, cu.cuCtxSynchronize())
            for param, a, pointer in zip(self.params, given, pointers):
                if param.writable and not isinstance(a, DeviceBuffer) and a.nbytes:
                    check(cu, cu.cuMemcpyDtoH(a.ctypes.data, pointer, a.nbytes))
            check(cu, cu.cuMemcpyDtoH(status.ctypes.data, pointers[-2], status.nbytes))
            check(cu, cu.cuMemcpyDtoH(err.ctypes.data, pointers[-1], err.nbytes))
        finally:
            for pointer in allocated:
                cu.cuMemFree(pointer)
        if status[0] == 0:
            return None
        return KernelFailure(int(err[0]), int(err[1]), int(err[2]), int(err[3]))


register(CUDABackend())
