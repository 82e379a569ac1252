"""Temporaries: a top-level heap local comes from a pool kept between calls, and it starts
as NaN (0 for integers) only when a read could see an earlier content. Checked on the
generated text, against NumPy over repeated calls and from two threads at once, and
against the interpreter for programs that read a local before writing it."""
from __future__ import annotations

import re
import threading

import numpy as np
import pytest
from c_harness import CKernel, local, needs_cc, param, rand, view

import polytile as pt
from polytile import dtypes as D
from polytile.codegen import COptions, generate_c
from polytile.dtypes import DType
from polytile.ir import interp
from polytile.ir.nodes import Block, Constant, Function, Index, Intrinsic, Load, Store
from polytile.sema.specialize import specialize

pytestmark = needs_cc
RNG = np.random.default_rng(11)
POOLED = COptions(stack_bytes=0)      # every local on the heap


def pointer(text: str, name: str) -> str:
    """The C pointer (or array) of local `name` in generated `text`."""
    line = next(line for line in text.splitlines()
                if f"/* {name}: local" in line and not line.startswith("static"))
    found = re.search(r"\b(l\d+)\b", line)
    assert found is not None, line
    return found.group(1)


def filled(text: str, name: str) -> bool:
    """Whether the code gives local `name` its NaN or 0 start on every call."""
    ptr = pointer(text, name)
    return bool(re.search(rf"{ptr}\[\w+\] = NAN;|memset\({ptr}, 0, |{ptr}\[\d+\] = \{{0\}}",
                          text))


def normalize(rows: int, cols: int, init: bool = True) -> Function:
    """Y(i, j) = X(i, j) / sum_k X(i, k), with the sums in local T. `init` zeroes T
    first; without it the `:add` block is T's first writer (and adds to NaN)."""
    x, y, t = (param("in", "X", D.FLOAT32, (rows, cols)),
               param("out", "Y", D.FLOAT32, (rows, cols)), local("T", D.FLOAT32, (rows,)))
    zero = Block("t_init", (Index("i", rows),), (), (view(t, "t", ("i",), "out"),),
                 (Constant("$z", 0.0, D.FLOAT32), Store("t", "$z")))
    sums = Block("t_sum", (Index("i", rows), Index("k", cols)), (),
                 (view(x, "x", ("i", "k")), view(t, "t", ("i",), "out", "add")),
                 (Load("$x", "x"), Store("t", "$x")), frozenset({"parallel"}))
    div = Block("y", (Index("i", rows), Index("j", cols)), (),
                (view(x, "x", ("i", "j")), view(t, "t", ("i",)), view(y, "y", ("i", "j"), "out")),
                (Load("$x", "x"), Load("$t", "t"), Intrinsic("div", ("$x", "$t"), "$q", D.FLOAT32),
                 Store("y", "$q")), frozenset({"parallel"}))
    stmts = (zero, sums, div) if init else (sums, div)
    return Function("normalize", ("X", "Y"), Block("main", refs=(x, y, t), stmts=stmts))


def read_then_write(n: int, dtype: DType) -> Function:
    """OLD(i) = T(i), then T(i) = X(i): OLD must be the start value on every call, never
    the previous call's X."""
    x, old, t = (param("in", "X", dtype, (n,)), param("out", "OLD", dtype, (n,)),
                 local("T", dtype, (n,)))
    peek = Block("peek", (Index("i", n),), (), (view(t, "t", ("i",)), view(old, "o", ("i",), "out")),
                 (Load("$t", "t"), Store("o", "$t")))
    put = Block("put", (Index("i", n),), (), (view(x, "x", ("i",)), view(t, "t", ("i",), "out")),
                (Load("$x", "x"), Store("t", "$x")))
    return Function("stale", ("X", "OLD"), Block("main", refs=(x, old, t), stmts=(peek, put)))


def test_pooled_local_code() -> None:
    text = generate_c(normalize(13, 7), POOLED).text
    assert "static void *pt_pool_l0[PT_POOL_SLOTS];" in text
    assert "l0 = (float *)pt_pool_take(pt_pool_l0, 13, sizeof(float));" in text
    assert "pt_pool_give(pt_pool_l0, l0);" in text and "pt_pool_drain(pt_pool_l0);" in text
    # not allocated per call (the pool's own allocator, pt_pool_alloc, zeroes a new block
    # once, so that a kept block starts as "not filled")
    assert "l0 = (float *)calloc" not in text and "free(l0)" not in text
    assert "calloc(count * size + PT_POOL_ALIGN" in text


def test_block_private_heap_local_is_still_per_iteration() -> None:
    rows, cols = 5, 3
    x, y = param("in", "X", D.FLOAT32, (rows, cols)), param("out", "Y", D.FLOAT32, (rows,))
    acc = local("acc", D.FLOAT32, (1,))
    row = Block("row", (Index("i", rows),), (),
                (view(x, "x", ("i", 0), sizes=(1, cols)), view(y, "y", ("i",), "out"), acc),
                (Constant("$z", 0.0, D.FLOAT32), Store("acc", "$z"), Load("$s", "acc"),
                 Store("y", "$s")), frozenset({"parallel"}))
    text = generate_c(Function("rows", ("X", "Y"), Block("main", refs=(x, y), stmts=(row,))),
                      POOLED).text
    assert "calloc(1, sizeof(float))" in text and "free(l0);" in text
    assert "pt_pool" not in text and filled(text, "acc")


@pytest.mark.parametrize("options", [COptions(), POOLED], ids=["stack", "pool"])
def test_fill_skipped_only_when_the_first_toucher_overwrites(options: COptions) -> None:
    assert not filled(generate_c(normalize(13, 7), options).text, "T")
    assert filled(generate_c(normalize(13, 7, init=False), options).text, "T")
    for dtype in (D.FLOAT32, D.INT32):
        assert filled(generate_c(read_then_write(5, dtype), options).text, "T")


@pytest.mark.parametrize("stack_bytes", [4096, 0])
@pytest.mark.parametrize("dtype", [D.FLOAT32, D.INT32], ids=str)
def test_read_before_write_sees_the_start_value_on_every_call(tmp_path, stack_bytes: int,
                                                              dtype: DType) -> None:
    n = 9
    fn = read_then_write(n, dtype)
    kernel = CKernel(fn, tmp_path, COptions(stack_bytes=stack_bytes))
    for _ in range(3):
        x = rand(RNG, dtype.numpy, (n,))
        old = np.full(n, 5, dtype.numpy)
        assert kernel(x, old)[0] == 0
        want = np.full(n, 5, dtype.numpy)
        interp.run(fn, {"X": x, "OLD": want})
        np.testing.assert_array_equal(old, want)     # NaN or 0, like the interpreter
        assert (np.isnan(old).all() if dtype.is_float else (old == 0).all())


def test_add_first_writer_gives_nan_on_every_call(tmp_path) -> None:
    fn = normalize(6, 4, init=False)
    kernel = CKernel(fn, tmp_path, POOLED)
    for _ in range(2):
        y = np.zeros((6, 4), np.float32)
        assert kernel(rand(RNG, np.float32, (6, 4)), y)[0] == 0
        assert np.isnan(y).all()


@pytest.mark.parametrize("rows,cols", [(13, 7), (300, 1), (1, 1)])
def test_kept_local_across_calls_with_new_inputs(tmp_path, rows: int, cols: int) -> None:
    kernel = CKernel(normalize(rows, cols), tmp_path, POOLED)
    assert not filled(kernel.source.text, "T")
    for _ in range(4):
        x = np.abs(rand(RNG, np.float32, (rows, cols), 1.0, 2.0))
        y = np.zeros((rows, cols), np.float32)
        assert kernel(x, y)[0] == 0
        np.testing.assert_allclose(y, x / x.astype(np.float64).sum(axis=1, keepdims=True),
                                   rtol=1e-5)


def test_kept_local_from_two_threads_at_once(tmp_path) -> None:
    """ctypes drops the GIL during the call, so the two threads' calls overlap; had they
    shared T, one would zero or add into the other's sums."""
    rows, cols, calls = 2048, 64, 60
    kernel = CKernel(normalize(rows, cols), tmp_path, POOLED)
    start = threading.Barrier(2)
    failures: list[str] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        inputs = [np.abs(rand(rng, np.float32, (rows, cols), 1.0, 2.0)) for _ in range(3)]
        wants = [x / x.astype(np.float64).sum(axis=1, keepdims=True) for x in inputs]
        start.wait()
        for call in range(calls):
            y = np.zeros((rows, cols), np.float32)
            status = kernel(inputs[call % 3], y)[0]
            if status != 0 or not np.allclose(y, wants[call % 3], rtol=1e-5, atol=0):
                failures.append(f"thread {seed}, call {call}: status {status}")
                return

    threads = [threading.Thread(target=work, args=(seed,)) for seed in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures


MLP = ("def mlp(float(B,M) I, float(N,M) W1, float(O,N) W2) -> (O2) {\n"
       "  O1(b,n) +=! I(b,m) * W1(n,m)\n"
       "  O2(b,o) +=! O1(b,n) * W2(o,n)\n}\n")
SHAPES = [(67, 30, 130, 9), (5, 17, 2000, 3)]      # (B, M, N, O): O1 is over 32 KiB


def mlp_module() -> pt.Module:
    """MLP compiled without fusion, so that O1 is a top-level (kept) local."""
    mod = pt.define(MLP)
    mod.compiler.options = {"fuse.strategy": "none"}
    return mod


def mlp_inputs(rng: np.random.Generator, b: int, m: int, n: int,
               o: int) -> tuple[np.ndarray, ...]:
    return tuple(rng.standard_normal(s).astype(np.float32) for s in ((b, m), (n, m), (o, n)))


def mlp_reference(i: np.ndarray, w1: np.ndarray, w2: np.ndarray) -> np.ndarray:
    return (i.astype(np.float64) @ w1.T) @ w2.T


def test_compiled_mlp_keeps_its_temporary() -> None:
    mod = mlp_module()
    fn = mod.mlp.fn
    args = mlp_inputs(RNG, *SHAPES[0])
    shapes = {p.name: a.shape for p, a in zip(fn.params, args)}
    text = generate_c(mod.compiler.ir(specialize(fn, shapes, {}))).text
    o1 = pointer(text, "t0")
    assert f"{o1} = (float *)pt_pool_take(pt_pool_{o1}," in text
    assert not filled(text, "t0")       # its init block writes all of it


def test_compiled_mlp_across_calls_shapes_and_threads() -> None:
    mod = mlp_module()
    for _ in range(2):          # alternate shapes: each has its own kernel and pools
        for shape in SHAPES:
            args = mlp_inputs(RNG, *shape)
            np.testing.assert_allclose(mod.mlp(*args), mlp_reference(*args),
                                       rtol=1e-4, atol=1e-3)
    start = threading.Barrier(2)
    failures: list[str] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        cases = [mlp_inputs(rng, *shape) for shape in SHAPES for _ in range(2)]
        wants = [mlp_reference(*args) for args in cases]
        start.wait()
        for call in range(40):
            got = mod.mlp(*cases[call % len(cases)])
            if not np.allclose(got, wants[call % len(cases)], rtol=1e-4, atol=1e-3):
                failures.append(f"thread {seed}, call {call}")
                return

    threads = [threading.Thread(target=work, args=(seed,)) for seed in (3, 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
