"""Pass collapse: two loop indices that walk one contiguous stretch of every buffer become
one index. Golden IR (a 1x1 convolution, a fused batch norm, an elementwise kernel that
becomes one loop), the cases that must stay apart, random shapes and layouts through the
IR interpreter, and compiled kernels against the reference interpreter with sizes that
divide no tile and sliced (non-contiguous) inputs."""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import polytile as pt
from polytile.bench.memorybound import BATCHNORM, GROUPNORM
from polytile.config import Config
from polytile.errors import ArgumentError, TuningEntryWarning
from polytile.ir import nodes as N
from polytile.ir.parser import parse_function
from polytile.ir.verify import verify
from polytile.passes.collapse import collapse
from polytile.passes.fuse import fuse
from polytile.sema.specialize import specialize
from polytile.targets.target import host_features, load_target, supports
from polytile.tune.database import TuningDatabase
from polytile.tune.options import Options

from .helpers import assert_same_meaning, check_pass, check_round_trip, lowered, target

AVX2 = target("cpu-avx2")

CONV1X1 = """
def conv1x1(float(N,C,H,W) X, float(C,K) Wt) -> (O) {
  O(n,k,h,w) +=! X(n,c,h,w) * Wt(c,k)
}
"""
SCALE = """
def scale(float(N,C,H,W) X, float(C) s) -> (Y) {
  Y(n,c,h,w) = X(n,c,h,w) * s(c)
}
"""
COPY = """
def copy(float(N,C,H,W) X) -> (Y) {
  Y(n,c,h,w) = X(n,c,h,w) + 1
}
"""


def kernels(fn: N.Function) -> list[N.Block]:
    """The leaf blocks of `fn` (kernels and the members of fused row loops)."""
    out = []

    def walk(b: N.Block) -> None:
        nested = [s for s in b.stmts if isinstance(s, N.Block)]
        if not nested and b is not fn.body:
            out.append(b)
        for s in nested:
            walk(s)
    walk(fn.body)
    return out


def loop_names(block: N.Block) -> list[str]:
    return [i.name for i in block.idxs if i.affine is None]


# ---------------------------------------------------------------- golden

def test_a_1x1_convolution_runs_over_h_w_as_one_index() -> None:
    before = lowered(CONV1X1, {"X": (2, 5, 6, 7), "Wt": (5, 3)})
    after = collapse(before, AVX2, {})
    check_pass("collapse_conv1x1", before, after)
    assert [loop_names(b) for b in kernels(after)] == [["n", "k", "h_w"],
                                                       ["n", "k", "h_w", "c"]]


def test_members_of_a_fused_row_loop_merge_through_its_whole_row_views() -> None:
    before = fuse(lowered(BATCHNORM, {"X": (3, 4, 5, 6), "gamma": (4,), "beta": (4,)}),
                  AVX2, {"strategy": "rows"})
    after = collapse(before, AVX2, {})
    check_pass("collapse_batchnorm_fused", before, after)
    merged = {b.name: loop_names(b) for b in kernels(after)}
    # The normalization joined the loop over channels (fuse's side member): c is passed.
    assert merged["s0"] == ["n", "h_w"] and merged["s4"] == ["n", "h_w"]


def test_an_elementwise_kernel_over_contiguous_arrays_becomes_one_loop() -> None:
    before = lowered(COPY, {"X": (2, 3, 4, 5)})
    after = collapse(before, AVX2, {})
    check_pass("collapse_elementwise", before, after)
    [k] = kernels(after)
    assert loop_names(k) == ["n_c_h_w"] and k.idxs[0].range == 120
    assert [r.shape.sizes for r in after.body.refs] == [(120,), (120,)]


def test_disabled_the_pass_changes_nothing() -> None:
    before = lowered(CONV1X1, {"X": (2, 5, 6, 7), "Wt": (5, 3)})
    assert collapse(before, AVX2, {"enabled": False}) == before


# ---------------------------------------------------------------- what must stay apart

APART = {
    # h walks every other row of X: not one stretch.
    "strided view": ("""
def f(float(N,C,H2,W) X) -> (O) {
  O(n,c,h,w) = X(n,c,2*h,w)
}""", {"X": (2, 3, 8, 5)}),
    # a 3x3 convolution's input X(n,c,h+r,w+s): h and w share their dimensions with r, s
    "border": ("""
def f(float(N,C,H,W) X, float(K,C,3,3) Wt) -> (O) {
  O(n,k,h,w) +=! X(n,c,h+r,w+s) * Wt(k,c,r,s)
}""", {"X": (2, 3, 7, 6), "Wt": (4, 3, 3, 3)}),
    # index(h) in the body
    "index in the body": ("""
def f(float(N,C,H,W) X) -> (O) {
  O(n,c,h,w) = X(n,c,h,w) + h
}""", {"X": (2, 3, 4, 5)}),
    # O's rows are X's columns
    "transposed output": ("""
def f(float(N,C,H,W) X) -> (O) {
  O(n,c,w,h) = X(n,c,h,w)
}""", {"X": (2, 3, 4, 5)}),
    # X's third subscript comes from data (checked per dimension at run time)
    "gather": ("""
def f(float(N,C,H,W) X, int32(H) I) -> (O) {
  O(n,c,h,w) = X(n,c,I(h),w)
}""", {"X": (2, 3, 4, 5), "I": (4,)}),
    # gamma(c, h) uses h without w
    "one of the pair alone": ("""
def f(float(N,C,H,W) X, float(C,H) gamma) -> (O) {
  O(n,c,h,w) = X(n,c,h,w) * gamma(c,h)
}""", {"X": (2, 3, 4, 5), "gamma": (3, 4)}),
}


@pytest.mark.parametrize("case", list(APART))
def test_h_and_w_stay_apart(case: str) -> None:
    source, shapes = APART[case]
    before = lowered(source, shapes)
    after = collapse(before, AVX2, {})
    verify(after)
    check_round_trip(after)
    assert_same_meaning(before, after, int_high={"I": 4})
    [kernel] = [k for k in kernels(after) if "init" not in k.tags]
    names = loop_names(kernel)
    assert not any({"h", "w"} <= set(n.split("_")) for n in names), names
    assert "w" in names, names


# A constraint on h (no lowering makes one; a pass could): h and w stay apart.
CONSTRAINED = """\
function f(p0, o0) {
  block main #main (
    in p0[0, 0] float32(4:5, 5:1)
    out o0[0, 0] float32(4:5, 5:1)
  ) {
    block s0 [i0:4, i1:5] #elementwise #kernel (
      -i0 + 2 >= 0
      out o0 <- o0[i0, i1] float32(1:5, 1:1)
      in p0 <- p0[i0, i1] float32(1:5, 1:1)
    ) {
      $p0 = load(p0)
      o0 = store($p0)
    }
  }
}
"""


def test_an_index_in_a_constraint_stays_apart() -> None:
    fn = parse_function(CONSTRAINED)
    verify(fn)
    assert collapse(fn, AVX2, {}) == fn


def test_a_buffer_whose_other_user_cannot_merge_stays_whole() -> None:
    """Y is written row by row as h, w and read transposed by a second kernel: merging Y's
    last two dimensions would break the second kernel's view, so neither merges them."""
    source = """
def f(float(N,H,W) X) -> (Z) {
  Y(n,h,w) = X(n,h,w) * 2
  Z(n,w,h) = Y(n,h,w) + 1
}"""
    before = lowered(source, {"X": (2, 3, 4)})
    after = collapse(before, AVX2, {})
    verify(after)
    assert_same_meaning(before, after)
    for k in kernels(after):
        assert len(loop_names(k)) == 3, loop_names(k)


# ---------------------------------------------------------------- random shapes and layouts

@st.composite
def programs(draw: st.DrawFn) -> tuple[str, dict[str, tuple[int, ...]]]:
    """An elementwise or reducing kernel over a random rank-2..4 input, its output in a
    random dimension order, times a factor indexed by a random subset of dimensions."""
    rank = draw(st.integers(2, 4))
    sizes = tuple(draw(st.integers(1, 6)) for _ in range(rank))
    names = [f"d{k}" for k in range(rank)]
    dims = ",".join(f"D{k}" for k in range(rank))
    factor = sorted(draw(st.sets(st.integers(0, rank - 1))))
    used = ",".join(names[k] for k in factor)
    rhs = f"X({','.join(names)})" + (f" * F({used})" if factor else "")
    params = f"float({dims}) X" + (
        f", float({','.join(f'D{k}' for k in factor)}) F" if factor else "")
    if draw(st.booleans()):
        order = draw(st.permutations(names))
        body = f"O({','.join(order)}) = {rhs}"
    else:
        kept = sorted(draw(st.sets(st.integers(0, rank - 1), min_size=1)))
        body = f"O({','.join(names[k] for k in kept)}) +=! {rhs}"
    shapes = {"X": sizes}
    if factor:
        shapes["F"] = tuple(sizes[k] for k in factor)
    return f"def f({params}) -> (O) {{\n  {body}\n}}", shapes


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_random_shapes_and_layouts_keep_the_meaning(
        program: tuple[str, dict[str, tuple[int, ...]]]) -> None:
    source, shapes = program
    before = lowered(source, shapes)
    after = collapse(before, AVX2, {})
    verify(after)
    check_round_trip(after)
    assert_same_meaning(before, after, seeds=(0,), sum_of_products=True)
    assert collapse(after, AVX2, {}) == after          # nothing is left to merge


# ---------------------------------------------------------------- compiled, against the reference

needs_avx2 = pytest.mark.skipif(not supports(load_target("cpu-avx2"), host_features()),
                                reason="compiles for cpu-avx2: the host lacks AVX2")


def sliced(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """A float32 array of `shape` that is a non-contiguous slice of a larger one."""
    whole = rng.standard_normal(shape[:-1] + (2 * shape[-1] + 1,)).astype(np.float32)
    view = whole[..., 1::2]
    assert not view.flags.c_contiguous
    return view


@needs_avx2
@pytest.mark.parametrize("source,name,shapes", [
    (CONV1X1, "conv1x1", [(2, 19, 7, 9), (19, 21)]),
    (CONV1X1, "conv1x1", [(1, 8, 28, 28), (8, 24)]),
    (BATCHNORM, "batchnorm", [(4, 6, 7, 5), (6,), (6,)]),
    (GROUPNORM, "groupnorm", [(3, 4, 2, 7, 5), (4, 2), (4, 2)]),
    (SCALE, "scale", [(3, 5, 13, 11), (5,)]),
])
def test_compiled_kernels_agree_with_the_reference(source: str, name: str,
                                                   shapes: list[tuple[int, ...]]) -> None:
    rng = np.random.default_rng(11)
    args = [sliced(rng, s) for s in shapes]
    got = pt.define(source, target="cpu-avx2")[name](*args)
    want = pt.define(source, backend="interp")[name](*args)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)


@needs_avx2
def test_the_compiled_convolution_runs_the_merged_index(tmp_path: Path) -> None:
    module = pt.define(CONV1X1, target="cpu-avx2", config=Config(cache_dir=tmp_path))
    assert module.compiler is not None
    spec = specialize(module.program.functions[0], {"X": (2, 19, 7, 9), "Wt": (19, 21)}, {})
    fn = module.compiler.ir(spec)
    vectors = {k.schedule.vector.index for k in kernels(fn) if k.schedule.vector}
    assert vectors == {"i2_i3"}


# ---------------------------------------------------------------- schedules naming old indices

def _conv_spec(module: pt.Module) -> object:
    return specialize(module.program.functions[0], {"X": (2, 8, 6, 6), "Wt": (8, 16)}, {})


@needs_avx2
def test_a_schedule_naming_a_merged_index_is_refused_with_the_new_name(tmp_path: Path) -> None:
    from polytile.compile import Compiler
    module = pt.define(CONV1X1, target="cpu-avx2", config=Config(cache_dir=tmp_path))
    assert module.compiler is not None
    stale = Options.from_json({"schedules": {"s0": {"vector": "i3", "lanes": 8}}})
    compiler = Compiler(module.compiler.config, module.compiler.target,
                        options=stale.pass_options())
    with pytest.raises(ArgumentError, match="'i3' is not an index") as caught:
        compiler.build(_conv_spec(module))
    assert "collapse merged i3 into i2_i3" in str(caught.value.hint)
    turned_off = Compiler(module.compiler.config, module.compiler.target,
                          options={**stale.pass_options(), "collapse.enabled": False})
    turned_off.build(_conv_spec(module))


@needs_avx2
def test_a_stored_record_from_before_the_merge_falls_back_to_the_heuristics(
        tmp_path: Path) -> None:
    config = Config(cache_dir=tmp_path / "cache")
    module = pt.define(CONV1X1, target="cpu-avx2", config=config)
    assert module.compiler is not None
    stale = Options.from_json({"schedules": {"s0": {"vector": "i3", "lanes": 8}}})
    TuningDatabase.of(config).inject(module.compiler.tuning_key(_conv_spec(module)), stale,
                                     "conv1x1")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 8, 6, 6)).astype(np.float32)
    wt = rng.standard_normal((8, 16)).astype(np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = pt.define(CONV1X1, target="cpu-avx2", config=config).conv1x1(x, wt)
    np.testing.assert_allclose(got, np.einsum("nchw,ck->nkhw", x, wt), rtol=1e-4, atol=1e-4)
    [report] = [w for w in caught if issubclass(w.category, TuningEntryWarning)]
    assert "collapse merged i3 into i2_i3" in str(report.message)


def test_a_gather_copy_keeps_its_indices_and_its_contraction_merges() -> None:
    """Pass gathercopy's dense copy of a shifted image is written by a block that also
    reads the bordered image (its rows 2 wider): that copy keeps h and w and writes the
    merged dimension at W*h + w, and the contraction on the copy runs over h_w."""
    from polytile.passes.gathercopy import gathercopy

    from .test_ptrinc import SHIFT_CENTERED
    copied = gathercopy(lowered(SHIFT_CENTERED, {"I": (2, 5, 7, 6), "SH": (5,), "SW": (5,),
                                                  "Wt": (3, 5)}), AVX2, {"min_reuse": 2})
    after = collapse(copied, AVX2, {})
    verify(after)
    assert_same_meaning(copied, after, int_high={"SH": 2, "SW": 2})
    names = {k.name: loop_names(k) for k in kernels(after)}
    assert names["s0_copy"] == ["n", "c", "h", "w"]
    assert "h_w" in names["s0"] and "h" not in names["s0"]
    (copy_view,) = [r for k in kernels(after) if k.name == "s0_copy" for r in k.refs
                    if r.dir == "out"]
    assert str(copy_view.access[-1]) in ("4*h + w", "w + 4*h")
