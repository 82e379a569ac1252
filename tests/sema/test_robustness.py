"""Property: whatever the program and the inputs, polytile answers with a result or a
PolytileError, never with another exception (the interpreter process keeps running).

Random statements mix every operator, casts, builtins, gathers, reductions and dtypes;
most are rejected by the checks, the rest run on random data of several shapes."""
from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import polytile as pt
from polytile.lang import ast
from polytile.lang.printer import format_expr
from polytile.sema.specialize import specialize

INDEX = st.sampled_from(["i", "j", "k"]).map(ast.Name)
NUMBERS = st.sampled_from([("0", 0), ("1", 1), ("2", 2), ("300", 300), ("0.5", 0.5),
                           ("1e3", 1e3)]).map(lambda tv: ast.Number(*tv))
LEAVES = st.one_of(
    INDEX, NUMBERS, st.sampled_from(["N", "M", "s", "f"]).map(ast.Name),
    st.builds(lambda a, b: ast.Call("A", (a, b)), INDEX, INDEX),
    st.builds(lambda a, b: ast.Call("I", (a, b)), INDEX, INDEX),
    st.builds(lambda a: ast.Call("X", (a,)), INDEX),
)


def _extend(children: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(
        st.builds(ast.Unary, st.sampled_from(["-", "!"]), children),
        st.builds(ast.Binary, st.sampled_from(["+", "-", "*", "/", "%", "<", "==", "&&", "||"]),
                  children, children),
        st.builds(ast.Ternary, children, children, children),
        st.builds(lambda n, a: ast.Call(n, (a,)),
                  st.sampled_from(["exp", "abs", "int32", "float", "int8", "bool", "sqrt",
                                   "round", "relu", "half", "uint8", "bfloat16"]), children),
        st.builds(lambda n, a, b: ast.Call(n, (a, b)),
                  st.sampled_from(["fmax", "min", "pow", "fmod"]), children, children),
        st.builds(lambda a: ast.Call("X", (a,)), children),
        st.builds(lambda a, b: ast.Call("A", (a, b)), children, children),
    )


EXPRS = st.recursive(LEAVES, _extend, max_leaves=10)
DTYPES = {"float": np.float32, "int": np.int32, "int8": np.int8, "half": np.float16,
          "uint8": np.uint8, "double": np.float64, "bool": np.bool_,
          "bfloat16": ml_dtypes.bfloat16}


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(rhs=EXPRS, op=st.sampled_from(["=", "+=!", "max=!", "min=!", "*=!", "+="]),
       lhs=st.lists(st.sampled_from(["i", "j", "k"]), unique=True, max_size=2),
       data_type=st.sampled_from(sorted(DTYPES)), index_type=st.sampled_from(sorted(DTYPES)),
       where=st.booleans(), seed=st.integers(0, 2**16))
def test_random_programs_never_crash(rhs, op, lhs, data_type, index_type, where, seed):
    clause = " where i in 0:N, j in 0:M, k in 0:3" if where else ""
    source = (f"def f(int s, float f, {data_type}(N,M) A, {index_type}(N,M) I,"
              f" {data_type}(N) X) -> (B) {{\n"
              f"  B({', '.join(lhs)}) {op} {format_expr(rhs)}{clause}\n}}\n")
    try:
        mod = pt.define(source, backend="interp")
    except pt.PolytileError:
        return
    rng = np.random.default_rng(seed)

    def array(name: str, *shape: int) -> np.ndarray:
        return (3 * rng.standard_normal(shape)).astype(DTYPES[name])

    out_type = mod.f.fn.outputs[0].dtype.numpy
    for n, m in [(3, 4), (1, 1), (5, 2)]:
        args = (2, 1.5, array(data_type, n, m), array(index_type, n, m), array(data_type, n))
        out = None
        if mod.f.fn.inout:   # B is read before it is written: give it a starting value
            try:
                shape = specialize(mod.f.fn, {"A": (n, m), "I": (n, m), "X": (n,)},
                                   {"s": 2}).shape("B")
            except pt.PolytileError:
                continue
            out = np.ones(shape, out_type)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                result = mod.f(*args, out=out)
        except pt.PolytileError:
            continue
        assert isinstance(result, np.ndarray), source
        assert result.dtype == out_type, source
