"""Run-time checks in generated C: data-dependent subscripts and allocation failures
return an error code with the right fields, and the kernel keeps working."""
from __future__ import annotations

import numpy as np
import pytest
from c_harness import CKernel, local, needs_cc, parallel, param, rand, view

from polytile import dtypes as D
from polytile.codegen import ERR_INDEX, ERR_NOMEM, COptions, generate_c, kernel_error
from polytile.errors import KernelError
from polytile.ir import interp
from polytile.ir.nodes import Block, BlockSchedule, Function, Index, Intrinsic, Load, Store

pytestmark = needs_cc
RNG = np.random.default_rng(5)


def gather(p: int, n: int, index_dtype=D.INT32, parallel: bool = False) -> Function:
    """Y(i) = A(I(i)) * 2."""
    a, idx, y = (param("in", "A", D.FLOAT32, (p,)), param("in", "I", index_dtype, (n,)),
                 param("out", "Y", D.FLOAT32, (n,)))
    blk = Block("gather", (Index("i", n),), (),
                (view(idx, "ix", ("i",)), view(a, "a", (0,), sizes=(p,)),
                 view(y, "y", ("i",), "out")),
                (Load("$k", "ix"), Load("$a", "a", ("$k",)),
                 Intrinsic("add", ("$a", "$a"), "$r", D.FLOAT32), Store("y", "$r")),
                schedule=BlockSchedule(parallel="i" if parallel else None))
    return Function("gather", ("A", "I", "Y"), Block("main", refs=(a, idx, y), stmts=(blk,)))


@pytest.mark.parametrize("parallel", [False, True], ids=["seq", "omp"])
@pytest.mark.parametrize("index_dtype", [D.INT32, D.INT64, D.UINT8], ids=str)
def test_gather_in_range_and_out_of_range(tmp_path, parallel, index_dtype):
    p, n = 7, 101
    fn = gather(p, n, index_dtype, parallel)
    kernel = CKernel(fn, tmp_path)
    assert ("#pragma omp parallel for" in kernel.source.text) == parallel
    a = rand(RNG, np.float32, (p,))
    good = RNG.integers(0, p, n).astype(index_dtype.numpy)
    y = np.zeros(n, np.float32)
    assert kernel(a, good, y) == (0, (-7, -7, -7, -7))       # err untouched on success
    np.testing.assert_array_equal(y, 2 * a[good])

    bad = good.copy()
    bad[n // 2] = p                         # one past the end
    status, err = kernel(a, bad, np.zeros(n, np.float32))
    assert status == ERR_INDEX
    assert err == (ERR_INDEX, 0, 0, p)      # A is params[0], dimension 0, value 7

    if index_dtype.kind == "i":
        bad[n // 2] = -1
        bad[n - 1] = -5
        status, err = kernel(a, bad, np.zeros(n, np.float32))
        assert status == ERR_INDEX and err[:3] == (ERR_INDEX, 0, 0) and err[3] in (-1, -5)

    y = np.zeros(n, np.float32)             # and it still works afterwards
    assert kernel(a, good, y)[0] == 0
    np.testing.assert_array_equal(y, 2 * a[good])


def test_all_bad_indices_in_parallel_report_one_of_them(tmp_path):
    p, n = 3, 997
    kernel = CKernel(gather(p, n, D.INT32, True), tmp_path)
    bad = np.arange(n, dtype=np.int32) + p
    status, err = kernel(rand(RNG, np.float32, (p,)), bad, np.zeros(n, np.float32))
    assert status == ERR_INDEX and err[:3] == (ERR_INDEX, 0, 0) and p <= err[3] < p + n


def test_float_index_nan_is_out_of_range(tmp_path):
    kernel = CKernel(gather(5, 3, D.FLOAT32), tmp_path)
    a = rand(RNG, np.float32, (5,))
    status, err = kernel(a, np.array([1.7, np.nan, 0], np.float32), np.zeros(3, np.float32))
    assert status == ERR_INDEX and err[:3] == (ERR_INDEX, 0, 0)
    y = np.zeros(3, np.float32)
    assert kernel(a, np.array([1.7, 4.2, 0], np.float32), y)[0] == 0
    np.testing.assert_array_equal(y, 2 * a[[1, 4, 0]])


def gather_2d(p: int, q: int, n: int) -> Function:
    """Y(i, j) = A(I(i), J(j)): dynamic offsets in both dimensions."""
    a = param("in", "A", D.INT16, (p, q))
    ii, jj = param("in", "I", D.INT64, (n,)), param("in", "J", D.INT64, (n,))
    y = param("out", "Y", D.INT16, (n, n))
    blk = Block("gather2", (Index("i", n), Index("j", n)), (),
                (view(ii, "ix", ("i",)), view(jj, "jx", ("j",)),
                 view(a, "a", (0, 0), sizes=(p, q)), view(y, "y", ("i", "j"), "out")),
                (Load("$i", "ix"), Load("$j", "jx"), Load("$a", "a", ("$i", "$j")),
                 Store("y", "$a")))
    return Function("gather2", ("A", "I", "J", "Y"), Block("main", refs=(a, ii, jj, y),
                                                           stmts=(blk,)))


def test_gather_two_dimensions(tmp_path):
    p, q, n = 5, 3, 11
    fn = gather_2d(p, q, n)
    kernel = CKernel(fn, tmp_path)
    a = RNG.integers(-1000, 1000, (p, q)).astype(np.int16)
    i, j = RNG.integers(0, p, n), RNG.integers(0, q, n)
    y = np.zeros((n, n), np.int16)
    assert kernel(a, i, j, y)[0] == 0
    np.testing.assert_array_equal(y, a[i[:, None], j[None, :]])
    y_interp = np.zeros((n, n), np.int16)
    interp.run(fn, {"A": a, "I": i, "J": j, "Y": y_interp})
    np.testing.assert_array_equal(y, y_interp)

    j_bad = j.copy()
    j_bad[3] = q
    status, err = kernel(a, i, j_bad, y)
    assert (status, err) == (ERR_INDEX, (ERR_INDEX, 0, 1, q))   # dimension 1 this time
    error = kernel_error(fn, status, err)
    assert isinstance(error, KernelError)
    assert "'A'" in str(error) and "index 3 " in str(error) and "dimension 1" in str(error)
    with pytest.raises(KernelError):
        interp.run(fn, {"A": a, "I": i, "J": j_bad, "Y": y_interp})


def test_failed_allocation_returns_nomem_and_frees(tmp_path):
    """A local too large for memory: the kernel reports it instead of crashing."""
    y = param("out", "Y", D.INT32, (3,))
    small, huge = local("S", D.INT32, (100_000,)), local("H", D.INT32, (1 << 60,))
    blk = Block("touch", (Index("i", 3),), (),
                (view(small, "s", ("i",), "out"), view(huge, "h", ("i",), "out"),
                 view(y, "y", ("i",), "out")),
                (Load("$s", "s"), Store("y", "$s"), Store("h", "$s")))
    fn = Function("huge", ("Y",), Block("main", refs=(y, small, huge), stmts=(blk,)))
    kernel = CKernel(fn, tmp_path, COptions(stack_bytes=0))
    for _ in range(2):      # the small buffer went back to its pool and is taken again
        status, err = kernel(np.ones(3, np.int32))
        assert (status, err) == (ERR_NOMEM, (ERR_NOMEM, -1, -1, 4 << 60))
    assert "out of memory" in str(kernel_error(fn, status, err))
    text = kernel.source.text
    assert "pt_pool_give(pt_pool_l0, l0);" in text and "pt_pool_give(pt_pool_l1, l1);" in text


def test_checks_inside_heap_scope_inside_parallel_loop(tmp_path):
    """A failing check in a block with a per-iteration heap buffer, in a parallel loop:
    the buffer is freed and the error still reaches the caller."""
    p, n = 4, 64
    a, idx, y = (param("in", "A", D.FLOAT32, (p,)), param("in", "I", D.INT32, (n,)),
                 param("out", "Y", D.FLOAT32, (n,)))
    t = local("T", D.FLOAT32, (8,))
    blk = parallel(Block("g", (Index("i", n),), (),
                (view(idx, "ix", ("i",)), view(a, "a", (0,), sizes=(p,)),
                 view(y, "y", ("i",), "out"), t),
                (Load("$k", "ix"), Load("$a", "a", ("$k",)), Store("T", "$a"), Load("$t", "T"),
                 Store("y", "$t"))))
    fn = Function("g", ("A", "I", "Y"), Block("main", refs=(a, idx, y), stmts=(blk,)))
    kernel = CKernel(fn, tmp_path, COptions(stack_bytes=0))
    assert "pt_bad_" in kernel.source.text and "#pragma omp parallel for" in kernel.source.text
    av = rand(RNG, np.float32, (p,))
    good = RNG.integers(0, p, n).astype(np.int32)
    out = np.zeros(n, np.float32)
    assert kernel(av, good, out)[0] == 0
    np.testing.assert_array_equal(out, av[good])
    bad = good.copy()
    bad[17] = 1000
    assert kernel(av, bad, out) == (ERR_INDEX, (ERR_INDEX, 0, 0, 1000))


def test_kernel_error_names_the_tensor():
    fn = gather(7, 5)
    error = kernel_error(fn, ERR_INDEX, (ERR_INDEX, 0, 0, 9))
    assert "index 9 is out of range for dimension 0 of tensor 'A' (size 7)" in str(error)
    assert "gather" in str(error)
    assert "code 5" in str(kernel_error(fn, 5, (5, 0, 0, 0)))


def test_check_is_before_the_read():
    text = generate_c(gather(7, 5)).text
    check = text.index("if (d0 < 0 || d0 >= 7)")
    assert check < text.index("b0[d0]")
