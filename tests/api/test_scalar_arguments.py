"""Scalar arguments: the cached fast call path gives exactly the checked path's answers
(issue 11, defect 2: after a warm-up call, `fs([], V)` read past a heap buffer)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import polytile as pt
from polytile.config import Config
from polytile.errors import ArgumentError

SOURCE = """
def fs(float a, float(N) A) -> (B) { B(i) = A(i) * a }
def fi(int32 k, float(N) A) -> (B) { B(i) = A(i) * k }
"""
V = np.arange(1, 9, dtype=np.float32)
BAD = [[], None, "0.5", [[0.5, 7]], 1 + 2j, np.complex64(1), np.str_("0.5"), b"1",
       np.array([0.5]), np.array([]), object(), np.datetime64("2020-01-01")]


@pytest.fixture(scope="module")
def module(tmp_path_factory: pytest.TempPathFactory) -> pt.Module:
    return pt.define(SOURCE, config=Config(cache_dir=tmp_path_factory.mktemp("cache")))


def value_id(value: Any) -> str:
    """A test id that is the same in every process (pytest-xdist compares them): a bare
    object's repr holds its address."""
    return "object()" if type(value) is object else repr(value)


def outcome(fn: Any, value: Any) -> Any:
    """What a call returns, or the class of the error it raises."""
    try:
        return ("ok", fn(value, V).tolist())
    except Exception as e:     # noqa: BLE001 - the class is the answer
        return ("error", type(e))


@pytest.mark.parametrize("value", BAD, ids=value_id)
def test_bad_float_scalar_is_refused_before_and_after_warm_up(value: Any,
                                                             tmp_path: Path) -> None:
    fs = pt.define(SOURCE, config=Config(cache_dir=tmp_path)).fs
    with pytest.raises(ArgumentError, match="a must be a float32 scalar"):
        fs(value, V)
    np.testing.assert_array_equal(fs(0.5, V), V * 0.5)     # warm-up: now the fast path
    with pytest.raises(ArgumentError, match="a must be a float32 scalar"):
        fs(value, V)


@pytest.mark.parametrize("value", BAD + [0.5, float("nan"), float("inf"), 2**40, -(2**31) - 1],
                         ids=value_id)
def test_bad_integer_scalar_is_refused_before_and_after_warm_up(value: Any,
                                                               module: pt.Module) -> None:
    fresh = pt.define(SOURCE, config=Config(cache_dir=Path(module.compiler.config.cache_dir)))
    with pytest.raises(ArgumentError, match="k "):
        fresh.fi(value, V)
    module.fi(3, V)
    with pytest.raises(ArgumentError, match="k "):
        module.fi(value, V)


scalars = st.one_of(
    st.integers(-2**40, 2**40), st.integers(2**1000, 2**1001), st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.floats(3e38, 1e308), st.floats(-1e308, -3e38),
    st.booleans(), st.none(), st.text(max_size=3), st.complex_numbers(max_magnitude=4),
    st.lists(st.floats(-4, 4, width=32), max_size=2),
    st.integers(-200, 200).map(np.int16),
    st.floats(-4, 4, width=32).map(np.float32), st.floats(-4, 4).map(np.array))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=scalars)
def test_fast_path_agrees_with_the_checked_path(value: Any, module: pt.Module) -> None:
    for name in ("fs", "fi"):
        warm = getattr(module, name)
        warm(1, V)                                          # cached: the fast path
        cold = getattr(pt.define(SOURCE, backend="interp"), name)
        fast, checked = outcome(warm, value), outcome(cold, value)
        if fast[0] == "ok" and checked[0] == "ok":
            np.testing.assert_allclose(fast[1], checked[1], rtol=1e-6)
        else:
            assert fast == checked, (name, value)


def test_unknown_keyword_is_an_argument_error_listing_the_parameters(module: pt.Module) -> None:
    for fn in (module.fs, pt.define(SOURCE, backend="interp").fs):
        with pytest.raises(ArgumentError, match="unknown keyword argument.*bogus") as info:
            fn(0.5, V, bogus=1)
        assert "(a, A)" in info.value.render() and "out= and tune=" in info.value.render()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float", "double"])
def test_a_finite_scalar_that_would_become_inf_is_refused(dtype: str, tmp_path: Path) -> None:
    """Converting to the parameter's type must not turn a finite value into inf (a silent
    wrong answer): the exact limit is refused before and after a warm-up; the value just
    below it, inf and NaN are taken."""
    import math

    from polytile import dtypes

    fn = pt.define(f"def g({dtype} a, float(N) A) -> (B) {{ B(i) = A(i) * a }}",
                   config=Config(cache_dir=tmp_path)).g
    limit = dtypes.overflow_limit(dtypes.lookup(dtype))
    small = np.full(8, 0.25, np.float32)       # products stay finite in the output type
    for warm in (False, True):
        if warm:
            fn(1.0, small)
        for value in (math.inf, -math.inf):
            assert np.isinf(fn(value, small)).all()
        assert np.isnan(fn(math.nan, small)).all()
        if math.isinf(limit):        # double: every finite float fits
            assert np.isfinite(fn(1e300, small)).all()
            continue
        for value in (limit, -limit, 1e300):
            with pytest.raises(ArgumentError, match="would become inf"):
                fn(value, small)
        assert np.isfinite(fn(float(np.nextafter(limit, 0.0)), small)).all()
