"""Pass stream: the views whose stores bypass the caches (BlockSchedule.stream). Golden
IR of softmax after the AVX2 pipeline, and the outputs it must leave alone: one that
fits the last-level cache, one the kernel reads back, one written by two statements."""
from __future__ import annotations

from dataclasses import replace

import pytest

from polytile.bench.memorybound import LAYERNORM, SOFTMAX
from polytile.errors import ArgumentError
from polytile.ir import nodes as N
from polytile.ir.printer import format_function
from polytile.passes.pipeline import run_pipeline
from polytile.passes.stream import stream

from .helpers import check_pass, lowered, marked, target

AVX2 = target("cpu-avx2")
BEFORE = replace(AVX2, passes=tuple(p for p in AVX2.passes if p[0] != "stream"))
FORCED = {"llc_multiple": 1e-9}


def _scheduled(source: str, shapes: dict[str, tuple[int, ...]],
               options: dict[str, object] | None = None) -> N.Function:
    return run_pipeline(lowered(source, shapes), BEFORE, options or {})


def _streamed(fn: N.Function) -> list[tuple[str, tuple[str, ...]]]:
    return marked(fn, "stream")


def test_softmax_streams_the_last_writer_of_its_output() -> None:
    before = _scheduled(SOFTMAX, {"X": (7, 37)})
    after = stream(before, AVX2, FORCED)
    check_pass("stream_softmax", before, after)
    assert [name for name, _ in _streamed(after)] == ["s3_tile"]


def test_the_output_must_be_larger_than_the_last_level_cache() -> None:
    fn = _scheduled(SOFTMAX, {"X": (64, 64)})                       # 16 KiB
    caches = dict(AVX2.cache_bytes)
    assert not _streamed(stream(fn, replace(AVX2, cache_bytes=tuple(
        sorted({**caches, "L3": 16 << 10}.items()))), {}))
    assert _streamed(stream(fn, replace(AVX2, cache_bytes=tuple(
        sorted({**caches, "L3": (16 << 10) - 1}.items()))), {}))


def test_an_output_the_kernel_reads_back_does_not_stream() -> None:
    # without rowbuffer, softmax stores Y, sums it and divides it in place
    fn = _scheduled(SOFTMAX, {"X": (7, 37)}, {"rowbuffer.enabled": False})
    assert not _streamed(stream(fn, AVX2, FORCED))


def test_an_output_written_by_two_statements_does_not_stream() -> None:
    fn = _scheduled("""
def twice(float(N,D) X) -> (Y) {
  Y(n,d) = X(n,d)
  Y(n,d) = Y(n,d) + 1
}""", {"X": (7, 3000)}, {"rowbuffer.enabled": False})
    assert not _streamed(stream(fn, AVX2, FORCED))


def test_layernorm_streams_only_when_forced() -> None:
    fn = _scheduled(LAYERNORM, {"X": (7, 37), "gamma": (37,), "beta": (37,)})
    assert not _streamed(stream(fn, AVX2, {}))
    assert "stream(" in format_function(stream(fn, AVX2, FORCED))


def test_options_are_checked() -> None:
    fn = _scheduled(SOFTMAX, {"X": (7, 37)})
    with pytest.raises(ArgumentError):
        stream(fn, AVX2, {"llc_multiple": 0})
    assert stream(fn, AVX2, {**FORCED, "enabled": False}) == fn
