"""Pass nextrow: a row loop's second reader of a row prefetches the next row
(BlockSchedule.next_row). Golden IR of softmax after the AVX2 pipeline, the rows it leaves
alone (an input the caches hold, rows under 4 KiB or over half of L2, one reader), and
the guarded prefetches the lowering prints, on a kernel that runs."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

import polytile as pt
from polytile.bench.memorybound import LAYERNORM, SOFTMAX
from polytile.compile import Compiler
from polytile.config import load_config
from polytile.ir import nodes as N
from polytile.loops.lower import lower
from polytile.loops.text import kernel_text
from polytile.passes.nextrow import nextrow
from polytile.passes.pipeline import run_pipeline
from polytile.sema.specialize import specialize

from .helpers import check_pass, lowered, marked, target

AVX2 = target("cpu-avx2")
BEFORE = replace(AVX2, passes=tuple(p for p in AVX2.passes if p[0] != "nextrow"))


def _scheduled(source: str, shapes: dict[str, tuple[int, ...]]) -> N.Function:
    return run_pipeline(lowered(source, shapes), BEFORE, {})


def _marked(fn: N.Function) -> list[tuple[str, tuple[N.NextRow, ...]]]:
    return marked(fn, "next_row")


def test_softmax_prefetches_the_next_row_in_its_exp_phase() -> None:
    # 33 rows of 8 KiB (264 KiB, more than the target's 256 KiB L2): the maximum reads the
    # row from memory, the exponentials read it again and prefetch the next one.
    before = _scheduled(SOFTMAX, {"X": (33, 2048)})
    after = nextrow(before, AVX2, {})
    check_pass("nextrow_softmax", before, after)
    assert _marked(after) == [("s1_tile", (N.NextRow("X", "n", 33, 2048),))]
    assert nextrow(before, AVX2, {"enabled": False}) == before


def test_layernorm_prefetches_in_its_variance() -> None:
    fn = _scheduled(LAYERNORM, {"X": (70, 1024), "gamma": (1024,), "beta": (1024,)})
    assert [name for name, _ in _marked(nextrow(fn, AVX2, {}))] == ["s2"]


def test_rows_it_leaves_alone() -> None:
    small = _scheduled(SOFTMAX, {"X": (7, 2048)})                   # 56 KiB: cached
    short = _scheduled(SOFTMAX, {"X": (300, 1000)})                 # rows of 4000 bytes
    long = _scheduled(SOFTMAX, {"X": (3, 40000)})                   # rows over half of L2
    once = _scheduled("def f(float(N,D) X, float(D) B) -> (Y) {\n  s(n) +=! X(n,d)\n"
                      "  Y(n,d) = s(n) * B(d)\n}\n",
                      {"X": (70, 2048), "B": (2048,)})              # one reader of X
    for fn in (small, short, long, once):
        assert nextrow(fn, AVX2, {}) == fn


def test_the_prefetch_is_guarded_by_the_row_and_the_kernel_agrees() -> None:
    source = SOFTMAX
    fn = pt.define(source, backend="interp")["softmax"].fn
    spec = specialize(fn, {"X": (33, 2048)}, {})
    ir = Compiler(load_config(), AVX2).ir(spec)
    text = kernel_text(lower(ir))
    # rows 0..31 prefetch row + 1, the last one nothing
    assert "if -i0 + 31 >= 0:\n          prefetch b0[2048*i0 + 8*i2 + 2048]" in text
    x = (np.random.default_rng(5).standard_normal((33, 2 * 2048)) * 4).astype(np.float32)
    view = x[:, ::2]                                     # a strided input
    got = pt.define(source).softmax(view)
    want = np.exp(view - view.max(axis=1, keepdims=True))
    np.testing.assert_allclose(got, want / want.sum(axis=1, keepdims=True), rtol=2e-6,
                               atol=1e-9)
