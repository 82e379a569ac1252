"""`polytile bench --target cuda-sm90`'s path (polytile.bench.device), run without a GPU
on the emulated driver API (tests/gpu/cuda_emulation.py): quick tmm and softmax are placed
on the device once, polytile's kernels are launched on those pointers with no tensor
copied in the timed calls, every clock read that ends timed calls waits for the device,
and the outputs are checked against the NumPy reference. torch here is a CPU build, so
its column says why it is missing. Nothing about the times is asserted."""
from __future__ import annotations

import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from polytile.bench import harness, report
from polytile.bench.device import Placed
from polytile.bench.timing import TimingOptions
from polytile.bench.workloads import quick_set
from polytile.config import Config
from polytile.runtime import cuda as runtime
from polytile.runtime.cuda_memory import DeviceArray

PROBLEM = runtime.nvrtc_problem() or (None if shutil.which("g++") else "g++ (for the emulation)")
pytestmark = pytest.mark.skipif(PROBLEM is not None, reason=f"the emulation needs {PROBLEM}")

FAST = TimingOptions(rounds=2, block_seconds=0.001, settle_seconds=0.0, discard_calls=1,
                     min_sample_seconds=0.0)
TORCH_MISSING = ("torch has no CUDA device (a CPU build)", "torch has no CUDA device",
                 "torch not installed")
# The launcher's own per-call copies: the failure flag (4 bytes) and error record (32).
FLAG_BYTES = 32


def _no_sleep(_: float) -> None:
    pass


def _run_on_emulated_gpu(key: str, monkeypatch: pytest.MonkeyPatch, **changes: Any
                         ) -> tuple[list[harness.Row], Placed, list[tuple[str, int]]]:
    """The quick workload `key` through run_workload on cuda-sm90; its rows, the placed
    inputs, and the driver's events from the placement on (clock reads included)."""
    workload = replace(next(w for w in quick_set() if w.key == key), **changes)
    driver = runtime.cuda_device().driver
    placements: list[Placed] = []
    place_inputs = harness.place_inputs

    def place(args: Any, use_torch: bool) -> Placed:
        placements.append(place_inputs(args, use_torch))
        placements[-1].synchronize()
        driver.events.clear()       # from here on: only the calls, checked and timed
        return placements[-1]

    def clock() -> float:
        driver.events.append(("clock", 0))
        return time.perf_counter()
    with monkeypatch.context() as patch:
        patch.setattr(harness, "place_inputs", place)
        rows = harness.run_workload(workload, target="cuda-sm90", options=FAST,
                                    clock=clock, sleep=_no_sleep)
    return rows, placements[0], list(driver.events)


@pytest.mark.parametrize("key", ["tmm", "softmax"])
def test_a_gpu_run_times_kernels_on_device_inputs(key: str, emulated: Config,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLYTILE_CACHE_DIR", str(emulated.cache_dir))
    rows, placed, events = _run_on_emulated_gpu(key, monkeypatch)
    (row,) = rows       # softmax is memory-bound: no out= row on the GPU
    ours = row.outcomes["polytile"]
    assert ours.status == "ok", ours.detail
    assert ours.timing is not None and ours.timing.calls >= FAST.rounds
    assert row.outcomes["numpy"].status == "n/a" and row.outcomes["numpy"].timing is None
    assert row.outcomes["torch"].status == "n/a"
    assert row.outcomes["torch"].detail in TORCH_MISSING
    assert f"torch: {row.outcomes['torch'].detail}" in report.throughput_text(rows, None)

    driver = runtime.cuda_device().driver
    pointers = tuple(a.pointer for a in placed.inputs)
    assert all(isinstance(a, DeviceArray) for a in placed.inputs)
    assert len(driver.arguments) >= ours.timing.calls
    # every launch since placement took the placed inputs by their pointers ...
    launches = sum(1 for kind, _ in events if kind == "launch")
    for arguments in driver.arguments[-launches:]:
        assert arguments[:len(pointers)] == pointers
    # ... and no tensor crossed to the device: the calls copied only the launcher's flags
    copies = [n for kind, n in events if kind == "htod"]
    assert copies and max(copies) <= FLAG_BYTES < min(a.nbytes for a in placed.inputs)
    # every clock read that ends launches comes right after a context synchronize
    since_clock: list[str] = []
    for kind, _ in events:
        if kind == "clock":
            if "launch" in since_clock:
                assert since_clock[-1] == "sync", since_clock
            since_clock = []
        else:
            since_clock.append(kind)


def test_a_gpu_run_checks_outputs_against_the_numpy_reference(
        emulated: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reference that disagrees makes polytile's outcome WRONG: the device's output was
    copied back and compared."""
    monkeypatch.setenv("POLYTILE_CACHE_DIR", str(emulated.cache_dir))
    tmm = next(w for w in quick_set() if w.key == "tmm")
    rows, _, _ = _run_on_emulated_gpu("tmm", monkeypatch,
                                      numpy=lambda *args: tmm.numpy(*args) + 1)
    assert rows[0].outcomes["polytile"].status == "WRONG"
    assert "elements off" in rows[0].outcomes["polytile"].detail


def test_the_command_on_a_cuda_target_names_the_device_and_measures_no_cpu_peak(
        emulated: Config, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    from polytile import cli
    from polytile.bench import command, peak

    def no_peak(**_: Any) -> None:
        raise AssertionError("a GPU run measured the CPU's peak")
    monkeypatch.setenv("POLYTILE_CACHE_DIR", str(emulated.cache_dir))
    monkeypatch.setattr(command, "BLAS_ENV_VARS", ())   # never re-run in a child here
    monkeypatch.setattr(peak, "measure_peak", no_peak)
    fast_run = harness.run_workload
    monkeypatch.setattr(harness, "run_workload",
                        lambda w, **kw: fast_run(w, **{**kw, "options": FAST,
                                                       "sleep": _no_sleep}))
    results = tmp_path / "RESULTS.md"
    assert cli.main(["bench", "--quick", "--only", "tmm", "--target", "cuda-sm90",
                     "--write", str(results)]) == 0
    out = capsys.readouterr().out
    assert "polytile target: cuda-sm90 on CPU emulation (compute capability 9.0)" in out
    assert "NumPy: not timed in a GPU run" in out
    written = results.read_text()
    assert "not measured: a GPU run" in written
    assert "inputs on the device, each timed group synchronized" in written
