"""Reading a DLPack capsule of CUDA memory: for producers that export `__dlpack__` but no
`__cuda_array_interface__` (TensorFlow, PaddlePaddle, ...).

    tensor = read_capsule(value)    a DeviceTensor that keeps the capsule

The capsule is asked for with `stream=1`: the consumer launches on the legacy default
stream, so the producer makes the data ready there (the DLPack protocol's contract). It
is read, not consumed: polytile keeps it while the kernel runs, and when it is dropped
the capsule's destructor calls the producer's deleter, as for any unused capsule. The
layout is DLPack's pre-1.0 `DLManagedTensor` (the one every producer exports when the
consumer asks for no `max_version`).
"""
from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from polytile.interop.device import DeviceTensor

_LEGACY_DEFAULT_STREAM = 1
_KINDS = {0: "i", 1: "u", 2: "f", 6: "b"}     # kDLInt, kDLUInt, kDLFloat, kDLBool


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32),
                ("dtype", _DataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def read_capsule(value: Any) -> DeviceTensor:
    """The tensor `value.__dlpack__` describes (holding the capsule); ValueError saying
    what cannot be read."""
    try:
        capsule = value.__dlpack__(stream=_LEGACY_DEFAULT_STREAM)
    except TypeError:                  # a producer from before the stream argument
        capsule = value.__dlpack__()
    tensor = _Tensor.from_address(_get_pointer(capsule, b"dltensor"))   # the first field
    kind = _KINDS.get(tensor.dtype.code)
    if kind is None or tensor.dtype.lanes != 1 or tensor.dtype.bits % 8:
        raise ValueError(f"DLPack dtype code {tensor.dtype.code}, {tensor.dtype.bits} bits, "
                         f"{tensor.dtype.lanes} lanes has no polytile type")
    dtype = np.dtype(f"{kind}{tensor.dtype.bits // 8}")
    shape = tuple(int(tensor.shape[k]) for k in range(tensor.ndim))
    strides = (None if not tensor.strides else
               tuple(int(tensor.strides[k]) * dtype.itemsize for k in range(tensor.ndim)))
    return DeviceTensor((tensor.data or 0) + tensor.byte_offset, shape, dtype, strides,
                        int(tensor.device.device_id), False, value, keep=capsule)
