"""Packed panels (polytile/passes/pack.py) are written by the register-transpose code of
polytile/codegen/transpose.py and read by masked outer-product kernels: results agree
with NumPy on the targets with masked vector moves (AVX-512: 16 lanes, AVX2: 8) for
panel and reduction sizes that do not divide the vector width, for operands packed
once per call (tmm) and once per fused row (tbmm), and for non-contiguous inputs."""
from __future__ import annotations

import numpy as np
import pytest

import polytile as pt
from polytile.codegen.c import generate_c
from polytile.sema.specialize import specialize
from polytile.targets.target import host_features, load_target, supports

TMM = "def tmm(float(M,K) A, float(N,K) B) -> (C) {\n  C(m,n) +=! A(m,kk) * B(n,kk)\n}\n"
TBMM = ("def tbmm(float(B,N,M) X, float(B,K,M) Y) -> (Z) {\n"
        "  Z(b,n,k) +=! X(b,n,m) * Y(b,k,m)\n}\n")
MM = "def mm(float(M,K) A, float(K,N) B) -> (C) {\n  C(m,n) +=! A(m,kk) * B(kk,n)\n}\n"
ATB = "def atb(float(K,M) A, float(K,N) B) -> (C) {\n  C(m,n) +=! A(kk,m) * B(kk,n)\n}\n"
TARGETS = [t for t in ("cpu-avx512", "cpu-avx2") if supports(load_target(t), host_features())]


def _source(module: pt.Module, name: str, *args: np.ndarray) -> str:
    fn = getattr(module, name).fn
    shapes = {p.name: a.shape for p, a in zip(fn.params, args)}
    return generate_c(module.compiler.ir(specialize(fn, shapes, {}))).text


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("m,n,k", [(37, 29, 53), (20, 16, 16), (9, 70, 2), (33, 17, 200),
                                   (5, 45, 31)])
def test_tmm_through_panels(target: str, m: int, n: int, k: int) -> None:
    rng = np.random.default_rng(m * n + k)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((n, k)).astype(np.float32)
    mod = pt.define(TMM, target=target)
    mod.compiler.options = {"fuse.strategy": "none", "pack.max_reduction": 1 << 20}
    assert "transposes" in _source(mod, "tmm", a, b)
    np.testing.assert_allclose(mod.tmm(a, b), a @ b.T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("b,n,m,k", [(7, 26, 72, 26), (3, 5, 19, 33), (4, 9, 16, 8), (5, 4, 64, 50)])
def test_tbmm_packs_each_row(target: str, b: int, n: int, m: int, k: int) -> None:
    rng = np.random.default_rng(b + n + m + k)
    # Non-contiguous inputs: every other row of a larger array, and a transposed one.
    x = rng.standard_normal((b, 2 * n, m)).astype(np.float32)[:, ::2]
    y = np.ascontiguousarray(rng.standard_normal((b, m, k)).astype(np.float32)
                             ).transpose(0, 2, 1)
    mod = pt.define(TBMM, target=target)
    got = mod.tbmm(x, y)
    np.testing.assert_allclose(got, np.einsum("bnm,bkm->bnk", x, y), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("k,m,n", [(53, 37, 29), (128, 20, 70), (9, 33, 17), (200, 13, 45)])
def test_atb_reads_a_transposed_copy(target: str, k: int, m: int, n: int) -> None:
    # A^T B, the reduction over the outer index of both operands (a weight gradient):
    # A is copied with kk innermost when its rows are longer than a cache line; sizes that
    # divide neither the vectors nor the tiles.
    rng = np.random.default_rng(k + m + n)
    a = rng.standard_normal((k, m)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    mod = pt.define(ATB, target=target)
    assert ("block pack_p0_panels0" in _source(mod, "atb", a, b)) == (m * 4 > 64)
    np.testing.assert_allclose(mod.atb(a, b), a.T @ b, rtol=1e-4, atol=1e-4)
    # Non-contiguous: every other row of larger arrays, and A as a transposed view.
    wide = rng.standard_normal((2 * k, n)).astype(np.float32)[::2]
    at = np.ascontiguousarray(rng.standard_normal((m, k)).astype(np.float32)).T
    np.testing.assert_allclose(mod.atb(at, wide), at.T @ wide, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("m,k,n", [(37, 45, 1024), (5, 130, 1024), (70, 20, 1100),
                                   (65, 33, 1030)])
def test_mm_packs_rows_far_apart(target: str, m: int, k: int, n: int) -> None:
    # B's rows 4 KiB apart (one set of L1), or a page or more apart and read by 64 rows of
    # A or more, are copied into panels (plain vector copies); a view of all but 24
    # columns (non-contiguous) leaves a partial last panel.
    rng = np.random.default_rng(m + k + n)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    mod = pt.define(MM, target=target)
    assert "block pack_p1_panels0" in _source(mod, "mm", a, b)
    np.testing.assert_allclose(mod.mm(a, b), a @ b, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(mod.mm(a, b[:, 3:n - 21]), a @ b[:, 3:n - 21], rtol=1e-4,
                               atol=1e-4)


def test_transpose_kernel_is_used_for_fused_rows() -> None:
    if "cpu-avx512" not in TARGETS:
        pytest.skip("host cannot run cpu-avx512")
    x = np.ones((3, 26, 72), np.float32)
    text = _source(pt.define(TBMM, target="cpu-avx512"), "tbmm", x, x)
    assert "16x16 transposes" in text
