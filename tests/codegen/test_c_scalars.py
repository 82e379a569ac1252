"""Every intrinsic, every dtype, and the conversions, in generated C against NumPy.

The oracle is `polytile.ir.intrinsics.evaluate` (NumPy) where its semantics are the
C ones, plus hand-computed values for the integer corner cases.
"""
from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
from c_harness import CKernel, needs_cc, param, view

from polytile import dtypes as D
from polytile.dtypes import DType
from polytile.ir import intrinsics
from polytile.ir.nodes import Block, Function, Index, Intrinsic, Load, Store

pytestmark = needs_cc
RNG = np.random.default_rng(11)


def op_function(op: str, in_types: tuple[DType, ...], out: DType, n: int) -> Function:
    """Y(i) = op(X0(i), X1(i), ...) computed in `out`."""
    xs = [param("in", f"X{k}", t, (n,)) for k, t in enumerate(in_types)]
    y = param("out", "Y", out, (n,))
    loads = tuple(Load(f"$x{k}", f"x{k}") for k in range(len(xs)))
    blk = Block("op", (Index("i", n),), (),
                tuple(view(x, f"x{k}", ("i",)) for k, x in enumerate(xs))
                + (view(y, "y", ("i",), "out"),),
                loads + (Intrinsic(op, tuple(f"$x{k}" for k in range(len(xs))), "$r", out),
                         Store("y", "$r")))
    return Function(f"op_{op}", tuple(x.into for x in xs) + ("Y",),
                    Block("main", refs=(*xs, y), stmts=(blk,)))


def run_op(tmp_path, op: str, inputs: list[np.ndarray], out: DType) -> np.ndarray:
    in_types = tuple(D.from_numpy(x.dtype) for x in inputs)
    kernel = CKernel(op_function(op, in_types, out, len(inputs[0])), tmp_path)
    y = np.zeros(len(inputs[0]), out.numpy)
    assert kernel(*inputs, y)[0] == 0
    return y


FLOAT_SPECIALS = [0.0, -0.0, 0.5, -0.5, 1.0, -1.0, 2.5, -2.5, 1e-3, np.inf, -np.inf, np.nan]


def float_inputs(dtype: np.dtype, n: int = 61) -> np.ndarray:
    values = np.concatenate([FLOAT_SPECIALS, RNG.uniform(-3, 3, n - len(FLOAT_SPECIALS))])
    return values.astype(dtype)


@pytest.mark.parametrize("op", sorted(intrinsics.OPS))
@pytest.mark.parametrize("dtype", [D.FLOAT32, D.FLOAT64], ids=str)
def test_every_intrinsic_on_floats(tmp_path, op, dtype):
    arity = intrinsics.OPS[op].arity
    inputs = [np.roll(float_inputs(dtype.numpy), 7 * k) for k in range(arity)]
    if op == "select":
        inputs[0] = (inputs[0] > 0).astype(np.bool_)
    out = intrinsics.result_dtype(op, dtype)
    got = run_op(tmp_path, op, inputs, out)
    want = intrinsics.evaluate(op, out, *inputs)
    if out == D.BOOL:
        np.testing.assert_array_equal(got, want)
    else:
        tol = 2e-6 if dtype == D.FLOAT32 else 1e-13
        # C's fma rounds once, NumPy's a*b+c twice: allow an absolute difference.
        atol = tol * 10 if op == "fma" else tol * 1e-3
        np.testing.assert_allclose(got, want, rtol=tol, atol=atol, equal_nan=True)


INT_OPS = ["add", "sub", "mul", "div", "mod", "neg", "abs", "relu", "fmax", "fmin", "cast",
           "ident", "eq", "ne", "lt", "le", "gt", "ge", "and", "or", "not"]


def int_pairs(dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    info = np.iinfo(dtype)
    edge = sorted(v for v in {int(info.min), int(info.min) + 1, -7, -2, -1, 0, 1, 2, 7,
                              int(info.max) - 1, int(info.max)} if info.min <= v <= info.max)
    pairs = list(itertools.product(edge, edge))
    a = np.array([p[0] for p in pairs] + list(RNG.integers(info.min, info.max, 50, dtype=dtype)), dtype)
    b = np.array([p[1] for p in pairs] + list(RNG.integers(info.min, info.max, 50, dtype=dtype)), dtype)
    return a, b


@pytest.mark.parametrize("op", INT_OPS)
@pytest.mark.parametrize("dtype", [D.INT8, D.INT32, D.INT64, D.UINT8, D.UINT64, D.UINT16],
                         ids=str)
def test_integer_intrinsics(tmp_path, op, dtype):
    a, b = int_pairs(dtype.numpy)
    if op == "div" and dtype.kind == "i":
        # The NumPy reference takes abs() of INT_MIN, which wraps; those cases are checked
        # by hand in test_signed_division_truncates_and_never_traps.
        lo = np.iinfo(dtype.numpy).min
        keep = ((a != lo) | (np.abs(b.astype(np.float64)) <= 1)) & (b != lo)
        a, b = a[keep], b[keep]
    inputs = [a, b][:intrinsics.OPS[op].arity]
    out = intrinsics.result_dtype(op, dtype)
    got = run_op(tmp_path, op, inputs, out)
    np.testing.assert_array_equal(got, intrinsics.evaluate(op, out, *inputs))


@pytest.mark.parametrize("dtype", [D.INT8, D.INT32], ids=str)
def test_signed_division_truncates_and_never_traps(tmp_path, dtype):
    lo = int(np.iinfo(dtype.numpy).min)
    cases = [(-7, 2, -3, -1), (7, -2, -3, 1), (-7, -2, 3, -1), (7, 2, 3, 1), (5, 0, 0, 0),
             (-5, 0, 0, 0), (0, 0, 0, 0), (lo, -1, lo, 0), (lo, 1, lo, 0), (lo, 2, lo // 2, 0),
             (lo, 0, 0, 0), (lo + 1, -1, -(lo + 1), 0), (-1, lo, 0, -1), (lo, lo, 1, 0),
             (lo + 1, lo, 0, lo + 1)]
    a = np.array([c[0] for c in cases], dtype.numpy)
    b = np.array([c[1] for c in cases], dtype.numpy)
    np.testing.assert_array_equal(run_op(tmp_path, "div", [a, b], dtype), [c[2] for c in cases])
    np.testing.assert_array_equal(run_op(tmp_path, "mod", [a, b], dtype), [c[3] for c in cases])


def test_integer_overflow_wraps(tmp_path):
    a = np.array([127, -128, 100, 64], np.int8)
    b = np.array([1, -1, 100, 2], np.int8)
    np.testing.assert_array_equal(run_op(tmp_path, "add", [a, b], D.INT8), (a + b))
    np.testing.assert_array_equal(run_op(tmp_path, "mul", [a, b], D.INT8), (a * b))
    u = np.array([65535, 40000], np.uint16)
    np.testing.assert_array_equal(run_op(tmp_path, "mul", [u, u], D.UINT16), u * u)


@pytest.mark.parametrize("dtype", [D.FLOAT16, D.BFLOAT16], ids=str)
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "neg", "abs", "relu", "fmax", "fmin",
                                "exp", "sqrt", "tanh", "sigmoid", "lt", "eq", "fma"])
def test_half_precision_ops(tmp_path, dtype, op):
    arity = intrinsics.OPS[op].arity
    inputs = [np.roll(float_inputs(dtype.numpy), 5 * k) for k in range(arity)]
    out = intrinsics.result_dtype(op, dtype)
    got = run_op(tmp_path, op, inputs, out)
    want = intrinsics.evaluate(op, out, *inputs)
    if op in ("exp", "tanh", "sigmoid", "sqrt", "fma"):
        # float32 math may differ by an ulp of float32, which rarely flips the rounding.
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                                   rtol=1e-2 if dtype == D.BFLOAT16 else 1e-3, equal_nan=True)
    else:   # computed in float32 and rounded once: bit-exact
        assert_same_bits(got, want)


def assert_same_bits(got: np.ndarray, want: np.ndarray) -> None:
    with np.errstate(invalid="ignore"):
        nan = np.isnan(want.astype(np.float64))
        np.testing.assert_array_equal(np.isnan(got.astype(np.float64)), nan)
    if got.dtype.itemsize == 2:
        np.testing.assert_array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan])
    else:
        np.testing.assert_array_equal(got[~nan], want[~nan])


def test_float16_to_float32_exhaustive(tmp_path):
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    got = run_op(tmp_path, "cast", [halves], D.FLOAT32)
    assert_same_bits(got, halves.astype(np.float32))
    got = run_op(tmp_path, "cast", [halves.view(ml_dtypes.bfloat16)], D.FLOAT32)
    assert_same_bits(got, halves.view(ml_dtypes.bfloat16).astype(np.float32))


def tricky_floats() -> np.ndarray:
    """Random bit patterns, and values at and next to every half-way point."""
    bits = RNG.integers(0, 1 << 32, 200_000, dtype=np.uint64).astype(np.uint32)
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    mids = (halves[:-1].astype(np.float64) + halves[1:].astype(np.float64)) / 2
    mids = mids[np.isfinite(mids)]
    near = np.concatenate([mids, np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf)])
    sub = np.array([2.0 ** -25, 2.0 ** -24, 3 * 2.0 ** -26, 2.0 ** -14 * 0.99, 65504.0, 65519.0,
                    65520.0, 1e-45, -2.0 ** -25])
    return np.concatenate([bits.view(np.float32), near.astype(np.float32),
                           sub.astype(np.float32)])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # NaN/inf inputs on purpose
def test_float32_to_half_rounds_to_nearest_even(tmp_path):
    x = tricky_floats()
    assert_same_bits(run_op(tmp_path, "cast", [x], D.FLOAT16), x.astype(np.float16))
    assert_same_bits(run_op(tmp_path, "cast", [x], D.BFLOAT16), x.astype(ml_dtypes.bfloat16))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # NaN/inf inputs on purpose
def test_float64_to_half_rounds_once(tmp_path):
    halves = np.arange(1 << 15, dtype=np.uint32).astype(np.uint16).view(np.float16)
    mids = (halves[:-1].astype(np.float64) + halves[1:].astype(np.float64)) / 2
    mids = mids[np.isfinite(mids)]
    # Just above a tie, by less than a float32 ulp: rounding through float32 would tie.
    x = np.concatenate([mids * (1 + 2.0 ** -40), mids * (1 - 2.0 ** -40), mids,
                        RNG.uniform(-7e4, 7e4, 10_000)])
    assert_same_bits(run_op(tmp_path, "cast", [x], D.FLOAT16), x.astype(np.float16))
    # bfloat16: compare with exact round-to-nearest-even on the float64 bits.
    y = np.array([1 + 2.0 ** -8 + 2.0 ** -40, 1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8,
                  -(1 + 2.0 ** -8 + 2.0 ** -40)])
    got = run_op(tmp_path, "cast", [y], D.BFLOAT16).astype(np.float64)
    np.testing.assert_array_equal(got, [1 + 2.0 ** -7, 1.0, 1 + 2.0 ** -6, -(1 + 2.0 ** -7)])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # NaN/inf inputs on purpose
@pytest.mark.parametrize("src,dst", [(D.FLOAT32, D.INT32), (D.FLOAT64, D.INT8),
                                     (D.FLOAT32, D.UINT8), (D.FLOAT16, D.INT16),
                                     (D.INT32, D.FLOAT16), (D.INT64, D.FLOAT32),
                                     (D.UINT64, D.FLOAT64), (D.INT32, D.BFLOAT16),
                                     (D.FLOAT32, D.BOOL), (D.INT8, D.BOOL), (D.BOOL, D.FLOAT32),
                                     (D.INT32, D.UINT8), (D.INT64, D.INT8), (D.UINT32, D.INT32),
                                     (D.FLOAT32, D.UINT64), (D.FLOAT64, D.UINT32)])
def test_casts(tmp_path, src, dst):
    if src.is_float:
        lo = 0 if dst.kind in "ub" and dst.bits < 64 else -100
        x = np.concatenate([RNG.uniform(lo, 120, 40), [0.0, -0.0, 0.5, -0.5, 1.5, -1.5][
            (2 if lo == 0 else 0):]]).astype(src.numpy)
        if dst.kind == "b":
            x = np.concatenate([x, [np.nan, np.inf]]).astype(src.numpy)
    elif src.kind == "b":
        x = np.array([True, False, True])
    else:
        info = np.iinfo(src.numpy)
        x = np.concatenate([[info.min, info.max, 0, 1, -1 if src.kind == "i" else 2],
                            RNG.integers(info.min, info.max, 40, dtype=src.numpy)]).astype(src.numpy)
    got = run_op(tmp_path, "cast", [x], dst)
    with np.errstate(all="ignore"):
        want = x.astype(dst.numpy)
    assert_same_bits(got, want)


def test_constants_of_every_dtype(tmp_path):
    from polytile.ir.nodes import Constant
    values = {D.BOOL: True, D.UINT8: 255, D.INT8: -128, D.UINT16: 65535, D.INT16: -32768,
              D.UINT32: 4294967295, D.INT32: -2147483648, D.UINT64: 18446744073709551615,
              D.INT64: -9223372036854775808, D.FLOAT16: 0.1, D.BFLOAT16: -0.1,
              D.FLOAT32: 0.1, D.FLOAT64: 0.1}
    for k, (dt, value) in enumerate(values.items()):
        y = param("out", "Y", dt, ())
        blk = Block("c", (), (), (view(y, "y", ()),), (Constant("$c", value, dt), Store("y", "$c")))
        blk = Block("c", (), (), (y.__class__("out", "Y", "y", (), y.shape),),
                    (Constant("$c", value, dt), Store("y", "$c")))
        kernel = CKernel(Function(f"const{k}", ("Y",), Block("main", refs=(y,), stmts=(blk,))),
                         tmp_path)
        out = np.zeros((), dt.numpy)
        assert kernel(out)[0] == 0
        assert_same_bits(out.reshape(1), np.array([value]).astype(dt.numpy))
    for special in (np.inf, -np.inf, np.nan):
        y = param("out", "Y", D.FLOAT32, ())
        blk = Block("c", (), (), (y.__class__("out", "Y", "y", (), y.shape),),
                    (Constant("$c", special, D.FLOAT32), Store("y", "$c")))
        kernel = CKernel(Function("const_special", ("Y",), Block("main", refs=(y,),
                                                                  stmts=(blk,))), tmp_path)
        out = np.zeros((), np.float32)
        assert kernel(out)[0] == 0
        assert_same_bits(out.reshape(1), np.array([special], np.float32))
