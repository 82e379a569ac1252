"""`polytile einsum`: the TC it prints (golden text) and how it reports a bad spec."""
from __future__ import annotations

import pytest

from polytile.cli import main

CONV = """\
def einsum(float32(N, C, HR, WS) x, float32(C, K, R, S) w2) -> (out) {
  out(n, k, h, w) +=! x(n, c, h + r, w + s) * w2(c, k, r, s)
}
"""

SHIFT = """\
def einsum(float32(N, C, H, W) x, float64(C, K) wt, int16(C) sh, int32(C) sw, \
int64 size_h, int64 size_w) -> (out) {
  out(n, k, h, w) +=! x(n, c, h + 1 + sh(c), 2 * w - sw(c)) * wt(c, k)
    where h in 0:size_h, w in 0:size_w
}
"""


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(["einsum", *argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_a_convolution(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "nc(h+r)(w+s), ckrs -> nkhw", "--shapes", "x=8,64,30,30",
               "w=64,64,3,3") == (0, CONV, "")


def test_a_shift_convolution_with_tables_anywhere_and_types(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "nc(h+1+sh[c])(2w-sw[c]),ck->nkhw", "--shapes", "x=8,256,30,30",
               "sh=256", "wt=256,256", "sw=256", "--dtypes", "sh=int16,wt=float64"
               ) == (0, SHIFT, "")


def test_malformed_spec_prints_the_caret_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(capsys, "ij,jk->iK", "--shapes", "a=2,3", "b=3,4")
    assert (status, out) == (1, "")
    assert err == ("<einsum>:1:9: parse error: expected an index, found 'K'\n"
                   "  ij,jk->iK\n"
                   "          ^\n"
                   "hint: indices are the letters a-z\n")


def test_shapes_that_do_not_fit_the_spec(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(capsys, "ij,jk->ik", "--shapes", "a=2,3,4", "b=3,4")
    assert status == 1
    assert err.startswith("<einsum>:1:1: argument error: a has 3 size(s), its subscripts "
                          "name 2\n")
    status, _, err = run(capsys, "ij,jk->ik", "--shapes", "a=2,3")
    assert (status, err) == (1, ("argument error: the spec has 2 operand(s), --shapes gives 1"
                                " (a)\n"))
