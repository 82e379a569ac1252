"""Every program of the corpus (programs.py) on every backend agrees with its independent
NumPy implementation: float32 to a relative error below 1e-5 in norm, integers and
bools exactly, NaNs in the same places."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import polytile as pt

from .programs import CASES, EXACT, Case

BACKENDS = ["interp", "c"]
SEEDS = [0, 1, 2]

_MODULES: dict[tuple[str, str], pt.Module] = {}


# Backends of other test modules, which are the c launcher on another target:
# test_opencl.py, test_arm64.py.
TARGETS = {"opencl": "opencl", "arm64": "cpu-arm64-dot"}


def module(source: str, backend: str) -> pt.Module:
    key = (source, backend)
    if key not in _MODULES:
        _MODULES[key] = (pt.define(source, target=TARGETS[backend]) if backend in TARGETS
                         else pt.define(source, backend=backend))
    return _MODULES[key]


def as_tuple(x: Any) -> tuple:
    return x if isinstance(x, tuple) else (x,)


def assert_agrees(got: Any, want: Any, tolerance: float, what: str) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    if want.dtype.kind in "biu" or tolerance == EXACT:
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    g, w = got.astype(np.float64), want.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=f"{what}: NaN positions")
    finite = ~np.isnan(w)
    g, w = g[finite], w[finite]
    error = np.linalg.norm(g - w)
    scale = np.linalg.norm(w)
    assert error <= tolerance * scale or (scale == 0 and error == 0), (
        f"{what}: relative error {error / scale if scale else error:.3g} > {tolerance:g}\n"
        f"got  {g}\nwant {w}")


def run_case(case: Case, backend: str, seed: int, layout: str = "c") -> None:
    rng = np.random.default_rng(seed)
    args = case.make_inputs(rng)
    initial = case.make_out(rng, args) if case.make_out else {}
    want = as_tuple(case.numpy_reference(*args, **{k: v.copy() for k, v in initial.items()}))
    call_args = tuple(relayout(a, layout) for a in args)
    fn = module(case.source, backend)[case.function]
    got = as_tuple(fn(*call_args, out={k: v.copy() for k, v in initial.items()} or None))
    assert len(got) == len(want), f"{len(got)} outputs, expected {len(want)}"
    names = [o.name for o in fn.fn.outputs]
    for name, g, w in zip(names, got, want):
        assert_agrees(g, w, case.tolerance, f"{case.name}: output {name} (seed {seed})")
    # The arguments are never modified.
    again = case.make_inputs(np.random.default_rng(seed))
    for a, b in zip(call_args, again):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def relayout(a: Any, layout: str) -> Any:
    """The same values with other strides: Fortran order, or a view of a bigger array."""
    if not isinstance(a, np.ndarray) or a.ndim == 0 or layout == "c":
        return a
    if layout == "f":
        return np.asfortranarray(a)
    big = np.zeros(tuple(2 * s + 1 for s in a.shape), dtype=a.dtype)
    view = big[tuple(slice(1, 2 * s + 1, 2) for s in a.shape)]
    view[...] = a
    return view


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_conformance(case: Case, backend: str, seed: int) -> None:
    run_case(case, backend, seed)


@pytest.mark.parametrize("layout", ["f", "strided"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_conformance_with_other_strides(case: Case, backend: str, layout: str) -> None:
    run_case(case, backend, 3, layout)


def test_corpus_size_and_coverage() -> None:
    assert len(CASES) >= 60
    sources = "\n".join(c.source for c in CASES)
    for construct in ("+=!", "*=!", "max=!", "min=!", " max= ", " min= ", " += ", "where",
                      "exists", "?", "&&", "||", ".0", "int8", "int16", "int64", "long",
                      "uint8", "byte", "half", "float16", "bfloat16", "double", "bool"):
        assert construct in sources, construct
    assert len({c.source for c in CASES}) >= 60


def test_sizes_include_one_and_primes() -> None:
    seen: set[int] = set()
    for case in CASES:
        for seed in SEEDS:
            for a in case.make_inputs(np.random.default_rng(seed)):
                if isinstance(a, np.ndarray):
                    seen.update(a.shape)
    assert {1, 2, 3, 5, 7, 11, 13} <= seen


@pytest.mark.parametrize("every", [2, pytest.param(1, marks=pytest.mark.slow, id="all")])
def test_outputs_allocated_without_clearing_are_written_in_full(monkeypatch, every) -> None:
    """The fast path allocates outputs with np.empty where the kernel writes every element
    before reading it (analysis/overwrite.py); fill those with garbage and every program
    (every other one in the ordinary run) must still agree, and some must have taken
    that path."""
    import polytile.compile as compile_module
    from polytile.runtime.pool import OutputPool

    poisoned: list[tuple[int, ...]] = []

    def garbage(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        poisoned.append(shape)
        out = np.empty(shape, dtype)
        out.reshape(-1).view(np.uint8)[...] = 0xA5     # far from any answer
        if out.dtype.kind == "f":
            out[...] = np.nan
        return out

    monkeypatch.setattr(compile_module, "_uncleared", garbage)
    monkeypatch.setattr(OutputPool, "empty", lambda self, shape, dtype: garbage(shape, dtype))
    _MODULES.clear()
    try:
        for case in CASES[::every]:
            run_case(case, "c", 4)      # compiles, on the checked path
            run_case(case, "c", 4)      # the same shapes again: the fast path
    finally:
        _MODULES.clear()
    assert len(poisoned) >= len(CASES[::every]) // 2
