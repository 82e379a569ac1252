"""A test double of a CUDA array (as CuPy's or Numba's): memory the emulated driver
(tests/gpu/cuda_emulation.EmulatedDriver) allocated, described by
`__cuda_array_interface__` and `__dlpack_device__` = (kDLCUDA, ordinal). It is not a
device array of any library; it lets the launcher's device path run without a GPU."""
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
