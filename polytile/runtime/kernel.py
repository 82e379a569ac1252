"""Calling a compiled kernel: `int32_t fn(void **args, int64_t *err)`.

`args[p]` is the data pointer of parameter p; a nonzero return means a run-time
check failed and err[0..3] = (code, parameter, dimension, offending index). The
runtime knows nothing about the IR: the caller maps the parameter number back to
a tensor name.

Calls go through cffi: taking an array's address with `ffi.from_buffer` costs a
fraction of `ndarray.ctypes.data`, and that dominates the dispatch of small ops.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Sequence

import _cffi_backend
import cffi

SYMBOL = "polytile_kernel"    # the name every kernel exports
_FFI = cffi.FFI()
_FFI.cdef(f"int32_t {SYMBOL}(void **args, int64_t *err);")
# The backend's own functions: the FFI wrappers cost as much as the work on tiny calls.
_newp = _cffi_backend.newp
_from_buffer = _cffi_backend.from_buffer
_CHARS = _FFI.typeof("char[]")
_cast = _cffi_backend.cast
_VOIDP = _FFI.typeof("void *")
_ERR = _FFI.typeof("int64_t[4]")


@dataclass(frozen=True)
class KernelFailure:
    code: int
    param: int
    dim: int
    index: int


class Runnable(Protocol):
    """What a backend's `load` returns and the launcher calls: run on the parameters'
    arrays (contiguous NumPy arrays, outputs last, written in place); None on success."""

    n_params: int
    takes_addresses: bool    # whether a buffer may also be a data address (an int)

    def __call__(self, buffers: Sequence[Any]) -> KernelFailure | None: ...


class Kernel:
    """The exported `polytile_kernel` of a shared object."""

    def __init__(self, so_path: Path, n_params: int):
        self._lib: Any = _FFI.dlopen(str(so_path))
        self._cfunc = self._lib.polytile_kernel
        self._args_type = _FFI.typeof(f"void *[{max(1, n_params)}]")
        self.n_params = n_params

    takes_addresses = True

    @property
    def address(self) -> int:
        """The address of the exported function (polytile.runtime.dispatch calls it)."""
        return int(_FFI.cast("uintptr_t", self._cfunc))

    def __call__(self, buffers: Sequence[Any]) -> KernelFailure | None:
        """Run on objects exporting the buffer protocol (NumPy arrays) or on data
        addresses (ints, which the caller vouches for: polytile.torch passes tensors'
        data pointers this way); None on success."""
        args = _newp(self._args_type, [_cast(_VOIDP, b) if type(b) is int
                                       else _from_buffer(_CHARS, b, False) for b in buffers])
        err = _newp(_ERR, None)
        code = self._cfunc(args, err)
        if code == 0:
            return None
        return KernelFailure(int(code), int(err[1]), int(err[2]), int(err[3]))
