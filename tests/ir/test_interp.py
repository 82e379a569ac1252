"""The interpreter against NumPy, on random non-zero data."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from polytile import dtypes
from polytile.errors import ArgumentError, IRError, KernelError, UnsupportedError
from polytile.ir import interp, intrinsics
from polytile.ir.nodes import Function
from polytile.ir.parser import parse_function
from polytile.ir.verify import verify

GOLDEN = Path(__file__).parents[1] / "golden" / "ir"


def load(name: str, **replace: str) -> Function:
    text = (GOLDEN / f"{name}.ir").read_text()
    for old, new in replace.items():
        text = text.replace(old, new)
    fn = parse_function(text)
    verify(fn)
    return fn


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(7)


def uniform(rng: np.random.Generator, shape: tuple[int, ...], dtype=np.float32) -> np.ndarray:
    return rng.uniform(0.5, 2.0, shape).astype(dtype)


@pytest.mark.parametrize("name", ["matmul", "tiled_matmul"])
def test_matmul(name: str, rng: np.random.Generator) -> None:
    fn = load(name)
    a_shape, b_shape = ((5, 7), (7, 3)) if name == "matmul" else ((10, 5), (5, 6))
    a, b = uniform(rng, a_shape), uniform(rng, b_shape)
    c = np.full((a_shape[0], b_shape[1]), 123.0, np.float32)
    interp.run(fn, {"A": a, "B": b, "C": c})
    np.testing.assert_allclose(c, a @ b, rtol=1e-5)


def test_small_chunks_give_the_same_result(rng: np.random.Generator,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(interp, "CHUNK_POINTS", 7)
    monkeypatch.setattr(interp, "CHUNK_LOCAL_ELEMENTS", 3)
    a, b = uniform(rng, (10, 5)), uniform(rng, (5, 6))
    c = np.zeros((10, 6), np.float32)
    interp.run(load("tiled_matmul"), {"A": a, "B": b, "C": c})
    np.testing.assert_allclose(c, a @ b, rtol=1e-5)
    x, y = uniform(rng, (5, 7)), np.zeros((5, 7), np.float32)
    interp.run(load("normalize_rows"), {"X": x, "Y": y})
    np.testing.assert_allclose(y, x / x.sum(axis=1, keepdims=True), rtol=1e-6)


def test_local_buffer_is_private_to_each_iteration(rng: np.random.Generator) -> None:
    x, y = uniform(rng, (5, 7)), np.zeros((5, 7), np.float32)
    interp.run(load("normalize_rows"), {"X": x, "Y": y})
    np.testing.assert_allclose(y, x / x.sum(axis=1, keepdims=True), rtol=1e-6)


def test_local_buffer_read_before_written_shows_nan(rng: np.random.Generator) -> None:
    fn = load("normalize_rows", **{"      special zero() -> (T)\n": ""})
    x, y = uniform(rng, (5, 7)), np.zeros((5, 7), np.float32)
    interp.run(fn, {"X": x, "Y": y})
    assert np.isnan(y).all()


def test_gather_and_its_bounds_check(rng: np.random.Generator) -> None:
    fn = load("gather")
    x = uniform(rng, (6, 4))
    idx = np.array([5, 0, 3, 3, 1], np.int32)
    y = np.zeros((5, 4), np.float32)
    interp.run(fn, {"X": x, "I": idx, "Y": y})
    np.testing.assert_array_equal(y, x[idx])
    idx[2] = 6
    before = y.copy()
    with pytest.raises(KernelError) as info:
        interp.run(fn, {"X": x, "I": idx, "Y": y})
    assert "index 6 is out of range [0, 6) in dimension 0 of X" in info.value.message
    np.testing.assert_array_equal(y, before)       # outputs change only on success
    idx[2] = -1
    with pytest.raises(KernelError, match="index -1 is out of range"):
        interp.run(fn, {"X": x, "I": idx, "Y": y})


def test_pointer_increments_read_through_the_table(rng: np.random.Generator) -> None:
    fn = load("pointer_increments")
    x, w = uniform(rng, (9,)), uniform(rng, (3,))
    s = np.array([3, 0, 2], np.int32)
    y = np.zeros(6, np.float32)
    interp.run(fn, {"X": x, "S": s, "W": w, "Y": y})
    want = sum(x[np.arange(6) + s[k]].astype(np.float64) * w[k] for k in range(3))
    np.testing.assert_allclose(y, want, rtol=1e-6)
    # A table entry outside the view is a compiler bug (the pass checks the data when it
    # builds the table), reported as such instead of reading another element.
    s[1] = 4
    with pytest.raises(IRError, match="offset 4 of a load from X .* leaves the view"):
        interp.run(fn, {"X": x, "S": s, "W": w, "Y": y})


def test_constraint_index_and_zero_dim_scalar(rng: np.random.Generator) -> None:
    x, y = rng.uniform(0.5, 2, (6, 6)), np.ones((6, 6))
    interp.run(load("lower_triangle"), {"X": x, "s": np.array(2.5), "Y": y})
    np.testing.assert_allclose(y, np.tril(x * 2.5 + np.arange(6)[:, None]))


def test_parameter_layout_follows_the_refinement_strides(rng: np.random.Generator) -> None:
    # C stored column-major: the array is still indexed C[i, j]; only the IR's layout differs.
    fn = load("matmul", **{
        "out C[0, 0] float32(5:3, 3:1)": "out C[0, 0] float32(5:1, 3:5)",
        "out C <- C[i, j] float32(1:3, 1:1)": "out C <- C[i, j] float32(1:1, 1:5)"})
    a, b, c = uniform(rng, (5, 7)), uniform(rng, (7, 3)), np.zeros((5, 3), np.float32)
    interp.run(fn, {"A": a, "B": b, "C": c})
    np.testing.assert_allclose(c, a @ b, rtol=1e-5)


def reduction_ir(agg: str, init: str, dtype: str = "float32", m: int = 4, n: int = 9) -> str:
    return f"""function reduce(X, Y) {{
  block main (
    in X[0, 0] {dtype}({m}:{n}, {n}:1)
    out Y[0] {dtype}({m}:1)
  ) {{
    block init [i:{m}] (
      out Y <- Y[i] {dtype}(1:1)
    ) {{
      $c = const({init}, {dtype})
      Y = store($c)
    }}
    block reduce [i:{m}, j:{n}] (
      in X <- X[i, j] {dtype}(1:{n}, 1:1)
      out Y <- Y[i] {dtype}(1:1):{agg}
    ) {{
      $x = load(X)
      Y = store($x)
    }}
  }}
}}
"""


@pytest.mark.parametrize("agg, init, reference", [
    ("add", "0.0", np.sum), ("mul", "1.0", np.prod),
    ("max", "-inf", np.max), ("min", "inf", np.min)])
def test_aggregations_match_numpy_including_nan(
        agg: str, init: str, reference: Callable[..., np.ndarray],
        rng: np.random.Generator) -> None:
    fn = parse_function(reduction_ir(agg, init))
    verify(fn)
    x = uniform(rng, (4, 9))
    x[1, 3] = np.nan                       # NumPy's max/min propagate NaN; so does the IR
    y = np.zeros(4, np.float32)
    interp.run(fn, {"X": x, "Y": y})
    np.testing.assert_allclose(y, reference(x, axis=1), rtol=1e-5)
    assert np.isnan(y[1])


def test_integer_reduction_is_exact(rng: np.random.Generator) -> None:
    fn = parse_function(reduction_ir("add", "0", "int64", m=3, n=1000))
    x = rng.integers(-2**40, 2**40, (3, 1000))
    y = np.zeros(3, np.int64)
    interp.run(fn, {"X": x, "Y": y})
    np.testing.assert_array_equal(y, x.sum(axis=1))


@pytest.mark.parametrize("dtype", [dtypes.FLOAT16, dtypes.BFLOAT16])
def test_half_precision_rounds_after_every_operation(dtype: dtypes.DType,
                                                     rng: np.random.Generator) -> None:
    text = f"""function f(X, Y) {{
  block main (
    in X[0] {dtype}(33:1)
    out Y[0] {dtype}(33:1)
  ) {{
    block k [i:33] (
      in X <- X[i] {dtype}(1:1)
      out Y <- Y[i] {dtype}(1:1)
    ) {{
      $x = load(X)
      $xx = mul($x, $x) : {dtype}
      $e = exp($xx) : {dtype}
      $y = add($e, $x) : {dtype}
      Y = store($y)
    }}
  }}
}}
"""
    fn = parse_function(text)
    verify(fn)
    x = rng.uniform(-1.5, 1.5, 33).astype(dtype.numpy)
    y = np.zeros(33, dtype.numpy)
    interp.run(fn, {"X": x, "Y": y})
    xx = intrinsics.evaluate("mul", dtype, x, x)
    expected = intrinsics.evaluate("add", dtype, intrinsics.evaluate("exp", dtype, xx), x)
    assert y.dtype == dtype.numpy
    np.testing.assert_array_equal(y.astype(np.float32), expected.astype(np.float32))


def test_copy_special_between_views(rng: np.random.Generator) -> None:
    text = """function f(X, Y) {
  block main (
    in X[0, 0] float32(4:6, 6:1)
    out Y[0, 0] float32(4:6, 6:1)
  ) {
    block rows [i:4] (
      in X <- X[i, 0] float32(1:6, 6:1)
      out Y <- Y[i, 0] float32(1:6, 6:1)
      none T[0, 0] float32(1:6, 6:1)
    ) {
      special copy(X) -> (T)
      special copy(T) -> (Y)
    }
  }
}
"""
    fn = parse_function(text)
    verify(fn)
    x, y = uniform(rng, (4, 6)), np.zeros((4, 6), np.float32)
    interp.run(fn, {"X": x, "Y": y})
    np.testing.assert_array_equal(y, x)
    with pytest.raises(UnsupportedError, match="no special 'transpose'"):
        interp.run(parse_function(text.replace("copy(T)", "transpose(T)")), {"X": x, "Y": y})


@pytest.mark.parametrize("buffers, message", [
    ({"A": np.ones((5, 7), np.float32), "B": np.ones((7, 3), np.float32)},
     "parameter C needs a NumPy array, got NoneType"),
    ({"A": np.ones((5, 7), np.float32), "B": np.ones((7, 4), np.float32),
      "C": np.ones((5, 3), np.float32)}, "parameter B is float32(7, 4), expected float32(7, 3)"),
    ({"A": np.ones((5, 7), np.float64), "B": np.ones((7, 3), np.float32),
      "C": np.ones((5, 3), np.float32)}, "parameter A is float64(5, 7), expected float32(5, 7)"),
    ({"A": np.ones((5, 7), np.float32), "B": np.ones((7, 3), np.float32),
      "C": np.ones((5, 3), np.float32), "D": np.ones(1)}, "matmul has no parameter D"),
])
def test_argument_errors(buffers: dict[str, np.ndarray], message: str) -> None:
    with pytest.raises(ArgumentError) as info:
        interp.run(load("matmul"), buffers)
    assert message in info.value.message


def test_large_flat_block_is_vectorized(rng: np.random.Generator) -> None:
    # 64^3 = 262144 iterations must run in well under a second.
    text = (GOLDEN / "matmul.ir").read_text()
    for old, new in [("5:7, 7:1", "64:64, 64:1"), ("7:3, 3:1", "64:64, 64:1"),
                     ("5:3, 3:1", "64:64, 64:1"), ("1:7, 1:1", "1:64, 1:1"),
                     ("1:3, 1:1", "1:64, 1:1"), ("i:5", "i:64"), ("j:3", "j:64"),
                     ("k:7", "k:64")]:
        text = text.replace(old, new)
    fn = parse_function(text)
    verify(fn)
    a, b, c = uniform(rng, (64, 64)), uniform(rng, (64, 64)), np.zeros((64, 64), np.float32)
    interp.run(fn, {"A": a, "B": b, "C": c})
    np.testing.assert_allclose(c, a @ b, rtol=1e-5)
