"""The launcher's adapters: NumPy arrays, DLPack producers, buffer-protocol objects and a
framework's own arrays are bound without copies, and outputs are made by the adapter of
the first tensor argument."""
from __future__ import annotations

import array
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import polytile
from polytile.errors import ArgumentError
from polytile.interop import adapters as A

SRC = """
def scale(float a, float(N,M) X, float(M) b) -> (Y) {
  Y(n,m) = X(n,m) * a + b(m)
}
"""
RNG = np.random.default_rng(3)


@pytest.fixture(scope="module", params=["c", "interp"])
def scale(request: pytest.FixtureRequest) -> Any:
    return polytile.define(SRC, backend=request.param).scale


SCALE_C = polytile.define(SRC).scale
SCALE_INTERP = polytile.define(SRC, backend="interp").scale


def expected(a: float, x: np.ndarray, b: np.ndarray) -> np.ndarray:
    return x * np.float32(a) + b


class Producer:
    """A DLPack producer that is not a NumPy array (as JAX or CuPy host arrays are)."""

    def __init__(self, data: np.ndarray):
        self.data = data

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.data.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.data.__dlpack_device__()


class DeviceOnly(Producer):
    def __dlpack__(self, **kwargs: Any) -> Any:
        raise BufferError("the tensor lives on cuda:0")


@dataclass
class Boxed:
    """A stand-in framework array type with an adapter of its own."""

    data: np.ndarray


@dataclass(frozen=True)
class BoxedAdapter:
    name: str = "boxed"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, Boxed)

    def view(self, value: Any) -> np.ndarray:
        return value.data

    def allocate(self, shape: tuple[int, ...], dtype: np.dtype) -> tuple[Any, np.ndarray]:
        box = Boxed(np.full(shape, np.nan, dtype))   # not zeros: every element must be written
        return box, box.data


if "boxed" not in {a.name for a in A.adapters()}:
    A.register_adapter(BoxedAdapter())


def test_dlpack_producers_are_bound_without_a_copy_even_strided(scale: Any) -> None:
    base = RNG.standard_normal((9, 14), dtype=np.float32)
    x = base[::2, 1::3]                     # odd strides, 5 x 5
    b = RNG.standard_normal(5, dtype=np.float32)
    y = scale(0.5, Producer(x), Producer(b))
    assert type(y) is np.ndarray            # a generic producer cannot be asked for a new array
    np.testing.assert_allclose(y, expected(0.5, x, b), rtol=1e-6)


def test_buffer_protocol_objects_are_arguments(scale: Any) -> None:
    x = RNG.standard_normal((3, 4), dtype=np.float32)
    b = array.array("f", RNG.standard_normal(4).tolist())
    y = scale(2.0, memoryview(x), b)
    np.testing.assert_allclose(y, expected(2.0, x, np.asarray(b)), rtol=1e-6)


def test_a_frameworks_adapter_makes_the_outputs(scale: Any) -> None:
    x = RNG.standard_normal((6, 7), dtype=np.float32)
    b = RNG.standard_normal(7, dtype=np.float32)
    y = scale(-1.5, Boxed(x), b)
    assert isinstance(y, Boxed)
    np.testing.assert_allclose(y.data, expected(-1.5, x, b), rtol=1e-6)
    # The first tensor argument decides: a NumPy X gives NumPy outputs.
    assert type(scale(-1.5, x, Boxed(b))) is np.ndarray


def test_out_may_be_any_adapted_writeable_array(scale: Any) -> None:
    x = RNG.standard_normal((4, 5), dtype=np.float32)
    b = RNG.standard_normal(5, dtype=np.float32)
    box = Boxed(np.zeros((4, 5), np.float32))
    assert scale(3.0, x, b, out=box) is box
    np.testing.assert_allclose(box.data, expected(3.0, x, b), rtol=1e-6)
    column = np.zeros((5, 4), np.float32).T          # not contiguous: written back
    assert scale(3.0, x, b, out=Producer(column)).data is column
    np.testing.assert_allclose(column, expected(3.0, x, b), rtol=1e-6)


def test_what_no_adapter_takes_is_refused_with_the_options(scale: Any) -> None:
    b = np.ones(3, np.float32)
    with pytest.raises(ArgumentError, match=r"X must be an array of float32 \(NumPy, or any "
                                            r"object with __dlpack__ or the buffer protocol\), "
                                            r"got list"):
        scale(1.0, [[1.0, 2.0, 3.0]], b)


def test_memory_the_cpu_cannot_read_is_an_argument_error(scale: Any) -> None:
    with pytest.raises(ArgumentError, match="X: its memory cannot be read on the CPU through "
                                            "DLPack .*cuda:0"):
        scale(1.0, DeviceOnly(np.ones((2, 3), np.float32)), np.ones(3, np.float32))


def test_read_only_buffers_are_refused_as_out(scale: Any) -> None:
    x = np.ones((2, 2), np.float32)
    b = np.ones(2, np.float32)
    with pytest.raises(ArgumentError, match="out= for Y is read-only"):
        scale(1.0, x, b, out=bytes(16))


def test_a_buffer_numpy_has_no_dtype_for_is_an_argument_error(scale: Any) -> None:
    odd = memoryview(b"\x00" * 8).cast("B").cast("c")
    with pytest.raises(ArgumentError, match="b: its buffer cannot be viewed|b must have dtype"):
        scale(1.0, np.ones((1, 8), np.float32), odd)


def test_an_adapter_name_is_registered_once() -> None:
    with pytest.raises(ValueError, match="registered already"):
        A.register_adapter(BoxedAdapter())


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 9), cols=st.integers(1, 9), step_r=st.integers(-3, 3).filter(bool),
       step_c=st.integers(-3, 3).filter(bool), transpose=st.booleans(), seed=st.integers(0, 99))
def test_every_adapter_gives_numpys_answer_on_any_layout(rows: int, cols: int, step_r: int,
                                                         step_c: int, transpose: bool,
                                                         seed: int) -> None:
    """The same strided view (negative steps, transposes) through NumPy, a DLPack producer
    and a memoryview: the same outputs, and the inputs untouched."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((rows * abs(step_r), cols * abs(step_c)), dtype=np.float32)
    x = base[::step_r, ::step_c]
    x = x.T if transpose else x
    b = rng.standard_normal(x.shape[1], dtype=np.float32)
    before = base.copy()
    want = expected(0.25, x, b)
    for kind, wrap in (("numpy", lambda v: v), ("dlpack", Producer), ("buffer", memoryview)):
        for scale in (SCALE_C, SCALE_INTERP):
            got = scale(0.25, wrap(x), wrap(b))
            np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=kind)
    np.testing.assert_array_equal(base, before)
