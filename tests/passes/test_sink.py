"""Pass sink: a copy of what a tiled block wrote runs inside that block's iterations, a
chunk at a time. Golden IR of a group convolution whose transpose (with its bias) moves
into the contraction, the schedules it leaves alone, `analysis.sink`'s and the
verifier's refusals of a reader that reads across chunks, and compiled kernels against
the reference interpreter on sizes that divide no tile."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import polytile as pt
from polytile.analysis.sink import final_reads
from polytile.bench.contractions import GCONV
from polytile.errors import IRError
from polytile.ir import nodes as N
from polytile.ir.polyhedra import Scope
from polytile.ir.verify import verify
from polytile.passes.pipeline import run_pipeline
from polytile.passes.sink import sink
from polytile.targets.target import host_features, load_target, supports

from .helpers import assert_same_meaning, block, check_pass, lowered, target, with_block

AVX512, AVX2 = target("cpu-avx512"), target("cpu-avx2")


def _without_sink(t):  # type: ignore[no-untyped-def]
    return replace(t, passes=tuple(p for p in t.passes if p[0] != "sink"))


def _gconv(n: int, g: int, c: int, h: int, w: int) -> N.Function:
    return lowered(GCONV, {"I": (n, g, c, h, w), "W1": (g, 16, c, 3, 3), "B": (g, 16)})


def _scheduled(t, fn: N.Function) -> N.Function:  # type: ignore[no-untyped-def]
    return run_pipeline(fn, _without_sink(t), {})


def test_the_transpose_runs_in_the_contractions_iterations() -> None:
    before = _scheduled(AVX512, _gconv(2, 32, 16, 6, 6))
    after = sink(before, AVX512, {})
    check_pass("sink_gconv", before, after)
    names = [s.name for s in after.body.stmts if isinstance(s, N.Block)]
    assert "s0_out" not in names
    s0 = block(after, "s0")
    assert [s.name for s in s0.stmts if isinstance(s, N.Block)] == ["s0_tile", "s0_out"]
    assert s0.ref("O").dir == "inout"
    assert sink(before, AVX512, {"enabled": False}) == before


def test_what_it_leaves_alone() -> None:
    # cpu-avx2 sums the 144-step reduction in chunks: an iteration of the contraction
    # does not finish its part of the output.
    chunked = _scheduled(AVX2, _gconv(2, 32, 16, 6, 6))
    assert sink(chunked, AVX2, {}) == chunked
    # A chunk (here 2 KiB) over half of L2 would not be in cache when the copy reads it.
    small = replace(AVX512, cache_bytes=tuple((k, 2048 if k == "L2" else v)
                                              for k, v in AVX512.cache_bytes))
    scheduled = _scheduled(AVX512, _gconv(2, 32, 16, 6, 6))
    assert sink(scheduled, small, {}) == scheduled


def test_a_reader_across_chunks_is_refused() -> None:
    after = sink(_scheduled(AVX512, _gconv(2, 32, 16, 6, 6)), AVX512, {})
    s0 = block(after, "s0")
    copy = s0.stmts[-1]
    assert isinstance(copy, N.Block)
    # The copy reads the next group's chunk: another iteration writes it.
    moved = tuple(replace(r, access=(r.access[0], r.access[1] + 1, *r.access[2:]))
                  if r.from_ == "O" else r for r in copy.refs)
    bad = replace(s0, stmts=(*s0.stmts[:-1], replace(copy, refs=moved)))
    why = final_reads(Scope.root(after.body).child(bad))
    assert why is not None and "does not write in the same iteration" in why
    assert final_reads(Scope.root(after.body).child(s0)) is None
    with pytest.raises(IRError):
        verify(with_block(after, "s0", bad))


@settings(max_examples=6, deadline=None)
@given(n=st.integers(1, 3), g=st.sampled_from([3, 8, 32]), c=st.sampled_from([8, 16]),
       h=st.integers(4, 7), w=st.integers(4, 7))
def test_the_move_keeps_the_meaning(n: int, g: int, c: int, h: int, w: int) -> None:
    """Whatever chunks autotile picks (sunk or not), the IR means what it meant."""
    before = _scheduled(AVX512, _gconv(n, g, c, h, w))
    after = sink(before, AVX512, {})
    verify(after)
    assert_same_meaning(before, after, seeds=(n,))


RUNNABLE = [t for t in ("cpu-avx512", "cpu-avx2") if supports(load_target(t), host_features())]


@pytest.mark.parametrize("target_name", RUNNABLE)
@pytest.mark.parametrize("n, g, c, h, w", [(3, 32, 16, 5, 7), (4, 8, 16, 9, 6)])
def test_compiled_group_convolutions_match_the_reference(target_name: str, n: int, g: int,
                                                         c: int, h: int, w: int) -> None:
    """A strided image and bias; on cpu-avx512 (file cache sizes or the host's) the copy
    runs inside the contraction."""
    fn = pt.define(GCONV, target=target_name).gconv
    ref = pt.define(GCONV, backend="interp").gconv
    rng = np.random.default_rng(n * 100 + g)
    image = np.zeros((n, g, c, h, 2 * w), np.float32)[..., ::2]
    image[...] = rng.standard_normal((n, g, c, h, w))
    weights = rng.standard_normal((g, 16, c, 3, 3)).astype(np.float32)
    bias = rng.standard_normal((g, 32)).astype(np.float32)[:, ::2]
    np.testing.assert_allclose(fn(image, weights, bias), ref(image, weights, bias),
                               rtol=1e-4, atol=1e-4)


def test_a_folded_contraction_is_not_split_over_the_chunks_of_its_pack() -> None:
    """The tuner found this schedule (gconv 32x32x16x16x14x14, AMD EPYC Zen 5 host): the
    packing of the weights tiled along the window row, and the contraction tiled so that
    its chunks are the pack's. Moved into the pack's loop, the contraction, whose first
    writes pass fold made stores (`first(i6_c)`), started its window sum at 0 again in
    every chunk and kept only the last row's. A contraction an init is folded into now
    stays where it is (another schedule, tiled along the groups, split no reduction but
    left the fold unprovable for the verifier: also refused)."""
    from polytile.sema.specialize import specialize
    from polytile.tune.options import Options
    options = Options.from_json({
        "passes": {"ptrinc.enabled": False, "pack.min_reuse": 1, "outlayout.enabled": True},
        "schedules": {
            "pack_p1_panels0": {"lanes": 1, "parallel": False, "tiles": [["a3", 1]],
                                "unroll": [], "vector": None, "vectors": 1},
            "s0": {"lanes": 16, "parallel": True, "tiles": [["i1", 1], ["i6", 1]],
                   "unroll": [], "vector": "i2", "vectors": 1}}}).pass_options()
    mod = pt.define(GCONV, target="cpu-avx512")
    mod.compiler.options = options
    rng = np.random.default_rng(7)
    image = rng.standard_normal((4, 4, 16, 8, 8)).astype(np.float32)
    weights = rng.standard_normal((4, 16, 16, 3, 3)).astype(np.float32)
    bias = rng.standard_normal((4, 16)).astype(np.float32)
    ir = mod.compiler.ir(specialize(mod.gconv.fn, {"I": image.shape, "W1": weights.shape,
                                                   "B": bias.shape}, {}))
    verify(ir)
    pack = block(ir, "pack_p1_panels0")
    assert "s0" not in [s.name for s in pack.stmts if isinstance(s, N.Block)]
    assert block(ir, "s0").stmts[0].schedule.first == ("i6_c",)  # type: ignore[union-attr]
    if "cpu-avx512" in RUNNABLE:
        ref = pt.define(GCONV, backend="interp").gconv
        np.testing.assert_allclose(mod.gconv(image, weights, bias), ref(image, weights, bias),
                                   rtol=1e-4, atol=1e-4)
