"""The native call path (polytile/runtime/dispatch.c): cached calls run through C, and
every call it does not take gives exactly what the Python path gives."""
from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import polytile as pt
from polytile.api import TCFunction
from polytile.compile import CompiledFunction
from polytile.config import Config, load_config
from polytile.runtime import dispatch

SOURCE = """
def add(float(N) A, float(N) B) -> (C) { C(i) = A(i) + B(i) }
def scaled(float s, int32 k, float(M,N) A) -> (C) { C(m,n) = A(m,n) * s + k }
def two(float(M,N) A) -> (S, T) {
  S(m) +=! A(m,n)
  T(m,n) = A(m,n) * 2
}
def gather(float(E) T, int32(B) I) -> (O) { O(b) = T(I(b)) }
def acc(float(N) A) -> (C) { C(i) += A(i) }
"""


def _has_python_headers() -> bool:
    import sysconfig
    return Path(sysconfig.get_paths()["include"], "Python.h").is_file()


pytestmark = pytest.mark.skipif(not _has_python_headers(),
                                reason="no Python.h: the native call path cannot be built here")


@pytest.fixture(scope="module")
def modules(tmp_path_factory: pytest.TempPathFactory) -> tuple[pt.Module, pt.Module]:
    """The same functions with the native call path and with the Python path alone."""
    config = Config(cache_dir=tmp_path_factory.mktemp("cache"))
    assert dispatch.new_dispatcher(config, wait=True) is not None      # built now
    native = pt.define(SOURCE, config=config)
    python = pt.define(SOURCE, config=replace(config, native_dispatch=False))
    return native, python


def _python_path_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every call that reaches the Python path fail the test."""
    def refuse(*_: Any, **__: Any) -> Any:
        raise AssertionError("the call took the Python path")
    monkeypatch.setattr(CompiledFunction, "run_fast", refuse)
    monkeypatch.setattr(TCFunction, "_checked_call", refuse)


def _rng() -> np.random.Generator:
    return np.random.default_rng(7)


def test_cached_calls_run_in_c(modules: tuple[pt.Module, pt.Module],
                               monkeypatch: pytest.MonkeyPatch) -> None:
    native, _ = modules
    rng = _rng()
    a, b = rng.standard_normal(37).astype(np.float32), rng.standard_normal(37).astype(np.float32)
    x = rng.standard_normal((5, 7)).astype(np.float32)
    native.add(a, b), native.scaled(1.5, 3, x), native.two(x)          # compile
    _python_path_only(monkeypatch)
    np.testing.assert_array_equal(native.add(a, b), a + b)
    out = np.full(37, np.nan, np.float32)
    assert native.add(a, b, out=out) is out
    np.testing.assert_array_equal(out, a + b)
    np.testing.assert_allclose(native.scaled(-0.25, 3, x), x * -0.25 + 3, rtol=1e-6)
    np.testing.assert_allclose(native.scaled(2, 3, x), x * 2 + 3, rtol=1e-6)  # int for float
    np.testing.assert_allclose(native.scaled(True, 3, x), x + 3, rtol=1e-6)
    s, t = native.two(x)
    np.testing.assert_allclose(s, x.sum(1), rtol=1e-5)
    np.testing.assert_array_equal(t, x * 2)
    outs = (np.empty(5, np.float32), np.empty((5, 7), np.float32))
    assert all(r is o for r, o in zip(native.two(x, out=outs), outs, strict=True))
    np.testing.assert_allclose(outs[0], x.sum(1), rtol=1e-5)


def test_integer_scalars_and_shapes_choose_the_kernel(modules: tuple[pt.Module, pt.Module]
                                                      ) -> None:
    native, _ = modules
    rng = _rng()
    fn = native.scaled
    for k, shape in [(1, (3, 4)), (2, (3, 4)), (1, (6, 2)), (-7, (1, 1))]:
        x = rng.standard_normal(shape).astype(np.float32)
        for _ in range(2):                                 # compiled, then dispatched
            np.testing.assert_allclose(fn(0.5, k, x), x * 0.5 + k, rtol=1e-6)
    assert len(fn._dispatch) == len(fn._kernels) >= 4


def _outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    try:
        result = call()
    except pt.PolytileError as e:
        return type(e).__name__, str(e)
    return "ok", result


ARGUMENTS: dict[str, Callable[[np.ndarray, np.ndarray], tuple[tuple[Any, ...], Any]]] = {
    "strided input": lambda a, b: ((a[::2], b[::2]), None),
    "float64 input": lambda a, b: ((a.astype(np.float64), b), None),
    "byte-swapped input": lambda a, b: ((a.astype(">f4"), b), None),
    "list input": lambda a, b: ((list(a), b), None),
    "subclass input": lambda a, b: ((a.view(_Sub), b), None),
    "unaligned input": lambda a, b: ((_unaligned(a), b), None),
    "wrong length": lambda a, b: ((a, b[:-1]), None),
    "out overlaps input": lambda a, b: ((a.copy(), b), "first"),
    "strided out": lambda a, b: ((a, b), np.empty(2 * len(a), np.float32)[::2]),
    "read-only out": lambda a, b: ((a, b), _read_only(len(a))),
    "float64 out": lambda a, b: ((a, b), np.empty(len(a), np.float64)),
    "out of another shape": lambda a, b: ((a, b), np.empty(len(a) + 1, np.float32)),
    "out tuple for one output": lambda a, b: ((a, b), (np.empty(len(a), np.float32),)),
    "too many arguments": lambda a, b: ((a, b, a), None),
}


class _Sub(np.ndarray):
    pass


def _unaligned(a: np.ndarray) -> np.ndarray:
    raw = np.zeros(a.nbytes + 1, np.uint8)
    view = raw[1:].view(np.float32)
    view[...] = a
    return view


def _read_only(n: int) -> np.ndarray:
    out = np.zeros(n, np.float32)
    out.flags.writeable = False
    return out


@pytest.mark.parametrize("case", list(ARGUMENTS))
def test_calls_it_does_not_take_give_the_python_paths_answer(
        case: str, modules: tuple[pt.Module, pt.Module]) -> None:
    native, python = modules
    rng = _rng()
    a, b = rng.standard_normal(40).astype(np.float32), rng.standard_normal(40).astype(np.float32)
    results = []
    for module in (native, python):
        module.add(a, b), module.add(a[::2].copy(), b[::2].copy())     # both kernels cached
        args, out = ARGUMENTS[case](a, b)
        if isinstance(out, str):
            out = args[0]
        results.append(_outcome(partial(module.add, *args, out=out)))
    (kind, value), (want_kind, want) = results
    assert kind == want_kind, case
    if kind == "ok":
        np.testing.assert_array_equal(np.asarray(value), np.asarray(want))
    else:
        assert value == want


def test_a_kernel_failure_raises_the_same_error(modules: tuple[pt.Module, pt.Module]) -> None:
    native, python = modules
    table = np.arange(4, dtype=np.float32)
    for module in (native, python):
        np.testing.assert_array_equal(module.gather(table, np.array([3, 1], np.int32)), [3, 1])
    bad = np.array([0, 9], np.int32)
    errors = [_outcome(partial(m.gather, table, bad)) for m in (native, python)]
    assert errors[0] == errors[1] and errors[0][0] == "OutOfBoundsError"
    assert "T is indexed at 9 in dimension 0" in errors[0][1]


def test_in_out_outputs_stay_on_the_python_path(modules: tuple[pt.Module, pt.Module]) -> None:
    native, _ = modules
    a = np.arange(5, dtype=np.float32)
    c = np.ones(5, np.float32)
    native.acc(a, out=c)
    native.acc(a, out=c)
    np.testing.assert_array_equal(c, 1 + 2 * a)
    assert native.acc._dispatch is not None and len(native.acc._dispatch) == 0


def test_pooled_outputs_are_not_handed_out_while_held(modules: tuple[pt.Module, pt.Module]
                                                      ) -> None:
    native, _ = modules
    rng = _rng()
    a, b = (rng.standard_normal(1 << 16).astype(np.float32) for _ in range(2))
    native.add(a, b)
    first = native.add(a, b)                               # 256 KiB: from the output pool
    second = native.add(b, b)
    np.testing.assert_array_equal(first, a + b)
    np.testing.assert_array_equal(second, b + b)
    assert first.ctypes.data % 64 == 0


def test_no_references_leak(modules: tuple[pt.Module, pt.Module]) -> None:
    native, _ = modules
    a, b = np.ones(8, np.float32), np.ones(8, np.float32)
    table, bad = np.ones(4, np.float32), np.array([5], np.int32)
    native.add(a, b), native.gather(table, np.array([0], np.int32))
    out = np.empty(8, np.float32)
    before = [sys.getrefcount(x) for x in (a, b, out, table, bad)]
    for _ in range(200):
        native.add(a, b)
        native.add(a, b, out=out)
        native.add(a, b, out=a)                                # taken by the Python path
        with pytest.raises(pt.OutOfBoundsError):
            native.gather(table, bad)
    assert [sys.getrefcount(x) for x in (a, b, out, table, bad)] == before


def test_calls_from_two_threads(modules: tuple[pt.Module, pt.Module]) -> None:
    native, _ = modules
    rng = _rng()
    data = [rng.standard_normal((2, 33)).astype(np.float32) for _ in range(2)]
    native.add(data[0][0], data[0][1])
    failures: list[str] = []

    def work(pair: np.ndarray) -> None:
        for _ in range(300):
            if not np.array_equal(native.add(pair[0], pair[1]), pair[0] + pair[1]):
                failures.append("wrong sum")

    threads = [threading.Thread(target=work, args=(d,)) for d in data]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def test_off_by_configuration_and_where_it_cannot_be_built(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    a = np.arange(3, dtype=np.float32)
    assert not load_config({"POLYTILE_NO_NATIVE_DISPATCH": "1"}).native_dispatch
    assert load_config({}).native_dispatch
    off = pt.define(SOURCE, config=Config(cache_dir=tmp_path / "a", native_dispatch=False)).add
    np.testing.assert_array_equal(off(a, a), 2 * a)
    assert off._dispatch is None
    monkeypatch.setattr(dispatch, "_LOADED", {})
    monkeypatch.setattr(dispatch.sysconfig, "get_paths", lambda: {"include": str(tmp_path)})
    headless = pt.define(SOURCE, config=Config(cache_dir=tmp_path / "b")).add
    np.testing.assert_array_equal(headless(a, a), 2 * a)
    np.testing.assert_array_equal(headless(a, a), 2 * a)
    assert headless._dispatch is None


def test_built_in_the_background_and_taken_up_once_built(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """A cache without the extension builds it beside the calls, which take the Python
    path until it is there (no call waits for the compiler)."""
    monkeypatch.setattr(dispatch, "_LOADED", {})
    monkeypatch.setattr(dispatch, "_BUILDS", {})
    fn = pt.define(SOURCE, config=Config(cache_dir=tmp_path)).add
    a = np.arange(5, dtype=np.float32)
    np.testing.assert_array_equal(fn(a, a), 2 * a)       # the kernel compiles
    assert fn._dispatch is None
    for build in list(dispatch._BUILDS.values()):
        build.join()
    np.testing.assert_array_equal(fn(a, a), 2 * a)       # takes the built call path up
    assert fn._dispatch is not None and len(fn._dispatch) == 1
    assert list((tmp_path / dispatch.DISPATCH_DIR).glob("*.so"))


def test_cache_clear_removes_the_built_extension(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from polytile.runtime.cache import clear_cache
    config = Config(cache_dir=tmp_path)
    monkeypatch.setattr(dispatch, "_LOADED", {})
    assert dispatch.new_dispatcher(config, wait=True) is not None
    assert list((tmp_path / dispatch.DISPATCH_DIR).glob("*.so"))
    clear_cache(config)
    assert not (tmp_path / dispatch.DISPATCH_DIR).exists()


layouts = st.sampled_from(["contiguous", "strided", "float64", "fortran"])


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.integers(1, 9), cols=st.integers(1, 9), layout=layouts,
       s=st.floats(-1e3, 1e3, width=32), k=st.integers(-3, 3), use_out=st.booleans())
def test_native_and_python_paths_agree(rows: int, cols: int, layout: str, s: float, k: int,
                                       use_out: bool, modules: tuple[pt.Module, pt.Module]
                                       ) -> None:
    native, python = modules
    x = np.random.default_rng(rows * 10 + cols).standard_normal((rows, 2 * cols))
    x = {"contiguous": x[:, :cols].astype(np.float32).copy(),
         "strided": x.astype(np.float32)[:, ::2], "float64": x[:, :cols].copy(),
         "fortran": np.asfortranarray(x[:, :cols].astype(np.float32))}[layout]
    results = []
    for module in (native, python):
        module.scaled(s, k, np.zeros((rows, cols), np.float32))      # cached
        out = np.empty((rows, cols), np.float32) if use_out else None
        results.append(_outcome(partial(module.scaled, s, k, x, out=out)))
    assert results[0][0] == results[1][0]
    if results[0][0] == "ok":
        np.testing.assert_array_equal(results[0][1], results[1][1])


def test_a_forked_child_builds_or_calls_without_the_parents_lock(tmp_path: Path) -> None:
    """A child forked while another thread held the build lock (the tuner forks) finds a
    lock of its own and no build in flight, and its calls run."""
    import os
    import signal
    import time
    a = np.arange(4, dtype=np.float32)
    with dispatch._LOCK:
        pid = os.fork()
        if pid == 0:                                      # the child
            code = 1
            try:
                fn = pt.define(SOURCE, config=Config(cache_dir=tmp_path)).add
                code = 0 if np.array_equal(fn(a, a), 2 * a) \
                    and np.array_equal(fn(a, a), 2 * a) else 1
            finally:
                os._exit(code)
    deadline = time.monotonic() + 120
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung (the parent's lock?)")
    assert os.waitstatus_to_exitcode(done[1]) == 0
