"""The OpenCL device polytile runs kernels on, through pyopencl (the optional `gpu` extra).

`opencl_device()` picks, once per process, the first device of any platform on which a
probe kernel (a work-group reduction in `__local` memory with barriers) builds and gives
the right answer: an installed driver that cannot compile (PoCL's wheel on a CPU its LLVM
does not know says "unknown target CPU") is passed over for the next one. Without pyopencl
or a working device, `device_problem()` says why in words and using the device raises
UnsupportedError with that reason.

`build_program` compiles OpenCL C for the device and returns the device's program binary
(what a cache entry stores; the device's name and driver version are in the cache key, so
a binary is only loaded where it was made); `load_program` makes a program from one.

On PoCL, a program with a row group (polytile.loops.gpu_rows, which marks its code with
ROW_GROUP_MARK) is built with `-cl-opt-disable`: PoCL 3.1's optimizer miscompiled the
multi-interests motif's row group (tests/gpu/test_block_composition.py: its 32
work-items' partial sums read as 0 although the values they summed were right; the same
source built unoptimized, and on the CUDA emulation, is right). Other programs stay
optimized: unoptimized, softmax 4096 x 1024 with a kernel per statement (reductions
across work-items, with barriers) took 139 ms instead of 16 (Zen 5 host).
"""
from __future__ import annotations

import re
import threading
import warnings
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from polytile.errors import BuildError, UnsupportedError

_PROBE = """
__kernel void probe(__global const float *x, __global float *out)
{
    __local float part[16];
    int l = get_local_id(0);
    part[l] = x[get_global_id(0)];
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = 8; s > 0; s >>= 1) {
        if (l < s)
            part[l] += part[l + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (l == 0)
        out[get_group_id(0)] = part[0];
}
"""


@dataclass(frozen=True)
class Device:
    """A working OpenCL device with its context and an in-order queue (kernels enqueued on
    it run one after another, which is how one call's kernels see each other's writes)."""

    cl: Any                 # the pyopencl module
    device: Any
    context: Any
    queue: Any
    fp64: bool              # cl_khr_fp64: float64 kernels build
    fp16: bool              # cl_khr_fp16
    max_work_group: int
    pocl: bool = False      # PoCL: programs with row groups are built unoptimized

    def options(self, source: str, options: tuple[str, ...]) -> list[str]:
        """The build options for `source` on this device (see the module docstring)."""
        from polytile.loops.gpu_rows import ROW_GROUP_MARK
        if self.pocl and ROW_GROUP_MARK in source:
            return [*options, "-cl-opt-disable"]
        return list(options)

    @property
    def identity(self) -> str:
        """Device, driver and OpenCL version: what a compiled binary is valid for."""
        d = self.device
        text = f"{d.name}|{d.platform.name}|{d.driver_version}|{d.version}"
        return re.sub(r"[^A-Za-z0-9_.|+-]", "_", text)


_LOCK = threading.Lock()


@lru_cache(maxsize=1)
def _find_device() -> Device | str:
    try:
        import pyopencl as cl
    except ImportError as e:
        return f"pyopencl ({e}; pip install 'polytile[gpu]')"
    try:
        platforms = cl.get_platforms()
    except Exception as e:  # noqa: BLE001 (no ICD configuration: pyopencl raises its own)
        return f"an OpenCL platform (pyopencl finds none: {e})"
    failures = []
    for platform in platforms:
        for device in platform.get_devices():
            try:
                return _probe(cl, device)
            except Exception as e:  # noqa: BLE001 (any failure: try the next device)
                first = str(e).strip().splitlines()
                failures.append(f"{device.name}: {first[-1] if first else type(e).__name__}")
    if not failures:
        return "an OpenCL device (no platform has one)"
    return "a working OpenCL device (" + "; ".join(failures) + ")"


def _probe(cl: Any, device: Any) -> Device:
    context = cl.Context([device])
    queue = cl.CommandQueue(context)
    program = cl.Program(context, _PROBE).build()
    x = np.arange(32, dtype=np.float32)
    out = np.zeros(2, np.float32)
    mf = cl.mem_flags
    xb = cl.Buffer(context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=x)
    ob = cl.Buffer(context, mf.WRITE_ONLY, out.nbytes)
    program.probe(queue, (32,), (16,), xb, ob)
    cl.enqueue_copy(queue, out, ob)
    queue.finish()
    if not np.array_equal(out, x.reshape(2, 16).sum(axis=1)):
        raise RuntimeError(f"the probe kernel computed {out.tolist()}")
    ext = device.extensions.split()
    return Device(cl, device, context, queue, "cl_khr_fp64" in ext, "cl_khr_fp16" in ext,
                  int(device.max_work_group_size),
                  "Portable Computing Language" in device.platform.name)


def device_problem() -> str | None:
    """None when a working OpenCL device exists, else what is missing, in words."""
    with _LOCK:
        found = _find_device()
    return found if isinstance(found, str) else None


def opencl_device() -> Device:
    """The device kernels run on; UnsupportedError (saying what is missing) without one."""
    with _LOCK:
        found = _find_device()
    if isinstance(found, str):
        raise UnsupportedError(f"the opencl target needs {found}",
                               hint="install the gpu extra (pip install 'polytile[gpu]') and an "
                                    "OpenCL driver such as PoCL; `polytile show --target "
                                    "opencl` prints the code without one")
    return found


def build_program(source: str, options: tuple[str, ...]) -> tuple[bytes, str]:
    """Compile `source` for the device: its program binary and the compiler's warnings
    (kept in the cache entry, not shown: pyopencl would warn on every build). A compile
    error is a BuildError carrying the source and the compiler's log."""
    dev = opencl_device()
    if not dev.fp64 and re.search(r"\bdouble\b", source):
        raise UnsupportedError(f"the OpenCL device {dev.device.name} lacks cl_khr_fp64, which "
                               "this kernel needs (float64 data, or a float-to-integer "
                               "conversion, computed in double)",
                               hint="use a device with fp64, or the CPU targets")
    try:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always", dev.cl.CompilerWarning)
            program = dev.cl.Program(dev.context, source).build(
                options=dev.options(source, options))
    except dev.cl.Error as e:
        log = str(e)
        lines = [line for line in log.splitlines() if "error" in line.lower()][:5]
        raise BuildError("the OpenCL compiler failed on generated code:\n  "
                         + "\n  ".join(lines or log.splitlines()[:5]), source, log,
                         hint="`polytile show FILE.tc --stage opencl --target opencl` prints "
                              "the source") from e
    binaries = program.get_info(dev.cl.program_info.BINARIES)
    return bytes(binaries[0]), "\n".join(str(w.message) for w in said)


def load_program(binary: bytes) -> Any:
    """A built program from a binary `build_program` made on this device."""
    dev = opencl_device()
    program = dev.cl.Program(dev.context, [dev.device], [binary])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dev.cl.CompilerWarning)
        return program.build()
