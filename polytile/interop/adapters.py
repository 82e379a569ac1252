"""Adapters: how the caller's arrays become kernel arguments, and how outputs are made.

A kernel argument is (pointer, shape, strides, dtype); a NumPy array is exactly that
record, so an adapter turns a caller's object into a NumPy *view* of the same memory
(no copy) and makes new outputs in the caller's kind of array:

    adapter = adapter_for(value)            # the first registered adapter that accepts it
    view = adapter.view(value)              # np.ndarray on the same memory
    native, view = adapter.allocate(shape, dtype)   # an output and its view

The launcher (polytile.compile.CompiledFunction) then checks shapes and dtypes, copies
what is not C-contiguous, and calls the kernel. Outputs are made by the adapter of the
first tensor argument, so a function called on framework tensors returns framework
tensors. Adapters shipped here: NumPy arrays, PyTorch tensors (CPU, any strides,
bfloat16 included; outputs are torch tensors), then any object with `__dlpack__` (CPU
memory) or the buffer protocol; both of the latter return NumPy outputs (a generic
DLPack producer has no way to be asked for a new array). A framework adds its own with
`register_adapter` (placed before the generic ones). Arrays in CUDA memory never reach
the adapters: the launcher sends them to polytile.interop.device first.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np


class Adapter(Protocol):
    @property
    def name(self) -> str: ...

    def accepts(self, value: Any) -> bool: ...

    def view(self, value: Any) -> np.ndarray: ...

    def allocate(self, shape: tuple[int, ...], dtype: np.dtype) -> tuple[Any, np.ndarray]: ...


class AdapterError(Exception):
    """An accepted object whose memory cannot be reached from the CPU (the message says why)."""


@dataclass(frozen=True)
class NumpyAdapter:
    name: str = "numpy"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, (np.ndarray, np.generic))

    def view(self, value: Any) -> np.ndarray:
        return np.asarray(value)

    def allocate(self, shape: tuple[int, ...], dtype: np.dtype) -> tuple[Any, np.ndarray]:
        array = np.zeros(shape, dtype)
        return array, array


@dataclass(frozen=True)
class DLPackAdapter(NumpyAdapter):
    """Objects with `__dlpack__` in CPU memory (JAX, CuPy host arrays, TensorFlow, ...)."""

    name: str = "dlpack"

    def accepts(self, value: Any) -> bool:
        return hasattr(value, "__dlpack__")

    def view(self, value: Any) -> np.ndarray:
        try:
            return np.from_dlpack(value)
        except (BufferError, RuntimeError, TypeError, ValueError) as e:
            raise AdapterError(f"its memory cannot be read on the CPU through DLPack ({e})"
                               ) from e


@dataclass(frozen=True)
class BufferAdapter(NumpyAdapter):
    """Objects exporting the buffer protocol (array.array, memoryview, bytearray, ...)."""

    name: str = "buffer"

    def accepts(self, value: Any) -> bool:
        try:
            memoryview(value).release()
        except TypeError:
            return False
        return True

    def view(self, value: Any) -> np.ndarray:
        try:
            return np.asarray(memoryview(value))
        except (TypeError, ValueError) as e:     # a format NumPy has no dtype for
            raise AdapterError(f"its buffer cannot be viewed as an array ({e})") from e


@dataclass(frozen=True)
class TorchAdapter:
    """torch.Tensor on the CPU, viewed without a copy; new outputs are torch tensors.
    torch is never imported here: a value can only be a tensor if torch is loaded."""

    name: str = "torch"

    def accepts(self, value: Any) -> bool:
        torch = sys.modules.get("torch")
        return torch is not None and isinstance(value, torch.Tensor)

    def view(self, value: Any) -> np.ndarray:
        if value.device.type != "cpu":
            raise AdapterError(f"it is a {value.device.type} tensor, and polytile has no "
                               "backend for that device yet: move it with .cpu()")
        return torch_view(value.detach())

    def allocate(self, shape: tuple[int, ...], dtype: np.dtype) -> tuple[Any, np.ndarray]:
        import torch
        tensor = torch.zeros(shape, dtype=torch_dtype(dtype))
        return tensor, torch_view(tensor)


def torch_view(tensor: Any) -> np.ndarray:
    """A NumPy view of a CPU tensor's memory (bfloat16, which NumPy lacks, through
    ml_dtypes)."""
    import torch
    if tensor.dtype == torch.bfloat16:
        import ml_dtypes
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def torch_dtype(dtype: np.dtype) -> Any:
    import torch
    if dtype.name == "bfloat16":
        return torch.bfloat16
    return torch.from_numpy(np.empty(0, dtype)).dtype


NUMPY = NumpyAdapter()
_ADAPTERS: list[Adapter] = [NUMPY, TorchAdapter(), DLPackAdapter(), BufferAdapter()]
_GENERIC = 2    # the last entries: DLPack and the buffer protocol, tried after any framework's


def register_adapter(adapter: Adapter) -> None:
    """Add an adapter for a framework's arrays; it is tried before the generic ones."""
    if any(a.name == adapter.name for a in _ADAPTERS):
        raise ValueError(f"an adapter called {adapter.name!r} is registered already")
    _ADAPTERS.insert(len(_ADAPTERS) - _GENERIC, adapter)


def adapter_for(value: Any) -> Adapter | None:
    """The first adapter that accepts `value`, or None."""
    if type(value) is np.ndarray:     # the common case, answered without a search
        return NUMPY
    for adapter in _ADAPTERS:
        if adapter.accepts(value):
            return adapter
    return None


def adapters() -> tuple[Adapter, ...]:
    return tuple(_ADAPTERS)
