"""Compiled kernels that take the vector paths of polytile/codegen/vector.py agree with
independent NumPy references, on the host's default target and on cpu-avx2 and
cpu-generic (`define(src, target=...)`):

* outer-product register tiles (mm, N a multiple of 16 and not);
* dot-product tiles with a horizontal reduction (tmm with few columns or a long
  reduction, tbmm);
* elementwise math through the vector approximations (exp, log, tanh, erf, sigmoid)
  and lane-wise ops (fmaxf, sqrt);
* row and column max/min reductions with NaNs, including NaNs in tail lanes;
* partial vectors (rows of width 14 in a convolution and in elementwise code);
* boundary register tiles (sizes 1, 17, 37, 45, 67 against tiles of 4-16 x 8-32).

Every kernel is checked to run vector code (the leaf's schedule vector and the vector
block in the C); the sizes after the first stress remainders.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from conformance.test_conformance import assert_agrees
from scipy import special

import polytile as pt
from polytile.codegen.c import COptions, generate_c
from polytile.ir import nodes as N
from polytile.sema.specialize import specialize

F32 = 1e-5
TARGETS = [None, "cpu-avx2", "cpu-generic"]
LANES = {"cpu-avx512": 16, "cpu-avx2": 8, "cpu-generic": 4}


def f64(x: Any) -> np.ndarray:
    return np.asarray(x, np.float64)


def f32(x: Any) -> np.ndarray:
    return np.asarray(x, np.float64).astype(np.float32)


def normal(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


@dataclass(frozen=True)
class Kernel:
    name: str
    source: str
    sizes: tuple[tuple[int, ...], ...]                       # the first one must vectorize
    inputs: Callable[[np.random.Generator, tuple[int, ...]], tuple[np.ndarray, ...]]
    reference: Callable[..., Any]
    vector: str | None = "parallel"      # or "reduction" (dot style); None: not checked
    tolerance: float = F32

    @property
    def function(self) -> str:
        return self.source.split("def ", 1)[1].split("(", 1)[0]


def _with_nans(rng: np.random.Generator, m: int, n: int) -> np.ndarray:
    x = normal(rng, m, n)
    x[rng.random((m, n)) < 0.05] = np.nan
    x[0, 0] = np.nan                      # first lane of the first vector
    x[min(1, m - 1), n - 1] = np.nan      # last lane: a tail lane unless n % lanes == 0
    if m > 2:
        x[2, :] = np.nan                  # a row of NaNs
    return x


def _with_zeros_and_nans(rng: np.random.Generator, m: int, n: int) -> np.ndarray:
    x = normal(rng, m, n)
    x[rng.random((m, n)) < 0.2] = 0.0
    x[rng.random((m, n)) < 0.1] = np.nan
    x[0, -1] = np.nan                     # a tail lane unless n % lanes == 0
    return x


def _conv(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    n, _, h, wd = x.shape
    f, _, kh, kw = w.shape
    out = np.zeros((n, f, h - kh + 1, wd - kw + 1))
    for a in range(kh):
        for b in range(kw):
            out += np.einsum("nchw,fc->nfhw", f64(x)[:, :, a:a + h - kh + 1, b:b + wd - kw + 1],
                             f64(w)[:, :, a, b])
    return f32(out)


KERNELS = [
    Kernel("mm", "def mm(float(M,K) A, float(K,N) B) -> (C) {\n  C(m,n) +=! A(m,k) * B(k,n)\n}",
           ((37, 45, 64), (37, 45, 67), (45, 17, 1), (1, 45, 37)),
           lambda r, s: (normal(r, s[0], s[1]), normal(r, s[1], s[2])),
           lambda a, b: f32(f64(a) @ f64(b))),
    Kernel("mm_bias_relu", """def mmbr(float(M,K) A, float(K,N) B, float(N) c) -> (C) {
  C(m,n) +=! A(m,k) * B(k,n)
  C(m,n) = fmaxf(C(m,n) + c(n), 0)
}""", ((45, 37, 48), (17, 1, 33)),
           lambda r, s: (normal(r, s[0], s[1]), normal(r, s[1], s[2]), normal(r, s[2])),
           lambda a, b, c: f32(np.maximum(f64(a) @ f64(b) + f64(c), 0))),
    # Few columns (N < lanes of the widest target) or a long reduction: dot products.
    Kernel("tmm", "def tmm(float(M,K) A, float(N,K) B) -> (C) {\n  C(m,n) +=! A(m,kk) * B(n,kk)\n}",
           ((37, 3, 300), (17, 2, 53), (1, 1, 37)),
           lambda r, s: (normal(r, s[0], s[2]), normal(r, s[1], s[2])),
           lambda a, b: f32(f64(a) @ f64(b).T), vector="reduction"),
    Kernel("tbmm", "def tbmm(float(B,N,M) X, float(B,K,M) Y) -> (Z) {\n"
           "  Z(b,n,k) +=! X(b,n,m) * Y(b,k,m)\n}",
           ((3, 7, 37, 3), (2, 1, 45, 2)),
           lambda r, s: (normal(r, s[0], s[1], s[2]), normal(r, s[0], s[3], s[2])),
           lambda x, y: f32(np.einsum("bnm,bkm->bnk", f64(x), f64(y))), vector="reduction"),
    # A row loop's dot products into consecutive outputs (MLP3's hidden layers): the
    # sums of `lanes` accumulators go out as one vector (a tree of shuffles).
    Kernel("row_dot", """def rowdot(float(B,O) X, float(P,O) W) -> (Y) {
  H(b,o) = fmaxf(X(b,o), 0)
  Y(b,p) +=! H(b,o) * W(p,o)
}""", ((37, 64, 32), (5, 19, 13), (3, 64, 40)),
           lambda r, s: (normal(r, s[0], s[1]), normal(r, s[2], s[1])),
           lambda x, w: f32(np.maximum(f64(x), 0) @ f64(w).T), vector="reduction"),
    Kernel("math", """def math(float(M,N) X, float(M,N) P) -> (E, L, T, R, S, F, Q) {
  E(i,j) = exp(X(i,j))
  L(i,j) = log(P(i,j))
  T(i,j) = tanh(X(i,j))
  R(i,j) = erf(X(i,j))
  S(i,j) = sigmoid(X(i,j))
  F(i,j) = fmaxf(X(i,j), P(i,j) - 2)
  Q(i,j) = sqrt(P(i,j))
}""", ((37, 45), (1, 17), (5, 14)),
           lambda r, s: (4 * normal(r, *s), r.uniform(1e-3, 10, s).astype(np.float32)),
           lambda x, p: (f32(np.exp(f64(x))), f32(np.log(f64(p))), f32(np.tanh(f64(x))),
                         f32(special.erf(f64(x))), f32(special.expit(f64(x))),
                         np.fmax(x, p - np.float32(2)), f32(np.sqrt(f64(p))))),
    Kernel("gelu_residual", """def gelu(float(M,N) X, float(N) b, float(M,N) R) -> (Y) {
  Y(i,j) = 0.5 * (X(i,j) + b(j)) * (1 + erf((X(i,j) + b(j)) * 0.70710678)) + R(i,j)
}""", ((13, 67), (3, 14)),
           lambda r, s: (normal(r, *s), normal(r, s[1]), normal(r, *s)),
           lambda x, b, res: f32(0.5 * (f64(x) + f64(b)) * (
               1 + special.erf((f64(x) + f64(b)) * 0.70710678)) + f64(res))),
    Kernel("rowmaxmin", """def rowmm(float(M,N) X) -> (Mx, Mn) {
  Mx(i) max=! X(i,j)
  Mn(i) min=! X(i,j)
}""", ((13, 37), (7, 16), (5, 1), (3, 67)),
           lambda r, s: (_with_nans(r, *s),),
           lambda x: (np.max(x, axis=1), np.min(x, axis=1)), vector="reduction"),
    # No vector code today: fuse makes j (the output's index) the row loop of init and
    # reduction, which leaves only the strided i inside. Checked for NaN handling only.
    Kernel("colmax", """def colmax(float(M,N) X) -> (Mx) {
  Mx(j) max=! X(i,j)
}""", ((13, 37), (1, 17)),
           lambda r, s: (_with_nans(r, *s),),
           lambda x: np.max(x, axis=0), vector=None),
    Kernel("conv_w14", """def conv(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) {
  O(n,f,h,w) +=! I(n,c,h + kh,w + kw) * Wt(f,c,kh,kw)
}""", ((2, 3, 14, 14, 5),),
           lambda r, s: (normal(r, s[0], s[1], s[2], s[3]), normal(r, s[4], s[1], 3, 3)),
           _conv),
    # Comparisons, logic and selects on masks: a ReLU's derivative as autodiff writes it
    # (0.5 at 0), a threshold per column, a condition per row (one mask in every lane),
    # a mask turned into 1s and 0s, with NaNs (false in every ordered comparison).
    Kernel("masks", """def masks(float(M,N) X, float(M,N) G, float(N) t, float(M) r) -> (D, S, C) {
  D(i,j) = X(i,j) > 0.0 ? G(i,j) : X(i,j) == 0.0 ? G(i,j) * 0.5 : 0.0
  S(i,j) = r(i) > 0.0 && !(X(i,j) >= t(j)) || X(i,j) != X(i,j) ? X(i,j) : -G(i,j)
  C(i,j) = float(X(i,j) < t(j)) * G(i,j) + float(r(i) <= 0.0)
}""", ((13, 67), (5, 14), (1, 3)),
           lambda r, s: (_with_zeros_and_nans(r, *s), normal(r, *s), normal(r, s[1]),
                         normal(r, s[0])),
           lambda x, g, t, r: (
               np.where(x > 0, g, np.where(x == 0, g * np.float32(0.5), np.float32(0))),
               np.where(((r[:, None] > 0) & ~(x >= t)) | np.isnan(x), x, -g),
               f32(f64(x < t) * f64(g) + f64(r[:, None] <= 0))), tolerance=0.0),
    Kernel("rows_w14", """def scale(float(M,W) X, float(W) g) -> (Y) {
  Y(i,w) = X(i,w) * g(w) + 1
}""", ((37, 14), (1, 14)),
           lambda r, s: (normal(r, *s), normal(r, s[1])),
           lambda x, g: f32(f64(x) * f64(g) + 1)),
]

_MODULES: dict[tuple[str, str | None], pt.Module] = {}


def module(kernel: Kernel, target: str | None) -> pt.Module:
    key = (kernel.source, target)
    if key not in _MODULES:
        try:
            _MODULES[key] = pt.define(kernel.source, target=target)
        except pt.PolytileError as err:          # a host without AVX2
            pytest.skip(str(err))
    return _MODULES[key]


def leaves(b: N.Block) -> list[N.Block]:
    inner = [s for s in b.stmts if isinstance(s, N.Block)]
    return [b] if not inner else [leaf for s in inner for leaf in leaves(s)]


def vector_leaves(ir: N.Function) -> list[tuple[N.Block, str]]:
    found = []
    for leaf in leaves(ir.body):
        if leaf.schedule.vector is not None:
            found.append((leaf, leaf.schedule.vector.index))
    return found


def _is_reduction(leaf: N.Block, index: str) -> bool:
    outs = [r for r in leaf.refs if r.dir in ("out", "inout")]
    return all(not any(a.coeff(index) for a in r.access) for r in outs)


@pytest.mark.parametrize("target", TARGETS, ids=["default", "avx2", "generic"])
@pytest.mark.parametrize("kernel", KERNELS, ids=[k.name for k in KERNELS])
def test_vector_kernel(kernel: Kernel, target: str | None) -> None:
    mod = module(kernel, target)
    fn = mod[kernel.function]
    for k, size in enumerate(kernel.sizes):
        rng = np.random.default_rng(k)
        args = kernel.inputs(rng, size)
        want = kernel.reference(*args)
        want = want if isinstance(want, tuple) else (want,)
        got = fn(*args)
        got = got if isinstance(got, tuple) else (got,)
        names = [o.name for o in fn.fn.outputs]
        for name, g, w in zip(names, got, want):
            assert_agrees(g, w, kernel.tolerance, f"{kernel.name} {size}: {name}")
        again = fn(*args)                        # the cached fast path
        again = again if isinstance(again, tuple) else (again,)
        for g, a in zip(got, again):
            np.testing.assert_array_equal(g, a)
        if k == 0 and kernel.vector is not None:
            check_vector_code(kernel, mod, fn, args)


def check_vector_code(kernel: Kernel, mod: pt.Module, fn: Any, args: tuple) -> None:
    """The first size does take the vector path this test is about, at the target's width."""
    assert mod.compiler is not None
    target = mod.compiler.target
    shapes = {p.name: a.shape for p, a in zip(fn.fn.params, args) if p.kind == "input"}
    ir = mod.compiler.ir(specialize(fn.fn, shapes, {}))
    found = vector_leaves(ir)
    assert found, f"{kernel.name}: no leaf block is scheduled for vector code on {target.name}"
    kinds = {_is_reduction(leaf, index) for leaf, index in found}
    assert (kernel.vector == "reduction") in kinds, (kernel.name, target.name, kinds)
    lanes = {leaf.schedule.vector.lanes for leaf, _ in found if leaf.schedule.vector}
    assert lanes == {LANES[target.name]}, (kernel.name, target.name, lanes)
    text = generate_c(ir, COptions(symbol="polytile_kernel")).text
    assert ": vector" in text, f"{kernel.name} on {target.name}: the C has no vector block"
    assert f"vector_size({4 * LANES[target.name]})" in text


@pytest.mark.parametrize("target", ["cpu-avx512", "cpu-avx2", "cpu-generic"])
def test_dot_sums_into_consecutive_outputs_go_out_as_vectors(target: str) -> None:
    # Each group of dot products whose outputs are consecutive (a power of two, up to the
    # lanes) leaves as one vector made by shuffles, and one store; AVX-512's 8 sums fill
    # half a vector (count 8). Loop IR of any target, run by the loop interpreter; the
    # host runs the C in test_vector_kernel.
    from polytile.compile import Compiler
    from polytile.config import load_config
    from polytile.lang.parser import parse
    from polytile.loops.interp import run_kernel
    from polytile.loops.lower import lower
    from polytile.sema.analyze import analyze
    from polytile.targets.target import inspection_target

    kernel = next(k for k in KERNELS if k.name == "row_dot")
    fn = analyze(parse(kernel.source)).functions[0]
    compiler = Compiler(load_config(), inspection_target(target))
    for p, stores in ((32, {"cpu-avx512": ["(count 8) add="], "cpu-avx2": ["add= v"],
                            "cpu-generic": ["add= v", "add= v"]}[target]), (13, None)):
        rng = np.random.default_rng(p)
        x, w = normal(rng, 37, 64), normal(rng, p, 64)
        ir = compiler.ir(specialize(fn, {"X": x.shape, "W": w.shape}, {}))
        text = compiler.backend.generate(ir, compiler.target).text("loops")
        assert "reduce_add(" not in text or p == 13
        if stores is not None:
            found = [line.split("]", 1)[1].strip() for line in text.splitlines()
                     if "store" in line and "add=" in line]
            assert [f[:len(s)] for f, s in zip(found, stores)] == stores and len(found) == len(
                stores), found
        got = np.full((37, p), np.nan, np.float32)
        run_kernel(lower(ir), [x, w, got])
        assert_agrees(got, kernel.reference(x, w), F32, f"row_dot P={p} on {target}")


def test_nan_in_every_lane_position() -> None:
    """max=/min= propagate a NaN wherever it is: each lane of a full vector, each tail
    lane, and the scalar remainder of a boundary tile."""
    kernel = next(k for k in KERNELS if k.name == "rowmaxmin")
    fn = module(kernel, None)[kernel.function]
    n = 37
    x = np.tile(np.arange(n, dtype=np.float32), (n, 1))
    x[np.arange(n), np.arange(n)] = np.nan        # row i has its NaN at column i
    mx, mn = fn(x)
    assert np.isnan(mx).all() and np.isnan(mn).all()
    x[np.arange(n), np.arange(n)] = -np.inf
    mx, mn = fn(x)
    np.testing.assert_array_equal(mx, np.max(x, axis=1))
    np.testing.assert_array_equal(mn, np.full(n, -np.inf, np.float32))


@pytest.mark.parametrize("target", ["cpu-avx512", "cpu-generic"])
def test_strided_vector_index_is_refused_or_correct(target: str, tmp_path: Any) -> None:
    """A schedule is a replayable decision (tuning records can be imported): one that
    names the row index of a row-major view as the vector index must still compute the
    right result, by falling back to scalar code or by strided vector loads."""
    from polytile.compile import Compiler
    from polytile.config import Config
    from polytile.passes.schedule import Schedule
    from polytile.targets.target import select_target

    try:
        chosen = select_target(target)          # it runs here, so the host must have it
    except pt.PolytileError as err:
        pytest.skip(str(err))
    lanes = LANES[target]
    source = "def f(float(I,J) A) -> (O) {\n  O(i, j) = A(i, j) * 2\n}\n"
    fn = pt.define(source, backend="interp").program.functions[0]
    a = normal(np.random.default_rng(0), 5, 37)
    compiler = Compiler(Config(cache_dir=tmp_path / "cache"),
                        chosen,
                        # collapse off: it would merge i0 and i1 into one index
                        options={"autotile.schedules": {"s0": Schedule("i0", lanes)},
                                 "collapse.enabled": False})
    compiled = compiler.compile(specialize(fn, {"A": a.shape}, {}))
    out = np.zeros_like(a)
    compiled.run({"A": a}, {}, {"O": out})
    np.testing.assert_array_equal(out, 2 * a)


def test_a_vector_schedule_the_block_cannot_run_is_an_ir_error() -> None:
    """Hand-written IR that asks for vectors where the generator has none (a float64
    block): an IRError with the reason, never a silent scalar fallback."""
    from polytile.errors import IRError
    from polytile.ir.parser import parse_function

    fn = parse_function("""function f(A, B) {
  block main #main (
    in A[0] float64(16:1)
    out B[0] float64(16:1)
  ) {
    block s0 [i:16] #kernel schedule(micro, vector(i, float64, 4)) (
      out B <- B[i] float64(1:1)
      in A <- A[i] float64(1:1)
    ) {
      $A = load(A)
      B = store($A)
    }
  }
}""")
    with pytest.raises(IRError, match="block s0 is scheduled as vector code along i, but "
                                      "load \\$A is not float32"):
        generate_c(fn, COptions())


def test_every_op_has_one_row_in_the_c_backends_table() -> None:
    """polytile/codegen/cops.py is the C backend's only list of ops: every op of the IR is a
    row there or follows from its operand types (comparisons, logic, select, casts)."""
    from polytile.codegen.cops import C_OPS, VECTOR_IDENTITIES, VECTOR_OPS
    from polytile.ir.intrinsics import BOOL, OPS

    structural = {n for n, info in OPS.items() if info.result == BOOL} | {"select"}
    assert set(C_OPS) | structural | VECTOR_IDENTITIES == set(OPS)
    assert not set(C_OPS) & (structural | VECTOR_IDENTITIES)
    assert all(C_OPS[n].float is not None for n in C_OPS)
    assert VECTOR_OPS >= {"add", "mul", "exp", "tanh", "sqrt", "fmax", "ident"}


BOUNDARY_IR = """function f(A, B) {{
  block main #main (
    in A[0] float32(13:1)
    out B[0] float32(13:1)
  ) {{
    block s0 [i_r:2] (
      out B <- B[0] float32(13:1)
      in A <- A[0] float32(13:1)
    ) {{
      block s0_tile [i:8, i_r = i_r] #kernel schedule({schedule}) (
        -i - 8*i_r + 12 >= 0
        out B <- B[i + 8*i_r] float32(1:1)
        in A <- A[i + 8*i_r] float32(1:1)
      ) {{
        $A = load(A)
        B = store($A)
      }}
    }}
  }}
}}"""


def test_how_boundary_tiles_run_is_read_from_the_schedule() -> None:
    """A vector leaf cut short by a constraint: the schedule pass records the boundary
    kind; hand-written IR without it (or with the other kind) is an IRError naming the
    kind the block needs, and with it the C has masked lanes (8 lanes can mask)."""
    from polytile.errors import IRError
    from polytile.ir.parser import parse_function

    def c_of(schedule: str) -> str:
        return generate_c(parse_function(BOUNDARY_IR.format(schedule=schedule)),
                          COptions()).text

    with pytest.raises(IRError, match=r"boundary\(remainders\), not nothing"):
        c_of("micro, vector(i, float32, 8)")
    with pytest.raises(IRError, match=r"boundary\(remainders\), not boundary\(guarded\)"):
        c_of("micro, vector(i, float32, 8), boundary(guarded)")
    assert "one version per tile remainder" in c_of("micro, vector(i, float32, 8), "
                                                    "boundary(remainders)")


def test_the_verifier_refuses_a_boundary_without_constraints() -> None:
    from polytile.errors import IRError
    from polytile.ir.parser import parse_function
    from polytile.ir.verify import verify

    text = BOUNDARY_IR.format(schedule="micro, vector(i, float32, 8), boundary(remainders)")
    verify(parse_function(text))
    with pytest.raises(IRError, match="needs one of remainders, guarded, a vector index and "
                                      "constraints"):
        verify(parse_function(text.replace("-i - 8*i_r + 12 >= 0", "")))
