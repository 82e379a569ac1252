"""Streaming (non-temporal) stores: printed where pass `stream` decided them, with a
fence after each thread's share and before the kernel returns; not for outputs that fit
the last-level cache; and the kernels agree with the reference interpreter on odd sizes,
unaligned and non-contiguous arrays, on the AVX2 target (when the host runs it) and on
the generic one (whose C uses no intrinsics: its streaming store is a plain one)."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from polytile.bench.memorybound import GELU, LAYERNORM, SOFTMAX
from polytile.compile import Compiler
from polytile.config import load_config
from polytile.lang.parser import parse
from polytile.sema import reference
from polytile.sema.analyze import analyze
from polytile.sema.specialize import specialize
from polytile.targets.target import Target, host_features, load_target, select_target

FORCED = {"stream.llc_multiple": 1e-9}       # any output is "larger than the cache"


def _target(name: str, caches: dict[str, int] | None = None, stream: bool = False) -> Target:
    """A shipped target as a call on a host with these caches would see it; `stream`
    adds pass stream to the pipeline (the generic target does not list it)."""
    shipped = load_target(name)
    target = select_target(name, features=host_features() | frozenset(shipped.requires))
    if caches is not None:
        target = replace(target, cache_bytes=tuple(sorted(caches.items())))
    if stream and all(p != "stream" for p, _ in target.passes):
        target = replace(target, passes=(*target.passes, ("stream", ())))
    return target


def _spec(source: str, shapes: dict[str, tuple[int, ...]]) -> Any:
    fn = analyze(parse(source, "<test>")).functions[0]
    return specialize(fn, shapes, {})


def _c(source: str, shapes: dict[str, tuple[int, ...]], target: Target,
       options: dict[str, Any] | None = None) -> str:
    compiler = Compiler(load_config(), target, options=options or {})
    return compiler.backend.generate(compiler.ir(_spec(source, shapes)), target).text("c")


HOST_CACHES = {"L1": 32 << 10, "L2": 512 << 10, "L3": 32 << 20}     # this project's EPYC


@pytest.mark.parametrize("name,width", [("cpu-avx2", "_mm256_stream_ps"),
                                        ("cpu-avx512", "_mm512_stream_ps")])
def test_softmax_larger_than_l3_streams_its_output_and_fences(name: str, width: str) -> None:
    c = _c(SOFTMAX, {"X": (4096, 4096)}, _target(name, HOST_CACHES))
    assert c.count("pt_vstream(&b1[") >= 1 and width in c
    # one fence per thread after its rows (in the parallel region), one before returning
    assert c.count("pt_sfence();") == 2 and "#pragma omp for schedule(static) nowait" in c


def test_outputs_that_fit_the_last_level_cache_do_not_stream() -> None:
    layernorm = {"X": (4096, 1024), "gamma": (1024,), "beta": (1024,)}      # 16 MiB out
    c = _c(LAYERNORM, layernorm, _target("cpu-avx2", HOST_CACHES))
    assert "pt_vstream(&" not in c and "pt_sfence();" not in c
    # softmax's 64 MiB fits a 64 MiB L3 (the rule wants larger)
    c = _c(SOFTMAX, {"X": (4096, 4096)}, _target("cpu-avx2", {**HOST_CACHES, "L3": 64 << 20}))
    assert "pt_vstream(&" not in c and "pt_sfence();" not in c


def test_a_generic_kernel_prints_no_intrinsics_even_when_streaming() -> None:
    c = _c(SOFTMAX, {"X": (37, 1029)}, _target("cpu-generic", stream=True), FORCED)
    assert "pt_vstream(&" in c and "pt_sfence();" in c
    assert "_mm256" not in c and "_mm512" not in c and "_mm_stream_ps" not in c


# ------------------------------------------------------------------ numbers

def _run(source: str, target: Target, options: dict[str, Any], inputs: dict[str, np.ndarray],
         out: np.ndarray) -> np.ndarray:
    spec = _spec(source, {k: v.shape for k, v in inputs.items()})
    compiled = Compiler(load_config(), target, options=options).compile(spec)
    assert "pt_vstream(&" in Path(compiled.source_path).read_text()
    (name,) = [o.name for o in spec.fn.outputs]
    compiled.run(inputs, {}, {name: out})
    expected = np.zeros_like(out)
    reference.run(spec, inputs, {name: expected})
    return expected


def _offset_array(shape: tuple[int, ...], offset: int) -> np.ndarray:
    """A C-contiguous float32 array `offset` bytes past a 64-byte boundary, full of NaN
    (an element the kernel misses shows)."""
    nbytes = int(np.prod(shape)) * 4
    raw = np.empty(nbytes + 128, np.uint8)
    start = (offset - raw.ctypes.data) % 64
    a = raw[start:start + nbytes].view(np.float32).reshape(shape)
    a[...] = np.nan
    return a


def _targets() -> list[Any]:
    avx2 = pytest.param("cpu-avx2", marks=pytest.mark.skipif(
        not {"avx2", "fma"} <= host_features(), reason="the host runs no AVX2 code"))
    return [avx2, "cpu-generic"]


@pytest.mark.parametrize("name", _targets())
@pytest.mark.parametrize("n,d", [(37, 1029), (3, 8), (16, 256)])
@pytest.mark.parametrize("offset", [0, 4, 16, 32])
def test_streamed_softmax_agrees_with_the_reference(name: str, n: int, d: int,
                                                    offset: int) -> None:
    rng = np.random.default_rng(n * d + offset)
    x = rng.standard_normal((n, 2 * d)).astype(np.float32)[:, ::2]     # non-contiguous
    y = _offset_array((n, d), offset)
    expected = _run(SOFTMAX, _target(name, stream=True), FORCED, {"X": x}, y)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", _targets())
@pytest.mark.parametrize("offset", [0, 12])
def test_streamed_elementwise_agrees_with_the_reference(name: str, offset: int) -> None:
    rng = np.random.default_rng(offset)
    n, d = 29, 515
    inputs = {"X": rng.standard_normal((n, d)).astype(np.float32),
              "bias": rng.standard_normal(d).astype(np.float32),
              "R": rng.standard_normal((d, n)).astype(np.float32).T}      # transposed view
    y = _offset_array((n, d), offset)
    expected = _run(GELU, _target(name, stream=True), FORCED, inputs, y)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)
