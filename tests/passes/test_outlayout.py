"""Pass outlayout: a convolution whose output's unit-stride index the image reads through
a window sums along its output channels into a copy with them innermost, transposed into
the output afterwards. Golden IR (a 3x3 convolution, a group convolution with its bias
statement after), the programs it leaves alone, the meaning through the IR interpreter,
and compiled kernels against the reference interpreter with sizes that divide no tile
and strided inputs, on every CPU target this host runs."""
from __future__ import annotations

import numpy as np
import pytest

import polytile as pt
from polytile.bench.contractions import GCONV
from polytile.ir import nodes as N
from polytile.passes.outlayout import outlayout
from polytile.targets.target import host_features, load_target, supports

from .helpers import check_pass, lowered, target

AVX512, AVX2 = target("cpu-avx512"), target("cpu-avx2")

CONV = """
def conv(float(N,C,HR,WS) I, float(K,C,R,S) W) -> (O) {
  O(n,k,h,w) +=! I(n,c,h+r,w+s) * W(k,c,r,s) where h in 0:HR-R+1, w in 0:WS-S+1
}
"""


def names(fn: N.Function) -> list[str]:
    return [s.name for s in fn.body.stmts if isinstance(s, N.Block)]


def test_a_convolution_sums_along_its_channels_then_transposes() -> None:
    before = lowered(CONV, {"I": (2, 3, 7, 9), "W": (32, 3, 3, 3)})
    after = outlayout(before, AVX512, {})
    check_pass("outlayout_conv", before, after)
    assert names(after) == ["s0_init", "s0", "s0_out"]
    [local] = [r for r in after.body.refs if r.dir == "none"]
    assert local.shape.sizes == (2, 5, 7, 32)            # n, h, w, k: k innermost
    assert after.body.stmts[2].schedule.transpose == 16


def test_a_group_convolution_keeps_its_bias_after_the_transpose() -> None:
    before = lowered(GCONV, {"I": (2, 3, 4, 6, 6), "W1": (3, 8, 4, 3, 3), "B": (3, 8)})
    after = outlayout(before, AVX2, {})
    check_pass("outlayout_gconv", before, after)
    assert names(after) == ["s0_init", "s0", "s0_out", "s1"]


@pytest.mark.parametrize("source, shapes", [
    # K = 24 is not a multiple of 16 lanes.
    (CONV, {"I": (1, 3, 7, 9), "W": (24, 3, 3, 3)}),
    # No window: a 1x1 convolution vectorizes along w with whole vectors of the image.
    ("def c(float(N,C,H,W) I, float(K,C) Wt) -> (O) {\n  O(n,k,h,w) +=! I(n,c,h,w) * Wt(k,c)\n}\n",
     {"I": (1, 3, 7, 9), "Wt": (32, 3)}),
    # Adds into what an earlier statement wrote (no init of zeros just before).
    (("def c(float(N,C,HR,WS) I, float(K,C,R,S) W, float(K) b) -> (O) {\n"
      "  O(n,k,h,w) = b(k) where h in 0:HR-R+1, w in 0:WS-S+1\n"
      "  O(n,k,h,w) += I(n,c,h+r,w+s) * W(k,c,r,s)\n}\n"),
     {"I": (1, 3, 7, 9), "W": (32, 3, 3, 3), "b": (32,)}),
    # A double output.
    (CONV.replace("float(N", "double(N").replace("float(K", "double(K"),
     {"I": (1, 3, 7, 9), "W": (32, 3, 3, 3)}),
])
def test_what_it_leaves_alone(source: str, shapes: dict) -> None:
    before = lowered(source, shapes)
    assert outlayout(before, AVX512, {}) == before


def test_disabled_it_changes_nothing() -> None:
    before = lowered(CONV, {"I": (2, 3, 7, 9), "W": (32, 3, 3, 3)})
    assert outlayout(before, AVX512, {"enabled": False}) == before


RUNNABLE = [t for t in ("cpu-avx512", "cpu-avx2") if supports(load_target(t), host_features())]


@pytest.mark.parametrize("target_name", RUNNABLE)
# Weights over half of L1 (16 KiB), which pass fuse does not fuse into a row loop over n.
@pytest.mark.parametrize("n, c, k, h, w", [(1, 16, 32, 13, 17), (2, 11, 48, 6, 29),
                                           (1, 32, 16, 3, 3)])
def test_compiled_convolutions_match_the_reference(target_name: str, n: int, c: int, k: int,
                                                   h: int, w: int) -> None:
    """Sizes that divide no register tile, a Fortran-ordered and a strided image."""
    fn = pt.define(CONV, target=target_name).conv
    ref = pt.define(CONV, backend="interp").conv
    rng = np.random.default_rng(n * 1000 + k + w)
    image = rng.standard_normal((n, c, h + 2, w + 2)).astype(np.float32)
    weights = rng.standard_normal((k, c, 3, 3)).astype(np.float32)
    want = ref(image, weights)
    strided = np.zeros((n, c, h + 2, 2 * (w + 2)), np.float32)[..., ::2]
    strided[...] = image
    for x in (image, np.asfortranarray(image), strided):
        np.testing.assert_allclose(fn(x, weights), want, rtol=1e-4, atol=1e-4)
    for kernel in fn._kernels.values():
        ir = (kernel.source_path.parent / "stage-ir.txt").read_text()
        assert "block s0_out [" in ir and "transpose(" in ir


@pytest.mark.parametrize("target_name", RUNNABLE)
def test_a_compiled_group_convolution_matches_the_reference(target_name: str) -> None:
    fn = pt.define(GCONV, target=target_name).gconv
    ref = pt.define(GCONV, backend="interp").gconv
    rng = np.random.default_rng(3)
    args = (rng.standard_normal((3, 2, 5, 9, 11)).astype(np.float32),
            rng.standard_normal((2, 16, 5, 3, 3)).astype(np.float32),
            rng.standard_normal((2, 16)).astype(np.float32))
    np.testing.assert_allclose(fn(*args), ref(*args), rtol=1e-4, atol=1e-4)
