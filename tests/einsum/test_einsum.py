"""pt.einsum against NumPy references computed independently of polytile's parser and
lowering (tests/einsum/cases.py), compiled and on the TC reference interpreter; the
shift convolution and 3x3 convolutions of the paper; the errors a call can meet."""
from __future__ import annotations

import array
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numpy.lib.stride_tricks import sliding_window_view

import polytile as pt
from polytile import dtypes
from polytile.einsum import compile_einsum, einsum_tc
from tests.einsum.cases import Case, cases

SETTINGS = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow,
                                                      HealthCheck.data_too_large]}


def _inputs(case: Case, rng: np.random.Generator, strided: bool) -> list[np.ndarray]:
    arrays = []
    for shape in case.shapes():
        if strided:     # every other element of a larger array: not C-contiguous
            big = rng.standard_normal(tuple(2 * d for d in shape)).astype(np.float32)
            arrays.append(big[tuple(slice(None, None, 2) for _ in shape)])
        else:
            arrays.append(rng.standard_normal(shape).astype(np.float32))
    return arrays


def _check(case: Case, backend: str, strided: bool) -> None:
    arrays = _inputs(case, np.random.default_rng(len(case.spec)), strided)
    want = case.reference(arrays)
    types = tuple("float32" for _ in arrays)
    tables = tuple(sorted((n, dtypes.from_numpy(v.dtype).name)  # type: ignore[union-attr]
                          for n, v in case.table_values.items()))
    program = compile_einsum(case.spec, types, tables, backend)
    got = program(*arrays, **case.table_values)
    assert got.shape == want.shape, (case.spec, program.tc)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=program.tc)
    if backend == "c":      # pt.einsum is the same program through the cache
        np.testing.assert_array_equal(pt.einsum(case.spec, *arrays, **case.table_values), got)


@settings(max_examples=40, **SETTINGS)
@given(cases(), st.booleans())
def test_random_specs_on_the_reference_interpreter_match_numpy(case: Case, strided: bool
                                                               ) -> None:
    _check(case, "interp", strided)


@settings(max_examples=14, **SETTINGS)
@given(cases(), st.booleans())
def test_random_specs_compiled_match_numpy(case: Case, strided: bool) -> None:
    _check(case, "c", strided)


def _conv_reference(x: np.ndarray, w: np.ndarray, stride: int = 1, dilation: int = 1
                    ) -> np.ndarray:
    """NCHW input, (C, K, R, S) filter, no padding, from NumPy's windows."""
    r, s = w.shape[2:]
    span = (dilation * (r - 1) + 1, dilation * (s - 1) + 1)
    windows = sliding_window_view(x.astype(np.float64), span, axis=(2, 3))
    windows = windows[:, :, ::stride, ::stride, ::dilation, ::dilation]
    return np.einsum("nchwrs,ckrs->nkhw", windows, w.astype(np.float64))


@pytest.mark.parametrize("spec, stride, dilation", [
    ("nc(h+r)(w+s),ckrs->nkhw", 1, 1),
    ("nc(2h+r)(2w+s),ckrs->nkhw", 2, 1),
    ("nc(h+2r)(w+2s),ckrs->nkhw", 1, 2),
])
def test_convolutions_match_numpy(spec: str, stride: int, dilation: int) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 13, 11)).astype(np.float32)
    w = rng.standard_normal((5, 6, 3, 3)).astype(np.float32)
    np.testing.assert_allclose(pt.einsum(spec, x, w), _conv_reference(x, w, stride, dilation),
                               rtol=1e-4, atol=1e-4)


def _shift_reference(x: np.ndarray, sh: np.ndarray, sw: np.ndarray, w: np.ndarray
                     ) -> np.ndarray:
    """Channel c moved by (sh[c], sw[c]) inside a one-pixel border, then a 1x1 conv."""
    _n, c, h, wd = x.shape
    moved = np.stack([x[:, k, 1 + sh[k]:h - 1 + sh[k], 1 + sw[k]:wd - 1 + sw[k]]
                      for k in range(c)], axis=1).astype(np.float64)
    return np.einsum("nchw,ck->nkhw", moved, w.astype(np.float64))


def test_the_shift_convolution_matches_numpy() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 7, 10, 9)).astype(np.float32)
    sh, sw = (rng.integers(-1, 2, 7).astype(np.int32) for _ in range(2))
    sh[0], sw[1] = 1, 1     # the widest shift is present: the output is 8x7
    w = rng.standard_normal((7, 5)).astype(np.float32)
    got = pt.einsum("nc(h+1+sh[c])(w+1+sw[c]),ck->nkhw", x, w, sh=sh, sw=sw)
    np.testing.assert_allclose(got, _shift_reference(x, sh, sw, w), rtol=1e-4, atol=1e-4)


def test_the_sparse_filter_of_the_paper_matches_numpy() -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, 9, 8)).astype(np.float32)
    off_h, off_w = rng.integers(0, 5, 7), rng.integers(0, 5, 7)
    off_h[0] = off_w[0] = 4
    w = rng.standard_normal((4, 3, 7)).astype(np.float32)
    got = pt.einsum("nc(h+off_h[x])(w+off_w[x]),kcx->nkhw", x, w, off_h=off_h, off_w=off_w)
    want = sum(np.einsum("nchw,kc->nkhw", x[:, :, a:a + 5, b:b + 4].astype(np.float64),
                         w[:, :, k]) for k, (a, b) in enumerate(zip(off_h, off_w)))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_table_value_out_of_range_is_an_out_of_bounds_error() -> None:
    x = np.ones((1, 2, 5, 5), np.float32)
    w = np.ones((2, 3), np.float32)
    sh = np.array([0, -1], np.int32)      # channel 1 reads row -1 at h = 0
    with pytest.raises(pt.OutOfBoundsError, match="outside its bounds"):
        pt.einsum("nc(h+sh[c])w,ck->nkhw", x, w, sh=sh)


def test_integer_operands_follow_tc_promotion() -> None:
    rng = np.random.default_rng(3)
    a = rng.integers(-50, 50, (4, 6)).astype(np.int16)
    b = rng.integers(-50, 50, (6, 3)).astype(np.int32)
    got = pt.einsum("ij,jk->ik", a, b)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, a.astype(np.int32) @ b)


def test_operands_of_other_kinds_pass_through_the_adapters() -> None:
    x = array.array("f", [1.0, 2.0, 3.0])
    y = np.array([4.0, 5.0, 6.0], np.float32)
    np.testing.assert_array_equal(pt.einsum("i,i->i", x, y), np.array([4, 10, 18], np.float32))


def test_a_repeated_call_neither_parses_nor_defines(monkeypatch: pytest.MonkeyPatch) -> None:
    x = np.ones((3, 4), np.float32)
    first = compile_einsum("ij->ji", ("float32",))

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("parsed or defined again")
    # sys.modules: the attribute polytile.einsum is the function, not the package
    monkeypatch.setattr(sys.modules["polytile.einsum"], "parse_spec", refuse)
    monkeypatch.setattr("polytile.api.define", refuse)
    np.testing.assert_array_equal(pt.einsum("ij->ji", x), x.T)
    assert compile_einsum("ij->ji", ("float32",), (), "c") is first


@pytest.mark.parametrize("call, message", [
    (lambda: pt.einsum("ij,jk->ik", np.ones((2, 3), np.float32)),
     "the spec has 2 operand(s), the call gives 1"),
    (lambda: pt.einsum("ijk->i", np.ones((2, 3), np.float32)),
     "operand 0 has 2 dimension(s), its subscripts name 3"),
    (lambda: pt.einsum("(i+sh[j])j->i", np.ones((2, 3), np.float32)),
     "the spec reads table sh, which the call does not pass"),
    (lambda: pt.einsum("ij->i", np.ones((2, 3), np.float32), sh=np.zeros(2, np.int32)),
     "the call passes sh=..., which the spec does not read"),
    (lambda: pt.einsum("(i+sh[j])j->i", np.ones((2, 3), np.float32), sh=np.zeros(3)),
     "table sh holds float64; a table holds integers"),
    (lambda: pt.einsum("ij->i", [[1.0]]), "operand 0 is a list, not an array"),
])
def test_bad_calls_are_argument_errors(call, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(pt.ArgumentError) as e:
        call()
    assert e.value.message == message


def test_sizes_that_disagree_are_refused_by_tc() -> None:
    with pytest.raises(pt.ArgumentError):
        pt.einsum("ij,jk->ik", np.ones((2, 3), np.float32), np.ones((4, 2), np.float32))


def test_an_index_sized_only_through_two_tables_is_unsupported() -> None:
    with pytest.raises(pt.UnsupportedError, match="depend on each other"):
        einsum_tc("(h+r+sh[c])c->h", ["float32"], {"sh": "int32"})


def test_an_index_tc_cannot_size_is_a_range_inference_error() -> None:
    with pytest.raises(pt.RangeInferenceError) as e:
        pt.einsum("b(2h+r+3)->bh", np.ones((2, 9), np.float32))
    assert e.value.message == "range of h is ambiguous: it is only used together with r in in0(...)"
    assert e.value.hint is not None and "plain subscript" in e.value.hint


@pytest.mark.parametrize("spec, make, want", [
    ("ij->", lambda x: (x,), lambda x: x.sum()),
    ("ii->i", lambda x: (x,), np.diagonal),
    (",ij->ij", lambda x: (np.float32(3), x), lambda x: 3 * x),
    ("(-i+2)j->ij", lambda x: (x,), lambda x: x[::-1]),
    ("i(j+1),j->i", lambda x: (x, x[0, :2].copy()), lambda x: x[:, 1:] @ x[0, :2]),
])
def test_numpy_einsum_forms(spec: str, make, want) -> None:  # type: ignore[no-untyped-def]
    x = np.random.default_rng(5).standard_normal((3, 3)).astype(np.float32)
    np.testing.assert_allclose(pt.einsum(spec, *make(x)), want(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("spec, tables", [
    ("nc(h+1+sh[c])(w+1+sw[c]),ck->nkhw", (("sh", "int32"), ("sw", "int32"))),
    ("nc(h+r)(w+s),kcrs->nkhw", ()),
])
def test_the_kernels_run_through_pointer_increments(spec: str, tables) -> None:  # type: ignore[no-untyped-def]
    """The paper's compilation: pass ptrinc precomputes one increment per reduction step
    (a #ptrinc block) and the contraction reads its operand through it."""
    from polytile.ir import nodes as N
    from polytile.sema.specialize import specialize

    program = compile_einsum(spec, ("float32", "float32"), tables)
    compiler = program.module.compiler
    assert compiler is not None
    fn = program.module["einsum"].fn
    x_shape = (2, 8, 12, 12)
    shapes = {"in0": x_shape, "in1": (8, 4) if tables else (4, 8, 3, 3)}
    shapes |= {name: (8,) for name, _ in tables}
    ir = compiler.ir(specialize(fn, shapes, {"size_h": 10, "size_w": 10} if tables else {}))

    def blocks(b: N.Block) -> list[N.Block]:
        return [b] + [x for s in b.stmts if isinstance(s, N.Block) for x in blocks(s)]
    found = blocks(ir.body)
    assert any("ptrinc" in b.tags for b in found)
    assert any(isinstance(s, N.Load) and s.offset is not None
               for b in found if "contraction" in b.tags for s in b.stmts)


def test_tuning_runs_on_the_callers_tables_and_later_calls_use_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The tuner's own random inputs would send a shift table out of range; tuning through
    the program runs on the caller's values, and pt.einsum then compiles with the best."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 6, 9, 10)).astype(np.float32)
    w = rng.standard_normal((6, 5)).astype(np.float32)
    sh = rng.integers(-1, 2, 6).astype(np.int32)
    sh[0] = 1                  # so the reference's one-row border on each side fits
    spec = "nc(h+1+sh[c])w,ck->nkhw"
    program = compile_einsum(spec, ("float32", "float32"), (("sh", "int32"),))
    result = program.tune(x, w, tables={"sh": sh}, candidates=3, progress=False)
    assert result.candidates >= 1
    assert result.key.signature.endswith("| 7")          # h in 0:9-1-max(sh), from the table
    from polytile.config import load_config
    from polytile.tune.database import lookup
    assert lookup(load_config(), result.key) is not None       # stored for later calls
    want = _shift_reference(np.pad(x, ((0, 0), (0, 0), (0, 0), (1, 1))), sh,
                            np.zeros(6, np.int32), w)
    np.testing.assert_allclose(pt.einsum(spec, x, w, sh=sh), want, rtol=1e-4, atol=1e-4)
