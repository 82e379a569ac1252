"""Deep and huge expressions stay inside the error hierarchy (issue 11, defect 7): ~100
nested parentheses or ~500 chained `+` raised RecursionError, a 310-digit literal
OverflowError. Chains of 10,000 terms compile and run; past the named limits, a
ParseError says which limit."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import polytile as pt
from polytile import cli
from polytile.config import Config
from polytile.deep import MAX_DEPTH, MAX_NESTING
from polytile.errors import ParseError, TypeCheckError

A = np.arange(1, 6, dtype=np.float32)


def program(expr: str) -> str:
    return f"def f(float(N) A) -> (B) {{ B(i) = {expr} }}"


@pytest.mark.parametrize("backend", [
    "interp", pytest.param("c", marks=pytest.mark.slow)])    # c: gcc takes 50 s on it
def test_a_chain_of_10000_terms_compiles_and_runs(backend: str, tmp_path: Path) -> None:
    terms = [f"A(i) * {k % 7}.0" for k in range(10_000)]
    mod = pt.define(program(" + ".join(terms)), backend=backend,
                    config=Config(cache_dir=tmp_path))
    want = A * sum(k % 7 for k in range(10_000))
    np.testing.assert_allclose(mod.f(A), want, rtol=1e-5)


def test_chains_keep_left_to_right_order() -> None:
    """No reassociation: the float result is the one of the order written."""
    expr = " + ".join(["A(i) * 1e8", *["1.0"] * 3000, "-A(i) * 1e8"])
    mod = pt.define(program(expr), backend="interp")
    want = []
    for a in A:                  # left to right, in float32
        acc = np.float32(a) * np.float32(1e8)
        for _ in range(3000):
            acc = np.float32(acc + np.float32(1.0))
        want.append(np.float32(acc - np.float32(a) * np.float32(1e8)))
    np.testing.assert_array_equal(mod.f(A), want)


@pytest.mark.parametrize("depth", [100, 400])
def test_nested_parentheses_unary_and_calls(depth: int, tmp_path: Path) -> None:
    config = Config(cache_dir=tmp_path)
    for expr, want in [("(" * depth + "A(i)" + ")" * depth, A),
                       ("-" * depth + "A(i)", A if depth % 2 == 0 else -A),
                       ("fabs(" * depth + "A(i)" + ")" * depth, A)]:
        np.testing.assert_allclose(pt.define(program(expr), config=config).f(A), want)


def test_nesting_past_the_limit_is_a_parse_error_naming_it() -> None:
    n = MAX_NESTING + 1
    with pytest.raises(ParseError, match=f"nested more than {MAX_NESTING} levels"):
        pt.define(program("(" * n + "A(i)" + ")" * n), backend="interp")
    with pytest.raises(ParseError, match=f"nested more than {MAX_NESTING} levels"):
        pt.define(program("(" * 100_000 + "A(i)" + ")" * 100_000), backend="interp")


def test_depth_past_the_limit_is_a_parse_error_naming_it() -> None:
    expr = "-" * (MAX_DEPTH + 1) + "A(i)"
    with pytest.raises(ParseError, match=f"polytile compiles up to {MAX_DEPTH}"):
        pt.define(program(expr), backend="interp")


@pytest.mark.parametrize("literal", ["1" + "0" * 310, "1" + "0" * 310 + ".0", "1e400",
                                     "99999999999999999999"])
def test_literals_beyond_their_widest_type_are_type_errors(literal: str) -> None:
    with pytest.raises(TypeCheckError, match="does not fit in int64|out of range for float64"):
        pt.define(program(f"A(i) * {literal}"), backend="interp")


def test_the_command_line_checks_deep_programs(tmp_path: Path,
                                               capsys: pytest.CaptureFixture) -> None:
    source = tmp_path / "deep.tc"
    source.write_text(program(" + ".join(["A(i)"] * 5000)))
    assert cli.main(["check", str(source)]) == 0
    assert "where i in 0:N" in capsys.readouterr().out


@pytest.mark.parametrize("source", [
    "def f(float(" + "9" * 5000 + ") A) -> (B) {\n  B(i) = A(i)\n}\n",
    "def f(float(99999999999999999999) A) -> (B) {\n  B(i) = A(i)\n}\n",
    "def f(float(N) A) -> (B) {\n  B(i) = A(i) + A." + "9" * 5000 + "\n}\n",
    "def f(float(N) A) -> (B) {\n  B(i) = A(i) * " + "7" * 5000 + "\n}\n",
    "def f(float(N) A) -> (B) {\n  B(i) = A(i) * 0x" + "f" * 40 + "\n}\n",
])
def test_numbers_past_python_s_digit_limit_are_type_errors(source: str) -> None:
    """int() refuses decimals of over 4,300 digits with a ValueError, which escaped
    define (found by polytile.fuzz); sizes are int64."""
    with pytest.raises(TypeCheckError, match="too large: sizes are int64|does not fit in int64"):
        pt.define(source, backend="interp")


def test_where_bindings_that_double_per_binding_are_refused_at_once() -> None:
    """Each binding uses the previous one twice: 60 of them expand to 2**61 operations,
    which hung define (every stage walks the expression as a tree). The size is counted
    on the shared form and refused with the limit named."""
    lets = ["t0 = A(i) + A(i)"] + [f"t{k} = t{k - 1} + t{k - 1}" for k in range(1, 60)]
    source = f"def f(float(N) A) -> (B) {{ B(i) = t59 where {', '.join(lets)} }}"
    with pytest.raises(pt.UnsupportedError, match="expands to 3458764513820540927 operations"):
        pt.define(source, backend="interp")
    small = ", ".join(lets[:4])           # 4 doublings: fine
    mod = pt.define(f"def f(float(N) A) -> (B) {{ B(i) = t3 where {small} }}",
                    backend="interp")
    np.testing.assert_array_equal(mod.f(A), A * 16)
