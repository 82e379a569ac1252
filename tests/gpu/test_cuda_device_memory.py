"""The CUDA launcher on arguments in device memory (polytile.interop.device), without a
GPU: the emulated driver (tests/gpu/cuda_emulation.py) hands out host addresses as device
pointers, and a test double of a CUDA array (tests/gpu/emulated_arrays.py) describes
them through `__cuda_array_interface__` and `__dlpack_device__`. Checked: the kernel is
given the arrays' own pointers with no host-to-device copy of them, outputs are allocated
on the device, results agree with the reference interpreter on random inputs, and calls
the device path cannot take are refused saying why. Where a GPU exists, tmm runs on
DeviceArrays it made (skipped here, saying why)."""
from __future__ import annotations

import shutil
from dataclasses import replace

import numpy as np
import pytest
from gpu.emulated_arrays import DLPackOnlyArray, EmulatedCudaArray

import polytile as pt
from polytile.config import Config
from polytile.errors import ArgumentError, UnsupportedError
from polytile.runtime import cuda as runtime
from polytile.runtime.cuda_memory import KDL_CUDA, DeviceArray

PROBLEM = runtime.nvrtc_problem() or (None if shutil.which("g++") else "g++ (for the emulation)")
DEVICE = runtime.device_problem("sm_90")
emulation = pytest.mark.skipif(PROBLEM is not None, reason=f"the emulation needs {PROBLEM}")

TMM = "def tmm(float(M,K) A, float(N,K) B) -> (C) {\n  C(m,n) +=! A(m,k) * B(n,k)\n}\n"
SOFTMAX = ("def softmax(float(N,M) X) -> (Y) {\n  mx(n) max=! X(n,m)\n"
           "  e(n,m) = exp(X(n,m) - mx(n))\n  s(n) +=! e(n,m)\n  Y(n,m) = e(n,m) / s(n)\n}\n")
SCALE = "def scale(float a, float(N) X) -> (Y) {\n  Y(n) = X(n) * a\n}\n"


def reference(source: str, name: str, *args: object, **options: object) -> np.ndarray:
    return pt.define(source, backend="interp")[name](*args, **options)


def random(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def on_device(*arrays: np.ndarray, **options: object) -> list[EmulatedCudaArray]:
    device = runtime.cuda_device()
    return [EmulatedCudaArray.of(device, a, **options) for a in arrays]   # type: ignore[arg-type]


@emulation
def test_tmm_reads_and_writes_device_memory_in_place(emulated: Config) -> None:
    A, B = random(37, 53), random(29, 53, seed=1)
    dA, dB = on_device(A, B)
    driver = runtime.cuda_device().driver
    tmm = pt.define(TMM, target="cuda-sm90", config=emulated).tmm
    C = tmm(dA, dB)
    assert isinstance(C, DeviceArray)
    assert C.__dlpack_device__() == (KDL_CUDA, 0)
    assert C.__cuda_array_interface__["shape"] == (37, 29)
    np.testing.assert_allclose(C.to_host(), reference(TMM, "tmm", A, B), rtol=1e-5, atol=1e-4)
    assert driver.launched and len(driver.arguments) == len(driver.launched)
    for arguments in driver.arguments:      # every launch got the arrays' own pointers
        assert arguments[:3] == (dA.pointer, dB.pointer, C.pointer)
    assert not {dA.pointer, dB.pointer, C.pointer} & set(driver.copied_to)


@emulation
def test_softmax_on_device_agrees_with_the_reference(emulated: Config) -> None:
    X = random(7, 100, seed=2)
    X[3, 41] = np.nan
    softmax = pt.define(SOFTMAX, target="cuda-sm90", config=emulated).softmax
    (dX,) = on_device(X)
    np.testing.assert_allclose(softmax(dX).to_host(), reference(SOFTMAX, "softmax", X),
                               rtol=1e-5, atol=1e-6)


@emulation
def test_a_dlpack_only_producer_is_read_through_its_capsule(emulated: Config) -> None:
    """No CUDA array interface: the capsule gives the pointer, asked for on stream 1
    (the legacy default stream the launches use), and is not copied."""
    A, B = random(9, 6), random(7, 6, seed=1)
    dA, dB = (DLPackOnlyArray(a) for a in on_device(A, B))
    assert not hasattr(dA, "__cuda_array_interface__")
    tmm = pt.define(TMM, target="cuda-sm90", config=emulated).tmm
    C = tmm(dA, dB)
    np.testing.assert_allclose(C.to_host(), reference(TMM, "tmm", A, B), rtol=1e-5, atol=1e-5)
    assert dA.streams == [1] and dB.streams == [1]
    driver = runtime.cuda_device().driver
    assert driver.arguments[-1][:3] == (dA.array.pointer, dB.array.pointer, C.pointer)
    assert not {dA.array.pointer, dB.array.pointer} & set(driver.copied_to)


@emulation
def test_the_producers_stream_is_waited_for_before_the_launch(emulated: Config) -> None:
    """The interface's `stream`: 1 (the legacy default stream, the one the launches use)
    needs no wait; another stream is synchronized once before the launches."""
    X = random(300, seed=3)
    (dX,) = on_device(X)
    scale = pt.define(SCALE, target="cuda-sm90", config=emulated).scale
    driver = runtime.cuda_device().driver
    scale(2.0, replace(dX, stream=1))
    assert driver.synchronized == []
    np.testing.assert_allclose(scale(2.0, replace(dX, stream=7)).to_host(),
                               reference(SCALE, "scale", 2.0, X))
    assert driver.synchronized == [7]


@emulation
def test_an_array_with_only_the_interface_is_placed_by_the_driver(emulated: Config) -> None:
    """No `__dlpack_device__` (as Numba's arrays): cuPointerGetAttribute says the device."""
    X = random(300, seed=3)
    (dX,) = on_device(X, describe_device=False)
    assert not hasattr(dX, "__dlpack_device__")
    scale = pt.define(SCALE, target="cuda-sm90", config=emulated).scale
    np.testing.assert_allclose(scale(1.5, dX).to_host(), reference(SCALE, "scale", 1.5, X))


@emulation
def test_out_on_the_device_is_written_in_place(emulated: Config) -> None:
    X = random(300, seed=4)
    dX, dY = on_device(X, np.full(300, np.nan, np.float32))
    scale = pt.define(SCALE, target="cuda-sm90", config=emulated).scale
    assert scale(-2.0, dX, out=dY) is dY
    np.testing.assert_allclose(dY.to_host(), reference(SCALE, "scale", -2.0, X))
    with pytest.raises(ArgumentError, match="input X and output Y share device memory"):
        scale(-2.0, dX, out=dX)


@emulation
def test_an_in_out_output_on_the_device_starts_from_out(emulated: Config) -> None:
    src = "def acc(float(N,M) X) -> (S) {\n  S(m) += X(n,m)\n}\n"
    X, S0 = random(9, 13, seed=6), random(13, seed=7)
    acc = pt.define(src, target="cuda-sm90", config=emulated).acc
    dX, dS = on_device(X, S0)
    with pytest.raises(ArgumentError, match="S is read before it is written"):
        acc(dX)
    assert acc(dX, out=dS) is dS
    np.testing.assert_allclose(dS.to_host(), reference(src, "acc", X, out=S0.copy()),
                               rtol=1e-5, atol=1e-5)


@emulation
def test_outputs_the_kernel_does_not_write_in_full_start_as_zeros(emulated: Config) -> None:
    """The emulated driver's memory starts as 0xA5 bytes; an output the kernel does not
    write in full (element 0 here) is cleared on the device with cuMemsetD8."""
    src = "def shift(float(N) X) -> (Y) {\n  Y(i) = X(i - 1) where i in 1:N+1\n}\n"
    X = random(50, seed=5)
    shift = pt.define(src, target="cuda-sm90", config=emulated).shift
    (dX,) = on_device(X)
    Y = shift(dX)
    np.testing.assert_array_equal(Y.to_host(), reference(src, "shift", X))
    assert Y.to_host()[0] == 0


@emulation
def test_the_gradient_runs_on_device_arrays(emulated: Config) -> None:
    """polytile.grad's function checks its seeds' shapes without reading their memory."""
    A, B, G = random(8, 6), random(5, 6, seed=1), random(8, 5, seed=2)
    tmm_grad = pt.grad(pt.define(TMM, target="cuda-sm90", config=emulated).tmm).tmm_grad
    want = pt.grad(pt.define(TMM, backend="interp").tmm).tmm_grad(A, B, G)
    got = tmm_grad(*on_device(A, B, G))
    assert len(got) == len(want) == 2
    for g, w in zip(got, want):
        assert isinstance(g, DeviceArray)
        np.testing.assert_allclose(g.to_host(), w, rtol=1e-5, atol=1e-5)


@emulation
def test_a_strided_device_array_is_refused_with_a_hint(emulated: Config) -> None:
    """The kernels index dense row-major memory; a transposed view is not copied through
    the host behind the caller's back."""
    A, Bt = random(8, 6), random(6, 5, seed=1)
    dA, dBt = on_device(A, Bt)
    tmm = pt.define(TMM, target="cuda-sm90", config=emulated).tmm
    with pytest.raises(ArgumentError, match=r"B is a strided view .* C-contiguous") as e:
        tmm(dA, dBt.transposed())
    assert e.value.hint is not None and ".contiguous()" in e.value.hint


@emulation
def test_wrong_device_mixed_memory_dtype_and_shape_are_refused(emulated: Config) -> None:
    A, B = random(8, 6), random(5, 6, seed=1)
    dA, dB = on_device(A, B)
    (elsewhere,) = on_device(A, ordinal=1)
    (doubles,) = on_device(A.astype(np.float64))
    (short,) = on_device(random(5, 4))
    tmm = pt.define(TMM, target="cuda-sm90", config=emulated).tmm
    with pytest.raises(ArgumentError, match=r"A is on cuda:1, but tmm's kernel is loaded on "
                                            r"cuda:0 \(CPU emulation\)"):
        tmm(elsewhere, dB)
    with pytest.raises(ArgumentError, match="got A on cuda:0 and B in host memory"):
        tmm(dA, B)
    with pytest.raises(ArgumentError, match="got B on cuda:0 and A in host memory"):
        tmm(A, dB)
    (dC,) = on_device(np.zeros((8, 5), np.float32))
    with pytest.raises(ArgumentError, match="got C on cuda:0 and A, B in host memory"):
        tmm(A, B, out=dC)
    with pytest.raises(ArgumentError, match="A must have dtype float32, got float64"):
        tmm(doubles, dB)
    with pytest.raises(ArgumentError, match="size K is 6 from A but 4 from B"):
        tmm(dA, short)
    with pytest.raises(ArgumentError, match="out= for C must have shape"):
        tmm(dA, dB, out=dB)


def test_device_arrays_are_refused_by_host_targets() -> None:
    """No driver is needed to refuse: the arrays only describe device memory."""
    host = EmulatedCudaArray(0x1000, (4, 3), np.dtype(np.float32))
    for module in (pt.define(TMM), pt.define(TMM, backend="interp")):
        with pytest.raises(UnsupportedError, match=r"tmm: A is in CUDA memory \(cuda:0\)") as e:
            module.tmm(host, host)
        assert e.value.hint is not None and "cuda-sm90" in e.value.hint


@pytest.mark.skipif(DEVICE is not None, reason=f"{DEVICE}")
def test_tmm_on_device_arrays_on_a_gpu() -> None:
    A, B = random(100, 64), random(70, 64, seed=1)
    device = runtime.cuda_device()
    tmm = pt.define(TMM, target="cuda-sm90").tmm
    C = tmm(DeviceArray.from_host(device, A), DeviceArray.from_host(device, B))
    assert isinstance(C, DeviceArray)
    np.testing.assert_allclose(C.to_host(), A @ B.T, rtol=1e-4, atol=1e-4)
