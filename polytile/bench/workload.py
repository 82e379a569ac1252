"""One benchmark workload as data: TC source, inputs, NumPy and PyTorch versions, work.

Each workload's TC is written from the TC paper (tmm, tbmm, gconv, MLP1, MLP3, 2LUT)
or in the same style (softmax, layernorm, batchnorm, group norm, bias+GELU+residual).
The NumPy version is what a NumPy user would write (BLAS for contractions, ufuncs with
`out=` for the preallocated variant) and is the oracle for correctness. The PyTorch
versions are eager calls of the framework's own operators; they import torch only when
called, so this module works without torch. A workload may also have a JAX version
(`jax`, written with jax.numpy, for jax.jit), imported as lazily.

`flops` counts a multiply-add as 2; `bytes` is the compulsory traffic (every input read
once, every output written once) used for GB/s of memory-bound workloads.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

EPS = 1e-5   # of every normalization, as in PyTorch's defaults

Arrays = tuple[np.ndarray, ...]


@dataclass(frozen=True)
class Workload:
    key: str                                   # family, matched by --only: "tmm", "softmax", ...
    sizes: tuple[tuple[str, int], ...]         # ("M", 128), ("K", 32), ...
    tc: str
    function: str                              # the TC def to call
    make_inputs: Callable[[np.random.Generator], Arrays]
    numpy: Callable[..., Any]
    numpy_out: Callable[..., Any] | None = None    # f(*args, out=tuple_of_arrays)
    torch: Callable[..., Any] | None = None        # f(*tensors) -> tensor(s)
    torch_out: Callable[..., Any] | None = None    # f(*tensors, out=tuple_of_tensors)
    jax: Callable[..., Any] | None = None          # f(*jax_arrays) -> array(s), jit-able
    flops: float = 0.0
    bytes: float = 0.0
    memory_bound: bool = False
    rtol: float = 1e-4
    atol: float = 1e-5
    note: str = ""
    # Run through pt.einsum(einsum, *inputs) rather than the TC function (which is then
    # the TC the spec lowers to); the last inputs are the tables named here.
    einsum: str = ""
    tables: tuple[str, ...] = ()

    def tc_arguments(self, inputs: Arrays) -> tuple[Any, ...]:
        """The TC function's arguments for these inputs: those of an einsum with tables
        end with the sizes pt.einsum computes from the tables' values per call."""
        if not self.tables:
            return inputs
        from polytile.einsum.lower import extent_value, lower
        from polytile.einsum.spec import parse_spec

        n = len(inputs) - len(self.tables)
        tables = dict(zip(self.tables, inputs[n:]))
        lowered = lower(parse_spec(self.einsum), [str(a.dtype) for a in inputs[:n]],
                        {t: str(a.dtype) for t, a in tables.items()})
        shapes = [a.shape for a in inputs[:n]]
        return (*inputs, *(extent_value(e, shapes, tables) for e in lowered.extents))

    @property
    def name(self) -> str:
        return f"{self.key} " + "x".join(str(v) for _, v in self.sizes)

    @property
    def size_text(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.sizes)

    def matches(self, patterns: Iterable[str]) -> bool:
        return any(p.lower() in (self.key.lower(), self.name.lower()) for p in patterns)


def uniform(rng: np.random.Generator, *shape: int) -> np.ndarray:
    """float32 uniform in [-1, 1)."""
    return (rng.random(shape, dtype=np.float32) * 2 - 1).astype(np.float32, copy=False)


def normal(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32)


def torch_module() -> Any:
    """torch, imported on first use: only the PyTorch versions need it."""
    import torch
    return torch


def jax_module() -> Any:
    """jax.numpy, imported on first use: only the JAX versions need it (the optional
    `jax` extra). Their callers place the inputs on the CPU (polytile.bench.fusion)."""
    import jax.numpy
    return jax.numpy
