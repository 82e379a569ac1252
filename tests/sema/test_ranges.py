"""Golden tests of range inference (TC §3.1): the symbolic ranges and shapes as printed,
their exact values for many sizes, the errors, and `polytile check` on the command line."""
from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import polytile as pt
from polytile.lang.parser import parse
from polytile.sema.analyze import analyze
from polytile.sema.printer import format_function
from polytile.sema.specialize import specialize

PAPER = Path(__file__).resolve().parents[1] / "paper"
REPO = Path(__file__).resolve().parents[2]


def function(text: str, name: str | None = None):
    program = analyze(parse(text))
    return program.get(name) if name else program.functions[0]


def ranges(fn, k: int = 0) -> dict[str, str]:
    return {name: str(r) for name, r in fn.statements[k].ranges}


def shape(fn, tensor: str) -> list[str]:
    return [str(d) for d in fn.tensor(tensor).shape]


def spec_ranges(fn, shapes, scalars=None, k: int = 0) -> dict[str, tuple[int, int]]:
    spec = specialize(fn, shapes, scalars or {})
    return {name: (lo, hi) for name, lo, hi in spec.ranges[k]}


# ------------------------------------------------------------------ the goldens

STRIDE_123 = "def f(float(N) I) -> (O) {\n  O(i) = I(123 * i)\n}\n"


def test_stride_123_symbolic():
    fn = function(STRIDE_123)
    assert ranges(fn) == {"i": "0:ceil(N/123)"}
    assert shape(fn, "O") == ["ceil(N/123)"]
    assert "O(i) = I(123 * i)\n      where i in 0:ceil(N/123)" in format_function(fn)
    assert "float32(ceil(N/123)) O" in format_function(fn)


def test_stride_123_values():
    fn = function(STRIDE_123)
    for n in list(range(1, 400)) + [1000, 12299, 12300, 12301, 123 * 123, 10**6 + 3]:
        spec = specialize(fn, {"I": (n,)}, {})
        assert spec.ranges[0] == (("i", 0, math.ceil(n / 123)),)
        assert spec.shape("O") == (-(-n // 123),)


def test_stride_123_runs():
    mod = pt.define(STRIDE_123, backend="interp")
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    np.testing.assert_array_equal(mod.f(x), x[::123])


CONV1D = "def conv1d(float(M) I, float(N) K) -> (O) {\n  O(i) +=! K(x) * I(i + x)\n}\n"


def test_conv1d_rounds():
    fn = function(CONV1D)
    assert ranges(fn) == {"i": "0:M - N + 1", "x": "0:N"}
    assert shape(fn, "O") == ["M - N + 1"]
    assert fn.statements[0].reduction_indices == ("x",)


@pytest.mark.parametrize("m,n", [(1, 1), (2, 1), (7, 7), (13, 5), (5, 2), (97, 31)])
def test_conv1d_values(m, n):
    assert spec_ranges(function(CONV1D), {"I": (m,), "K": (n,)}) == {"i": (0, m - n + 1),
                                                                   "x": (0, n)}


def test_conv1d_kernel_larger_than_input_is_an_error():
    with pytest.raises(pt.RangeInferenceError, match="empty"):
        specialize(function(CONV1D), {"I": (3,), "K": (5,)}, {})


STRIDED = ("def f(float(H) I, float(KH) K) -> (O) {\n"
           "  O(h) +=! I(2 * h + kh) * K(kh)\n}\n")


def test_strided_symbolic():
    fn = function(STRIDED)
    assert ranges(fn) == {"h": "0:floor((H - KH)/2) + 1", "kh": "0:KH"}
    assert shape(fn, "O") == ["floor((H - KH)/2) + 1"]


def test_strided_values():
    fn = function(STRIDED)
    for h in range(1, 40):
        for kh in range(1, h + 1):
            assert spec_ranges(fn, {"I": (h,), "K": (kh,)})["h"] == (0, (h - kh) // 2 + 1)


def test_strided_by_scalar_arguments():
    fn = function((PAPER / "sconv2d.tc").read_text())
    assert shape(fn, "O") == ["N", "F", "floor((H - KH)/sh) + 1", "floor((W - KW)/sw) + 1"]
    got = spec_ranges(fn, {"I": (2, 3, 11, 7), "W": (5, 3, 3, 2), "B": (5,)},
                      {"sh": 2, "sw": 3}, k=1)
    assert got == {"n": (0, 2), "f": (0, 5), "h": (0, 5), "w": (0, 2), "c": (0, 3),
                   "kh": (0, 3), "kw": (0, 2)}


def test_sgemm_k_is_the_intersection():
    fn = function((PAPER / "sgemm.tc").read_text())
    assert ranges(fn, 1) == {"i": "0:N", "j": "0:K", "k": "0:M"}
    assert shape(fn, "C") == ["N", "K"]
    assert fn.inout == frozenset({"C"})
    # With different size names the intersection stays symbolic and takes the minimum.
    fn = function("def mm(float(N,M) A, float(K,L) B) -> (C) {\n"
                  "  C(i,j) +=! A(i,k) * B(k,j)\n}\n")
    assert ranges(fn)["k"] == "0:min(K, M)"
    assert spec_ranges(fn, {"A": (2, 5), "B": (3, 4)})["k"] == (0, 3)
    assert spec_ranges(fn, {"A": (2, 3), "B": (5, 4)})["k"] == (0, 3)


def test_fcrelu_whole_function_inference():
    fn = function((PAPER / "fcrelu.tc").read_text())
    # out(i,j) = bias(j): nothing on the right bounds i; the shape of out fixed by the
    # second statement does.
    assert ranges(fn, 0) == {"i": "0:B", "j": "0:I"}
    assert ranges(fn, 1) == {"b": "0:B", "o": "0:O", "i": "0:I"}
    assert ranges(fn, 2) == {"i": "0:B", "j": "0:O"}
    assert shape(fn, "out") == ["B", "O"]


def test_mv_initialization_takes_the_shape_of_c():
    fn = function((PAPER / "mv.tc").read_text())
    assert ranges(fn, 0) == {"i": "0:M"}
    assert ranges(fn, 1) == {"i": "0:M", "k": "0:K"}


def test_maxpool_where_and_stride():
    fn = function((PAPER / "maxpool2x2.tc").read_text())
    assert ranges(fn) == {"b": "0:B", "c": "0:C", "i": "0:floor((H - 2)/2) + 1",
                          "j": "0:floor((W - 2)/2) + 1", "kw": "0:2", "kh": "0:2"}


def test_three_rounds():
    fn = function("def f(float(NA) A, float(NB) B, float(NC) C) -> (O) {\n"
                  "  O(i) +=! A(x) * B(x + y) * C(i + y)\n}\n")
    assert ranges(fn) == {"i": "0:NA + NC - NB", "x": "0:NA", "y": "0:NB - NA + 1"}
    got = spec_ranges(fn, {"A": (3,), "B": (7,), "C": (11,)})
    assert got == {"i": (0, 7), "x": (0, 3), "y": (0, 5)}


def test_intersection_in_one_round():
    fn = function("def f(float(N) A, float(M) C) -> (B) {\n  B(i) = A(i) + C(i)\n}\n")
    assert ranges(fn) == {"i": "0:min(M, N)"}
    assert spec_ranges(fn, {"A": (7,), "C": (5,)}) == {"i": (0, 5)}


def test_negative_coefficient_and_sizes_in_subscripts():
    fn = function("def f(float(N) A) -> (B) {\n  B(i) = A(N - 1 - i)\n}\n")
    assert ranges(fn) == {"i": "0:N"}


def test_constant_dimensions():
    fn = function("def f(float(M, 5) A) -> (B) {\n  B(i, j) = A(i, j + 1)\n}\n")
    assert ranges(fn) == {"i": "0:M", "j": "0:4"}
    assert shape(fn, "B") == ["M", "4"]


def test_temporary_shapes_are_inferred():
    fn = function("def f(float(N, M) A) -> (B) {\n"
                  "  t(i) +=! A(i, j)\n  B(i, j) = A(i, j) / t(i)\n}\n")
    (t,) = fn.temps
    assert t.name == "t" and [str(d) for d in t.shape] == ["N"]


# ------------------------------------------------------------------ where clauses

def test_explicit_where_wins():
    fn = function("def conv1d(float(M) I, float(N) K) -> (O) {\n"
                  "  O(i) +=! K(x) * I(i + x) where x in 0:2\n}\n")
    assert ranges(fn) == {"i": "0:M - 1", "x": "0:2"}


def test_where_on_an_output_index():
    fn = function("def f(float(N) A) -> (B) {\n  B(i) = A(i) where i in 0:3\n}\n")
    assert ranges(fn) == {"i": "0:3"}
    assert shape(fn, "B") == ["3"]


def test_where_with_a_lower_bound():
    fn = function("def f(float(N) A) -> (B) {\n  B(i) = A(i - 2) where i in 2:N\n}\n")
    assert ranges(fn) == {"i": "2:N"}
    mod = pt.define("def f(float(N) A) -> (B) {\n  B(i) = A(i - 2) where i in 2:N\n}\n",
                    backend="interp")
    a = np.arange(1, 8, dtype=np.float32)
    np.testing.assert_array_equal(mod.f(a), np.concatenate([[0, 0], a[:-2]]))


def test_exists_constrains_ranges_only():
    fn = function("def f(float(N) A, float(M) C) -> (B) {\n"
                  "  B(i) = C(0) where exists A(i)\n}\n")
    assert ranges(fn) == {"i": "0:N"}
    mod = pt.define("def f(float(N) A, float(M) C) -> (B) {\n"
                    "  B(i) = C(0) where exists A(i)\n}\n", backend="interp")
    got = mod.f(np.ones(5, np.float32), np.full(2, 3, np.float32))
    np.testing.assert_array_equal(got, np.full(5, 3, np.float32))


def test_where_bounds_may_use_sizes_and_integer_scalars():
    fn = function("def f(int s, float(N) A) -> (B) {\n"
                  "  B(i) +=! A(i + k) where k in 0:s\n}\n")
    assert ranges(fn) == {"i": "0:N - s + 1", "k": "0:s"}
    assert spec_ranges(fn, {"A": (10,)}, {"s": 3}) == {"i": (0, 8), "k": (0, 3)}


# ------------------------------------------------------------------ exactness (property)

@settings(max_examples=300, deadline=None)
@given(a=st.integers(-5, 5).filter(bool), b=st.integers(-4, 4), c=st.integers(-6, 6),
       klo=st.integers(0, 3), kk=st.integers(1, 4), n=st.integers(1, 40))
def test_inferred_range_is_the_maximal_safe_interval(a, b, c, klo, kk, n):
    """For B(i) +=! A(a*i + b*k + c) where k in klo:klo+kk, the inferred range of i is
    exactly the set of i >= 0 for which every k keeps the subscript in bounds (brute
    force), and universal quantification holds: no k may read out of bounds. Where no i
    is valid the range is empty or an error, never one that reads out of bounds."""
    text = (f"def f(float(N) A) -> (B) {{\n  B(i) +=! A({a} * i + {b} * k + {c})"
            f" where k in {klo}:{klo + kk}\n}}\n")
    valid = [i for i in range(200)
             if all(0 <= a * i + b * k + c < n for k in range(klo, klo + kk))]
    try:
        got = spec_ranges(function(text), {"A": (n,)})["i"]
    except pt.RangeInferenceError:
        assert not valid
        return
    if not valid:          # an empty range: no iterations (a size of 0 in NumPy terms)
        assert got[0] == got[1]
        return
    assert got == (min(valid), max(valid) + 1)


# ------------------------------------------------------------------ errors

def where_hint(err: pt.PolytileError) -> None:
    assert err.loc is not None and err.loc.line >= 1 and err.loc.col >= 1
    assert err.hint is not None and "where" in err.hint
    assert "^" in str(err)


def test_ambiguous_range():
    with pytest.raises(pt.RangeInferenceError, match="ambiguous") as info:
        function("def f(float(N) A) -> (B) {\n  B(i) +=! A(i + j)\n}\n")
    where_hint(info.value)
    assert (info.value.loc.line, info.value.loc.col) == (2, 14)


def test_unconstrained_range():
    with pytest.raises(pt.RangeInferenceError, match="range of j") as info:
        function("def f(float(N) A) -> (B) {\n  B(i, j) = A(i)\n}\n")
    where_hint(info.value)
    assert (info.value.loc.line, info.value.loc.col) == (2, 8)


def test_unconstrained_reduction_index_of_maxpool_without_where():
    with pytest.raises(pt.RangeInferenceError) as info:
        function("def maxpool2x2(float(B,C,H,W) in) -> (out) {\n"
                 "  out(b,c,i,j) max=! in(b,c, 2 * i + kw, 2 * j + kh)\n}\n")
    where_hint(info.value)
    assert info.value.loc.line == 2


def test_non_affine_subscript_needs_a_where():
    with pytest.raises(pt.RangeInferenceError) as info:
        function("def f(float(N) A) -> (B) {\n  B(i) = A(i / 2)\n}\n")
    where_hint(info.value)
    fn = function("def f(float(N) A) -> (B) {\n  B(i) = A(i / 2) where i in 0:2 * N\n}\n")
    assert ranges(fn) == {"i": "0:2*N"}


@pytest.mark.parametrize("stmt,col", [
    ("  B(i) = A(i) where i in 3:3", 12),
    ("  B(i) = A(i) where i in 5:2", 12),
    ("  B(i) +=! A(i + k) where k in 0:N + 1", 14),
])
def test_empty_range_at_analysis(stmt, col):
    with pytest.raises(pt.RangeInferenceError, match="empty") as info:
        function(f"def f(float(N) A) -> (B) {{\n{stmt}\n}}\n")
    where_hint(info.value)
    assert (info.value.loc.line, info.value.loc.col) == (2, col)


def test_empty_range_at_call():
    mod = pt.define("def f(float(N) A) -> (B) {\n  B(i) +=! A(i + k) where k in 0:3\n}\n",
                    backend="interp")
    with pytest.raises(pt.RangeInferenceError, match="empty") as info:
        mod.f(np.ones(1, np.float32))          # i in 0:-1: the input is too small
    where_hint(info.value)
    # i in 0:0 is a range of no iterations, as in NumPy: the result is empty.
    assert mod.f(np.ones(2, np.float32)).shape == (0,)


def test_where_naming_an_unused_index():
    with pytest.raises(pt.RangeInferenceError, match="does not use") as info:
        function("def f(float(N) A) -> (B) {\n  B(i) = A(i) where j in 0:3\n}\n")
    assert (info.value.loc.line, info.value.loc.col) == (2, 21)


def test_stride_must_be_positive_at_call():
    mod = pt.define("def f(int s, float(N) A) -> (B) {\n  B(i) = A(s * i)\n}\n",
                    backend="interp")
    np.testing.assert_array_equal(mod.f(2, np.arange(5, dtype=np.float32)), [0, 2, 4])
    for s in (0, -1):
        with pytest.raises(pt.PolytileError, match="positive") as info:
            mod.f(s, np.arange(5, dtype=np.float32))
        assert info.value.loc is not None


# ------------------------------------------------------------------ polytile check

def check(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "polytile", "check", *args], cwd=REPO, check=False,
                          capture_output=True, text=True, input=stdin, timeout=60)


def test_cli_check_symbolic():
    res = check(str(PAPER / "conv2d.tc"))
    assert res.returncode == 0, res.stderr
    assert res.stdout == (
        "def conv2d(float32(B, IP, H, W) in, float32(OP, IP, KH, KW) weight) -> "
        "(float32(B, OP, H - KH + 1, W - KW + 1) out)\n"
        "  out(b, op, h, w) +=! in(b, ip, h + kh, w + kw) * weight(op, ip, kh, kw)\n"
        "      where b in 0:B, op in 0:OP, h in 0:H - KH + 1, w in 0:W - KW + 1, ip in 0:IP,"
        " kh in 0:KH, kw in 0:KW; reduce over ip, kh, kw\n\n")


def test_cli_check_with_sizes():
    res = check(str(PAPER / "sconv2d.tc"), "--sizes", "N=1,C=2,H=9,W=9,F=3,KH=3,KW=3,sh=2,sw=3")
    assert res.returncode == 0, res.stderr
    assert "-> (float32(1, 3, 4, 3) O)" in res.stdout
    assert "sizes: N=1, C=2, H=9, W=9, F=3, KH=3, KW=3, sh=2, sw=3" in res.stdout
    assert "where n in 0:1, f in 0:3, h in 0:4, w in 0:3, c in 0:2, kh in 0:3, kw in 0:3" \
        in res.stdout


def test_cli_check_from_stdin():
    res = check("-", stdin=STRIDE_123)
    assert res.returncode == 0, res.stderr
    assert "where i in 0:ceil(N/123)" in res.stdout


def test_cli_check_reports_errors():
    res = check(str(PAPER / "conv1d.tc"))
    assert res.returncode == 1
    assert res.stdout == ""
    assert "conv1d.tc:3:1: type error" in res.stderr
    assert "O(i) = K(x) * I(i + x)\n  ^" in res.stderr
    assert "+=!" in res.stderr


def test_cli_check_range_error(tmp_path):
    path = tmp_path / "bad.tc"
    path.write_text("def f(float(N) A) -> (B) {\n  B(i) +=! A(i + j)\n}\n")
    res = check(str(path))
    assert res.returncode == 1
    assert f"{path}:2:14: range inference error: range of i is ambiguous" in res.stderr
    assert "hint: add a where clause" in res.stderr


def test_cli_check_bad_sizes_and_missing_file(tmp_path):
    res = check(str(PAPER / "mv.tc"), "--sizes", "M=3,K=0")     # no iterations over k
    assert res.returncode == 0 and "k in 0:0" in res.stdout
    conv = tmp_path / "conv.tc"
    conv.write_text("def f(float(M) I, float(N) K) -> (O) { O(i) +=! K(x) * I(i + x) }")
    res = check(str(conv), "--sizes", "M=3,N=5")       # the kernel is longer than the input
    assert res.returncode == 1 and "empty" in res.stderr
    res = check(str(PAPER / "sconv2d.tc"), "--sizes", "N=1")
    assert res.returncode == 1 and "--sizes does not give" in res.stderr
    res = check(str(tmp_path / "missing.tc"))
    assert res.returncode == 1 and "missing.tc" in res.stderr
