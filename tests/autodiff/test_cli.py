"""`polytile grad`: the backward TC, as pt.grad derives it, for each function or one."""
from __future__ import annotations

from pathlib import Path

import pytest

from polytile.cli import main

SOURCE = """
def fcrelu(float(B,I) x, float(O,I) w, float(O) b) -> (y) {
  y(n,o)  = b(o)
  y(n,o) += x(n,i) * w(o,i)
  y(n,o)  = fmaxf(y(n,o), 0)
}
def total(float(N) x) -> (s) {
  s() +=! x(i) * x(i)
}
"""

WANT = """\
def total_grad(float32(N) x, float32() d_s) -> (float32(N) d_x) {
  d_x(i) = d_s() * x(i) + d_s() * x(i) where i in 0:N
}

"""

WANT_SAVED = """\
def fcrelu(float32(B, I) x, float32(O, I) w, float32(O) b) -> (y, y_1) {
  y_1(n, o) = b(o) where n in 0:B, o in 0:O
  y_1(n, o) += x(n, i) * w(o, i) where n in 0:B, o in 0:O, i in 0:I
  y(n, o) = fmax(y_1(n, o), 0.0) where n in 0:B, o in 0:O
}

def fcrelu_grad(float32(B, I) x, float32(O, I) w, float32(O) b, float32(B, O) y_1, \
float32(B, O) d_y) -> (float32(B, I) d_x, float32(O, I) d_w, float32(O) d_b) {
  d_y_1(n, o) = y_1(n, o) > 0.0 ? d_y(n, o) : y_1(n, o) == 0.0 ? d_y(n, o) * 0.5 : 0.0 \
where n in 0:B, o in 0:O
  d_x(n, i) +=! d_y_1(n, o) * w(o, i) where n in 0:B, o in 0:O, i in 0:I
  d_w(o, i) +=! d_y_1(n, o) * x(n, i) where n in 0:B, o in 0:O, i in 0:I
  d_b(o) +=! d_y_1(n, o) where n in 0:B, o in 0:O
}

"""


@pytest.fixture
def tc(tmp_path: Path) -> str:
    path = tmp_path / "layers.tc"
    path.write_text(SOURCE)
    return str(path)


def test_one_function(tc: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["grad", tc, "--name", "total"]) == 0
    assert capsys.readouterr().out == WANT


def test_saved_prints_the_forward_that_returns_what_the_gradient_reads(
        tc: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["grad", tc, "--name", "fcrelu", "--saved"]) == 0
    assert capsys.readouterr().out == WANT_SAVED


def test_every_function_and_an_unknown_one(tc: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["grad", tc]) == 0
    assert capsys.readouterr().out.count("_grad(") == 2
    assert main(["grad", tc, "--name", "nope"]) == 1
    assert "defines no function 'nope'" in capsys.readouterr().err


def test_wrt_prints_only_those_inputs_gradients(tc: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["grad", tc, "--name", "fcrelu", "--saved", "--wrt", "w,b"]) == 0
    out = capsys.readouterr().out
    assert "-> (float32(O, I) d_w, float32(O) d_b)" in out and "d_x" not in out
    assert main(["grad", tc, "--name", "fcrelu", "--wrt", "q"]) == 1
    assert "no floating-point input q" in capsys.readouterr().err
