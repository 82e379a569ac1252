"""bfloat16 x bfloat16 -> float32 contractions without AVX-512 BF16: pass `pack` widens
the bf16 operands to float32 once per call (exact: a bf16 value is the upper half of a
float32's bits) and the fp32 FMA micro-kernel runs the contraction. Where the target has
`vdpbf16ps`, pass `tensorize` takes the contraction first and nothing is widened.

Exactness: every product of two bf16 values is exact in float32 and so is every sum of
the inputs drawn here (integers below 16 times 1, 1/2 or 1/4: the sums stay multiples of
1/16 below 2^20), so the kernel must equal the reference interpreter and float64 to the
bit, in any summation order, whatever the tiling. Standard normal inputs are compared
with float64 within float32 rounding of the sum's magnitude."""
from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import polytile as pt
from polytile.compile import Compiler
from polytile.config import Config, load_config
from polytile.ir import nodes as N
from polytile.ir.printer import format_function
from polytile.loops import interp
from polytile.loops.lower import lower
from polytile.loops.text import kernel_text
from polytile.sema.specialize import specialize
from polytile.targets.target import host_features, inspection_target, load_target, select_target

BF = np.dtype(ml_dtypes.bfloat16)
MM = ("def bmm(bfloat16(M,K) A, bfloat16(K,N) B) -> (C) {\n"
      "  C(m,n) +=! float(A(m,k)) * float(B(k,n))\n}")
TMM = ("def btmm(bfloat16(M,K) A, bfloat16(N,K) B) -> (C) {\n"
       "  C(m,n) +=! float(A(m,k)) * float(B(n,k))\n}")
ATB = ("def batb(bfloat16(K,M) A, bfloat16(K,N) B) -> (C) {\n"
       "  C(m,n) +=! float(A(k,m)) * float(B(k,n))\n}")
BATCHED = ("def bbmm(bfloat16(G,M,K) A, bfloat16(G,K,N) B) -> (C) {\n"
           "  C(g,m,n) +=! float(A(g,m,k)) * float(B(g,k,n))\n}")
SHARED = ("def bsmm(bfloat16(G,M,K) A, bfloat16(K,N) W) -> (C) {\n"
          "  C(g,m,n) +=! float(A(g,m,k)) * float(W(k,n))\n}")
LAYOUTS = {"mm": (MM, "mk,kn->mn"), "tmm": (TMM, "mk,nk->mn"), "atb": (ATB, "km,kn->mn")}
GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "loops"
AVX2_ONLY = replace(load_target("cpu-avx2"), features=frozenset({"avx2", "fma"}))


def avx2_module(source: str) -> pt.Module:
    """`source` for cpu-avx2 without AVX-VNNI or AVX-512 BF16, whatever the host has."""
    if not {"avx2", "fma"} <= host_features():
        pytest.skip("this host has no AVX2 and FMA to run cpu-avx2 kernels")
    module = pt.define(source, target="cpu-avx2")
    assert module.compiler is not None
    module.compiler.target = replace(module.compiler.target, features=AVX2_ONLY.features)
    return module


def function(module: pt.Module):  # type: ignore[no-untyped-def]
    return next(iter(module._functions.values()))


def exact_values(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """bf16 values whose products and sums (fewer than 4096 terms) are exact in float32."""
    whole = rng.integers(-15, 16, shape).astype(np.float64)
    return (whole * 2.0 ** -rng.integers(0, 3, shape)).astype(BF)


def shapes_of(layout: str, m: int, k: int, n: int) -> tuple[tuple[int, int], tuple[int, int]]:
    spec = LAYOUTS[layout][1].split("->")[0].split(",")
    size = {"m": m, "k": k, "n": n}
    return tuple(size[c] for c in spec[0]), tuple(size[c] for c in spec[1])  # type: ignore[return-value]


def float64(layout: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.einsum(LAYOUTS[layout][1], a.astype(np.float64), b.astype(np.float64))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout=st.sampled_from(sorted(LAYOUTS)), m=st.integers(1, 70), k=st.integers(1, 90),
       n=st.integers(1, 70), seed=st.integers(0, 2**16))
def test_bf16_contractions_equal_the_reference_interpreter(layout: str, m: int, k: int,
                                                            n: int, seed: int) -> None:
    source = LAYOUTS[layout][0]
    compiled, reference = function(avx2_module(source)), function(
        pt.define(source, backend="interp"))
    rng = np.random.default_rng(seed)
    sa, sb = shapes_of(layout, m, k, n)
    a, b = exact_values(rng, sa), exact_values(rng, sb)
    got = compiled(a, b)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, reference(a, b))
    np.testing.assert_array_equal(got, float64(layout, a, b))


# 37 x 53 x 29: nothing divides a tile; 300 x 270 x 257 and 130 x 515 x 9: tiled, not fused
# into rows, with remainders; 1 x 1 x 1 and 2 x 3 x 5: fewer lanes than a vector.
SIZES = [(37, 53, 29), (1, 1, 1), (2, 3, 5), (5, 4, 16), (64, 64, 64), (9, 130, 515),
         (130, 515, 9), (300, 257, 270)]


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("m,k,n", SIZES)
def test_bf16_contractions_are_exact_on_any_layout_of_the_inputs(layout: str, m: int, k: int,
                                                                 n: int) -> None:
    fn = function(avx2_module(LAYOUTS[layout][0]))
    rng = np.random.default_rng(m * k * n)
    sa, sb = shapes_of(layout, m, k, n)
    a, b = exact_values(rng, sa), exact_values(rng, sb)
    want = float64(layout, a, b)
    for _ in range(2):                      # the checked path, then the fast path
        np.testing.assert_array_equal(fn(a, b), want)
    # non-contiguous inputs: every other column of a wider array, Fortran order, reversed
    wide = np.zeros((sa[0], 2 * sa[1]), BF)
    wide[:, ::2] = a
    np.testing.assert_array_equal(fn(wide[:, ::2], np.asfortranarray(b)), want)
    np.testing.assert_array_equal(fn(a[::-1, ::-1], b[::-1, ::-1]),
                                  float64(layout, a[::-1, ::-1], b[::-1, ::-1]))


@pytest.mark.parametrize("m,k,n", [(37, 53, 29), (300, 257, 270)])
def test_random_normal_bf16_inputs_round_like_float32(m: int, k: int, n: int) -> None:
    """Sums that round: within float32 rounding of the terms' magnitude, against float64
    and against the reference interpreter (which sums in another order)."""
    fn = function(avx2_module(MM))
    rng = np.random.default_rng(k)
    a = rng.standard_normal((m, k)).astype(BF)
    b = rng.standard_normal((k, n)).astype(BF)
    got = fn(a, b).astype(np.float64)
    magnitude = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    bound = magnitude * k * 2.0 ** -24
    assert np.all(np.abs(got - a.astype(np.float64) @ b.astype(np.float64)) <= bound)
    reference = function(pt.define(MM, backend="interp"))(a, b).astype(np.float64)
    assert np.all(np.abs(got - reference) <= 2 * bound)


def test_every_finite_bf16_value_is_widened_exactly() -> None:
    """All 65280 finite bf16 values (zeros and subnormals included) times the identity:
    each output is one input, widened, plus zeros."""
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    values = bits.view(BF)
    finite = values[np.isfinite(values.astype(np.float32))]
    assert finite.size == 255 * 256
    a = finite.reshape(255, 256)
    fn = function(avx2_module(MM))
    got = fn(a, np.eye(256, dtype=BF))
    np.testing.assert_array_equal(got, a.astype(np.float32))
    # and the shift by 16 bits is what ml_dtypes does
    shifted = (a.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(got, shifted)


@pytest.mark.parametrize("source", [BATCHED, SHARED])
@pytest.mark.parametrize("g,m,k,n", [(3, 5, 17, 23), (2, 1, 7, 33), (4, 37, 53, 29)])
def test_batched_bf16_contractions_are_exact(source: str, g: int, m: int, k: int,
                                             n: int) -> None:
    fn = function(avx2_module(source))
    rng = np.random.default_rng(g * m * k * n)
    a = exact_values(rng, (g, m, k))
    if source == BATCHED:
        b = exact_values(rng, (g, k, n))
        want = np.einsum("gmk,gkn->gmn", a.astype(np.float64), b.astype(np.float64))
    else:
        b = exact_values(rng, (k, n))
        want = np.einsum("gmk,kn->gmn", a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_array_equal(fn(a, b), want)
    np.testing.assert_array_equal(fn(a, b), function(pt.define(source, backend="interp"))(a, b))


def ir(source: str, target, **shapes):  # type: ignore[no-untyped-def]
    fn = function(pt.define(source, backend="interp")).fn
    return Compiler(load_config(), target).ir(specialize(fn, shapes, {}))


def vector_leaves(fn: N.Function) -> list[N.Block]:
    out = []

    def walk(block: N.Block) -> None:
        for s in block.stmts:
            if isinstance(s, N.Block):
                if "contraction" in s.tags and s.schedule.vector is not None:
                    out.append(s)
                walk(s)
    walk(fn.body)
    return out


def test_the_widened_contraction_is_the_fp32_micro_kernel() -> None:
    """The 1024^3 bf16 matmul's IR on AVX2: the same register tile and cache tiles as the
    float32 matmul's, reading float32 copies of both operands."""
    bf16 = ir(MM, AVX2_ONLY, A=(1024, 1024), B=(1024, 1024))
    fp32 = ir(MM.replace("bfloat16", "float"), AVX2_ONLY, A=(1024, 1024), B=(1024, 1024))
    (leaf,) = vector_leaves(bf16)
    (twin,) = vector_leaves(fp32)
    assert leaf.schedule == twin.schedule
    assert leaf.schedule.vector is not None and leaf.schedule.vector.lanes == 8
    assert [i.range for i in leaf.idxs] == [i.range for i in twin.idxs]
    assert all(r.shape.dtype.name == "float32" for r in leaf.refs)
    assert {r.into: r.shape.dtype.name for r in bf16.body.refs if r.dir == "none"} == {
        "p0_panels0": "float32", "p1_panels1": "float32"}


def test_the_widening_loops_golden() -> None:
    """Golden loop IR (POLYTILE_UPDATE_GOLDEN=1 to accept a deliberate change) of a small
    bf16 matmul on AVX2: B widened once into panels, A's rows widened per row, float32x8
    vectors in the micro-kernel; run by the loop interpreter, exactly."""
    fn = ir(MM, AVX2_ONLY, A=(5, 9), B=(9, 20))
    kernel = lower(fn)
    text = kernel_text(kernel)
    path = GOLDEN / "bmm_widened_avx2.loops"
    if os.environ.get("POLYTILE_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), "the loop IR changed; see the docstring"
    assert "float32x8" in text and "bfloat16x" not in text
    rng = np.random.default_rng(5)
    a, b = exact_values(rng, (5, 9)), exact_values(rng, (9, 20))
    buffers = {"p0": a, "p1": b, "o0": np.zeros((5, 20), np.float32)}
    interp.run(fn, buffers, kernel)
    np.testing.assert_array_equal(buffers["o0"], a.astype(np.float64) @ b.astype(np.float64))


AVX512_BF16 = inspection_target("cpu-avx512", frozenset(load_target("cpu-avx512").requires)
                                | {"avx512_bf16"})
AVX512_PLAIN = inspection_target("cpu-avx512", frozenset(load_target("cpu-avx512").requires))


def test_vdpbf16ps_stays_preferred_where_the_target_has_it() -> None:
    with_bf16 = ir(MM, AVX512_BF16, A=(64, 64), B=(64, 48))
    assert [s.schedule.tensorize.instruction for s in with_bf16.body.stmts
            if isinstance(s, N.Block) and s.schedule.tensorize] == ["vdpbf16ps_512"]
    assert not [r for r in with_bf16.body.refs if r.dir == "none"
                and r.shape.dtype.name == "float32"]
    without = ir(MM, AVX512_PLAIN, A=(64, 64), B=(64, 48))
    assert "tensorize(" not in format_function(without)
    (leaf,) = vector_leaves(without)
    assert leaf.schedule.vector is not None and leaf.schedule.vector.lanes == 16


@pytest.mark.parametrize("target", [AVX512_BF16, AVX512_PLAIN], ids=["avx512_bf16", "avx512"])
def test_the_avx512_kernels_compile_on_any_x86_host(target, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Compiled with the target's flags by gcc (not run: the host may lack AVX-512)."""
    fn = function(pt.define(MM, backend="interp")).fn
    built = Compiler(Config(cache_dir=tmp_path), target).build(
        specialize(fn, {"A": (37, 53), "B": (53, 29)}, {}))
    assert built.library.so_path.exists()
    source = built.library.source_path.read_text()
    assert ("_mm512_dpbf16_ps" in source) == ("avx512_bf16" in target.features)


def test_this_host_runs_vdpbf16ps_or_the_widened_fp32_kernel() -> None:
    fn = function(pt.define(MM))
    a, b = exact_values(np.random.default_rng(2), (37, 53)), exact_values(
        np.random.default_rng(3), (53, 29))
    np.testing.assert_array_equal(fn(a, b), a.astype(np.float64) @ b.astype(np.float64))
    source = "\n".join(k.source_path.read_text() for k in fn._kernels.values())
    host = ir(MM, select_target(), A=(37, 53), B=(53, 29))
    if "avx512_bf16" in host_features():
        assert "_mm512_dpbf16_ps" in source
    else:
        assert "dpbf16" not in source
        (leaf,) = vector_leaves(host)
        assert all(r.shape.dtype.name == "float32" for r in leaf.refs)


def test_float16_operands_widen_the_same_way() -> None:
    source = MM.replace("bfloat16", "half")
    fn = function(avx2_module(source))
    rng = np.random.default_rng(11)
    a = exact_values(rng, (37, 53)).astype(np.float16)
    b = exact_values(rng, (53, 29)).astype(np.float16)
    np.testing.assert_array_equal(fn(a, b), a.astype(np.float64) @ b.astype(np.float64))
    (leaf,) = vector_leaves(ir(source, AVX2_ONLY, A=(37, 53), B=(53, 29)))
    assert all(r.shape.dtype.name == "float32" for r in leaf.refs)
