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
from polytile.targets import target as target_module
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


def test_a_group_convolution_adds_its_bias_in_the_transpose() -> None:
    before = lowered(GCONV, {"I": (2, 3, 4, 6, 6), "W1": (3, 8, 4, 3, 3), "B": (3, 8)})
    after = outlayout(before, AVX2, {})
    check_pass("outlayout_gconv", before, after)
    assert names(after) == ["s0_init", "s0", "s0_out"]
    copy = after.body.stmts[2]
    assert [type(st).__name__ for st in copy.stmts] == ["Load", "Load", "Intrinsic", "Store"]
    assert copy.ref("B").access == (N.Affine.index("a1"), N.Affine.index("a2"))


# A residual moves along w, the output's unit-stride index: it stays a statement of its own.
RESIDUAL = GCONV.replace("float(G,F) B) -> (O)", "float(N,G,F,OH,OW) R) -> (O)").replace(
    "O(n,g,o,h,w) + B(g,o)", "O(n,g,o,h,w) + R(n,g,o,h,w)")


def test_work_that_moves_along_the_unit_stride_index_stays_after_the_transpose() -> None:
    before = lowered(RESIDUAL, {"I": (2, 3, 4, 6, 6), "W1": (3, 8, 4, 3, 3),
                                "R": (2, 3, 8, 4, 4)})
    assert names(outlayout(before, AVX2, {})) == ["s0_init", "s0", "s0_out", "s1"]


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


@pytest.fixture
def l1_32k(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compiled on a host with a 32 KiB L1 (Cascade Lake, Zen 3): the weights below are over
    half of it. A 48 KiB L1 (Zen 5, and the target files) holds them, pass fuse then runs
    the convolutions in row loops over the images, and nothing is left for outlayout."""
    monkeypatch.setattr(target_module, "host_caches", lambda: {"L1": 32 << 10})


@pytest.mark.parametrize("target_name", RUNNABLE)
# Weights over half of L1 (16 KiB), which pass fuse does not fuse into a row loop over n.
@pytest.mark.parametrize("n, c, k, h, w", [(1, 16, 32, 13, 17), (2, 11, 48, 6, 29),
                                           (1, 32, 16, 3, 3)])
def test_compiled_convolutions_match_the_reference(target_name: str, n: int, c: int, k: int,
                                                   h: int, w: int, l1_32k: None) -> None:
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


# Elementwise work of several steps after the sum, folded into the transpose.
SCALED = GCONV.replace("O(n,g,o,h,w) = O(n,g,o,h,w) + B(g,o)",
                       "O(n,g,o,h,w) = fmaxf(O(n,g,o,h,w) + B(g,o), 0.5) * 2.0 - B(g,o)")


@pytest.mark.parametrize("target_name", RUNNABLE)
@pytest.mark.parametrize("source, name", [(GCONV, "gconv"), (SCALED, "gconv"),
                                          (RESIDUAL, "gconv")])
def test_a_compiled_group_convolution_matches_the_reference(target_name: str, source: str,
                                                            name: str, l1_32k: None) -> None:
    """Sizes that divide no tile and a strided bias; the bias and the work after it done
    in the transpose (but the residual's). Weights over half of L1 (18 KiB), which pass
    fuse leaves out of a row loop."""
    fn = pt.define(source, target=target_name)[name]
    ref = pt.define(source, backend="interp")[name]
    rng = np.random.default_rng(3)
    image = rng.standard_normal((3, 2, 16, 9, 11)).astype(np.float32)
    weights = rng.standard_normal((2, 16, 16, 3, 3)).astype(np.float32)
    last = (rng.standard_normal((3, 2, 16, 7, 9)).astype(np.float32) if source is RESIDUAL
            else rng.standard_normal((2, 32)).astype(np.float32)[:, ::2])
    np.testing.assert_allclose(fn(image, weights, last), ref(image, weights, last),
                               rtol=1e-4, atol=1e-4)
    for kernel in fn._kernels.values():
        ir = (kernel.source_path.parent / "stage-ir.txt").read_text()
        assert "transpose(" in ir and ("block s1 [" in ir) == (source is RESIDUAL)
