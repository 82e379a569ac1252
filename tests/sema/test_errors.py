"""Malformed programs and bad calls: each raises the right PolytileError subclass, with
the line and column of the culprit, the source line and a caret; and a process that
saw errors keeps computing correct results."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import polytile as pt

PAPER = Path(__file__).resolve().parents[1] / "paper"


def paper_def(file: str, name: str) -> str:
    """The text of one `def` of a paper file, exactly as written."""
    text = (PAPER / file).read_text()
    start = text.index(f"def {name}(")
    end = text.find("\ndef ", start + 1)
    return text[start:] if end < 0 else text[start:end + 1]


def define(src: str) -> pt.Module:
    return pt.define(src, backend="interp", name="bad.tc")


def fn(stmts: str, args: str = "float(N) A", outs: str = "B") -> str:
    """A function whose statements start on line 2."""
    return f"def f({args}) -> ({outs}) {{\n{stmts}\n}}\n"


def assert_located(err: pt.PolytileError, line: int, col: int, source: str) -> None:
    assert err.loc is not None, err
    assert (err.loc.line, err.loc.col) == (line, col), str(err)
    text = str(err)
    assert text.startswith(f"bad.tc:{line}:{col}: "), text
    lines = text.splitlines()
    shown = source.splitlines()[line - 1]
    k = lines.index(f"  {shown}")
    caret = lines[k + 1]
    assert caret.strip() and set(caret.strip()) == {"^"}, text
    assert caret.index("^") == 2 + col - 1, text


# (id, source, error class, line, col, message pattern)
MALFORMED = [
    # ---------------------------------------------------------------- parse errors
    ("unterminated def", "def f(float(N) A) -> (B) {\n  B(i) = A(i)\n",
     pt.ParseError, 2, 14, r"expected '\}' closing the body of f"),
    ("bad token", fn("  B(i) = A(i) $ 2"), pt.ParseError, 2, 15, "unexpected character '\\$'"),
    ("unknown type", "def f(floatx(N) A) -> (B) {\n  B(i) = A(i)\n}\n",
     pt.ParseError, 1, 7, "unknown type 'floatx'"),
    ("missing arrow", "def f(float(N) A) (B) {\n  B(i) = A(i)\n}\n",
     pt.ParseError, 1, 19, "expected '->'"),
    ("missing expression", fn("  B(i) = A(i) +"), pt.ParseError, 3, 1, "expected an expression"),
    ("ternary without colon", fn("  B(i) = A(i) > 0 ? A(i)"), pt.ParseError, 3, 1,
     "expected ':'"),
    ("expression on the left", fn("  B(i + 1) = A(i)"), pt.TypeCheckError, 2, 7,
     "indexed by an expression on the left-hand side"),
    ("missing operator", fn("  B(i) A(i)"), pt.ParseError, 2, 8, "expected '=' or a reduction"),
    ("no function", "# only a comment\n", pt.ParseError, 1, 1, "no TC function"),
    ("defined twice", fn("  B(i) = A(i)") + fn("  B(i) = A(i)"), pt.ParseError, 4, 1,
     "defined twice"),
    ("no outputs", "def f(float(N) A) -> () {\n}\n", pt.ParseError, 1, 5, "no outputs"),
    ("stray text after def", fn("  B(i) = A(i)") + "garbage", pt.ParseError, 4, 1,
     "expected 'def'"),
    ("bad dimension", "def f(float(N, 2.5) A) -> (B) {\n  B(i) = A(i, 0)\n}\n",
     pt.ParseError, 1, 16, "expected a size name or an integer"),
    # ---------------------------------------------------------------- names
    ("unknown tensor", fn("  B(i) = Q(i)"), pt.NameResolutionError, 2, 10,
     "unknown tensor or function 'Q'"),
    ("unknown function", fn("  B(i) = softplus(A(i))"), pt.NameResolutionError, 2, 10,
     "unknown tensor or function 'softplus'"),
    ("temporary read before written", fn("  B(i) = T(i) + A(i)\n  T(i) = A(i)"),
     pt.NameResolutionError, 2, 10, "temporary T is read before it is written"),
    ("temporary read by its own first statement", fn("  T(i) += A(i)\n  B(i) = T(i)"),
     pt.NameResolutionError, 2, 3, "temporary T is read before it is written"),
    ("duplicate argument", "def f(float(N) A, float(N) A) -> (B) {\n  B(i) = A(i)\n}\n",
     pt.NameResolutionError, 1, 28, "argument A is declared twice"),
    ("output is an argument", "def f(float(N) A) -> (A) {\n  A(i) = A(i)\n}\n",
     pt.NameResolutionError, 1, 23, "both an argument and an output"),
    ("output size not bound", "def f(float(N) A) -> (float(M) B) {\n  B(i) = A(i)\n}\n",
     pt.NameResolutionError, 1, 32, "size M of output B"),
    ("dimension of an unknown tensor", fn("  B(i) = A(i) * Z.0"), pt.NameResolutionError,
     2, 17, "Z is not a tensor"),
    ("let shadows a size", fn("  B(i) = A(i) + N where N = 2"), pt.NameResolutionError, 2, 25,
     "shadows"),
    # ---------------------------------------------------------------- types and shapes
    ("wrong rank", fn("  B(i) = A(i, i)"), pt.TypeCheckError, 2, 10,
     "A has 1 dimensions but is indexed with 2"),
    ("tensor without subscripts", fn("  B(i) = A"), pt.TypeCheckError, 2, 10,
     "used without subscripts"),
    ("writing an input", fn("  B(i) = A(i)\n  A(i) = 1"), pt.TypeCheckError, 3, 3,
     "A is an input and inputs are read-only"),
    ("writing a scalar argument", fn("  s = 1\n  B(i) = A(i)", "float(N) A, float s"),
     pt.TypeCheckError, 2, 3, "read-only"),
    ("writing a size", fn("  N(i) = A(i)\n  B(i) = A(i)"), pt.TypeCheckError, 2, 3,
     "N is a size"),
    ("duplicate index on the left", fn("  B(i, i) = A(i, i)", "float(N, N) A"),
     pt.TypeCheckError, 2, 8, "index i appears twice"),
    ("size as index", fn("  B(N) = A(N)"), pt.TypeCheckError, 2, 5, "not an index"),
    ("written with two ranks", fn("  B(i) = A(i)\n  B(i, j) = A(i) where j in 0:2"),
     pt.TypeCheckError, 3, 3, "written with 1 indices elsewhere but 2 here"),
    ("float to int output", fn("  B(i) = A(i)", outs="int32(N) B"), pt.TypeCheckError, 2, 3,
     "assigning a float32 value to B, which is int32"),
    ("float literal to int output", fn("  B(i) = 0.5 where exists A(i)", outs="int8(N) B"),
     pt.TypeCheckError, 2, 3, "assigning a float32 value to B"),
    ("float subscript", fn("  B(i) = A(X(i))", "float(N) A, float(N) X"), pt.TypeCheckError,
     2, 12, "subscript of A has type float32"),
    ("bool subscript", fn("  B(i) = A(i > 0)"), pt.TypeCheckError, 2, 14, "has type bool"),
    ("reduction index in =", fn("  B(i) = A(i, j)", "float(N, M) A"), pt.TypeCheckError, 2, 3,
     "j appears only on the right-hand side"),
    ("builtin arity (too many)", fn("  B(i) = exp(A(i), 2)"), pt.TypeCheckError, 2, 10,
     "exp takes 1 argument, got 2"),
    ("builtin arity (too few)", fn("  B(i) = pow(A(i))"), pt.TypeCheckError, 2, 10,
     "pow takes 2 arguments, got 1"),
    ("builtin arity (fma)", fn("  B(i) = fma(A(i), A(i))"), pt.TypeCheckError, 2, 10,
     "fma takes 3 arguments, got 2"),
    ("cast arity", fn("  B(i) = int32(A(i), 1)"), pt.TypeCheckError, 2, 10,
     "takes one argument"),
    ("dimension out of range", fn("  B(i) = A(i) * A.1"), pt.TypeCheckError, 2, 17,
     "A.1 does not exist"),
    ("output never written", fn("  B(i) = A(i)", outs="B, C"), pt.TypeCheckError, 1, 26,
     "output C is never written"),
    ("literal does not fit", fn("  B(i) = A(i) + 300", "int8(N) A"), pt.TypeCheckError, 2, 15,
     "literal 300 does not fit in int8"),
    # ---------------------------------------------------------------- ranges
    ("ambiguous range", fn("  B(i) +=! A(i + j)"), pt.RangeInferenceError, 2, 14,
     "range of i is ambiguous"),
    ("unconstrained range", fn("  B(i, j) = A(i)"), pt.RangeInferenceError, 2, 8,
     "range of j cannot be inferred"),
    ("empty where range", fn("  B(i) = A(i) where i in 4:2"), pt.RangeInferenceError, 2, 12,
     "range of i is empty"),
    ("where on an unused index", fn("  B(i) = A(i) where j in 0:3"), pt.RangeInferenceError,
     2, 21, "does not use"),
    ("two where ranges", fn("  B(i) = A(i) where i in 0:2, i in 0:3"),
     pt.RangeInferenceError, 2, 31, "two where ranges"),
    ("non-integer where bound", fn("  B(i) = A(i) where i in 0:A(0)"), pt.RangeInferenceError,
     2, 21, "bounds of i"),
    # ---------------------------------------------------------------- in-place updates
    ("in-place transpose", fn("  B(i, j) = A(i, j)\n  B(i, j) = B(j, i)", "float(N, N) A"),
     pt.CausalityError, 3, 13, r"in-place update of B reads B\(j, i\)"),
    ("in-place shift", fn("  B(i) = A(i)\n  B(i) = B(i + 1) where i in 0:N - 1"),
     pt.CausalityError, 3, 10, "another iteration writes"),
    ("in-place reduction reading itself", fn("  B(i) = A(i, 0)\n  B(i) += B(k) * A(i, k)",
                                             "float(N, N) A"),
     pt.CausalityError, 3, 11, r"reads B\(k\)"),
    # ---------------------------------------------------------------- not supported
    ("recursive call", fn("  (B) = f(A)"), pt.TypeCheckError, 2, 3, r"f calls itself \(f -> f\)"),
    ("call in an expression", fn("  B(i) = A(i)") + fn("  B(i) = f(A(i))").replace("def f",
                                                                                 "def g"),
     pt.UnsupportedError, 5, 10, "inside an expression"),
]


@pytest.mark.parametrize("src,cls,line,col,pattern", [c[1:] for c in MALFORMED],
                         ids=[c[0] for c in MALFORMED])
def test_malformed_program(src, cls, line, col, pattern):
    with pytest.raises(cls, match=pattern) as info:
        define(src)
    assert type(info.value) is cls
    assert isinstance(info.value, pt.PolytileError)
    assert_located(info.value, line, col, src)


def test_there_are_many_malformed_programs():
    assert len(MALFORMED) >= 20
    assert len({c[2] for c in MALFORMED}) >= 6


def test_errors_carry_hints_where_a_fix_is_known():
    hinted = ["unknown type", "missing arrow", "reduction index in =", "float to int output",
              "in-place transpose", "ambiguous range", "unconstrained range", "float subscript",
              "writing an input", "recursive call", "literal does not fit"]
    for name, src, cls, *_ in MALFORMED:
        if name in hinted:
            with pytest.raises(cls) as info:
                define(src)
            assert info.value.hint, name
            assert f"hint: {info.value.hint}" in str(info.value)


def test_transpose_into_another_tensor_is_accepted():
    mod = define(fn("  B(i, j) = A(j, i)", "float(N, N) A"))
    a = np.arange(9, dtype=np.float32).reshape(3, 3)
    np.testing.assert_array_equal(mod.f(a), a.T)


def test_pointwise_in_place_updates_are_accepted():
    mod = define(fn("  B(i) = A(i)\n  B(i) = B(i) * B(i) + 1"))
    np.testing.assert_array_equal(mod.f(np.array([1, 2, 3], np.float32)), [2, 5, 10])


def test_paper_conv1d_with_plain_assignment_is_rejected():
    src = (PAPER / "conv1d.tc").read_text()
    with pytest.raises(pt.TypeCheckError) as info:
        pt.define(src, backend="interp", name="bad.tc")
    err = info.value
    assert (err.loc.line, err.loc.col) == (3, 1)
    assert "x appears only on the right-hand side" in err.message
    assert "+=!" in err.hint
    # The initializing reduction is the form that runs.
    fixed = pt.define(src.replace("O(i) =", "O(i) +=!"), backend="interp")
    i, k = np.arange(1, 8, dtype=np.float32), np.array([1, -1, 2], np.float32)
    np.testing.assert_allclose(fixed.conv1d(i, k), np.correlate(i, k, mode="valid"))


def test_paper_mlp3_as_written_is_rejected():
    """Fig. 15's MLP3 reads O1, which it lists as an output but never computes."""
    src = paper_def("production_model.tc", "MLP3")
    with pytest.raises(pt.TypeCheckError, match="output O1 is never written") as info:
        pt.define(src, backend="interp", name="bad.tc")
    err = info.value
    assert (err.loc.line, err.loc.col) == (3, 18)
    assert_located(err, 3, 18, src)


def test_paper_production_model_is_rejected():
    # The whole of Fig. 15 stops at MLP3 ...
    src = (PAPER / "production_model.tc").read_text()
    with pytest.raises(pt.TypeCheckError, match="output O1 is never written") as info:
        pt.define(src, backend="interp")
    assert (info.value.loc.line, info.value.loc.col) == (14, 18)
    # ... and without MLP3, the call of 2LUT inlines; the call of MLP1 gets `I`, which
    # the pseudo-code's `I = concat(...)` (not TC) wrote as a scalar.
    src = "".join(paper_def("production_model.tc", name)
                  for name in ("2LUT", "MLP1", "prodModel"))
    with pytest.raises(pt.TypeCheckError, match="MLP1's parameter I has 2 dimensions, but I "
                       "has 0") as info:
        pt.define(src, backend="interp", name="bad.tc")
    assert_located(info.value, 22, 11, src)


@pytest.mark.parametrize("name", ["gconv", "dconv"])
def test_paper_grouped_convolutions_as_written_are_rejected(name):
    """Both add `B(m)` in a `=` statement: m is a reduction index there."""
    src = (PAPER / f"{name}.tc").read_text()
    with pytest.raises(pt.TypeCheckError):
        pt.define(src, backend="interp")


def test_error_render_without_a_file_name():
    with pytest.raises(pt.ParseError) as info:
        pt.define("def f(float(N) A) -> (B) {\n  B(i) = A(i) @ 2\n}\n", backend="interp")
    assert str(info.value).startswith("<tc>:2:15: parse error: unexpected character '@'")


# ------------------------------------------------------------------ bad calls

MM = "def mm(float(M,K) A, float(K,N) B) -> (C) {\n  C(m,n) +=! A(m,k) * B(k,n)\n}\n"
GATHER = (PAPER / "gather.tc").read_text()
SGEMM = (PAPER / "sgemm.tc").read_text()


@pytest.fixture(scope="module")
def mm():
    return pt.define(MM, backend="interp")


def rand(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def check_mm_still_works(mm) -> None:
    rng = np.random.default_rng(7)
    a, b = rand(rng, 5, 3), rand(rng, 3, 2)
    np.testing.assert_allclose(mm.mm(a, b), a @ b, rtol=1e-5, atol=1e-6)


def test_wrong_rank(mm):
    rng = np.random.default_rng(0)
    with pytest.raises(pt.ArgumentError, match="A must have 2 dimensions, got 1") as info:
        mm.mm(rand(rng, 4), rand(rng, 4, 2))
    assert info.value.loc is not None and "^" in str(info.value)
    check_mm_still_works(mm)


def test_wrong_dtype(mm):
    rng = np.random.default_rng(0)
    with pytest.raises(pt.ArgumentError, match="B must have dtype float32, got float64") as info:
        mm.mm(rand(rng, 3, 4), rand(rng, 4, 2, dtype=np.float64))
    assert "astype" in info.value.hint
    with pytest.raises(pt.ArgumentError, match="dtype float32, got int32"):
        mm.mm(np.ones((3, 4), np.int32), rand(rng, 4, 2))
    check_mm_still_works(mm)


def test_mismatched_sizes(mm):
    rng = np.random.default_rng(0)
    with pytest.raises(pt.ArgumentError) as info:
        mm.mm(rand(rng, 3, 4), rand(rng, 5, 2))
    assert info.value.message == "size K is 4 from A but 5 from B"
    check_mm_still_works(mm)


def test_missing_and_extra_arguments(mm):
    rng = np.random.default_rng(0)
    with pytest.raises(pt.ArgumentError, match=r"mm takes 2 arguments \(A, B\), got 1"):
        mm.mm(rand(rng, 3, 4))
    with pytest.raises(pt.ArgumentError, match="got 3"):
        mm.mm(rand(rng, 3, 4), rand(rng, 4, 2), rand(rng, 4, 2))
    with pytest.raises(pt.ArgumentError, match="got list"):
        mm.mm([[1.0]], rand(rng, 1, 1))
    check_mm_still_works(mm)


def test_constant_dimension_mismatch():
    mod = pt.define("def f(float(M, 4) A) -> (B) {\n  B(i, j) = A(i, j)\n}\n",
                    backend="interp")
    with pytest.raises(pt.ArgumentError, match="dimension 1 of A must be 4, got 5"):
        mod.f(np.ones((2, 5), np.float32))
    np.testing.assert_array_equal(mod.f(np.ones((2, 4), np.float32)), np.ones((2, 4)))


def test_scalar_arguments():
    mod = pt.define((PAPER / "sconv2d.tc").read_text(), backend="interp")
    rng = np.random.default_rng(0)
    args = (rand(rng, 1, 2, 7, 7), rand(rng, 3, 2, 3, 3), rand(rng, 3))
    with pytest.raises(pt.ArgumentError, match="sh must be an integer, got 1.5"):
        mod.sconv2d(1.5, 1, *args)
    with pytest.raises(pt.ArgumentError, match="sw must be a int32 scalar, got str"):
        mod.sconv2d(1, "2", *args)
    assert mod.sconv2d(np.int64(2), 1, *args).shape == (1, 3, 3, 5)


@pytest.mark.parametrize("bad", [7, 100, -1, -8])
def test_gather_index_out_of_range(bad):
    mod = pt.define(GATHER, backend="interp")
    x = np.arange(7, dtype=np.float32)
    idx = np.array([[0, 3], [bad, 6]], np.int32)
    with pytest.raises(pt.OutOfBoundsError, match=f"X is indexed at {bad}") as info:
        mod.gather(x, idx)
    assert isinstance(info.value, pt.PolytileError)
    assert (info.value.loc.line, info.value.loc.col) == (3, 10)
    idx[1, 0] = 5
    np.testing.assert_array_equal(mod.gather(x, idx), [[0, 3], [5, 6]])


def test_lookup_table_index_out_of_range():
    mod = pt.define((PAPER / "2LUT.tc").read_text(), backend="interp")
    rng = np.random.default_rng(3)
    lut1, lut2 = rand(rng, 5, 3), rand(rng, 11, 3)
    i1 = rng.integers(0, 5, (2, 4)).astype(np.int32)
    i2 = rng.integers(0, 11, (2, 1)).astype(np.int32)
    i2[1, 0] = 11
    with pytest.raises(pt.OutOfBoundsError, match="LUT2 is indexed at 11"):
        mod["2LUT"](lut1, i1, lut2, i2)
    i2[1, 0] = 10
    _, o2 = mod["2LUT"](lut1, i1, lut2, i2)
    np.testing.assert_allclose(o2, lut2[i2].sum(axis=1), rtol=1e-6)


def test_gather_index_dtype_must_match():
    mod = pt.define(GATHER, backend="interp")
    with pytest.raises(pt.ArgumentError, match="I must have dtype int32, got int64"):
        mod.gather(np.zeros(3, np.float32), np.zeros((1, 1), np.int64))


def test_static_out_of_bounds_at_call():
    mod = pt.define(fn("  B(i) = A(i + 1) where i in 0:N"), backend="interp")
    with pytest.raises(pt.OutOfBoundsError, match="A is accessed at 5 in dimension 0") as info:
        mod.f(np.ones(5, np.float32))
    assert (info.value.loc.line, info.value.loc.col) == (2, 10)


def test_in_out_output_must_be_passed():
    mod = pt.define(SGEMM, backend="interp")
    rng = np.random.default_rng(0)
    a, b = rand(rng, 3, 4), rand(rng, 4, 2)
    with pytest.raises(pt.ArgumentError, match="C is read before it is written"):
        mod.sgemm(1.0, 2.0, a, b)
    with pytest.raises(pt.ArgumentError, match=r"must have shape \(3, 2\)"):
        mod.sgemm(1.0, 2.0, a, b, out=np.ones((2, 3), np.float32))
    with pytest.raises(pt.ArgumentError, match="dtype float32"):
        mod.sgemm(1.0, 2.0, a, b, out=np.ones((3, 2), np.float64))
    with pytest.raises(pt.ArgumentError, match="not outputs"):
        mod.sgemm(1.0, 2.0, a, b, out={"D": np.ones((3, 2), np.float32)})
    c = np.ones((3, 2), np.float32)
    got = mod.sgemm(1.0, 2.0, a, b, out=c)
    assert got is c
    np.testing.assert_allclose(c, 2.0 + a @ b, rtol=1e-5)


def test_unknown_function_and_backend():
    mod = pt.define(MM, backend="interp")
    with pytest.raises(AttributeError, match="defines no function 'nope'"):
        mod.nope  # noqa: B018
    with pytest.raises(pt.ArgumentError, match="no function 'nope'"):
        mod["nope"]
    with pytest.raises(pt.ArgumentError, match="unknown backend"):
        pt.define(MM, backend="fortran")


def test_process_keeps_working_after_many_errors(mm):
    rng = np.random.default_rng(11)
    gather = pt.define(GATHER, backend="interp")
    for k in range(20):
        with pytest.raises(pt.PolytileError):
            mm.mm(rand(rng, 3, 4), rand(rng, 4 + 1 + k % 3, 2))
        with pytest.raises(pt.PolytileError):
            gather.gather(np.zeros(4, np.float32), np.full((2, 2), 4 + k, np.int32))
        with pytest.raises(pt.PolytileError):
            define(fn("  B(i) +=! A(i + j)"))
    check_mm_still_works(mm)
    x = rand(rng, 9)
    idx = rng.integers(0, 9, (3, 4)).astype(np.int32)
    np.testing.assert_array_equal(gather.gather(x, idx), x[idx])


# ------------------------------------------------------------------ bad scalars and outputs

def test_read_only_out_is_an_argument_error(mm):
    c = np.zeros((2, 2), np.float32)
    c.flags.writeable = False
    with pytest.raises(pt.ArgumentError):
        mm.mm(np.ones((2, 3), np.float32), np.ones((3, 2), np.float32), out=c)


@pytest.mark.parametrize("value", [2**40, -1])
def test_integer_scalar_out_of_range_is_an_argument_error(value):
    mod = pt.define("def f(uint8 s, float(N) X) -> (Y) {\n  Y(i) = X(i) * s\n}\n",
                    backend="interp")
    with pytest.raises(pt.ArgumentError):
        mod.f(value, np.ones(2, np.float32))


def test_numpy_integer_scalar_out_of_range_is_an_argument_error():
    mod = pt.define("def f(int s, float(N) X) -> (Y) {\n  Y(i) = X(i) * s\n}\n",
                    backend="interp")
    with pytest.raises(pt.ArgumentError):
        mod.f(np.int64(2**40), np.ones(2, np.float32))


def test_input_passed_again_as_out_is_read_before_it_is_overwritten():
    mod = pt.define("def scale(float(N) X, float(N) Y) -> (Z) {\n"
                    "  Z(i) = X(N - 1 - i) + Y(i)\n}\n")
    x = np.arange(5, dtype=np.float32)
    z = x.copy()
    result = mod.scale(z, x, out=z)
    np.testing.assert_array_equal(result, x[::-1] + x)
