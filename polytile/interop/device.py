"""Arguments in CUDA device memory: torch and CuPy CUDA tensors, Numba device arrays, and
any object exposing `__cuda_array_interface__` (CAI, version 2 or 3).

    tensor = device_tensor(value)   a DeviceTensor (pointer, shape, dtype, strides,
                                    device), or None for host memory (the adapters'
                                    business, polytile.interop.adapters)

An object is in device memory when `__dlpack_device__()` says kDLCUDA (2) or
kDLCUDAManaged (13), or, lacking that method, when it has the CAI. Its pointer, shape,
dtype and strides are read from the CAI; its device from `__dlpack_device__`, else
(CAI has no device field) from the driver when the kernel runs. A DLPack producer of
CUDA memory without the CAI is read through its capsule (polytile.interop.dlpack).

`bind` takes one call's arguments: every tensor (inputs and out=) in device memory, or
none (a call mixing them is an ArgumentError naming where each is); dtypes as the TC
declares and C-contiguous layouts (the kernels index dense row-major memory; a strided
device array is refused, not copied through the host). `allocate` makes an output like
the first tensor argument: a torch tensor on its device for torch inputs (its
`new_empty`, `new_zeros`), else a polytile.runtime.cuda_memory.DeviceArray.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polytile.errors import ArgumentError, SourceLoc, UnsupportedError
from polytile.interop.adapters import AdapterError, torch_dtype
from polytile.runtime.cuda import Device
from polytile.runtime.cuda_memory import KDL_CUDA, KDL_CUDA_MANAGED, DeviceArray, DeviceBuffer
from polytile.sema import program as P

_CUDA_KINDS = (KDL_CUDA, KDL_CUDA_MANAGED)


@dataclass(frozen=True)
class DeviceTensor:
    """A caller's array in CUDA memory, as its CAI describes it."""

    pointer: int
    shape: tuple[int, ...]
    dtype: np.dtype
    strides: tuple[int, ...] | None     # in bytes; None: C-contiguous
    device: int | None                  # the ordinal; None: not said
    readonly: bool
    owner: Any = field(compare=False, repr=False)    # the caller's object
    stream: int | None = None           # the CAI's stream (polytile.runtime.cuda_memory)
    keep: Any = field(default=None, compare=False, repr=False)    # a DLPack capsule read

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    @property
    def contiguous(self) -> bool:
        if self.strides is None:
            return True
        expected = self.dtype.itemsize
        for size, stride in zip(reversed(self.shape), reversed(self.strides)):
            if size > 1 and stride != expected:
                return False
            expected *= size
        return True

    @property
    def where(self) -> str:
        return "a CUDA device" if self.device is None else f"cuda:{self.device}"

    def buffer(self) -> DeviceBuffer:
        return DeviceBuffer(self.pointer, self.nbytes, self.device, self.stream)


def device_tensor(value: Any) -> DeviceTensor | None:
    """`value` as a DeviceTensor, or None when it is not in CUDA memory. An object in
    CUDA memory that cannot be read is an AdapterError saying why."""
    if type(value) is np.ndarray:
        return None
    kind, ordinal = _dlpack_device(value)
    if kind is not None and kind not in _CUDA_KINDS:
        return None
    try:
        cai = value.__cuda_array_interface__
    except AttributeError:
        if kind is None:
            return None
        return _from_capsule(value)
    except (RuntimeError, TypeError, ValueError) as e:     # torch: requires_grad, bfloat16
        raise AdapterError(f"its __cuda_array_interface__ cannot be read ({e})") from None
    if cai.get("mask") is not None:
        raise AdapterError("it is a masked device array")
    pointer, readonly = cai["data"]
    strides, stream = cai.get("strides"), cai.get("stream")
    return DeviceTensor(int(pointer or 0), tuple(int(d) for d in cai["shape"]),
                        np.dtype(cai["typestr"]),
                        None if strides is None else tuple(int(s) for s in strides),
                        ordinal, bool(readonly), value, None if stream is None else int(stream))


def _from_capsule(value: Any) -> DeviceTensor:
    # Imported here: interop.dlpack builds DeviceTensors, so it imports this module.
    from polytile.interop.dlpack import read_capsule
    try:
        return read_capsule(value)
    except (AttributeError, BufferError, RuntimeError, TypeError, ValueError) as e:
        raise AdapterError(f"it is in CUDA memory, but its DLPack capsule cannot be read "
                           f"({e})") from None


def _dlpack_device(value: Any) -> tuple[int | None, int | None]:
    probe = getattr(value, "__dlpack_device__", None)
    if probe is None:
        return None, None
    try:
        kind, ordinal = probe()
    except (AttributeError, BufferError, RuntimeError, TypeError, ValueError):
        return None, None       # e.g. torch's meta tensors: not device memory either
    return int(kind), int(ordinal)


@dataclass(frozen=True)
class DeviceCall:
    """One call's arguments bound for a CUDA kernel."""

    inputs: dict[str, DeviceTensor]
    scalars: dict[str, Any]
    outputs: dict[str, DeviceTensor]     # the out= ones given

    @property
    def first(self) -> DeviceTensor:
        return next(iter(self.inputs.values()))


def on_device(args: tuple[Any, ...], out: Any = None) -> bool:
    """Whether any of a call's arguments or out= arrays says it is in CUDA memory (cheap
    for host arrays; nothing is read yet)."""
    outs = (() if out is None else tuple(out.values()) if isinstance(out, dict)
            else tuple(out) if isinstance(out, (tuple, list)) else (out,))
    for a in (*args, *outs):
        if type(a) is np.ndarray or isinstance(a, (int, float)):
            continue
        kind, _ = _dlpack_device(a)
        if kind in _CUDA_KINDS or (kind is None and hasattr(a, "__cuda_array_interface__")):
            return True
    return False


def bind(fn: P.Function, args: tuple[Any, ...], out: dict[str, Any],
         scalar: Any) -> DeviceCall:
    """Check and bind a call on device arguments (see the module docstring); `out`
    maps output names to the out= objects given, `scalar(p, value)` checks a scalar."""
    tensors = [(p, a) for p, a in zip(fn.params, args) if p.kind == "input"]
    tensors += [(o, out[o.name]) for o in fn.outputs if o.name in out]
    found = {p.name: _read(p, a) for p, a in tensors}
    host = [name for name, t in found.items() if t is None]
    if host:
        device = next(t for t in found.values() if t is not None)
        on = [name for name, t in found.items() if t is not None]
        raise ArgumentError(f"{fn.name} got {_names(on)} on {device.where} and "
                            f"{_names(host)} in host memory; a call takes all its tensors on "
                            "one CUDA device or all in host memory", fn.loc,
                            f"move {_names(host)} to the device (torch: .cuda(), CuPy: "
                            "cupy.asarray), or every tensor to the host")
    checked: dict[str, DeviceTensor] = {}
    for p, _ in tensors:
        t = found[p.name]
        assert t is not None
        what = "out= for " if p.kind != "input" else ""
        if t.dtype != p.dtype.numpy:
            raise ArgumentError(f"{what}{p.name} must have dtype {p.dtype}, got {t.dtype}",
                                p.loc, f"convert it on the device to {p.dtype.numpy}")
        if not t.contiguous:
            raise ArgumentError(f"{what}{p.name} is a strided view (strides {t.strides} bytes "
                                f"for shape {t.shape}); a CUDA kernel reads C-contiguous "
                                "device memory", p.loc,
                                "make a contiguous copy on the device first (torch: "
                                ".contiguous(), CuPy: cupy.ascontiguousarray)")
        if what and t.readonly:
            raise ArgumentError(f"out= for {p.name} is read-only", p.loc)
        checked[p.name] = t
    scalars = {p.name: scalar(p, a) for p, a in zip(fn.params, args) if p.kind == "scalar"}
    inputs = {p.name: checked[p.name] for p, _ in tensors if p.kind == "input"}
    outputs = {o.name: checked[o.name] for o in fn.outputs if o.name in out}
    if not inputs:
        raise ArgumentError(f"{fn.name} has no tensor input to take the device from", fn.loc)
    return DeviceCall(inputs, scalars, outputs)


def refused(function: str, tensor: str, where: str, runs: str,
            loc: SourceLoc | None) -> UnsupportedError:
    """The error for a tensor in CUDA memory given to a function that `runs` on host
    memory ("target x86-avx2")."""
    return UnsupportedError(f"{function}: {tensor} is in CUDA memory ({where}), and its "
                            f"{runs} runs on host memory", loc,
                            "define the module with target='cuda-sm80' or 'cuda-sm90' to "
                            "run on the GPU, or move the tensors to the host (torch: .cpu(), "
                            "CuPy: .get())")


def _read(p: P.Tensor, value: Any) -> DeviceTensor | None:
    try:
        return device_tensor(value)
    except AdapterError as e:
        raise ArgumentError(f"{p.name}: {e}", p.loc) from None


def _names(names: list[str]) -> str:
    return ", ".join(names)


def allocate(like: DeviceTensor, device: Device, shape: tuple[int, ...], dtype: np.dtype,
             zero: bool) -> tuple[Any, DeviceTensor]:
    """An output on `device` and its DeviceTensor: a torch tensor when `like` is one
    (torch's allocator, on the tensor's device), else a DeviceArray; zeroed if `zero`."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(like.owner, torch.Tensor):
        make = like.owner.new_zeros if zero else like.owner.new_empty
        native: Any = make(shape, dtype=torch_dtype(dtype))     # on the tensor's device
    else:
        native = DeviceArray(device, shape, dtype, zero)
    tensor = device_tensor(native)
    assert tensor is not None
    return native, tensor
