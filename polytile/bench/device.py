"""The bench on a cuda target: inputs on the device once, kernels timed to completion.

    if on_cuda(target):
        placed = place_inputs(args, use_torch=True)   # before anything is timed
        function(*placed.inputs)        # polytile on device memory: pointers, no copies
        placed.torch_inputs             # the same tensors for torch's eager version, or None
        placed.torch_missing            # else why: "torch has no CUDA device (a CPU build)"
        placed.synchronize()            # waits for every kernel queued on the device
        host_arrays(outputs)            # NumPy copies, for the check after the first call

The inputs are torch CUDA tensors when torch has CUDA (so torch's column runs on the very
same memory), else polytile's own DeviceArrays. Either way polytile's launcher takes them
by pointer (polytile.interop.device) and allocates its outputs on the device, so a timed
call moves no tensor between host and device. torch launches asynchronously; the timing
calls `synchronize` before each clock read (polytile.bench.timing), so both columns are
kernel time. The synchronize is the driver's cuCtxSynchronize on the device's primary
context, which torch shares: one wait covers both.

The NumPy reference only checks here (a CPU time against a GPU time says nothing), and
torch.compile is not run: the comparison issue 15 asks for is with torch eager's
cuBLAS and cuDNN kernels. It has never run on a GPU: this project's machines have none,
and the tests run it under the emulated driver API (tests/gpu/test_cuda_bench.py).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from polytile.bench.workload import Arrays
from polytile.runtime.cuda_memory import DeviceArray


@dataclass(frozen=True)
class Placed:
    """A workload's inputs on the device, and how to wait for it."""

    inputs: tuple[Any, ...]
    torch_inputs: tuple[Any, ...] | None
    torch_missing: str
    synchronize: Callable[[], None]


def on_cuda(target: str | None) -> bool:
    """Whether `target` runs its kernels on a CUDA device (the target's data only: the
    host's features are the command's business)."""
    if target is None:
        return False
    from polytile.errors import ArgumentError
    from polytile.targets.target import load_target
    try:
        return load_target(target).backend == "cuda"
    except ArgumentError:
        return False    # an unknown target is polytile's FAILED row (polytile_function)


def place_inputs(args: Arrays, use_torch: bool) -> Placed:
    """Copies of `args` on the CUDA device (see the module docstring); an
    UnsupportedError when there is none."""
    from polytile.runtime import cuda
    device = cuda.cuda_device()
    torch, missing = _torch_with_cuda() if use_torch else (None, "torch not used")
    if torch is not None:
        where = torch.device("cuda", device.ordinal)
        inputs: tuple[Any, ...] = tuple(torch.from_numpy(a).to(where) for a in args)
    else:
        inputs = tuple(DeviceArray.from_host(device, a) for a in args)

    def synchronize() -> None:
        device.make_current()
        cuda.check(device.driver, device.driver.cuCtxSynchronize())
    synchronize()       # the copies are done before the first call
    return Placed(inputs, inputs if torch is not None else None, missing, synchronize)


def _torch_with_cuda() -> tuple[Any, str]:
    """torch when it can run on the device, else None and why not."""
    try:
        import torch
    except ImportError:
        return None, "torch not installed"
    if not torch.cuda.is_available():
        build = " (a CPU build)" if torch.version.cuda is None else ""
        return None, f"torch has no CUDA device{build}"
    return torch, ""


def host_arrays(value: Any) -> Arrays:
    """A call's outputs (DeviceArrays or torch CUDA tensors) as NumPy arrays: copied from
    the device, so used only for checking, never inside a timed call."""
    values = value if isinstance(value, (tuple, list)) else (value,)
    return tuple(v.to_host() if isinstance(v, DeviceArray) else
                 np.asarray(v.detach().cpu().numpy()) for v in values)
