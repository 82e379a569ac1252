"""Test doubles of CUDA arrays: memory the emulated driver
(tests/gpu/cuda_emulation.EmulatedDriver) allocated, described as CuPy's or Numba's
arrays do, by `__cuda_array_interface__` and `__dlpack_device__` = (kDLCUDA, ordinal)
(EmulatedCudaArray), or only by a DLPack capsule saying kDLCUDA (DLPackOnlyArray, as
TensorFlow's). They are no library's device arrays; they let the launcher's device path
run without a GPU."""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import numpy as np

from polytile.runtime.cuda import Device

KDL_CUDA = 2


@dataclass(frozen=True)
class EmulatedCudaArray:
    """`shape` elements of `dtype` at `pointer` (emulated device memory), with byte
    `strides` (None: C-contiguous), said to be on device `ordinal`."""

    pointer: int
    shape: tuple[int, ...]
    dtype: np.dtype
    strides: tuple[int, ...] | None = None
    ordinal: int = 0
    describe_device: bool = True     # False: only the CAI, as Numba's arrays
    stream: int | None = None        # the CAI's stream: the producer's pending work

    @staticmethod
    def of(device: Device, host: np.ndarray, ordinal: int = 0,
           describe_device: bool = True) -> EmulatedCudaArray:
        """A copy of `host` in memory the emulated driver hands out."""
        host = np.ascontiguousarray(host)
        pointer = device.driver.cuMemAlloc(max(1, host.nbytes))[1]
        ctypes.memmove(pointer, host.ctypes.data, host.nbytes)
        return EmulatedCudaArray(pointer, host.shape, host.dtype, None, ordinal,
                                 describe_device)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": self.shape, "typestr": self.dtype.str, "strides": self.strides,
                "data": (self.pointer, False), "version": 3, "stream": self.stream}

    @property
    def __dlpack_device__(self) -> Any:
        if not self.describe_device:
            raise AttributeError("__dlpack_device__")     # as an object with only the CAI
        return lambda: (KDL_CUDA, self.ordinal)

    def transposed(self) -> EmulatedCudaArray:
        """The same memory as a transposed (strided) 2-D view."""
        rows, cols = self.shape
        size = self.dtype.itemsize
        return EmulatedCudaArray(self.pointer, (cols, rows), self.dtype, (size, cols * size),
                                 self.ordinal, self.describe_device)

    def to_host(self) -> np.ndarray:
        """The contents of a C-contiguous array, read from the emulated device memory."""
        assert self.strides is None
        nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        raw = (ctypes.c_char * nbytes).from_address(self.pointer)
        return np.frombuffer(raw, self.dtype).reshape(self.shape).copy()


class DLPackOnlyArray:
    """An EmulatedCudaArray exported only through `__dlpack__` (no CUDA array interface):
    NumPy's capsule of the same memory with its device set to kDLCUDA. Records the
    stream each export was asked for."""

    def __init__(self, array: EmulatedCudaArray):
        self.array = array
        self.shape = array.shape
        self.streams: list[int | None] = []

    def __dlpack__(self, stream: int | None = None) -> Any:
        self.streams.append(stream)
        a = self.array
        nbytes = int(np.prod(a.shape, dtype=np.int64)) * a.dtype.itemsize
        raw = (ctypes.c_char * nbytes).from_address(a.pointer)
        capsule = np.frombuffer(raw, a.dtype).reshape(a.shape).__dlpack__()
        get = ctypes.pythonapi.PyCapsule_GetPointer
        get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
        # DLTensor: data (a pointer), then the device's type and id (two int32).
        device = (ctypes.c_int32 * 2).from_address(get(capsule, b"dltensor") + 8)
        device[0], device[1] = KDL_CUDA, a.ordinal
        return capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (KDL_CUDA, self.array.ordinal)
