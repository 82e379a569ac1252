"""Blocks, views, aggregation, constraints, locals and tags in generated C, checked
against NumPy on random inputs (sizes include primes and 1)."""
from __future__ import annotations

import numpy as np
import pytest
from c_harness import CKernel, aff, local, needs_cc, parallel, param, rand, view

from polytile import dtypes as D
from polytile.codegen import COptions, generate_c
from polytile.errors import IRError, UnsupportedError
from polytile.ir import interp
from polytile.ir.nodes import (Block, Constant, Function, Index, Intrinsic, Load,
                                Special, Store)

pytestmark = needs_cc
RNG = np.random.default_rng(7)


def elementwise_add(m: int, n: int, b_strides: tuple[int, int] | None = None) -> Function:
    a, b, c = (param("in", "A", D.FLOAT32, (m, n)),
               param("in", "B", D.FLOAT32, (m, n), b_strides),
               param("out", "C", D.FLOAT32, (m, n)))
    body = parallel(Block("add", (Index("i", m), Index("j", n)), (),
                 (view(a, "a", ("i", "j")), view(b, "b", ("i", "j")),
                  view(c, "c", ("i", "j"), "out")),
                 (Load("$a", "a"), Load("$b", "b"), Intrinsic("add", ("$a", "$b"), "$s", D.FLOAT32),
                  Store("c", "$s"))), simd=True)
    return Function("add", ("A", "B", "C"), Block("main", refs=(a, b, c), stmts=(body,)))


@pytest.mark.parametrize("m,n", [(1, 1), (13, 7), (1, 11), (17, 1)])
def test_elementwise_add(tmp_path, m, n):
    kernel = CKernel(elementwise_add(m, n), tmp_path)
    a, b = rand(RNG, np.float32, (m, n)), rand(RNG, np.float32, (m, n))
    c = np.zeros((m, n), np.float32)
    assert kernel(a, b, c)[0] == 0
    np.testing.assert_array_equal(c, a + b)


def test_strided_input(tmp_path):
    m, n = 13, 7
    kernel = CKernel(elementwise_add(m, n, b_strides=(1, m)), tmp_path)
    a = rand(RNG, np.float32, (m, n))
    b = np.ascontiguousarray(rand(RNG, np.float32, (n, m))).T     # element strides (1, 13)
    c = np.zeros((m, n), np.float32)
    assert kernel(a, b, c)[0] == 0
    np.testing.assert_array_equal(c, a + b)
    assert "b1[i0 + 13*i1]" in kernel.source.text


def matmul(m: int, k: int, n: int, dtype=D.FLOAT32, order=("i", "k", "j")) -> Function:
    a, b, c = (param("in", "A", dtype, (m, k)), param("in", "B", dtype, (k, n)),
               param("out", "C", dtype, (m, n)))
    init = Block("init", (Index("i", m), Index("j", n)), (), (view(c, "c", ("i", "j"), "out"),),
                 (Constant("$z", 0, dtype), Store("c", "$z")))
    ranges = {"i": m, "j": n, "k": k}
    acc = parallel(Block("acc", tuple(Index(x, ranges[x]) for x in order), (),
                (view(a, "a", ("i", "k")), view(b, "b", ("k", "j")),
                 view(c, "c", ("i", "j"), "out", "add")),
                (Load("$a", "a"), Load("$b", "b"), Intrinsic("mul", ("$a", "$b"), "$p", dtype),
                 Store("c", "$p"))), simd=True)
    return Function("matmul", ("A", "B", "C"), Block("main", refs=(a, b, c), stmts=(init, acc)))


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (13, 7, 11), (5, 1, 3), (2, 31, 1)])
def test_matmul(tmp_path, m, k, n):
    kernel = CKernel(matmul(m, k, n), tmp_path)
    a, b = rand(RNG, np.float32, (m, k)), rand(RNG, np.float32, (k, n))
    c = np.full((m, n), 99, np.float32)
    assert kernel(a, b, c)[0] == 0
    want = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(c, want, rtol=1e-5)


def test_threads_and_simd_only_on_loops_with_disjoint_writes(tmp_path):
    text = generate_c(matmul(13, 7, 11, order=("i", "k", "j"))).text
    assert text.count("#pragma omp parallel for") == 1       # the i loop of acc
    assert "#pragma omp simd" in text                        # j, innermost, writes distinct C
    # With k innermost, every k writes the same C(i, j): no simd.
    text = generate_c(matmul(13, 7, 11, order=("i", "j", "k"))).text
    assert "#pragma omp simd" not in text and "simd ignored" in text
    # With k outermost, no loop before i can be split across threads.
    text = generate_c(matmul(13, 7, 11, order=("k", "i", "j"))).text
    assert "#pragma omp parallel for" in text                 # the i loop, inside k
    kernel = CKernel(matmul(13, 7, 11, order=("k", "i", "j")), tmp_path)
    a, b = rand(RNG, np.float32, (13, 7)), rand(RNG, np.float32, (7, 11))
    c = np.zeros((13, 11), np.float32)
    assert kernel(a, b, c)[0] == 0
    np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-5)


def test_openmp_off_gives_plain_loops():
    text = generate_c(matmul(13, 7, 11), COptions(openmp=False)).text
    assert "#pragma" not in text


def reduction(op: str, rows: int, cols: int, dtype=D.FLOAT32, init: float = 0.0) -> Function:
    x, y = param("in", "X", dtype, (rows, cols)), param("out", "Y", dtype, (rows,))
    start = Block("init", (Index("i", rows),), (), (view(y, "y", ("i",), "out"),),
                  (Constant("$v", init, dtype), Store("y", "$v")))
    red = parallel(Block("red", (Index("i", rows), Index("k", cols)), (),
                (view(x, "x", ("i", "k")), view(y, "y", ("i",), "out", op)),
                (Load("$x", "x"), Store("y", "$x"))))
    return Function(f"reduce_{op}", ("X", "Y"), Block("main", refs=(x, y), stmts=(start, red)))


@pytest.mark.parametrize("op,identity,ref", [("max", -np.inf, np.max), ("min", np.inf, np.min)])
def test_max_min_reduction_propagates_nan(tmp_path, op, identity, ref):
    rows, cols = 7, 13
    kernel = CKernel(reduction(op, rows, cols, init=identity), tmp_path)
    x = rand(RNG, np.float32, (rows, cols))
    x[1, 0] = np.nan     # first
    x[2, 12] = np.nan    # last
    x[3, 5:7] = np.nan
    y = np.zeros(rows, np.float32)
    assert kernel(x, y)[0] == 0
    np.testing.assert_array_equal(y, ref(x, axis=1))        # NaN rows stay NaN
    assert np.isnan(y[1:4]).all() and not np.isnan(y[[0, 4, 5, 6]]).any()


@pytest.mark.parametrize("dtype,op", [(D.INT32, "max"), (D.INT8, "min"), (D.UINT16, "max"),
                                      (D.FLOAT64, "max"), (D.FLOAT16, "max"), (D.FLOAT32, "mul")])
def test_reductions_other_types(tmp_path, dtype, op):
    rows, cols = 5, 11
    npt = dtype.numpy
    if dtype.is_float:
        x = rand(RNG, npt, (rows, cols), 0.9, 1.1)
        init = {"max": -np.inf, "min": np.inf, "mul": 1.0}[op]
    else:
        info = np.iinfo(npt)
        x = RNG.integers(info.min, info.max, size=(rows, cols), endpoint=True).astype(npt)
        init = int(info.min if op == "max" else info.max)
    kernel = CKernel(reduction(op, rows, cols, dtype, init), tmp_path)
    y = np.zeros(rows, npt)
    assert kernel(x, y)[0] == 0
    if op == "mul":
        np.testing.assert_allclose(y, np.prod(x.astype(np.float64), axis=1), rtol=1e-5)
    else:
        np.testing.assert_array_equal(y, getattr(np, op)(x, axis=1))


def tiled_matmul(m: int, k: int, n: int, tile: int) -> Function:
    """C = A @ B with i and j tiled by `tile`; tail tiles are cut by constraints."""
    a, b, c = (param("in", "A", D.FLOAT32, (m, k)), param("in", "B", D.FLOAT32, (k, n)),
               param("out", "C", D.FLOAT32, (m, n)))
    ti, tj = -(-m // tile), -(-n // tile)
    inner = Block(
        "tile_body",
        (Index("io", 1, aff("io")), Index("jo", 1, aff("jo")), Index("ii", tile),
         Index("jj", tile), Index("k", k)),
        (aff({"io": -tile, "ii": -1}, m - 1), aff({"jo": -tile, "jj": -1}, n - 1)),
        (view(_ref("At", a, (tile, k)), "a", ("ii", "k")),
         view(_ref("Bt", b, (k, tile)), "b", ("k", "jj")),
         view(_ref("Ct", c, (tile, tile)), "c", ("ii", "jj"), "out", "add")),
        (Load("$a", "a"), Load("$b", "b"), Intrinsic("mul", ("$a", "$b"), "$p", D.FLOAT32),
         Store("c", "$p")))
    outer = parallel(Block(
        "tiles", (Index("io", ti), Index("jo", tj)), (),
        (view(a, "At", (aff({"io": tile}), 0), sizes=(tile, k)),
         view(b, "Bt", (0, aff({"jo": tile})), sizes=(k, tile)),
         view(c, "Ct", (aff({"io": tile}), aff({"jo": tile})), "out", "add", (tile, tile))),
        (inner,)))
    main = Block("main", refs=(a, b, c), stmts=(Special("zero", (), ("C",)), outer))
    return Function("tiled_matmul", ("A", "B", "C"), main)


def _ref(name, parent, sizes):
    """A stand-in refinement with the parent's strides, for building child views of it."""
    return view(parent, name, tuple(0 for _ in sizes), sizes=sizes)


@pytest.mark.parametrize("m,k,n,tile", [(13, 7, 11, 4), (1, 1, 1, 4), (8, 3, 8, 4), (17, 5, 2, 8)])
def test_tiled_matmul_with_tail_constraints(tmp_path, m, k, n, tile):
    fn = tiled_matmul(m, k, n, tile)
    kernel = CKernel(fn, tmp_path)
    a, b = rand(RNG, np.float32, (m, k)), rand(RNG, np.float32, (k, n))
    c = np.full((m, n), np.nan, np.float32)
    assert kernel(a, b, c)[0] == 0
    np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-5)
    c_interp = np.zeros((m, n), np.float32)
    interp.run(fn, {"A": a, "B": b, "C": c_interp})
    np.testing.assert_allclose(c, c_interp, rtol=1e-5)


def test_tail_constraint_folds_into_loop_bound():
    text = generate_c(tiled_matmul(13, 7, 11, 4)).text
    assert "pt_min_i64(4, 13 - 4*i2)" in text and "pt_min_i64(4, 11 - 4*i3)" in text
    assert "if (" not in text.split("int32_t pt_tiled_matmul")[1]   # no guards needed
    assert text.count("#pragma omp parallel for") == 1


def test_constraint_on_passed_indices_only_becomes_a_guard(tmp_path):
    # y(i) = x(i) for even i only, via a child block that gets i passed in.
    n = 11
    x, y = param("in", "X", D.INT32, (n,)), param("out", "Y", D.INT32, (n,))
    child = Block("even", (Index("i", 1, aff("i")), Index("h", 1, aff({"i": 1}))),
                  (aff({"h": -1}, 5),),                 # i <= 5
                  (view(_ref("xr", x, (1,)), "x", (0,)), view(_ref("yr", y, (1,)), "y", (0,), "out")),
                  (Load("$x", "x"), Store("y", "$x")))
    outer = Block("rows", (Index("i", n),), (),
                  (view(x, "xr", ("i",)), view(y, "yr", ("i",), "out")), (child,))
    fn = Function("guarded", ("X", "Y"), Block("main", refs=(x, y), stmts=(outer,)))
    kernel = CKernel(fn, tmp_path)
    xs = np.arange(1, n + 1, dtype=np.int32)
    ys = np.zeros(n, np.int32)
    assert kernel(xs, ys)[0] == 0
    np.testing.assert_array_equal(ys, np.where(np.arange(n) <= 5, xs, 0))
    assert "if (5 - i0 >= 0)" in kernel.source.text


def row_normalize(rows: int, cols: int) -> Function:
    """Y(i, j) = X(i, j) / sum_k X(i, k), with the sums in a top-level local buffer."""
    x, y, t = (param("in", "X", D.FLOAT32, (rows, cols)), param("out", "Y", D.FLOAT32, (rows, cols)),
               local("T", D.FLOAT32, (rows,)))
    zero = Block("t_init", (Index("i", rows),), (), (view(t, "t", ("i",), "out"),),
                 (Constant("$z", 0.0, D.FLOAT32), Store("t", "$z")))
    sums = parallel(Block("t_sum", (Index("i", rows), Index("k", cols)), (),
                 (view(x, "x", ("i", "k")), view(t, "t", ("i",), "out", "add")),
                 (Load("$x", "x"), Store("t", "$x"))))
    div = parallel(Block("y", (Index("i", rows), Index("j", cols)), (),
                (view(x, "x", ("i", "j")), view(t, "t", ("i",)), view(y, "y", ("i", "j"), "out")),
                (Load("$x", "x"), Load("$t", "t"), Intrinsic("div", ("$x", "$t"), "$q", D.FLOAT32),
                 Store("y", "$q"))), simd=True)
    return Function("row_normalize", ("X", "Y"),
                    Block("main", refs=(x, y, t), stmts=(zero, sums, div)))


@pytest.mark.parametrize("stack_bytes", [4096, 0])
@pytest.mark.parametrize("rows,cols", [(13, 7), (1, 1), (3, 1)])
def test_top_level_local_buffer(tmp_path, stack_bytes, rows, cols):
    fn = row_normalize(rows, cols)
    kernel = CKernel(fn, tmp_path, COptions(stack_bytes=stack_bytes))
    assert ("pt_pool_take" in kernel.source.text) == (stack_bytes == 0)
    x = rand(RNG, np.float32, (rows, cols), 1.0, 2.0)
    y = np.zeros((rows, cols), np.float32)
    for _ in range(2):      # a second call must not see the first call's sums
        assert kernel(x, y)[0] == 0
        want = x / x.astype(np.float64).sum(axis=1, keepdims=True)
        np.testing.assert_allclose(y, want, rtol=1e-5)


def per_row_local(rows: int, cols: int) -> Function:
    """Y(i) = 2 * sum_k X(i, k), accumulated in a buffer private to each row iteration."""
    x, y = param("in", "X", D.FLOAT32, (rows, cols)), param("out", "Y", D.FLOAT32, (rows,))
    acc = local("acc", D.FLOAT32, (1,))
    xr = view(x, "xr", ("i", 0), sizes=(1, cols))
    child = Block("sum", (Index("k", cols),), (),
                  (view(xr, "x", (0, "k")), view(acc, "a", (0,), "out", "add")),
                  (Load("$x", "x"), Store("a", "$x")))
    row = parallel(Block("row", (Index("i", rows),), (),
                (xr, view(y, "y", ("i",), "out"), acc),
                (Constant("$z", 0.0, D.FLOAT32), Store("acc", "$z"), child, Load("$s", "acc"),
                 Constant("$two", 2.0, D.FLOAT32), Intrinsic("mul", ("$s", "$two"), "$r", D.FLOAT32),
                 Store("y", "$r"))))
    return Function("row_sums", ("X", "Y"), Block("main", refs=(x, y), stmts=(row,)))


@pytest.mark.parametrize("stack_bytes", [4096, 0])
def test_local_buffer_private_to_iterations(tmp_path, stack_bytes):
    rows, cols = 31, 5
    fn = per_row_local(rows, cols)
    kernel = CKernel(fn, tmp_path, COptions(stack_bytes=stack_bytes))
    text = kernel.source.text
    assert "#pragma omp parallel for" in text
    assert ("free(l0)" in text) == (stack_bytes == 0)
    x = rand(RNG, np.float32, (rows, cols))
    y = np.zeros(rows, np.float32)
    assert kernel(x, y)[0] == 0
    np.testing.assert_allclose(y, 2 * x.astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-6)
    y_interp = np.zeros(rows, np.float32)
    interp.run(fn, {"X": x, "Y": y_interp})
    np.testing.assert_allclose(y, y_interp, rtol=1e-5, atol=1e-6)


def test_unwritten_float_local_reads_nan_like_the_interpreter(tmp_path):
    y, t = param("out", "Y", D.FLOAT32, (3,)), local("T", D.FLOAT32, (3,))
    blk = Block("copy", (Index("i", 3),), (), (view(t, "t", ("i",)), view(y, "y", ("i",), "out")),
                (Load("$t", "t"), Store("y", "$t")))
    kernel = CKernel(Function("nan_local", ("Y",), Block("main", refs=(y, t), stmts=(blk,))),
                     tmp_path)
    out = np.zeros(3, np.float32)
    assert kernel(out)[0] == 0
    assert np.isnan(out).all()


def test_specials_zero_and_copy(tmp_path):
    m, n = 5, 3
    x, y, z = (param("in", "X", D.FLOAT32, (m, n)), param("out", "Y", D.FLOAT16, (m, n)),
               param("inout", "Z", D.INT32, (m, n)))
    main = Block("main", refs=(x, y, z),
                 stmts=(Special("copy", ("X",), ("Y",)), Special("zero", (), ("Z",))))
    kernel = CKernel(Function("specials", ("X", "Y", "Z"), main), tmp_path)
    xs = rand(RNG, np.float32, (m, n))
    ys, zs = np.zeros((m, n), np.float16), np.ones((m, n), np.int32)
    assert kernel(xs, ys, zs)[0] == 0
    np.testing.assert_array_equal(ys, xs.astype(np.float16))
    np.testing.assert_array_equal(zs, 0)


def test_unknown_special_is_unsupported():
    x = param("out", "X", D.FLOAT32, (3,))
    fn = Function("f", ("X",), Block("main", refs=(x,), stmts=(Special("scatter", (), ("X",)),)))
    with pytest.raises(UnsupportedError, match="scatter"):
        generate_c(fn)


def test_ir_errors_are_reported():
    x = param("in", "X", D.FLOAT32, (3,))
    bad_store = Block("b", (Index("i", 3),), (), (view(x, "x", ("i",)),),
                      (Load("$x", "x"), Store("x", "$x")))
    with pytest.raises(IRError, match="read-only"):
        generate_c(Function("f", ("X",), Block("main", refs=(x,), stmts=(bad_store,))))
    unknown_index = Block("b", (Index("i", 3),), (), (view(x, "x", ("j",)),), ())
    with pytest.raises(IRError, match="'j'"):
        generate_c(Function("f", ("X",), Block("main", refs=(x,), stmts=(unknown_index,))))
    undefined = Block("b", (), (), (view(x, "x", (0,)),), (Store("x", "$nope"),))
    with pytest.raises(IRError):
        generate_c(Function("f", ("X",), Block("main", refs=(x,), stmts=(undefined,))))
    with pytest.raises(IRError, match="parameter"):
        generate_c(Function("f", ("Y",), Block("main", refs=(x,))))


def test_empty_iteration_space_and_false_constraint(tmp_path):
    y = param("out", "Y", D.INT32, (4,))
    never = Block("never", (Index("i", 4),), (aff({}, -1),), (view(y, "y", ("i",), "out"),),
                  (Constant("$c", 5, D.INT32), Store("y", "$c")))
    empty = Block("empty", (Index("i", 0),), (), (view(y, "y", (0,), "out"),),
                  (Constant("$c", 6, D.INT32), Store("y", "$c")))
    kernel = CKernel(Function("nothing", ("Y",), Block("main", refs=(y,), stmts=(never, empty))),
                     tmp_path)
    out = np.arange(4, dtype=np.int32)
    assert kernel(out)[0] == 0
    np.testing.assert_array_equal(out, np.arange(4))
