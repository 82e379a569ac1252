"""Every differentiable program of the conformance corpus: its derived gradient (in
float64, through the reference interpreter) matches finite differences, and the same
gradient compiled to C (in the corpus's own float32) matches the interpreter."""
from __future__ import annotations

import re

import numpy as np
import pytest
from conformance.programs import CASES, Case

import polytile as pt
from polytile.autodiff import backward

from .numeric import as_tuple, check, gradient_function


def _differentiable(case: Case) -> bool:
    fn = pt.define(case.source, backend="interp")[case.function].fn
    try:
        backward(fn)
    except pt.UnsupportedError:
        return False
    args = case.make_inputs(np.random.default_rng(0))
    return all(not isinstance(a, np.ndarray) or a.dtype.kind in "biu"
               or a.dtype in (np.float32, np.float64) for a in args)


DIFFERENTIABLE = [c for c in CASES if _differentiable(c)]
# Finite differences need a smooth neighbourhood: not NaN inputs, not inputs placed on
# the jumps of rounding functions by design.
ON_PURPOSE_NON_SMOOTH = {"round half away from zero, floor, ceil, trunc"}


def _smooth(case: Case) -> bool:
    args = case.make_inputs(np.random.default_rng(7))
    return case.name not in ON_PURPOSE_NON_SMOOTH and all(
        np.isfinite(a).all() for a in args if isinstance(a, np.ndarray) and a.dtype.kind == "f")


def test_most_of_the_corpus_is_differentiable() -> None:
    # Left out: integer-only and boolean programs, in/out outputs (sgemm), float16/bfloat16.
    assert len(DIFFERENTIABLE) >= 75


def _double(source: str) -> str:
    return re.sub(r"\bfloat(32)?\b", "double", source)


@pytest.mark.parametrize("case", [c for c in DIFFERENTIABLE if _smooth(c)], ids=lambda c: c.name)
def test_gradient_matches_finite_differences(case: Case) -> None:
    rng = np.random.default_rng(7)
    args = tuple(a.astype(np.float64) if isinstance(a, np.ndarray) and a.dtype.kind == "f"
                 else a for a in case.make_inputs(rng))
    fn = pt.define(_double(case.source), backend="interp")[case.function]
    check(fn, args, rng)


@pytest.mark.parametrize("case", DIFFERENTIABLE, ids=lambda c: c.name)
def test_compiled_gradient_matches_the_interpreter(case: Case) -> None:
    rng = np.random.default_rng(3)
    args = case.make_inputs(rng)
    compiled = pt.define(case.source)[case.function]
    outputs = [o for o in as_tuple(compiled(*args)) if o.dtype.kind == "f"]
    seeds = [rng.standard_normal(np.shape(o)).astype(o.dtype) for o in outputs]
    want = as_tuple(gradient_function(pt.grad(pt.define(case.source, backend="interp")[
        case.function]))(*args, *seeds))
    got = as_tuple(gradient_function(pt.grad(compiled))(*args, *seeds))
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        scale = max(float(np.abs(w).max(initial=0)), 1.0)
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * scale)
