"""CUDA device memory through the driver API: what a CUDA kernel takes besides host arrays.

    DeviceBuffer(pointer, nbytes, device)   the caller's device memory, passed to the
                                            kernel by its pointer (no copy, not freed)
    DeviceArray(device, shape, dtype, zero) new device memory (cuMemAlloc; cuMemsetD8
                                            when it must start as zeros)
    DeviceArray.from_host(device, array)    a copy of a NumPy array on the device
    pointer_device(device, pointer)         the ordinal of the device a pointer is on

A DeviceArray is what a call on device arguments returns when the caller's arrays are
not torch tensors: C-contiguous device memory exposing `__cuda_array_interface__`
(version 3, so `cupy.asarray`, `numba.cuda.as_cuda_array` and `torch.as_tensor(...,
device="cuda")` take it without a copy) and `__dlpack_device__`; `to_host()` copies it
to a NumPy array. It owns its memory, freed when the object is collected. It does not
export `__dlpack__` (building DLPack capsules by hand is not done here).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from polytile.runtime.cuda import Device, check

KDL_CUDA = 2                # DLPack's device types of CUDA memory
KDL_CUDA_MANAGED = 13


@dataclass(frozen=True)
class DeviceBuffer:
    """Memory on a CUDA device that a kernel argument points at; `device` is the
    ordinal, None when the caller's object did not say (the driver is asked); `stream`
    the producer's stream whose work must finish before the kernel reads it (the CUDA
    array interface's field: None or 1, the legacy default stream, which the launches
    use, need no wait; 2 is the per-thread default stream)."""

    pointer: int
    nbytes: int
    device: int | None
    stream: int | None = None

    @property
    def pending(self) -> int | None:
        """The stream to synchronize before a launch on the legacy default stream."""
        return None if self.stream in (None, 1) else self.stream


class DeviceArray:
    """C-contiguous memory allocated on a CUDA device (see the module docstring)."""

    def __init__(self, device: Device, shape: tuple[int, ...], dtype: np.dtype,
                 zero: bool = False):
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        self.device = device
        cu = device.driver
        device.make_current()
        handle = check(cu, cu.cuMemAlloc(max(1, self.nbytes)))
        self.pointer = int(handle)
        # Freed with the object; the finalizer holds the device, not the array.
        self._free = weakref.finalize(self, _free, device, handle)
        if zero and self.nbytes:
            check(cu, cu.cuMemsetD8(handle, 0, self.nbytes))

    @staticmethod
    def from_host(device: Device, array: np.ndarray) -> DeviceArray:
        """A copy of a NumPy array on the device (cuMemcpyHtoD)."""
        host = np.ascontiguousarray(array)
        copy = DeviceArray(device, host.shape, host.dtype)
        if host.nbytes:
            cu = device.driver
            check(cu, cu.cuMemcpyHtoD(copy.pointer, host.ctypes.data, host.nbytes))
        return copy

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": self.shape, "typestr": self.dtype.str, "strides": None,
                "data": (self.pointer, False), "version": 3, "stream": None}

    def __dlpack_device__(self) -> tuple[int, int]:
        return (KDL_CUDA, self.device.ordinal)

    def to_host(self) -> np.ndarray:
        """A NumPy copy of the contents (cuMemcpyDtoH)."""
        host = np.empty(self.shape, self.dtype)
        if self.nbytes:
            cu = self.device.driver
            self.device.make_current()
            check(cu, cu.cuCtxSynchronize())
            check(cu, cu.cuMemcpyDtoH(host.ctypes.data, self.pointer, self.nbytes))
        return host

    def __repr__(self) -> str:
        return (f"DeviceArray(shape={self.shape}, dtype={self.dtype}, "
                f"device=cuda:{self.device.ordinal})")


def _free(device: Device, handle: Any) -> None:
    device.make_current()       # the thread collecting the array may have no context
    device.driver.cuMemFree(handle)


def pointer_device(device: Device, pointer: int) -> int:
    """The ordinal of the device `pointer` is memory of (cuPointerGetAttribute)."""
    cu = device.driver
    attribute = cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
    return int(check(cu, cu.cuPointerGetAttribute(attribute, pointer)))
