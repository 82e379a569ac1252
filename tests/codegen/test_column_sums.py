"""Column sums fused into a threaded row loop (fuse + autotile's `combine`): each thread
adds its rows into a private copy of the sums, OpenMP adds the copies at the end. The
compiled kernel agrees with the reference interpreter at sizes that do not divide the
threads' shares, with the operands in odd layouts, and the C says what it does."""
from __future__ import annotations

import numpy as np
import pytest
from conformance.test_conformance import assert_agrees

import polytile as pt
from polytile.cli import main as cli

# The backward of layernorm: row statistics, then column sums of the weight and bias
# gradients (over the rows), and the input gradient per row.
LAYERNORM_GRAD = """
def lngrad(float(N,D) X, float(N,D) dY, float(D) g) -> (dX, dg, db) {
  mean(n) +=! X(n,d) / D
  xc(n,d) = X(n,d) - mean(n)
  var(n) +=! xc(n,d) * xc(n,d) / D
  rstd(n) = rsqrt(var(n) + 1e-5)
  xh(n,d) = xc(n,d) * rstd(n)
  dg(d) +=! dY(n,d) * xh(n,d)
  db(d) +=! dY(n,d)
  gdy(n,d) = g(d) * dY(n,d)
  s1(n) +=! gdy(n,d) / D
  s2(n) +=! gdy(n,d) * xh(n,d) / D
  dX(n,d) = rstd(n) * (gdy(n,d) - s1(n) - xh(n,d) * s2(n))
}
"""


@pytest.fixture(scope="module")
def compiled() -> pt.Module:
    return pt.define(LAYERNORM_GRAD)


@pytest.fixture(scope="module")
def reference() -> pt.Module:
    return pt.define(LAYERNORM_GRAD, backend="interp")


@pytest.mark.parametrize("n, d", [(1, 1), (7, 5), (333, 129), (1001, 67)])
def test_layernorm_backward_agrees_with_the_interpreter(compiled: pt.Module,
                                                         reference: pt.Module,
                                                         n: int, d: int) -> None:
    rng = np.random.default_rng(n * d)
    x = rng.standard_normal((n, d)).astype(np.float32) * 3 + 1
    dy = rng.standard_normal((d, n)).astype(np.float32).T      # a transposed view
    g = rng.standard_normal(2 * d).astype(np.float32)[::2]     # a strided view
    got, want = compiled.lngrad(x, dy, g), reference.lngrad(x, dy, g)
    for name, a, b in zip(("dX", "dg", "db"), got, want):
        assert_agrees(a, b, 1e-4, f"{name} at {n}x{d}")


def test_the_column_sums_are_per_thread_and_added_at_the_end(tmp_path, capsys) -> None:
    source = tmp_path / "lngrad.tc"
    source.write_text(LAYERNORM_GRAD)
    assert cli(["show", str(source), "--stage", "loops", "--sizes", "N=4096,D=256",
                "--target", "cpu-avx2"]) == 0
    loops = capsys.readouterr().out
    assert "adding into" in loops
    assert cli(["show", str(source), "--stage", "c", "--sizes", "N=4096,D=256",
                "--target", "cpu-avx2"]) == 0
    c = capsys.readouterr().out
    pragma = next(line for line in c.splitlines() if "omp parallel for" in line)
    assert "reduction(+:" in pragma and "[0:256]" in pragma
    assert c.count("omp parallel for") == 1        # one row loop: the whole function
