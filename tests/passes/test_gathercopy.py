"""gathercopy (polytile/passes/gathercopy.py): a gathered operand reused across an index
it does not use is copied once into a dense buffer (bounds-checked and stepped as pass
ptrinc does), and the contraction reads the copy with affine subscripts. Golden text,
the interpreter on random shifts including the extreme ones, the same errors for
out-of-range shifts (interpreted and compiled), the kernels it leaves alone, and the
compiled shift convolution through pt.einsum against NumPy."""
from __future__ import annotations

import numpy as np
import pytest

import polytile as pt
from polytile.compile import Compiler
from polytile.config import load_config
from polytile.einsum import compile_einsum
from polytile.errors import KernelError
from polytile.ir import nodes as N
from polytile.lang.parser import parse
from polytile.passes.gathercopy import MIN_REUSE, gathercopy
from polytile.passes.ptrinc import ptrinc
from polytile.sema.analyze import analyze
from polytile.sema.specialize import Specialized, specialize
from polytile.targets.target import select_target

from .helpers import assert_same_meaning, block, check_pass, lowered, random_buffers, run, target
from .test_ptrinc import CONV, SHIFT_CENTERED, SPARSE

AVX2 = target("cpu-avx2")
SHAPES = {"I": (2, 5, 7, 6), "SH": (5,), "SW": (5,), "Wt": (3, 5)}
# A reuse of 3 (O): below the default, so the small golden case asks for the copy.
SMALL_REUSE = {"min_reuse": 2}


def _tags(b: N.Block) -> set[str]:
    return set(b.tags).union(*(_tags(s) for s in b.stmts if isinstance(s, N.Block)))


def _blocks(fn: N.Function) -> list[str]:
    return [s.name for s in fn.body.stmts if isinstance(s, N.Block)]


def test_shift_convolution_reads_a_dense_copy() -> None:
    before = lowered(SHIFT_CENTERED, SHAPES)
    after = gathercopy(before, AVX2, SMALL_REUSE)
    assert _blocks(after) == ["s0_init", "s0_copy_bounds", "s0_copy_steps", "s0_copy", "s0"]
    (copy,) = [r for r in after.body.refs if r.into == "I_gathered"]
    assert copy.dir == "none" and copy.shape.sizes == (2, 5, 5, 4)     # (n, c, h, w)
    assert [d.stride for d in copy.shape.dims] == [100, 20, 4, 1]     # (h, w) contiguous
    kernel = block(after, "s0")
    assert kernel.ref("I").from_ == "I_gathered"
    assert [str(a) for a in kernel.ref("I").access] == ["n", "c", "h", "w"]
    assert not any(isinstance(s, N.Load) and (s.dynamic or s.offset) for s in kernel.stmts)
    assert {r.into for r in kernel.refs} == {"Out", "I", "Wt"}        # no shift tables left
    # The copy reads each channel's shifted window through ptrinc's step table.
    copier = block(after, "s0_copy")
    assert "gather" in copier.tags
    assert any(isinstance(s, N.Load) and s.offset for s in copier.stmts)
    check_pass("gathercopy_shift", before, after, int_high={"SH": 2, "SW": 2})
    # ptrinc then finds nothing left to do on the contraction.
    assert ptrinc(after, AVX2, {}) == after


def _shifts(rng: np.random.Generator, c: int) -> tuple[np.ndarray, np.ndarray]:
    sh, sw = (rng.integers(-1, 2, c).astype(np.int32) for _ in range(2))
    sh[0], sh[-1], sw[0], sw[-1] = -1, 1, 1, -1          # the extremes are present
    return sh, sw


def test_random_shifts_and_out_of_range_ones_fail_the_same_way() -> None:
    shapes = {"I": (3, 4, 9, 11), "SH": (4,), "SW": (4,), "Wt": (5, 4)}
    before = lowered(SHIFT_CENTERED, shapes)
    after = gathercopy(before, AVX2, SMALL_REUSE)
    assert "s0_copy" in _blocks(after)
    for seed in range(3):
        rng = np.random.default_rng(seed)
        buffers = random_buffers(before, rng)
        buffers["SH"], buffers["SW"] = _shifts(rng, 4)
        want, got = run(before, buffers), run(after, buffers)
        np.testing.assert_allclose(got["Out"], want["Out"], rtol=1e-5, atol=1e-5)
    for name, bad in [("SH", 2), ("SW", -2), ("SW", 40)]:
        broken = dict(buffers)
        broken[name] = buffers[name].copy()
        broken[name][1] = bad
        dim = 2 if name == "SH" else 3
        for fn in (before, after):
            with pytest.raises(KernelError, match=f"in dimension {dim} of I"):
                run(fn, broken)


@pytest.mark.parametrize("source, shapes, params", [
    # Reuse 3 (O), under the default threshold: ptrinc reads it in place.
    (SHIFT_CENTERED, SHAPES, {}),
    # The taps come from data through an index the image does not use (x): a copy
    # would hold a shifted image per tap, an im2col.
    (SPARSE.replace("h + DH(x), w + DW(x)", "h + 1 + DH(x), w + 1 + DW(x)"),
     {"I": (2, 3, 6, 9), "DH": (5,), "DW": (5,), "Wt": (40, 3, 5)}, SMALL_REUSE),
    # No gather at all.
    (CONV, {"I": (2, 3, 7, 6), "Wt": (40, 3, 3, 2)}, SMALL_REUSE),
    # The gathered rows depend on a parallel index (a lookup table): no per-channel shift.
    ("def lut(float(E,D) L, int(B,K) I) -> (O) {\n  O(i,j) +=! L(I(i,k), j)\n}\n",
     {"L": (5, 3), "I": (4, 6)}, SMALL_REUSE),
])
def test_leaves_kernels_where_the_copy_does_not_apply_or_pay(source, shapes, params) -> None:
    before = lowered(source, shapes)
    assert gathercopy(before, AVX2, params) == before


def test_the_threshold_is_the_reads_per_element() -> None:
    shapes = dict(SHAPES, Wt=(MIN_REUSE, 5))
    before = lowered(SHIFT_CENTERED, shapes)
    assert "s0_copy" in _blocks(gathercopy(before, AVX2, {}))
    smaller = lowered(SHIFT_CENTERED, dict(SHAPES, Wt=(MIN_REUSE - 1, 5)))
    assert gathercopy(smaller, AVX2, {}) == smaller
    assert gathercopy(before, AVX2, {"enabled": False}) is before


def test_twice_is_once_and_meaning_is_kept_with_ptrinc_after() -> None:
    before = lowered(SHIFT_CENTERED, SHAPES)
    once = gathercopy(before, AVX2, SMALL_REUSE)
    assert gathercopy(once, AVX2, SMALL_REUSE) == once
    assert_same_meaning(before, ptrinc(once, AVX2, {}), int_high={"SH": 2, "SW": 2})


def test_runs_between_fuse_and_pack_in_the_shipped_cpu_targets() -> None:
    for name in ("cpu-avx512", "cpu-avx2", "cpu-generic"):
        order = [p for p, _ in target(name).passes]
        assert order.index("fuse") < order.index("gathercopy") < order.index("pack") \
            < order.index("ptrinc"), name


# ---------------------------------------------------------------- compiled

def _shift_reference(x: np.ndarray, sh: np.ndarray, sw: np.ndarray, w: np.ndarray) -> np.ndarray:
    _, c, hh, ww = x.shape
    moved = np.stack([x[:, k, 1 + sh[k]:hh - 1 + sh[k], 1 + sw[k]:ww - 1 + sw[k]]
                      for k in range(c)], axis=1).astype(np.float64)
    return np.einsum("nchw,ck->nkhw", moved, w.astype(np.float64))


@pytest.mark.parametrize("n, c, k, h, w", [(2, 11, 40, 13, 19), (1, 9, 45, 30, 30)])
def test_compiled_shift_convolution_matches_numpy(n, c, k, h, w) -> None:
    """Sizes that divide no tile, a non-contiguous image (every other element) and a
    transposed filter, random shifts with the extremes present."""
    rng = np.random.default_rng(n * 1000 + c)
    big = rng.standard_normal((n, c, 2 * h, w)).astype(np.float32)
    x = big[:, :, ::2, :]
    wt = np.asfortranarray(rng.standard_normal((c, k)).astype(np.float32))
    sh, sw = _shifts(rng, c)
    spec = "nc(h+1+sh[c])(w+1+sw[c]),ck->nkhw"
    got = pt.einsum(spec, x, wt, sh=sh, sw=sw)
    np.testing.assert_allclose(got, _shift_reference(x, sh, sw, wt), rtol=1e-4, atol=1e-4)
    program = compile_einsum(spec, ("float32", "float32"), (("sh", "int32"), ("sw", "int32")))
    compiler = program.module.compiler
    assert compiler is not None
    ir = compiler.ir(specialize(program.module["einsum"].fn,
                                {"in0": x.shape, "in1": wt.shape, "sh": sh.shape, "sw": sw.shape},
                                {"size_h": h - 2, "size_w": w - 2}))
    assert "gather" in _tags(ir.body)      # the kernel that ran read the dense copy


FIXED = """def shift(float32(N,C,H,W) I, int32(C) SH, int32(C) SW, float32(C,K) Wt) -> (Out) {
  Out(n,k,h,w) +=! I(n, c, h + 1 + SH(c), w + 1 + SW(c)) * Wt(c,k) where h in 0:H-2, w in 0:W-2
}
"""


def _compiled(options: dict[str, object]) -> tuple[Compiler, Specialized]:
    config = load_config()
    fn = analyze(parse(FIXED, "<test>")).functions[0]
    spec = specialize(fn, {"I": (2, 6, 9, 10), "SH": (6,), "SW": (6,), "Wt": (6, 40)}, {})
    compiler = Compiler(config, select_target(config.target), options=options)
    return compiler, spec


def test_compiled_copy_is_in_the_ir_and_fails_like_the_kernel_without_it() -> None:
    rng = np.random.default_rng(4)
    inputs = {"I": rng.standard_normal((2, 6, 9, 10)).astype(np.float32),
              "Wt": rng.standard_normal((6, 40)).astype(np.float32)}
    inputs["SH"], inputs["SW"] = _shifts(rng, 6)
    messages, results = [], []
    for options in ({}, {"gathercopy.enabled": False}):
        compiler, spec = _compiled(options)
        assert ("gather" in _tags(compiler.ir(spec).body)) == (not options)
        compiled = compiler.compile(spec)
        out = {"Out": np.full((2, 40, 7, 8), np.nan, np.float32)}
        compiled.run(inputs, {}, out)
        results.append(out["Out"])
        broken = dict(inputs, SW=inputs["SW"].copy())
        broken["SW"][3] = 2
        with pytest.raises(pt.OutOfBoundsError) as error:
            compiled.run(broken, {}, {"Out": np.zeros((2, 40, 7, 8), np.float32)})
        messages.append(str(error.value))
    np.testing.assert_allclose(results[0], results[1], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(results[0], _shift_reference(inputs["I"], inputs["SH"],
                                                            inputs["SW"], inputs["Wt"]),
                               rtol=1e-4, atol=1e-4)
    assert messages[0] == messages[1]
    assert "in dimension 3, outside its bounds (the index comes from data)" in messages[0]
