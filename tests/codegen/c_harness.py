"""Helpers for the C code generator tests: build IR by hand, compile, call with NumPy.

Kept independent of polytile.runtime so that codegen is tested on its own: the
generated text is compiled with the system `cc` and loaded with ctypes.
"""
from __future__ import annotations

import ctypes
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from polytile.codegen import COptions, generate_c
from polytile.dtypes import DType
from polytile.ir.nodes import Affine, Block, BlockSchedule, Dim, Function, Refinement, TensorShape

CC = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler on PATH")
FLAGS = ("-O2", "-std=c99", "-fopenmp", "-Wall", "-Wextra", "-Werror")


# ---------------------------------------------------------------- IR builders

def aff(terms: Mapping[str, int] | str | None = None, const: int = 0) -> Affine:
    """aff("i") is the index i; aff({"io": 4, "ii": 1}, -1) is 4*io + ii - 1."""
    if isinstance(terms, str):
        terms = {terms: 1}
    return Affine.of(terms, const)


def contiguous(dtype: DType, sizes: tuple[int, ...]) -> TensorShape:
    strides, step = [], 1
    for size in reversed(sizes):
        strides.append(step)
        step *= max(size, 1)
    return TensorShape(dtype, tuple(Dim(s, t) for s, t in zip(sizes, reversed(strides))))


def param(direction: str, name: str, dtype: DType, sizes: tuple[int, ...],
          strides: tuple[int, ...] | None = None) -> Refinement:
    shape = contiguous(dtype, sizes) if strides is None else TensorShape(
        dtype, tuple(Dim(s, t) for s, t in zip(sizes, strides)))
    return Refinement(direction, "", name, tuple(Affine() for _ in sizes), shape)


def local(name: str, dtype: DType, sizes: tuple[int, ...]) -> Refinement:
    return param("none", name, dtype, sizes)


def view(parent: Refinement, into: str, access: tuple[Affine | str | int, ...],
         direction: str = "in", agg: str = "assign",
         sizes: tuple[int, ...] | None = None) -> Refinement:
    """A view of `parent` at `access` with the parent's strides (unit sizes by default)."""
    offsets = tuple(a if isinstance(a, Affine) else aff(a) if isinstance(a, str)
                    else Affine.constant(a) for a in access)
    dims = parent.shape.dims
    sizes = sizes or tuple(1 for _ in dims)
    return Refinement(direction, parent.into, into, offsets,
                      TensorShape(parent.shape.dtype,
                                  tuple(Dim(s, d.stride) for s, d in zip(sizes, dims))), agg)


# ---------------------------------------------------------------- compile and call

class CKernel:
    """A generated function compiled into a shared object, callable with NumPy arrays."""

    def __init__(self, fn: Function, tmp_path: Path, options: COptions | None = None,
                 flags: tuple[str, ...] = FLAGS):
        self.fn = fn
        self.source = generate_c(fn, options)
        c_file = tmp_path / f"{self.source.symbol}.c"
        so_file = tmp_path / f"{self.source.symbol}_{len(list(tmp_path.iterdir()))}.so"
        c_file.write_text(self.source.text)
        assert CC is not None
        result = subprocess.run([CC, *flags, "-shared", "-fPIC", "-o", str(so_file),
                                 str(c_file), "-lm"], capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stderr + "\n" + _numbered(self.source.text)
        self.lib = ctypes.CDLL(str(so_file))
        self.cfunc = getattr(self.lib, self.source.symbol)
        self.cfunc.restype = ctypes.c_int32
        self.cfunc.argtypes = (ctypes.c_void_p, ctypes.c_void_p)
        self.refs = {r.into: r for r in fn.body.refs}

    def __call__(self, *arrays: np.ndarray) -> tuple[int, tuple[int, ...]]:
        """Run on arrays given in `fn.params` order; returns (status, err)."""
        assert len(arrays) == len(self.fn.params)
        for name, array in zip(self.fn.params, arrays):
            ref = self.refs[name]
            assert array.dtype == ref.shape.dtype.numpy, (name, array.dtype)
            assert array.shape == ref.shape.sizes, (name, array.shape)
            strides = tuple(s // array.itemsize for s in array.strides)
            want = tuple(d.stride for d in ref.shape.dims)
            assert all(st == w for st, w, n in zip(strides, want, array.shape) if n > 1), name
        args = (ctypes.c_void_p * max(1, len(arrays)))(*[a.ctypes.data for a in arrays])
        err = np.full(4, -7, dtype=np.int64)
        status = self.cfunc(args, err.ctypes.data)
        return int(status), tuple(int(x) for x in err)


def _numbered(text: str) -> str:
    return "\n".join(f"{n + 1:4d}  {line}" for n, line in enumerate(text.splitlines()))


def rand(rng: np.random.Generator, dtype: np.dtype | type, shape: tuple[int, ...],
         low: float = 0.5, high: float = 2.0) -> np.ndarray:
    """Random non-zero values of either sign with magnitudes in [low, high)."""
    magnitude = rng.uniform(low, high, size=shape)
    sign = np.where(rng.random(size=shape) < 0.5, -1.0, 1.0)
    return (magnitude * sign).astype(dtype)


def parallel(block: Block, simd: bool = False) -> Block:
    """`block` scheduled to run in threads as the passes do: the loop that runs in
    threads is the one `polytile.passes.schedule.thread_loop` proves disjoint."""
    from polytile.passes.schedule import thread_loop
    return replace(block, schedule=BlockSchedule(parallel=thread_loop(block), simd=simd))
