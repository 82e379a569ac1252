"""Calling a compiled kernel: `int32_t fn(void **args, int64_t *err)`.

`args[p]` is the data pointer of parameter p; a nonzero return means a run-time
check failed and err[0..3] = (code, parameter, dimension, offending index). The
runtime knows nothing about the IR: the caller maps the parameter number back to
a tensor name.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

ERR_FIELDS = 4


@dataclass(frozen=True)
class KernelFailure:
    code: int
    param: int
    dim: int
    index: int


class Kernel:
    """One exported function of a loaded library, with its argument array preallocated."""

    def __init__(self, cdll: ctypes.CDLL, symbol: str, n_params: int):
        self._cfunc = getattr(cdll, symbol)
        self._cfunc.restype = ctypes.c_int32
        self._cfunc.argtypes = (ctypes.c_void_p, ctypes.c_void_p)
        self._cdll = cdll          # keeps the library mapped as long as the kernel lives
        self.n_params = n_params

    def __call__(self, pointers: list[int]) -> KernelFailure | None:
        """Run on raw data pointers; None on success."""
        args = (ctypes.c_void_p * self.n_params)(*pointers)
        err = np.zeros(ERR_FIELDS, dtype=np.int64)
        code = self._cfunc(args, err.ctypes.data)
        if code == 0:
            return None
        return KernelFailure(int(code), int(err[1]), int(err[2]), int(err[3]))
