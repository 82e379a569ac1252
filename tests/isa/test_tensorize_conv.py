"""UNIT's rewriter on quantized convolutions (issue 14): the instruction's groups take the
input channels, the window's reductions loop around them, the output channels run the
lanes. Exact (int32 sums mod 2^32, as NumPy's int64 result cast to int32) against a
NumPy reference on random full-range inputs: channels that are not a multiple of the
instruction's group, odd sizes, strides of 2, conv3d, batches, strided inputs; the loop
interpreter runs the VNNI kernels this AVX2 host cannot, and their C is compiled."""
from __future__ import annotations

import itertools
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polytile.backends import backend_for
from polytile.config import load_config
from polytile.ir.parser import parse_function
from polytile.ir.printer import format_function
from polytile.ir.verify import verify
from polytile.loops import interp
from polytile.loops.lower import lower
from polytile.loops.text import kernel_text
from polytile.runtime.build import build_shared_object
from polytile.runtime.toolchain import detect_toolchain
from polytile.targets.target import host_features, load_target

from .test_tensorize import AVX2_ONLY, VNNI_XEON, avx2_only, full_range, ir, schedules

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
AVX512 = VNNI_XEON      # without AMX, whose tiles take convolutions too (test_amx.py)
AVX_VNNI = replace(load_target("cpu-avx2"), features=frozenset({"avx2", "fma", "avx_vnni"}))
TARGETS = {"vpmaddwd_256": AVX2_ONLY, "vpdpbusd_512": AVX512, "vpdpbusd_256": AVX_VNNI}


def conv2d(stride: int = 1) -> str:
    h, o = ("h", "o") if stride == 1 else (f"{stride}*h", f"{stride}*o")
    return ("def qconv(uint8(N,C,H,W) x, int8(K,C,R,S) w) -> (y) {\n"
            f"  y(n,k,h,o) +=! int32(x(n,c,{h}+r,{o}+s)) * int32(w(k,c,r,s))\n}}")


def conv3d(stride: int = 1) -> str:
    d, h, o = (("d", "h", "o") if stride == 1 else
               (f"{stride}*d", f"{stride}*h", f"{stride}*o"))
    return ("def qconv3d(uint8(N,C,D,H,W) x, int8(K,C,T,R,S) w) -> (y) {\n"
            f"  y(n,k,d,h,o) +=! int32(x(n,c,{d}+t,{h}+r,{o}+s)) * int32(w(k,c,t,r,s))\n}}")


# channels last: the groups are contiguous in x and the lanes in y (nothing staged)
NHWC = ("def qconv(uint8(N,H,W,C) x, int8(R,S,C,K) w) -> (y) {\n"
        "  y(n,h,o,k) +=! int32(x(n,h+r,o+s,c)) * int32(w(r,s,c,k))\n}")


def reference(x: np.ndarray, w: np.ndarray, stride: int = 1) -> np.ndarray:
    """NCHW (or NCDHW) x KCRS (KCTRS) -> NKHW (NKDHW) in int64, wrapped to int32."""
    window = w.shape[2:]
    out = [(n - r) // stride + 1 for n, r in zip(x.shape[2:], window)]
    y = np.zeros((x.shape[0], w.shape[0], *out), np.int64)
    for at in itertools.product(*(range(r) for r in window)):
        part = tuple(slice(a, a + stride * (n - 1) + 1, stride) for a, n in zip(at, out))
        y += np.einsum("nc...,kc->nk...", x[(slice(None), slice(None), *part)].astype(np.int64),
                       w[(slice(None), slice(None), *at)].astype(np.int64))
    return y.astype(np.int32)


def inputs(seed: int, x_shape: tuple[int, ...], w_shape: tuple[int, ...]
           ) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return full_range(rng, np.uint8, x_shape), full_range(rng, np.int8, w_shape)


def run_loops(source: str, target, x: np.ndarray, w: np.ndarray,  # type: ignore[no-untyped-def]
              out_shape: tuple[int, ...]) -> np.ndarray:
    fn = ir(source, target, x=x.shape, w=w.shape)
    buffers = {"p0": x, "p1": w, "o0": np.zeros(out_shape, np.int32)}
    interp.run(fn, buffers, lower(fn))
    return buffers["o0"]


# ---------------------------------------------------------------- the rewriter's decision

def test_a_conv_runs_on_the_instruction_with_its_window_around_the_groups() -> None:
    """Lanes along k, groups along c; r and s are no mapped loops (they stay reductions
    around the instruction); the schedule, the IR round trip and the verifier."""
    for name, target in TARGETS.items():
        fn = ir(conv2d(), target, x=(1, 8, 6, 6), w=(16, 8, 3, 3))
        (t,) = schedules(fn)
        assert (t.instruction, t.lane, t.reduction) == (name, "i1", "i4")
        text = format_function(fn)
        assert format_function(parse_function(text)) == text
        verify(parse_function(text))


def test_the_rewriter_s_ir_and_loops_for_a_conv_are_golden() -> None:
    """Golden IR of the decision and golden loop IR of its lowering
    (POLYTILE_UPDATE_GOLDEN=1 to accept a deliberate change): w packed per strip as
    (window, group) pairs, x packed N[C/2]HW[2]c as int16, w kept between calls, the window's loops around the
    groups, the output tile staged through a stack buffer (y's lanes are K apart)."""
    fn = ir(conv2d(2), AVX2_ONLY, x=(1, 3, 7, 6), w=(10, 3, 2, 2))
    texts = {GOLDEN / "passes" / "tensorize_qconv_stride2_cpu-avx2.ir": format_function(fn),
             GOLDEN / "loops" / "qconv_stride2_vpmaddwd_avx2.loops": kernel_text(lower(fn))}
    for path, text in texts.items():
        if os.environ.get("POLYTILE_UPDATE_GOLDEN"):
            path.write_text(text)
        assert text == path.read_text(), f"{path.name} changed; see the docstring"
    ir_text, loops = texts.values()
    assert "#tensorized schedule(first(), tensorize(vpmaddwd_256, i1, i4, 3, 4, kept))" in ir_text
    assert "x packed" not in loops and "p0 widened for vpmaddwd_256" in loops
    assert "a tile of the output" in loops and "on stack" in loops


def test_channels_last_needs_no_staging_and_no_packed_input_on_vnni() -> None:
    """NHWC x RSCK -> NHWK: the groups are contiguous in x (read in place on VNNI, whose
    operand is uint8 like x) and the lanes in y (accumulators loaded and stored whole)."""
    fn = ir(NHWC, AVX512, x=(1, 6, 6, 8), w=(3, 3, 8, 32))
    (t,) = schedules(fn)
    assert (t.instruction, t.lane, t.reduction) == ("vpdpbusd_512", "i3", "i6")
    loops = kernel_text(lower(fn))
    assert "a tile of the output" not in loops and "p0 packed" not in loops


def test_a_window_read_through_a_sum_of_its_indices_is_left_to_the_vector_code() -> None:
    """w(k, c, r + s) is no plain subscript: the packed operand's loops could not fill it
    per (window, group); the block stays a contraction, and is exact."""
    source = ("def odd(uint8(N,C,H) x, int8(K,C,T) w) -> (y) {\n"
              "  y(n,k,h) +=! int32(x(n,c,h+r+s)) * int32(w(k,c,r+s)) where r in 0:3, s in 0:3\n}")
    x, w = inputs(3, (2, 6, 9), (16, 6, 5))
    fn = ir(source, AVX2_ONLY, x=x.shape, w=w.shape)
    assert schedules(fn) == []
    buffers = {"p0": x, "p1": w, "o0": np.zeros((2, 16, 5), np.int32)}
    interp.run(fn, buffers, lower(fn))
    want = np.zeros((2, 16, 5), np.int64)
    for r, s in itertools.product(range(3), range(3)):
        want += np.einsum("nch,kc->nkh", x[:, :, r + s:r + s + 5].astype(np.int64),
                          w[:, :, r + s].astype(np.int64))
    np.testing.assert_array_equal(buffers["o0"], want.astype(np.int32))


def test_grouped_and_depthwise_convs_are_left_alone_and_exact() -> None:
    """A depthwise conv's input depends on the lanes (no operand is broadcast), a grouped
    conv's weights on the group (an output loop besides the lanes): no layable mapping."""
    depthwise = ("def dw(uint8(N,C,H,W) x, int8(C,R,S) w) -> (y) {\n"
                 "  y(n,c,h,o) +=! int32(x(n,c,h+r,o+s)) * int32(w(c,r,s))\n}")
    grouped = ("def gc(uint8(N,G,C,H,W) x, int8(G,K,C,R,S) w) -> (y) {\n"
               "  y(n,g,k,h,o) +=! int32(x(n,g,c,h+r,o+s)) * int32(w(g,k,c,r,s))\n}")
    x, w = inputs(4, (1, 16, 6, 7), (16, 3, 3))
    fn = ir(depthwise, AVX2_ONLY, x=x.shape, w=w.shape)
    assert schedules(fn) == []
    want = np.concatenate([reference(x[:, c:c + 1], w[c:c + 1, None]) for c in range(16)],
                          axis=1)
    buffers = {"p0": x, "p1": w, "o0": np.zeros(want.shape, np.int32)}
    interp.run(fn, buffers, lower(fn))
    np.testing.assert_array_equal(buffers["o0"], want)
    x, w = inputs(5, (1, 2, 4, 5, 5), (2, 8, 4, 3, 3))
    fn = ir(grouped, AVX2_ONLY, x=x.shape, w=w.shape)
    assert schedules(fn) == []
    want = np.stack([reference(x[:, g], w[g]) for g in range(2)], axis=1)
    buffers = {"p0": x, "p1": w, "o0": np.zeros(want.shape, np.int32)}
    interp.run(fn, buffers, lower(fn))
    np.testing.assert_array_equal(buffers["o0"], want)


# ---------------------------------------------------------------- compiled on this host

CONV2D = [  # (x, w, stride)
    ((1, 8, 6, 6), (16, 8, 3, 3), 1),
    ((2, 13, 7, 9), (21, 13, 3, 2), 1),      # odd C, K, H, W; a batch; R != S
    ((1, 3, 9, 9), (5, 3, 3, 3), 2),         # stride 2, fewer lanes than a vector
    ((1, 37, 11, 10), (70, 37, 1, 1), 2),    # 1x1 stride 2, odd C
    ((1, 1, 5, 5), (9, 1, 2, 2), 1),         # one channel: no group loop, not tensorized
    ((1, 64, 16, 16), (128, 64, 3, 3), 1),   # rows in threads
    ((1, 17, 15, 15), (300, 17, 3, 3), 1),   # 64-lane column blocks and a tail
]


@pytest.mark.parametrize("x_shape,w_shape,stride", CONV2D)
def test_vpmaddwd_convs_are_exact(x_shape: tuple[int, ...], w_shape: tuple[int, ...],
                                  stride: int) -> None:
    qconv = avx2_only(conv2d(stride)).qconv
    x, w = inputs(sum(x_shape) * sum(w_shape), x_shape, w_shape)
    want = reference(x, w, stride)
    for _ in range(2):                    # the checked path, then the fast path
        np.testing.assert_array_equal(qconv(x, w), want)
    # strided, reversed and Fortran-ordered inputs (the call copies them)
    wide = np.zeros((*x_shape[:-1], 2 * x_shape[-1]), np.uint8)
    wide[..., ::2] = x
    np.testing.assert_array_equal(qconv(wide[..., ::2], np.asfortranarray(w)), want)
    np.testing.assert_array_equal(qconv(x[::-1], w[::-1]), want[::-1, ::-1])
    (kernel,) = qconv._kernels.values()
    assert ("_mm256_madd_epi16" in kernel.source_path.read_text()) == (x_shape[1] > 1)


@pytest.mark.parametrize("x_shape,w_shape,stride", [
    ((1, 5, 5, 6, 7), (12, 5, 2, 3, 2), 1),
    ((2, 9, 4, 5, 5), (33, 9, 3, 1, 2), 1),
    ((1, 6, 7, 7, 8), (8, 6, 3, 3, 3), 2),
])
def test_vpmaddwd_conv3d_is_exact_unchanged(x_shape: tuple[int, ...],
                                            w_shape: tuple[int, ...], stride: int) -> None:
    """One more spatial dimension, one more window loop: nothing in the rewriter names
    a dimension."""
    qconv = avx2_only(conv3d(stride)).qconv3d
    x, w = inputs(sum(x_shape) + sum(w_shape), x_shape, w_shape)
    np.testing.assert_array_equal(qconv(x, w), reference(x, w, stride))
    (kernel,) = qconv._kernels.values()
    assert "_mm256_madd_epi16" in kernel.source_path.read_text()


def test_vpmaddwd_channels_last_conv_is_exact() -> None:
    qconv = avx2_only(NHWC).qconv
    x, w = inputs(5, (2, 9, 8, 11), (3, 2, 11, 40))
    want = reference(x.transpose(0, 3, 1, 2), w.transpose(3, 2, 0, 1)).transpose(0, 2, 3, 1)
    np.testing.assert_array_equal(qconv(x, w), want)


def test_extremes_and_int32_wrap_are_exact() -> None:
    """255 x -128 everywhere, over a reduction long enough that the int32 sums wrap."""
    qconv = avx2_only(conv2d()).qconv
    x = np.full((1, 12000, 3, 4), 255, np.uint8)
    w = np.full((9, 12000, 2, 3), -128, np.int8)
    total = np.int64(255 * -128) * 12000 * 6
    assert total < np.iinfo(np.int32).min                               # it does wrap
    got = qconv(x, w)
    np.testing.assert_array_equal(got, reference(x, w))
    np.testing.assert_array_equal(got, np.full((1, 9, 2, 2), total).astype(np.int32))


# ---------------------------------------------------------------- VNNI: interpreted, compiled

@pytest.mark.parametrize("name", ["vpdpbusd_512", "vpdpbusd_256"])
@pytest.mark.parametrize("x_shape,w_shape,stride", [
    ((1, 6, 6, 5), (20, 6, 3, 2), 1),       # C = 6: a partial group of 4
    ((2, 5, 7, 7), (17, 5, 3, 3), 2),
])
def test_the_loop_interpreter_runs_vnni_convs_exactly(name: str, x_shape: tuple[int, ...],
                                                      w_shape: tuple[int, ...],
                                                      stride: int) -> None:
    x, w = inputs(len(name) + stride, x_shape, w_shape)
    want = reference(x, w, stride)
    fn = ir(conv2d(stride), TARGETS[name], x=x_shape, w=w_shape)
    assert [t.instruction for t in schedules(fn)] == [name]
    np.testing.assert_array_equal(run_loops(conv2d(stride), TARGETS[name], x, w, want.shape),
                                  want)


def test_the_loop_interpreter_runs_a_channels_last_vnni_conv_exactly() -> None:
    """Read in place, with the last partial group masked (C = 7)."""
    x, w = inputs(11, (1, 5, 6, 7), (2, 2, 7, 19))
    want = reference(x.transpose(0, 3, 1, 2), w.transpose(3, 2, 0, 1)).transpose(0, 2, 3, 1)
    np.testing.assert_array_equal(run_loops(NHWC, AVX512, x, w, want.shape), want)


@pytest.mark.parametrize("name,intrinsic", [("vpdpbusd_512", "_mm512_dpbusd_epi32"),
                                            ("vpdpbusd_256", "_mm256_dpbusd")])
def test_vnni_conv_kernels_compile_on_any_x86_host(name: str, intrinsic: str,
                                                   tmp_path: Path) -> None:
    """The whole kernel's C, built with the flags the target's backend gives it; run
    where the host has the feature."""
    target = TARGETS[name]
    for source in (conv2d(2), conv3d()):
        shapes = ({"x": (1, 19, 9, 9), "w": (40, 19, 3, 3)} if "qconv(" in source
                  else {"x": (1, 6, 4, 5, 5), "w": (24, 6, 2, 2, 2)})
        fn = ir(source, target, **shapes)
        assert [t.instruction for t in schedules(fn)] == [name]
        backend = backend_for(target)
        generated = backend.generate(fn, target)
        c = dict(generated.stages)["c"]
        assert intrinsic in c and "_mm256_madd_epi16" not in c
        toolchain = detect_toolchain(load_config())
        result = build_shared_object(c, backend.flags(target, toolchain, ()), toolchain,
                                     tmp_path / f"{name}.so")
        assert result.so_path.exists()


def test_a_vnni_conv_runs_where_the_host_has_it() -> None:
    if "avx512_vnni" not in host_features():
        pytest.skip("this host has no AVX-512 VNNI: the kernel is compiled and interpreted "
                    "above, not run")
    import polytile as pt
    qconv = pt.define(conv2d(2)).qconv
    x, w = inputs(2, (1, 19, 9, 9), (40, 19, 3, 3))
    np.testing.assert_array_equal(qconv(x, w), reference(x, w, 2))
    (kernel,) = qconv._kernels.values()
    assert "_mm512_dpbusd_epi32" in kernel.source_path.read_text()


# ---------------------------------------------------------------- property

@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(name=st.sampled_from(sorted(TARGETS)), n=st.integers(1, 2), c=st.integers(1, 9),
       k=st.integers(1, 20), r=st.integers(1, 3), s=st.integers(1, 3),
       stride=st.sampled_from([1, 2]), extra_h=st.integers(0, 4), extra_w=st.integers(0, 4),
       seed=st.integers(0, 2**16))
def test_the_rewriter_is_exact_on_any_conv(name: str, n: int, c: int, k: int, r: int, s: int,
                                           stride: int, extra_h: int, extra_w: int,
                                           seed: int) -> None:
    """Any shape, stride and instruction: tensorized where the channels and output
    channels are loops (more than one iteration each), and equal to the reference."""
    x, w = inputs(seed, (n, c, r + extra_h, s + extra_w), (k, c, r, s))
    want = reference(x, w, stride)
    fn = ir(conv2d(stride), TARGETS[name], x=x.shape, w=w.shape)
    assert [t.instruction for t in schedules(fn)] == ([name] if c > 1 and k > 1 else [])
    np.testing.assert_array_equal(run_loops(conv2d(stride), TARGETS[name], x, w, want.shape),
                                  want)


# ---------------------------------------------------------------- weights kept between calls

def test_kept_weights_follow_every_change_of_their_values() -> None:
    """The packed weights are kept between calls (`tensorize(..., kept)`) and packed
    again whenever the weights' values differ from the ones they were packed from: the
    same array changed in place, another array, the first one again, the int8 extremes;
    every result exact. Odd channels, stride 2, a partial group and a lane tail."""
    qconv = avx2_only(conv2d(2)).qconv
    x, w = inputs(14, (1, 13, 11, 10), (21, 13, 3, 3))
    first = w.copy()
    calls = [w, w]
    for change in ((0, 0, 0, 0, -128), (20, 12, 2, 2, 127), (7, 6, 1, 0, 0)):
        *at, value = change
        calls.append(("in place", tuple(at), value))
    other = inputs(15, (1, 13, 11, 10), (21, 13, 3, 3))[1]
    extremes = np.where(np.indices(w.shape).sum(axis=0) % 2, -128, 127).astype(np.int8)
    calls += [other, first, extremes, np.asfortranarray(extremes), first]
    for call in calls:
        if isinstance(call, tuple):
            _, at, value = call
            w[at] = value
            call = w
        np.testing.assert_array_equal(qconv(x, call), reference(x, call, 2))
    top = np.full_like(x, 255)          # 255 x -128 and 255 x 127 in every product
    np.testing.assert_array_equal(qconv(top, extremes), reference(top, extremes, 2))
    (kernel,) = qconv._kernels.values()
    source = kernel.source_path.read_text()
    assert "memcmp(pt_kept_" in source and "kept between calls" in source


def test_kept_weights_are_private_to_concurrent_calls() -> None:
    """Calls from several threads at once, each with its own weights, each exact: a call
    takes a kept block no other call holds (the pool's slots), with its own copy."""
    from concurrent.futures import ThreadPoolExecutor
    qconv = avx2_only(conv2d()).qconv
    cases = [inputs(seed, (1, 9, 8, 8), (24, 9, 3, 3)) for seed in range(4)]
    wants = [reference(x, w) for x, w in cases]

    def run(k: int) -> bool:
        x, w = cases[k % 4]
        return bool(np.array_equal(qconv(x, w), wants[k % 4]))

    qconv(*cases[0])
    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(run, range(64)))
