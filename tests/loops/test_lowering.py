"""The loop IR of scheduled blocks: what each schedule lowers to (golden text), and the
interpreter as the oracle for the shapes the conformance corpus is too small to reach
(register transposes of packed panels, parallel loops, remainder versions)."""
from __future__ import annotations

import collections
import dataclasses
import os
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import polytile as pt
from polytile.codegen.c import print_c
from polytile.compile import Compiler
from polytile.config import load_config
from polytile.dtypes import FLOAT32, INT64
from polytile.errors import IRError, KernelError, UnsupportedError
from polytile.ir import interp as ir_interp
from polytile.ir.nodes import Affine
from polytile.ir.parser import parse_function
from polytile.loops import interp
from polytile.loops import nodes as L
from polytile.loops.lower import LowerOptions, lower
from polytile.loops.text import kernel_text
from polytile.sema.specialize import specialize
from polytile.targets.target import inspection_target

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "loops"
TMM = "def tmm(float(M,K) A, float(N,K) B) -> (C) {\n  C(m,n) +=! A(m,kk) * B(n,kk)\n}\n"
MM = "def mm(float(M,K) A, float(K,N) B) -> (C) {\n  C(m,n) +=! A(m,k) * B(k,n)\n}\n"
PACKED = {"fuse.strategy": "none", "pack.max_reduction": 1 << 20}


def compiled_ir(source: str, target: str, options: dict | None = None, **shapes):
    name = re.search(r"def\s+(\w+)", source).group(1)
    fn = pt.define(source, backend="interp")[name].fn
    compiler = Compiler(load_config(), inspection_target(target))
    compiler.options = options or {}
    return compiler.ir(specialize(fn, shapes, {}))


def nodes(kernel: L.Kernel) -> collections.Counter:
    """How many nodes of each kind (loops by kind) the kernel has."""
    count: collections.Counter = collections.Counter()

    def walk(x: object) -> None:
        if isinstance(x, tuple):
            for y in x:
                walk(y)
        elif dataclasses.is_dataclass(x) and type(x).__module__ == L.__name__:
            count[f"Loop:{x.kind}" if isinstance(x, L.Loop) else type(x).__name__] += 1
            for f in dataclasses.fields(x):
                walk(getattr(x, f.name))
    walk(kernel.body)
    return count


def agree(fn, rng: np.random.Generator, kernel: L.Kernel | None = None) -> None:
    """The loop IR interpreter and the IR interpreter give the same outputs."""
    loops, blocks = {}, {}
    for ref in fn.body.refs:
        if ref.into in fn.params:
            data = (rng.standard_normal(ref.shape.sizes) * 3).astype(ref.shape.dtype.numpy)
            loops[ref.into], blocks[ref.into] = data.copy(), data.copy()
    interp.run(fn, loops, kernel)
    ir_interp.run(fn, blocks)
    for name in fn.params:
        np.testing.assert_allclose(loops[name], blocks[name], rtol=2e-5, atol=1e-4,
                                   err_msg=name)


@pytest.mark.parametrize("target", ["cpu-avx512", "cpu-avx2"])
@pytest.mark.parametrize("m,n,k", [(37, 29, 53), (9, 70, 2), (20, 16, 16)])
def test_packed_panels_are_register_transposes(target: str, m: int, n: int, k: int) -> None:
    fn = compiled_ir(TMM, target, PACKED, A=(m, k), B=(n, k))
    kernel = lower(fn)
    assert nodes(kernel)["Shuffle"] > 0
    agree(fn, np.random.default_rng(m + n + k), kernel)


@pytest.mark.parametrize("target", ["cpu-avx512", "cpu-avx2", "cpu-generic"])
def test_remainder_versions_of_a_matmul(target: str) -> None:
    fn = compiled_ir(MM, target, A=(100, 100), B=(100, 100))
    kernel = lower(fn)
    assert nodes(kernel)["Switch"] > 0
    agree(fn, np.random.default_rng(1), kernel)


SUMS = """function f(A, B) {
  block main (
    in A[0, 0] float32(6:5, 5:1)
    out B[0] float32(5:1)
  ) {
    block k [i:6, j:5] #kernel schedule(parallel(j)) (
      in A <- A[i, j] float32(1:5, 1:1)
      out B <- B[j] float32(1:1):add
    ) {
      $a = load(A)
      B = store($a)
    }
  }
}
"""


def test_a_parallel_loop_runs_backwards_in_the_interpreter() -> None:
    fn = parse_function(SUMS)
    kernel = lower(fn)
    assert nodes(kernel)["Loop:parallel"] == 1
    assert "parallel for i1 in [0, 5):" in kernel_text(kernel)
    agree(fn, np.random.default_rng(2), kernel)
    assert nodes(lower(fn, LowerOptions(threads=False)))["Loop:parallel"] == 0


PROGRAMS = {
    "matmul": (MM, ("A", "M", "K"), ("B", "K", "N")),
    "rows": ("def rows(float(M,K) A) -> (S) {\n  S(m) +=! exp(A(m,k)) * A(m,k)\n}\n",
             ("A", "M", "K")),
    "layer": ("def layer(float(M,K) X, float(K) B) -> (Y) {\n"
              "  Y(m,k) = fmaxf(X(m,k) + B(k), 0)\n  Y(m,k) = tanh(Y(m,k))\n}\n",
              ("X", "M", "K"), ("B", "K")),
}


@settings(max_examples=25, deadline=None)
@given(program=st.sampled_from(sorted(PROGRAMS)),
       target=st.sampled_from(["cpu-avx512", "cpu-avx2", "cpu-generic"]),
       sizes=st.fixed_dictionaries({d: st.integers(1, 40) for d in "MNK"}),
       seed=st.integers(0, 2**16))
def test_lowering_preserves_meaning(program: str, target: str, sizes: dict, seed: int) -> None:
    source, *params = PROGRAMS[program]
    shapes = {name: tuple(sizes[d] for d in dims) for name, *dims in params}
    agree(compiled_ir(source, target, **shapes), np.random.default_rng(seed))


def _kernel(*body: L.Stmt) -> L.Kernel:
    x = L.Buffer("b0", FLOAT32, 0, param=0, writable=False, label="X: in float32 4")
    y = L.Buffer("b1", FLOAT32, 0, param=1, label="Y: out float32 4")
    return L.Kernel("k", (x, y), (), body)


def _run(kernel: L.Kernel) -> np.ndarray:
    fn = parse_function(SUMS)      # any function with a 6x5 input and a 5-element output
    out = {"A": np.ones((6, 5), np.float32), "B": np.zeros(5, np.float32)}
    interp.run(fn, out, kernel)
    return out["B"]


def test_the_interpreter_refuses_accesses_outside_a_buffer() -> None:
    read = L.Let("s0", L.VType(FLOAT32), L.Read("b0", Affine.constant(28), lanes=1))
    assert _run(_kernel(L.Let("s0", L.VType(FLOAT32, 4), L.Read(
        "b0", Affine.constant(28), 4, Affine.constant(2))), L.Store(
        "b1", Affine.constant(0), "s0", count=Affine.constant(2)))).tolist() == [1, 1, 0, 0, 0]
    with pytest.raises(IRError, match="outside"):
        _run(_kernel(L.Let("s0", L.VType(FLOAT32, 4), L.Read("b0", Affine.constant(28), 4))))
    with pytest.raises(IRError, match="outside"):
        _run(_kernel(read, L.Store("b1", Affine.constant(5), "s0")))


def test_checks_fail_with_a_kernel_error() -> None:
    body = (L.Let("d0", L.VType(INT64), L.IntValue(Affine.constant(7))),
            L.Check("d0", 5, 0, 1))
    with pytest.raises(KernelError, match="index 7 is out of range for dimension 1"):
        _run(_kernel(*body))


@pytest.mark.parametrize("stmt", [L.Barrier(),
                                  L.Loop("i0", Affine.constant(0), Affine.constant(4), (),
                                         kind="grid")])
def test_the_c_printer_refuses_what_it_cannot_run(stmt: L.Stmt) -> None:
    with pytest.raises(UnsupportedError):
        print_c(_kernel(stmt))


def test_the_c_printer_computes_on_float32_vectors_only() -> None:
    # Other vectors are loaded, stored, filled and passed to instructions (test_isa.py).
    i64x8 = L.VType(INT64, 8)
    filled = L.Let("v0", i64x8, L.Lit(0))
    assert "pt_v_int64x8 v0 = (pt_v_int64x8){} + (int64_t)" in print_c(_kernel(filled)).text
    summed = L.Let("v1", i64x8, L.Op("add", ("v0", "v0"), INT64))
    with pytest.raises(UnsupportedError, match="cannot compute Op on them"):
        print_c(_kernel(filled, summed))


GOLDEN_CASES = {
    "matmul_avx512": (MM, "cpu-avx512", None, {"A": (5, 19), "B": (19, 21)}),
    "tmm_packed_avx2": (TMM, "cpu-avx2", PACKED, {"A": (9, 11), "B": (10, 11)}),
}


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_golden_loop_ir(name: str) -> None:
    """To accept a deliberate change, run with POLYTILE_UPDATE_GOLDEN=1 and review the diff."""
    source, target, options, shapes = GOLDEN_CASES[name]
    text = kernel_text(lower(compiled_ir(source, target, options, **shapes)))
    path = GOLDEN / f"{name}.loops"
    if os.environ.get("POLYTILE_UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), "the loop IR changed; see the docstring"


# Rows in tiles of 2 x 1: the unrolled `o` has range 1, so the constraint on the last
# (partial) tile of tiles names no loop of the leaf: it holds for the whole tile or for
# none (here the last tile of rows 6..7 is skipped). Such a tile runs as vector code or
# not at all, not as scalar code.
WHOLE_TILES = """function f(X, Y) {
  block main (
    in X[0, 0] float32(7:20, 20:1)
    out Y[0, 0] float32(7:20, 20:1)
  ) {
    block s0 [t:4] #kernel (
      out Y <- Y[0, 0] float32(7:20, 20:1)
      in X <- X[0, 0] float32(7:20, 20:1)
    ) {
      block s0_tile [o:1, i:2, j:20, t = t] #kernel schedule(micro, vector(j, float32, 8), boundary(remainders), unroll(i, o)) (
        -o - t + 2 >= 0
        -i - 2*o - 2*t + 6 >= 0
        out Y <- Y[i + 2*o + 2*t, j] float32(1:20, 1:1)
        in X <- X[i + 2*o + 2*t, j] float32(1:20, 1:1)
      ) {
        $x = load(X)
        $y = mul($x, $x) : float32
        Y = store($y)
      }
    }
  }
}
"""


def test_a_constraint_that_names_no_loop_of_the_leaf_guards_the_whole_tile() -> None:
    from polytile.analysis.vectorizable import boundary_versions
    fn = parse_function(WHOLE_TILES)
    leaf = fn.body.stmts[0].stmts[0]
    assert boundary_versions(leaf) == "remainders"
    kernel = lower(fn)
    counts = nodes(kernel)
    assert counts["If"] == 1 and counts["Switch"] > 0
    agree(fn, np.random.default_rng(3), kernel)


CONV1X1 = ("def c(float(N,C,H,W) X, float(C,K) Wt) -> (O) {\n"
           "  O(n,k,h,w) +=! X(n,c,h,w) * Wt(c,k)\n}\n")


def test_lanes_the_loops_around_keep_whole_load_without_a_mask() -> None:
    # 28-wide rows in tiles of two vectors: the last tile holds 12 lanes, a whole first
    # vector and 4 lanes of the second. Only the second is a masked (counted) load; a
    # masked first one cost the 1x1 convolution a third of its time on Zen 3.
    fn = compiled_ir(CONV1X1, "cpu-avx2", X=(2, 16, 5, 28), Wt=(16, 24))
    kernel = lower(fn)
    loads = [line for line in kernel_text(kernel).splitlines()
             if re.search(r"float32x8 = b\d+\[.*\] x8", line)]
    counted = [line for line in loads if "(count" in line]
    assert counted and len(counted) < len(loads)
    assert all(re.search(r"\+ 8\] x8 \(count", line) for line in counted), counted
    agree(fn, np.random.default_rng(3), kernel)
