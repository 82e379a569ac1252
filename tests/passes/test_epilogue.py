"""Pass epilogue: a layer's bias and activation become one statement after its
contraction, which pass autotile runs on each register tile right after its sums. Golden
IR of the rewrite and of the placed epilogue, what either leaves alone, `analysis.sink`'s
and the verifier's refusal of an epilogue outside its tile, and compiled kernels against
the reference interpreter on sizes that divide no tile, with strided inputs."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import polytile as pt
from polytile.analysis.fold import chain
from polytile.analysis.sink import final_reads
from polytile.bench.memorybound import LAYERNORM
from polytile.errors import IRError
from polytile.ir import nodes as N
from polytile.ir.polyhedra import Scope
from polytile.ir.printer import format_function
from polytile.ir.verify import verify
from polytile.passes.epilogue import EPILOGUE, epilogue
from polytile.passes.pipeline import run_pipeline
from polytile.targets.target import host_features, load_target, supports

from .helpers import (
    assert_same_meaning,
    block,
    check_golden,
    check_pass,
    lowered,
    target,
    with_block,
)

AVX512, AVX2 = target("cpu-avx512"), target("cpu-avx2")

FCRELU = """
def fcrelu(float(B,I) x, float(O,I) w, float(O) b) -> (y) {
  y(n,o) = b(o)
  y(n,o) += x(n,i) * w(o,i)
  y(n,o) = fmaxf(y(n,o), 0)
}
"""


def _fcrelu(batch: int, inputs: int, outputs: int) -> N.Function:
    return lowered(FCRELU, {"x": (batch, inputs), "w": (outputs, inputs), "b": (outputs,)})


def _tagged(fn: N.Function) -> list[str]:
    return [s.name for s in fn.body.stmts if isinstance(s, N.Block) and EPILOGUE in s.tags]


def test_the_bias_moves_into_the_activation() -> None:
    before = _fcrelu(40, 96, 80)
    after = epilogue(before, AVX512, {})
    check_pass("epilogue_fcrelu", before, after)
    s0, s2 = block(after, "s0"), block(after, "s2")
    assert "init" in s0.tags and len(s0.refs) == 1          # y = 0: pass fold's to make
    assert _tagged(after) == ["s2"] and {r.from_ for r in s2.refs} == {"y", "b"}
    assert epilogue(before, AVX512, {"enabled": False}) == before


LINEAR = """
def linear(float(B,I) x, float(O,I) w, float(O) b) -> (y) {
  z(n,o) +=! x(n,i) * w(o,i)
  y(n,o) = 1 / (1 + exp(-(z(n,o) + b(o))))
}
"""


def test_a_temporary_sum_is_written_into_the_output_it_becomes() -> None:
    # z is read by the next statement only, element by element: the contraction adds into
    # y, and y = sigmoid(y + b) is in place, an epilogue; z is gone.
    before = lowered(LINEAR, {"x": (40, 96), "w": (80, 96), "b": (80,)})
    after = epilogue(before, AVX512, {})
    check_pass("epilogue_renamed", before, after)
    assert _tagged(after) == ["s1"] and "z" not in {r.into for r in after.body.refs}
    assert {r.from_ for s in after.body.stmts if isinstance(s, N.Block)
            for r in s.refs if r.dir != "in"} == {"y"}
    placed = run_pipeline(before, AVX512, {})
    verify(placed)
    assert [s.name for s in chain(block(placed, "s0"))[-2].stmts][-1] == "s1"
    assert_same_meaning(before, placed, sum_of_products=True)


def test_a_temporary_needed_elsewhere_keeps_its_name() -> None:
    shapes = {"x": (8, 9), "w": (9, 9)}
    for source in ("""
def f(float(B,I) x, float(O,I) w) -> (y, u) {
  z(n,o) +=! x(n,i) * w(o,i)
  y(n,o) = fmaxf(z(n,o), 0)
  u(n,o) = z(n,o) * 2
}
""", """
def f(float(B,I) x, float(O,I) w) -> (y) {
  y(n,i) = x(n,i) * 2
  z(n,o) +=! y(n,i) * w(o,i)
  y(n,o) = fmaxf(z(n,o), 0)
}
""", """
def f(float(B,I) x, float(O,I) w) -> (y) {
  z(n,o) +=! x(n,i) * w(o,i)
  y(o,n) = fmaxf(z(n,o), 0)
}
""", """
def f(float(B,I) x, float(O,I) w) -> (z, y) {
  z(n,o) +=! x(n,i) * w(o,i)
  y(n,o) = fmaxf(z(n,o), 0)
}
"""):
        # Read after the statement; the output read by the contraction; written
        # transposed; not a temporary.
        before = lowered(source, shapes)
        after = epilogue(before, AVX512, {})
        assert any(r.into == "z" for r in after.body.refs), source
        assert _tagged(after) == [], source


def test_autotile_runs_it_in_the_register_tiles() -> None:
    before = _fcrelu(40, 96, 80)
    after = run_pipeline(before, AVX512, {})
    verify(after)
    check_golden("epilogue_placed", format_function(after))
    names = [s.name for s in after.body.stmts if isinstance(s, N.Block)]
    assert "s2" not in names
    levels = chain(block(after, "s1"))
    holder = levels[-2]
    assert [s.name for s in holder.stmts] == [levels[-1].name, "s2"]
    assert levels[-1].schedule.first == ()        # the zero fill folded into the sums
    assert block(after, "s0").schedule.folded == "s1"
    assert_same_meaning(before, after, sum_of_products=True)


def test_what_it_leaves_alone() -> None:
    # Something between the bias and the contraction reads y: the bias stays.
    read_between = lowered("""
def f(float(B,I) x, float(O,I) w, float(O) b) -> (y, z) {
  y(n,o) = b(o)
  z(n,o) = y(n,o) * 2
  y(n,o) += x(n,i) * w(o,i)
  y(n,o) = fmaxf(y(n,o), 0)
}
""", {"x": (8, 9), "w": (5, 9), "b": (5,)})
    after = epilogue(read_between, AVX512, {})
    assert "init" not in block(after, "s0").tags and _tagged(after) == ["s3"]
    # The statement after reads a neighbour of its element: no epilogue.
    neighbour = lowered("""
def f(float(B,I) x, float(O,I) w) -> (y, z) {
  y(n,o) +=! x(n,i) * w(o,i)
  z(n,o) = y(n,o) + y(n,o+1) where o in 0:O-1
}
""", {"x": (8, 9), "w": (5, 9)})
    assert epilogue(neighbour, AVX512, {}) == neighbour
    # A row reduction's statement after it stays in the row loop fuse makes.
    norm = run_pipeline(lowered(LAYERNORM, {"X": (6, 40), "gamma": (40,), "beta": (40,)}),
                        AVX512, {})
    fused = [s for s in norm.body.stmts if isinstance(s, N.Block) and "fused" in s.tags]
    assert len(fused) == 1 and any(EPILOGUE in m.tags for m in fused[0].stmts
                                   if isinstance(m, N.Block))


def test_a_small_layer_is_a_gemm_not_a_row_loop() -> None:
    # MLP3's last layer (64 x 32 weights fit pass fuse's budget): tiled, its epilogue in
    # its register tiles, rather than one row loop of fill, dot products and activation.
    layer = run_pipeline(_fcrelu(128, 64, 32), AVX512, {})
    assert not any("fused" in s.tags for s in layer.body.stmts if isinstance(s, N.Block))
    assert [s.name for s in chain(block(layer, "s1"))[-2].stmts][-1] == "s2"
    # A batched product of small matrices keeps its row loop.
    batched = run_pipeline(lowered("""
def f(float(B,K,D) C, float(B,L,D) X) -> (S) {
  S(b,k,l) +=! C(b,k,d) * X(b,l,d)
  S(b,k,l) = S(b,k,l) * 0.125
}
""", {"C": (64, 4, 32), "X": (64, 50, 32)}), AVX512, {})
    assert any("fused" in s.tags for s in batched.body.stmts if isinstance(s, N.Block))


def test_a_reduction_in_chunks_keeps_the_epilogue_a_kernel() -> None:
    # The 2000-step reduction is summed in chunks across the contraction's iterations:
    # a tile is not final before the last chunk.
    after = run_pipeline(_fcrelu(64, 2000, 128), AVX512, {})
    verify(after)
    names = [s.name for s in after.body.stmts if isinstance(s, N.Block)]
    assert names.index("s2") == names.index("s1") + 1


def test_an_epilogue_outside_its_tile_is_refused() -> None:
    after = run_pipeline(_fcrelu(40, 96, 80), AVX512, {})
    s1 = block(after, "s1")
    levels = chain(s1)
    assert len(levels) == 3
    holder = levels[1]
    kernel, moved = holder.stmts
    assert isinstance(moved, N.Block)
    # It updates the next row's tile, which another iteration writes.
    shifted = tuple(replace(r, access=(r.access[0] + 1, *r.access[1:])) if r.dir == "inout"
                    else r for r in moved.refs)
    bad_holder = replace(holder, stmts=(kernel, replace(moved, refs=shifted)))
    bad = replace(s1, stmts=(bad_holder,))
    why = final_reads(Scope.root(after.body).child(bad).child(bad_holder))
    assert why is not None and "does not write in the same iteration" in why
    assert final_reads(Scope.root(after.body).child(s1).child(holder)) is None
    with pytest.raises(IRError):
        verify(with_block(after, "s1", bad))


@settings(max_examples=8, deadline=None)
@given(batch=st.integers(1, 20), inputs=st.integers(1, 40), outputs=st.integers(1, 70))
def test_the_pipeline_keeps_the_meaning(batch: int, inputs: int, outputs: int) -> None:
    """Placed or not, renamed or not, the optimized IR means what the program meant."""
    shapes = {"x": (batch, inputs), "w": (outputs, inputs), "b": (outputs,)}
    for before in (_fcrelu(batch, inputs, outputs), lowered(LINEAR, shapes)):
        for t in (AVX512, AVX2):
            after = run_pipeline(before, t, {})
            verify(after)
            assert_same_meaning(before, after, seeds=(batch,), sum_of_products=True)


RUNNABLE = [t for t in ("cpu-avx512", "cpu-avx2", "cpu-generic")
            if supports(load_target(t), host_features())]

LAYERS = """
def mlp2(float(B,I) x, float(H,I) w1, float(H) b1, float(O,H) w2, float(O) b2,
         float(B,O) r) -> (y) {
  h(n,k) = b1(k)
  h(n,k) += x(n,i) * w1(k,i)
  h(n,k) = tanh(h(n,k)) * 0.5
  y(n,o) +=! h(n,k) * w2(o,k)
  y(n,o) = fmaxf(y(n,o) + b2(o), 0) + r(n,o)
}
"""


# The same layers with the second one's sum in a temporary (renamed into y).
RENAMED = LAYERS.replace("y(n,o) +=! h(n,k)", "z(n,o) +=! h(n,k)").replace(
    "fmaxf(y(n,o) + b2(o)", "fmaxf(z(n,o) + b2(o)")


@pytest.mark.parametrize("target_name", RUNNABLE)
@pytest.mark.parametrize("source, batch, inputs, hidden, outputs", [
    pytest.param(LAYERS, 37, 53, 71, 29, id="in-place-37"),
    pytest.param(LAYERS, 130, 100, 100, 70, id="in-place-130"),
    pytest.param(LAYERS, 5, 3, 17, 1, id="in-place-5"),
    pytest.param(RENAMED, 37, 53, 71, 29, id="temporary-37"),
    pytest.param(RENAMED, 5, 3, 17, 1, id="temporary-5")])
def test_compiled_layers_match_the_reference(source: str, target_name: str, batch: int,
                                             inputs: int, hidden: int, outputs: int) -> None:
    """A bias moved into a tanh, an epilogue with a residual, strided inputs."""
    fn = pt.define(source, target=target_name).mlp2
    ref = pt.define(source, backend="interp").mlp2
    rng = np.random.default_rng(batch + hidden)
    x = np.zeros((batch, 2 * inputs), np.float32)[:, ::2]
    x[...] = rng.standard_normal((batch, inputs))
    args = (x, rng.standard_normal((hidden, inputs)).astype(np.float32),
            rng.standard_normal(hidden).astype(np.float32),
            rng.standard_normal((outputs, hidden)).astype(np.float32),
            rng.standard_normal(2 * outputs).astype(np.float32)[::2],
            rng.standard_normal((batch, outputs)).astype(np.float32))
    np.testing.assert_allclose(fn(*args), ref(*args), rtol=1e-4, atol=1e-4)
