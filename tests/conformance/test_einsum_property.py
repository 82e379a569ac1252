"""Property: a random contraction written as one TC `+=!` statement computes what
np.einsum computes. Inputs have random ranks 0-3 over random index letters (repeats
allowed: `A(i,i)` is a diagonal), the output keeps a random subset of them in a random
order, every size is drawn from 1..6."""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import polytile as pt

from .test_conformance import BACKENDS

LETTERS = "ijklm"


@st.composite
def contractions(draw: st.DrawFn) -> tuple[list[str], str, dict[str, int], str]:
    n_inputs = draw(st.integers(1, 3))
    inputs = [draw(st.lists(st.sampled_from(LETTERS), min_size=0, max_size=3).map("".join))
              for _ in range(n_inputs)]
    used = sorted(set("".join(inputs)))
    output = "".join(draw(st.permutations(used))[:draw(st.integers(0, min(3, len(used))))])
    sizes = {c: draw(st.integers(1, 6)) for c in used}
    dtype = draw(st.sampled_from(["float", "double"]))
    return inputs, output, sizes, dtype


def tc_source(inputs: list[str], output: str, dtype: str) -> str:
    args = ", ".join(f"{dtype}({', '.join('N' + c for c in sub)}) T{k}"
                     for k, sub in enumerate(inputs))
    factors = " * ".join(f"T{k}({', '.join(sub)})" for k, sub in enumerate(inputs))
    return f"def contract({args}) -> (O) {{\n  O({', '.join(output)}) +=! {factors}\n}}\n"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(contractions(), st.integers(0, 2**32 - 1))
def test_random_contraction_matches_einsum(spec, seed):
    for backend in BACKENDS:
        check_contraction(spec, seed, lambda source: pt.define(source, backend=backend))


def check_contraction(spec, seed, define):
    """The contraction `spec` compiled by `define(source)` agrees with np.einsum."""
    inputs, output, sizes, dtype = spec
    source = tc_source(inputs, output, dtype)
    np_dtype = np.float32 if dtype == "float" else np.float64
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(tuple(sizes[c] for c in sub)).astype(np_dtype)
              for sub in inputs]
    want = np.einsum(",".join(inputs) + "->" + output,
                     *[a.astype(np.float64) for a in arrays]).astype(np_dtype)
    # Floating-point sums carry an error proportional to the sum of |terms|, not to the
    # (possibly cancelled) result: measure against that.
    magnitude = np.einsum(",".join(inputs) + "->" + output,
                          *[np.abs(a.astype(np.float64)) for a in arrays])
    tolerance = 1e-5 if dtype == "float" else 1e-12
    got = define(source).contract(*arrays)
    assert got.dtype == want.dtype and got.shape == want.shape, source
    error = np.linalg.norm(np.asarray(got, np.float64) - np.asarray(want, np.float64))
    assert error <= tolerance * max(np.linalg.norm(magnitude), 1e-30), source
