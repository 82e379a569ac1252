"""Smoke tests of the bench harness: structure and verdicts, never timing values.

Workloads run on the interp backend with a stubbed sleep and blocks of a millisecond,
so the file takes a few seconds.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from polytile.bench import command, latency, report
from polytile.bench.harness import (
    COMPILED,
    FRESH,
    IMPLS,
    PREALLOCATED,
    Outcome,
    Row,
    compare,
    polytile_function,
    run_workload,
)
from polytile.bench.peak import Peak, measure_peak
from polytile.bench.targets import memory_bound_targets
from polytile.bench.timing import Timing, TimingOptions, percentile, rotation, time_blocks
from polytile.bench.workloads import quick_set, select

FAST = TimingOptions(rounds=2, block_seconds=0.001, settle_seconds=0.0, discard_calls=1,
                     min_sample_seconds=0.0)
PEAK = Peak("avx2", 2, {1: 100.0, 2: 200.0}, {"copy": 10.0, "triad": 12.0}, 512.0)


def _no_sleep(_: float) -> None:
    pass


def _quick(key: str):  # type: ignore[no-untyped-def]
    return next(w for w in quick_set() if w.key == key)


def _run(workload, **kw):  # type: ignore[no-untyped-def]
    return run_workload(workload, backend="interp", options=FAST, sleep=_no_sleep, **kw)


def test_compute_bound_workload_gives_one_checked_row() -> None:
    (row,) = _run(_quick("tmm"))
    assert row.variant == FRESH
    assert set(row.outcomes) == set(IMPLS)
    assert row.outcomes["polytile"].status == "ok"
    assert row.outcomes["numpy"].timing is not None
    assert row.outcomes["numpy"].timing.calls >= FAST.rounds
    header, lines = report.results_table([row], PEAK)
    assert header == report.HEADER
    assert len(lines) == 1 and len(lines[0]) == len(header)
    assert lines[0][0] == row.label and lines[0][-1] == "ok"
    assert lines[0][header.index("rate")].endswith("GFLOP/s")
    assert lines[0][header.index("% peak")].endswith("%")


def test_memory_bound_workload_is_reported_fresh_and_preallocated() -> None:
    rows = _run(_quick("softmax"), use_torch=False)
    assert [r.variant for r in rows] == [FRESH, PREALLOCATED]
    assert all(r.outcomes["polytile"].status == "ok" for r in rows)
    assert rows[1].label.endswith("out=")
    assert rows[0].outcomes["torch"].status == "n/a"
    assert rows[0].outcomes[COMPILED].detail == "torch not used"
    text = report.throughput_text(rows, None)
    assert "GB/s" in text and "n/a [1]" in text and "[1] torch: torch not used" in text


def test_wrong_result_is_flagged_loudly() -> None:
    good = _quick("tmm")
    bad = dataclasses.replace(good, numpy=lambda a, b: a @ b.T + 1)   # the oracle moved
    (row,) = _run(bad, use_torch=False)
    assert row.outcomes["polytile"].status == "WRONG"
    assert "elements off" in row.outcomes["polytile"].detail
    assert row.outcomes["polytile"].timing is not None      # still timed, but flagged
    _, lines = report.results_table([row], PEAK)
    assert lines[0][-1].startswith("WRONG")
    banner = report.wrong_banner([row])
    assert "WRONG RESULTS" in banner and row.label in banner
    markdown = report.throughput_markdown([row], PEAK, None, {"CPU": "test"}, "polytile bench",
                                          "today", "Throughput")
    assert "### WRONG RESULTS" in markdown


def test_unwritten_preallocated_output_is_wrong() -> None:
    workload = _quick("gelu")
    lazy = dataclasses.replace(workload, numpy_out=lambda x, b, r, *, out: out)
    rows = _run(lazy, use_torch=False)
    # NumPy is the oracle in the fresh row; in the out= row its lazy version is checked too.
    assert rows[1].outcomes["numpy"].status == "WRONG"
    assert "NaN" in rows[1].outcomes["numpy"].detail


def test_compile_failure_is_failed_not_a_crash() -> None:
    broken = dataclasses.replace(_quick("tmm"), tc="def tmm(float(M,K) A) -> (C) { C(m) +=! }")
    (row,) = _run(broken, use_torch=False)
    assert row.outcomes["polytile"].status == "FAILED"
    assert row.outcomes["polytile"].detail
    assert row.outcomes["numpy"].timing is not None
    _, lines = report.results_table([row], PEAK)
    assert lines[0][1] == "FAILED" and lines[0][-1].startswith("FAILED")


def test_torch_compile_is_checked_timed_and_tabled_next_to_eager() -> None:
    pytest.importorskip("torch")
    fresh, preallocated = _run(_quick("softmax"))
    compiled = fresh.outcomes[COMPILED]
    assert compiled.status == "ok" and compiled.timing is not None
    assert compiled.compile_seconds is not None and compiled.compile_seconds > 0
    assert preallocated.outcomes[COMPILED].status == "n/a"
    assert preallocated.outcomes[COMPILED].detail == "no out= version"
    header, lines = report.results_table([fresh, preallocated], PEAK)
    assert header.index("torch.compile ms") == header.index("torch ms") + 1
    assert header.index("vs compile") == header.index("vs torch") + 1
    assert lines[0][header.index("vs compile")].endswith("x")
    assert lines[1][header.index("torch.compile ms")].startswith("n/a [")
    markdown = report.throughput_markdown([fresh, preallocated], PEAK, None, {}, "bench",
                                          "today", "Throughput")
    assert "| torch.compile ms | vs NumPy | vs torch | vs compile |" in markdown
    assert "torch.compile ms: median" in markdown          # the Spread table
    assert "torch.compile took" in markdown                # the compile time, under Workloads
    assert "### Memory-bound target" in markdown


def test_no_compile_leaves_torch_compile_out() -> None:
    pytest.importorskip("torch")
    (row,) = _run(_quick("tmm"), use_compile=False)
    assert row.outcomes["torch"].status == "ok"
    assert row.outcomes[COMPILED] == Outcome("n/a", "not used")


@pytest.mark.parametrize("fails_at", ["compile", "first call"])
def test_failing_torch_compile_is_na_with_its_reason(monkeypatch: pytest.MonkeyPatch,
                                                     fails_at: str) -> None:
    torch = pytest.importorskip("torch")

    def no_compiler(*_: object) -> None:
        raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found")
    monkeypatch.setattr(torch, "compile", no_compiler if fails_at == "compile"
                        else lambda fn: no_compiler)
    (row,) = _run(_quick("tmm"))
    compiled = row.outcomes[COMPILED]
    assert compiled.status == "n/a" and "No working C++ compiler" in compiled.detail
    assert compiled.timing is None and compiled.compile_seconds is None
    assert all(row.outcomes[n].timing is not None for n in ("polytile", "numpy", "torch"))
    header, lines = report.results_table([row], PEAK)
    assert lines[0][header.index("torch.compile ms")] == "n/a [1]"
    assert lines[0][header.index("vs compile")] == ""
    assert lines[0][-1] == "ok"
    (note,) = report.na_footnotes([row], 400)
    assert note.startswith("[1] torch.compile: failed to compile: RuntimeError")


def test_torch_compile_result_is_checked_against_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch, "compile", lambda fn: lambda *args: fn(*args) + 1)
    (row,) = _run(_quick("tmm"))
    assert row.outcomes["torch"].status == "ok"
    assert row.outcomes[COMPILED].status == "WRONG"
    assert "elements off" in row.outcomes[COMPILED].detail
    _, lines = report.results_table([row], PEAK)
    assert lines[0][-1] == "ok (torch.compile WRONG)"


def _timed(seconds: float | None, status: str = "ok") -> Outcome:
    return Outcome(status, timing=Timing((seconds,), 1) if seconds else None)


@pytest.mark.parametrize("polytile_s, compile_s, verdict", [
    (0.5, 0.6, "met: faster than torch.compile"),
    (0.1, 0.05, "met: ≥ 0.7 of bandwidth"),      # 10 GB/s of PEAK's 12
    (0.5, 0.05, "missed"),
    (0.5, None, "missed (no torch.compile time)"),
])
def test_memory_bound_target_is_compile_or_bandwidth(polytile_s: float,
                                                     compile_s: float | None,
                                                     verdict: str) -> None:
    workload = dataclasses.replace(_quick("softmax"), bytes=1e9)
    outcomes = {"polytile": _timed(polytile_s), "numpy": _timed(1.0), "torch": _timed(1.0),
                COMPILED: _timed(compile_s) if compile_s else Outcome("n/a", "failed")}
    rows = [Row(workload, FRESH, outcomes), Row(workload, PREALLOCATED, outcomes)]
    _, lines = memory_bound_targets(rows, PEAK)
    assert len(lines) == 1                          # fresh rows only
    assert lines[0][-1] == verdict
    assert memory_bound_targets(rows, None)[1][0][2] == "n/a"   # no bandwidth measured


def test_every_quick_workload_matches_numpy_on_the_interpreter() -> None:
    for workload in quick_set():
        args = workload.make_inputs(np.random.default_rng(1))
        function, error = polytile_function(workload, "interp")
        assert error is None, error
        got = function(*args)
        got = got if isinstance(got, tuple) else (got,)
        expected = workload.numpy(*args)
        expected = expected if isinstance(expected, tuple) else (expected,)
        assert compare(got, expected, workload.rtol, workload.atol).status == "ok", workload.name


def test_select_filters_by_family_and_full_name() -> None:
    assert {w.key for w in select(only=["tmm"])} == {"tmm"}
    assert len(select(only=["tmm"])) == 3
    assert [w.name for w in select(only=["tmm 128x32x256"])] == ["tmm 128x32x256"]
    assert select(quick=True, only=["nothing"]) == []


def test_time_blocks_rotates_order_and_times_each_in_blocks() -> None:
    now = [0.0]
    calls: list[str] = []

    def impl(name: str, cost: float):  # type: ignore[no-untyped-def]
        def call() -> None:
            calls.append(name)
            now[0] += cost
        return call
    unit = 2.0 ** -10     # exact in binary, so the stub clock's sums are exact
    options = TimingOptions(rounds=3, block_seconds=10 * unit, settle_seconds=0.0,
                            discard_calls=1, min_sample_seconds=0.0)
    timings = time_blocks({"a": impl("a", unit), "b": impl("b", 2 * unit)}, options,
                          clock=lambda: now[0], sleep=_no_sleep)
    assert timings["a"].median == unit and timings["b"].median == 2 * unit
    assert len(timings["a"].samples) == 3 * 10 and len(timings["b"].samples) == 3 * 5
    runs: list[list[str]] = []
    for name in calls:
        if runs and runs[-1][0] == name:
            runs[-1].append(name)
        else:
            runs.append([name])
    # calibration a, b; then blocks of 1 discarded + timed calls, never interleaved:
    # round 0 a b, round 1 b a, round 2 a b (adjacent blocks of one impl merge).
    assert [(r[0], len(r)) for r in runs] == [("a", 1), ("b", 1), ("a", 11), ("b", 12),
                                              ("a", 22), ("b", 6)]
    assert rotation(["x", "y", "z"], 1) == ["y", "z", "x"]


def test_time_blocks_synchronizes_before_every_clock_read_after_calls() -> None:
    """With `synchronize` (GPU runs), the clock that ends a calibrating call or a timed
    group is read only after the device was waited for, and the discarded calls' work is
    waited for before a block's first sample starts."""
    events: list[str] = []

    def clock() -> float:
        events.append("clock")
        return len(events) * 2.0 ** -12
    options = TimingOptions(rounds=2, block_seconds=2.0 ** -8, settle_seconds=0.0,
                            discard_calls=1, min_sample_seconds=0.0)
    timings = time_blocks({"a": lambda: events.append("call")}, options, clock=clock,
                          sleep=_no_sleep, synchronize=lambda: events.append("sync"))
    assert timings["a"].samples
    assert timings["a"].calls == len(timings["a"].samples)     # one call per group here
    # every call (calibrating, discarded, timed) is waited for before the clock is read
    for i, event in enumerate(events):
        if event == "call":
            assert events[i + 1:events.index("clock", i)][-1] == "sync", events[i - 2:i + 4]


def test_percentile_interpolates_like_numpy() -> None:
    data = [5.0, 1.0, 4.0, 2.0, 3.0]
    for q in (0, 10, 50, 90, 100):
        assert percentile(data, q) == pytest.approx(float(np.percentile(data, q)))


def test_write_section_replaces_only_its_own_section(tmp_path: Path) -> None:
    path = tmp_path / "benchmarks" / "RESULTS.md"
    report.write_section(path, "throughput", "## one\n")
    report.write_section(path, "latency", "## two\n")
    report.write_section(path, "throughput", "## three\n")
    text = path.read_text()
    assert "## one" not in text and "## two" in text and "## three" in text
    assert text.index("## three") < text.index("## two")


def _fast_cli_bench(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """`polytile bench` arguments for a run of a second: two quick workloads on the
    interpreter, stub peak, blocks of a millisecond."""
    from polytile.bench import harness, peak
    monkeypatch.setattr(command, "BLAS_ENV_VARS", ())   # never re-run in a child here
    monkeypatch.setattr(peak, "measure_peak", lambda **_: PEAK)
    fast_run = harness.run_workload
    monkeypatch.setattr(harness, "run_workload",
                        lambda w, **kw: fast_run(w, **{**kw, "options": FAST,
                                                       "sleep": _no_sleep}))
    return ["bench", "--quick", "--only", "tmm,layernorm", "--backend", "interp"]


def test_cli_bench_prints_and_writes_results_only_when_asked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from polytile import cli
    bench = _fast_cli_bench(monkeypatch)
    monkeypatch.chdir(tmp_path)
    project = command.results_path(True)
    recorded = project.read_bytes() if project.exists() else None
    assert cli.main(bench) == 0
    out = capsys.readouterr().out
    assert "polytile ms" in out and "torch.compile ms" in out and "layernorm 33x67 out=" in out
    # Without --write nothing is written: a new user's first run leaves the clone clean.
    assert list(tmp_path.iterdir()) == []
    target = tmp_path / "runs" / "bench.md"
    assert cli.main([*bench, "--write", str(target)]) == 0
    assert f"wrote {target}" in capsys.readouterr().out
    results = target.read_text()
    assert (f"polytile bench --quick --only=tmm,layernorm --write={target} "
            "--backend=interp") in results
    assert "### Measured peak" in results and "### Spread" in results
    assert "polytile-bench:throughput-quick-partial:begin" in results
    assert (project.read_bytes() if project.exists() else None) == recorded


def test_bare_write_records_in_the_checkouts_results_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from polytile import cli
    # This checkout's record, wherever the command starts; FILE is taken as given.
    monkeypatch.chdir(tmp_path)
    root = Path(command.__file__).resolve().parents[2]
    assert command.results_path(True) == root / "benchmarks" / "RESULTS.md"
    assert command.results_path("runs/x.md") == Path("runs/x.md")
    # A stand-in checkout, so that the run below does not rewrite the real record.
    checkout = tmp_path / "checkout"
    (checkout / "benchmarks").mkdir(parents=True)
    (checkout / "pyproject.toml").write_text("")
    monkeypatch.setattr(command, "__file__", str(checkout / "polytile" / "bench" / "command.py"))
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert cli.main([*_fast_cli_bench(monkeypatch), "--write"]) == 0
    written = checkout / "benchmarks" / "RESULTS.md"
    assert f"wrote {written}" in capsys.readouterr().out
    assert "polytile bench --quick --only=tmm,layernorm --write --backend=interp" in (
        written.read_text())
    assert list((tmp_path / "elsewhere").iterdir()) == []
    # Installed elsewhere (no checkout around the package): under the current directory.
    monkeypatch.setattr(command, "__file__", str(tmp_path / "site" / "polytile" / "bench" /
                                                 "command.py"))
    assert command.results_path(True) == Path("benchmarks") / "RESULTS.md"


def test_peak_probe_compiles_and_runs() -> None:
    measured = measure_peak(repeats=1, fma_seconds=0.01, array_bytes=8 << 20)
    assert measured.isa in ("avx512", "avx2", "scalar")
    assert all(v > 0 for v in measured.fma_gflops.values())
    assert {"copy", "triad", "triad_1t"} <= set(measured.bandwidth)
    assert measured.lines()


def test_latency_child_prints_one_json_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert latency.child_main("gather") == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert "define_s" in result or "error" in result
    assert "first_call_s" in result or "error" in result
    rows = [latency.LatencyRow(latency.EXAMPLES[5], [result], [result])]
    header, lines = report.latency_table(rows)
    assert len(lines[0]) == len(header)


def test_a_workload_runs_on_the_opencl_target() -> None:
    """`polytile bench --target opencl`: polytile's kernel runs on the OpenCL device and is
    checked against NumPy like any other (on PoCL the times are functional only)."""
    from polytile.runtime.opencl import device_problem
    problem = device_problem()
    if problem:
        pytest.skip(f"the opencl target needs {problem}")
    (row,) = run_workload(_quick("tmm"), target="opencl", options=FAST, sleep=_no_sleep,
                          use_torch=False)
    assert row.outcomes["polytile"].status == "ok"
    assert row.outcomes["polytile"].timing is not None


@pytest.mark.parametrize("tuned", [False, True])
def test_the_bench_measures_the_heuristics_unless_told_to_use_the_tuning_database(
        tuned: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A `polytile tune` on this machine must not change what `polytile bench` reports as
    the compiler's defaults (gconv and tmm 1024^3 ran their tuned schedules in the bench
    after they were tuned): the run sees POLYTILE_IGNORE_TUNED unless --tuned, and the
    environment is as it was afterwards."""
    import argparse
    import os

    from polytile.config import load_config
    monkeypatch.delenv("POLYTILE_IGNORE_TUNED", raising=False)
    monkeypatch.setattr(command, "BLAS_ENV_VARS", ())
    seen = []
    monkeypatch.setattr(command, "_run",
                        lambda args, t: seen.append((t, load_config().ignore_tuned)) or 0)
    assert command.run(argparse.Namespace(tuned=tuned, latency=False)) == 0
    assert seen == [(tuned, not tuned)]
    assert "POLYTILE_IGNORE_TUNED" not in os.environ
    assert ("--tuned" in command._argv(argparse.Namespace(
        quick=False, only=None, latency=False, write=None, repeats=None, no_compile=False,
        backend="c", tuned=tuned))) == tuned
