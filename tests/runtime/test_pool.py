"""The output pool: a block is handed out again only when no array can reach it."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import polytile as pt
from polytile.config import Config, load_config
from polytile.errors import PolytileError
from polytile.runtime.pool import OutputPool, output_pool

MB = 1 << 20
SHAPE = (512, 1024)          # 2 MiB of float32


def address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def test_a_block_is_reused_once_its_output_is_gone() -> None:
    pool = OutputPool(16 * MB)
    a = pool.empty(SHAPE, np.float32)
    first = address(a)
    b = pool.empty(SHAPE, np.float32)
    assert address(b) != first
    del a
    c = pool.empty(SHAPE, np.float32)
    assert address(c) == first and c.shape == SHAPE and c.flags.c_contiguous
    assert pool.held_bytes == 2 * SHAPE[0] * SHAPE[1] * 4


@pytest.mark.parametrize("keep", ["view", "memoryview", "transpose", "torch"])
def test_anything_that_reaches_the_block_keeps_it(keep: str) -> None:
    pool = OutputPool(16 * MB)
    a = pool.empty(SHAPE, np.float32)
    first = address(a)
    if keep == "torch":
        torch = pytest.importorskip("torch")
        holder = torch.from_numpy(a)
    else:
        holder = {"view": lambda x: x[::3, 1:], "memoryview": memoryview,
                  "transpose": lambda x: x.T}[keep](a)
    del a
    b = pool.empty(SHAPE, np.float32)
    assert address(b) != first
    del holder
    assert address(pool.empty(SHAPE, np.float32)) == first


def test_small_arrays_and_arrays_beyond_the_capacity_are_not_pooled() -> None:
    pool = OutputPool(3 * MB)
    pool.empty((16,), np.float32)
    assert pool.held_bytes == 0
    a = pool.empty(SHAPE, np.float32)           # 2 MiB: pooled
    pool.empty(SHAPE, np.float32)               # another 2 MiB would pass 3 MiB: np.empty
    assert pool.held_bytes == 2 * MB and a.base is not None
    assert output_pool(0) is None and output_pool(3 * MB) is output_pool(3 * MB)


def test_outputs_from_64_kib_are_pooled() -> None:
    """Below a MiB too: a call that frees a few such outputs has glibc give its heap's
    top back to the system, and the next call faults the pages in again."""
    pool = OutputPool(16 * MB)
    pool.empty((16383,), np.float32)
    assert pool.held_bytes == 0
    a = pool.empty((128, 128), np.float32)
    assert pool.held_bytes == 64 << 10 and address(a) % 64 == 0
    first = address(a)
    del a
    assert address(pool.empty((128, 128), np.float32)) == first


def test_threads_never_share_a_block() -> None:
    """Each thread marks its block and checks the mark after yielding: a block handed to
    two threads at once would show the other's mark."""
    pool = OutputPool(64 * MB)
    clashes: list[int] = []

    def work(k: int) -> None:
        for _ in range(200):
            a = pool.empty(SHAPE, np.float32)
            a[0, :64] = k
            time.sleep(0)
            if not (a[0, :64] == k).all():
                clashes.append(k)
            del a

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert clashes == [] and pool.held_bytes <= 4 * 2 * MB


SCALE = "def scale(float(M,N) X) -> (Y) {\n  Y(m,n) = X(m,n) * 2\n}\n"


def test_compiled_outputs_come_from_the_pool_and_never_alias(tmp_path) -> None:
    fn = pt.define(SCALE, config=Config(cache_dir=tmp_path, output_pool_bytes=64 * MB)).scale
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(3)]
    fn(xs[0])                                   # the checked path; the next calls are fast
    ys = [fn(x) for x in xs]                    # all alive: three blocks
    assert len({address(y) for y in ys}) == 3
    for x, y in zip(xs, ys):
        np.testing.assert_array_equal(y, x * 2)
    reused = address(ys[1])
    del ys[1]
    y = fn(xs[2])
    assert address(y) == reused
    np.testing.assert_array_equal(y, xs[2] * 2)
    np.testing.assert_array_equal(ys[0], xs[0] * 2)   # the others kept their values


def test_the_pool_is_off_with_zero(tmp_path) -> None:
    fn = pt.define(SCALE, config=Config(cache_dir=tmp_path, output_pool_bytes=0)).scale
    x = np.ones(SHAPE, np.float32)
    fn(x)
    assert fn(x).base is None


def test_the_environment_sets_the_capacity() -> None:
    assert load_config({"POLYTILE_OUTPUT_POOL_MB": "8"}).output_pool_bytes == 8 * MB
    assert load_config({}).output_pool_bytes == 256 * MB
    with pytest.raises(PolytileError, match="POLYTILE_OUTPUT_POOL_MB"):
        load_config({"POLYTILE_OUTPUT_POOL_MB": "lots"})


def test_a_forked_child_gets_a_fresh_lock() -> None:
    import os
    pool = output_pool(32 * MB)
    assert pool is not None
    pool._lock.acquire()          # held by this process at the fork, as another thread might
    try:
        pid = os.fork()
        if pid == 0:              # the child: would block forever on the inherited lock
            pool.empty(SHAPE, np.float32)
            os._exit(0)
        deadline = time.monotonic() + 20
        done, status = 0, 0
        while not done and time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            time.sleep(0.01)
        if not done:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        assert done and os.waitstatus_to_exitcode(status) == 0, "the child hung on the lock"
    finally:
        pool._lock.release()


@pytest.mark.parametrize("shape", [SHAPE, (4096, 4096), (37, 1029 * 29)])
def test_pooled_outputs_start_on_a_cache_line(shape: tuple[int, int]) -> None:
    # NumPy aligns large arrays to 16 bytes only; streaming stores want 32 or 64.
    pool = OutputPool(256 * MB)
    a = pool.empty(shape, np.float32)
    assert address(a) % 64 == 0 and a.shape == shape and a.flags.c_contiguous
    a[...] = 1.5
    held = address(a)
    b = pool.empty(shape, np.float32)            # a is alive: another block, aligned too
    assert address(b) % 64 == 0 and address(b) != held
    del a
    c = pool.empty(shape, np.float32)            # a's block again, at the same place
    assert address(c) == held
