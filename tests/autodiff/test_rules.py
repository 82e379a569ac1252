"""The derivative of every builtin, against finite differences in float64, on
random points of its domain (hypothesis draws the points and the seed)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import polytile as pt
from polytile.autodiff.rules import RULES
from polytile.ir import intrinsics

from .numeric import check

# Where each function is smooth: (low, high) of the inputs drawn.
DOMAIN = {"log": (0.1, 3), "log2": (0.1, 3), "log10": (0.1, 3), "log1p": (-0.5, 3),
          "sqrt": (0.1, 3), "rsqrt": (0.1, 3), "cbrt": (0.1, 3), "asin": (-0.9, 0.9),
          "acos": (-0.9, 0.9), "atanh": (-0.9, 0.9), "acosh": (1.1, 3), "tan": (-1.2, 1.2),
          "pow": (0.2, 2), "fmod": (0.5, 3), "mod": (0.5, 3)}
UNARY = sorted(n for n, info in intrinsics.OPS.items()
               if info.arity == 1 and n in RULES and n not in ("neg", "ident"))
BINARY = sorted(n for n, info in intrinsics.OPS.items()
                if info.arity == 2 and n in RULES and n not in intrinsics.BINARY_SYMBOLS.values())


def test_every_floating_builtin_has_a_rule() -> None:
    floating = {n for n, info in intrinsics.OPS.items() if info.result != intrinsics.BOOL}
    assert floating - set(RULES) == {"cast"}     # casts are differentiated in adjoints()


def _source(op: str, arity: int) -> str:
    args = ", ".join(f"X{k}(i)" for k in range(arity))
    params = ", ".join(f"double(N) X{k}" for k in range(arity))
    return f"def f({params}) -> (Y) {{\n  Y(i) = {op}({args})\n}}\n"


@pytest.mark.parametrize("op", UNARY + BINARY + ["fma"])
@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_builtin_gradient(op: str, seed: int) -> None:
    arity = intrinsics.OPS[op].arity
    rng = np.random.default_rng(seed)
    lo, hi = DOMAIN.get(op, (-2, 2))
    args = tuple(rng.uniform(lo, hi, 7) for _ in range(arity))
    if op in ("floor", "ceil", "round", "trunc"):
        args = tuple(a + 0.25 - (a % 0.5) for a in args)   # away from the jumps
    check(pt.define(_source(op, arity), backend="interp").f, args, rng)


def test_operators_and_select() -> None:
    source = """
def f(double(N) A, double(N) B) -> (Y) {
  Y(i) = A(i) > B(i) ? A(i) * B(i) - A(i) / B(i) : -(A(i) + B(i)) % 1.5
}"""
    rng = np.random.default_rng(4)
    args = (rng.uniform(0.5, 2, 9), rng.uniform(0.5, 2, 9))
    check(pt.define(source, backend="interp").f, args, rng)
