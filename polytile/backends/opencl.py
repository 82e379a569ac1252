"""The OpenCL backend: the GPU mapping (pass `gpu`) printed as OpenCL C and run through
pyopencl, on a GPU or, on a host without one, on the CPU through PoCL.

Stages: "loops" (the loop IR, grid and thread loops included) and "opencl" (its print,
polytile.codegen.opencl). A cache entry stores the source and the device's program binary
(`kernel-<hex>.bin`); the device's name and driver version are part of the flags, so of the
cache key, and a binary is only ever loaded on the device that made it.

`load` gives a Kernel with the C kernels' calling convention (polytile.runtime.kernel):
called with the parameters' NumPy arrays (contiguous: the launcher copies strided inputs,
as for the C kernels), it copies them to device buffers, runs the launches in order on the
device's in-order queue, copies the outputs back and reports a failed check.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from polytile.backends import Generated, register
from polytile.codegen.opencl import print_opencl
from polytile.errors import UnsupportedError
from polytile.ir import nodes as N
from polytile.loops import nodes as L
from polytile.loops.launch import Launch
from polytile.loops.lower import LowerOptions, lower
from polytile.loops.text import kernel_text
from polytile.runtime.build import BuildResult
from polytile.runtime.kernel import KernelFailure
from polytile.runtime.toolchain import Toolchain
from polytile.targets.target import Target

# Nested local buffers are a work-item's private arrays, never heap blocks.
LOWERING = LowerOptions(stack_bytes=1 << 40, threads=True)


def lowered(fn: N.Function) -> L.Kernel:
    return lower(fn, LOWERING)


class OpenCLBackend:
    name: str = "opencl"
    stages: tuple[str, ...] = ("loops", "opencl")

    def generate(self, fn: N.Function, target: Target) -> Generated:
        kernel = lowered(fn)
        return Generated((("loops", kernel_text(kernel)),
                          ("opencl", print_opencl(kernel).text)), "kernel.cl")

    def flags(self, target: Target, toolchain: Toolchain,
              sanitize: Sequence[str]) -> tuple[str, ...]:
        """Build options; the device's identity rides along as a define, so a cache key
        names the device a binary was made for."""
        if sanitize:
            raise UnsupportedError("the opencl target has no sanitizers")
        from polytile.runtime.opencl import opencl_device
        return ("-cl-std=CL1.2", f"-DPOLYTILE_DEVICE={opencl_device().identity}")

    def build(self, source: str, flags: Sequence[str], toolchain: Toolchain, out_path: Path,
              *, source_path: Path) -> BuildResult:
        from polytile.runtime.opencl import build_program
        source_path.write_text(source, encoding="utf-8")
        start = time.perf_counter()
        binary, said = build_program(source, tuple(flags))
        path = out_path.with_suffix(".bin")
        path.write_bytes(binary)
        return BuildResult(path, source_path, ("pyopencl", *flags), said,
                           time.perf_counter() - start)

    def load(self, binary: Path, fn: N.Function) -> OpenCLKernel:  # a kernel.Runnable
        from polytile.runtime.opencl import load_program
        kernel = lowered(fn)
        plan = print_opencl(kernel).launches
        return OpenCLKernel(load_program(binary.read_bytes()), kernel, plan)


class OpenCLKernel:
    """A loaded OpenCL program and the launches that run one call of it."""

    takes_addresses = False     # its buffers are copied to the device: arrays only

    def __init__(self, program: Any, kernel: L.Kernel, plan: tuple[Launch, ...]):
        from polytile.runtime.opencl import opencl_device
        self.device = opencl_device()
        self.kernels = [(getattr(program, launch.name), launch) for launch in plan]
        self.params = kernel.params
        self.locals = kernel.locals
        self.n_params = len(kernel.params)
        # pyopencl sets a kernel's arguments, then enqueues it: two calls from two threads
        # at once must not interleave those steps.
        self._lock = threading.Lock()
        limit = self.device.max_work_group
        for _, launch in self.kernels:
            if int(np.prod(launch.threads)) > limit:
                raise UnsupportedError(f"{launch.name} has {np.prod(launch.threads)} work-items "
                                       f"per group; the device runs at most {limit}",
                                       hint="lower the option gpu.threads")

    def __call__(self, buffers: Sequence[Any]) -> KernelFailure | None:
        cl, ctx, queue = self.device.cl, self.device.context, self.device.queue
        mf = cl.mem_flags
        arrays = [np.asarray(b) for b in buffers]
        device_buffers = []
        for array in arrays:
            if array.nbytes == 0:         # OpenCL has no empty buffers
                device_buffers.append(cl.Buffer(ctx, mf.READ_WRITE, max(1, array.itemsize)))
            else:
                device_buffers.append(cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR,
                                                hostbuf=np.ascontiguousarray(array)))
        for b in self.locals:
            item = b.dtype.numpy.itemsize
            local = cl.Buffer(ctx, mf.READ_WRITE, max(1, b.size) * item)
            if b.init:
                fill = np.full(1, np.nan if b.init == "nan" else 0, b.dtype.numpy)
                cl.enqueue_fill_buffer(queue, local, fill, 0, max(1, b.size) * item)
            device_buffers.append(local)
        flag = np.zeros(1, np.int32)
        err = np.zeros(4, np.int64)
        flag_buffer = cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=flag)
        err_buffer = cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=err)
        with self._lock:
            for program_kernel, launch in self.kernels:
                global_size = tuple(g * t for g, t in zip(launch.groups, launch.threads))
                if 0 not in global_size:
                    program_kernel(queue, global_size, launch.threads, *device_buffers,
                                   flag_buffer, err_buffer)
        for param, array, buffer in zip(self.params, arrays, device_buffers):
            if param.writable and array.nbytes:
                cl.enqueue_copy(queue, array, buffer)
        cl.enqueue_copy(queue, flag, flag_buffer)
        cl.enqueue_copy(queue, err, err_buffer)
        queue.finish()
        if flag[0] == 0:
            return None
        return KernelFailure(int(err[0]), int(err[1]), int(err[2]), int(err[3]))


register(OpenCLBackend())
