"""polytile.torch.op on CUDA tensors, without a GPU or a CUDA build of torch: a test double
of a torch CUDA tensor (a CPU tensor whose `device` says cuda:0 and whose
`__cuda_array_interface__` and `__dlpack_device__` describe its memory, which the
emulated driver, tests/gpu/cuda_emulation.py, reads as device memory) goes through the
op's device path. Checked: the kernel gets the tensors' own data pointers, outputs are
tensors made by torch on the input's device, gradients flow, non-contiguous tensors are
made contiguous by torch first, and host targets refuse CUDA tensors with a hint."""
from __future__ import annotations

import shutil
from typing import Any

import numpy as np
import pytest

import polytile as pt
from polytile.config import Config
from polytile.errors import UnsupportedError
from polytile.runtime import cuda as runtime

torch = pytest.importorskip("torch")
import polytile.torch as pt_torch  # after importorskip: needs torch

PROBLEM = runtime.nvrtc_problem() or (None if shutil.which("g++") else "g++ (for the emulation)")
pytestmark = pytest.mark.skipif(PROBLEM is not None, reason=f"the emulation needs {PROBLEM}")

TMM = "def tmm(float(M,K) A, float(N,K) B) -> (C) {\n  C(m,n) +=! A(m,k) * B(n,k)\n}\n"


class EmulatedCudaTensor(torch.Tensor):
    """A test double of a torch CUDA tensor (see the module docstring); torch keeps the
    subclass through detach, contiguous and new_empty, so outputs are doubles too."""

    @property
    def device(self) -> Any:
        return torch.device("cuda", 0)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        size = self.element_size()
        typestr = np.dtype(str(self.dtype).removeprefix("torch.")).str
        return {"shape": tuple(self.shape), "typestr": typestr,
                "strides": tuple(s * size for s in self.stride()),
                "data": (self.data_ptr(), False), "version": 3}

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, 0)


def cuda_double(t: Any) -> Any:
    return torch.Tensor._make_subclass(EmulatedCudaTensor, t, t.requires_grad)


def host(t: Any) -> Any:
    return t.as_subclass(torch.Tensor)


def reference(*args: np.ndarray) -> np.ndarray:
    return pt.define(TMM, backend="interp").tmm(*args)


def test_cuda_tensors_run_in_place_and_come_back_as_cuda_tensors(emulated: Config) -> None:
    gen = torch.Generator().manual_seed(0)
    A = cuda_double(torch.randn(37, 53, generator=gen))
    B = cuda_double(torch.randn(29, 53, generator=gen))
    tmm = pt_torch.op(pt.define(TMM, target="cuda-sm90", config=emulated).tmm)
    C = tmm(A, B)
    assert isinstance(C, EmulatedCudaTensor) and C.device.type == "cuda"
    np.testing.assert_allclose(host(C).numpy(), reference(host(A).numpy(), host(B).numpy()),
                               rtol=1e-5, atol=1e-4)
    driver = runtime.cuda_device().driver
    assert driver.arguments[-1][:3] == (A.data_ptr(), B.data_ptr(), C.data_ptr())
    assert not {A.data_ptr(), B.data_ptr(), C.data_ptr()} & set(driver.copied_to)


def test_a_non_contiguous_cuda_tensor_is_made_contiguous_by_torch(emulated: Config) -> None:
    gen = torch.Generator().manual_seed(1)
    A = cuda_double(torch.randn(8, 6, generator=gen))
    Bt = cuda_double(torch.randn(6, 5, generator=gen)).t()
    assert isinstance(Bt, EmulatedCudaTensor) and not Bt.is_contiguous()
    tmm = pt_torch.op(pt.define(TMM, target="cuda-sm90", config=emulated).tmm)
    C = tmm(A, Bt)
    np.testing.assert_allclose(host(C).numpy(),
                               reference(host(A).numpy(), host(Bt).contiguous().numpy()),
                               rtol=1e-5, atol=1e-5)
    assert runtime.cuda_device().driver.arguments[-1][1] != Bt.data_ptr()   # torch's copy


def test_gradients_of_cuda_tensors(emulated: Config) -> None:
    gen = torch.Generator().manual_seed(2)
    a, b = torch.randn(7, 5, generator=gen), torch.randn(4, 5, generator=gen)
    A, B = cuda_double(a).requires_grad_(), cuda_double(b).requires_grad_()
    tmm = pt_torch.op(pt.define(TMM, target="cuda-sm90", config=emulated).tmm)
    weights = torch.randn(7, 4, generator=gen)
    (tmm(A, B) * cuda_double(weights)).sum().backward()
    a.requires_grad_(), b.requires_grad_()
    (a @ b.T * weights).sum().backward()
    assert A.grad is not None and B.grad is not None
    torch.testing.assert_close(host(A.grad), a.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(host(B.grad), b.grad, rtol=1e-5, atol=1e-5)


def test_cuda_tensors_are_refused_by_host_targets() -> None:
    tmm = pt_torch.op(pt.define(TMM).tmm)
    A = cuda_double(torch.ones(3, 2))
    with pytest.raises(UnsupportedError, match=r"A is in CUDA memory \(cuda:0\), and its "
                                               r"target \S+ runs on host memory") as e:
        tmm(A, A)
    assert e.value.hint is not None and "cuda-sm90" in e.value.hint and ".cpu()" in e.value.hint
