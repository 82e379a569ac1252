"""`polytile tune` and `polytile cache export|import|inject|clear --tuning`."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from polytile import cli
from polytile.config import load_config
from polytile.tune.database import TuningDatabase

from .conftest import TMM

# 8 lanes: possible on every AVX target (cpu-avx2 has 8 float32 lanes, cpu-avx512 16).
INJECTED = {"schedules": {"s0": {"vector": "i2", "lanes": 8, "unroll": [["i1", 2]]}}}


@pytest.fixture
def tc_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("POLYTILE_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "tmm.tc"
    path.write_text(TMM)
    return path


def test_inject_export_clear_import(tc_file: Path, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    sizes = "--sizes=M=30,K=24,N=40"
    assert cli.main(["cache", "inject", str(tc_file), sizes,
                     "--options", json.dumps(INJECTED)]) == 0
    (entry,) = TuningDatabase.of(load_config()).entries()
    assert entry.source == "injected" and entry.function == "tmm"
    assert entry.options.schedule("s0").unroll == (("i1", 2),)
    exported = tmp_path / "tuning.json"
    assert cli.main(["cache", "export", str(exported)]) == 0
    assert cli.main(["cache", "clear", "--tuning"]) == 0
    assert TuningDatabase.of(load_config()).entries() == []
    assert cli.main(["cache", "import", str(exported)]) == 0
    assert TuningDatabase.of(load_config()).entries() == [entry]
    capsys.readouterr()
    # A block the program does not have is refused, with the blocks it does have.
    bad = json.dumps({"schedules": {"s7": {"vector": "i2"}}})
    assert cli.main(["cache", "inject", str(tc_file), sizes, "--options", bad]) == 1
    assert "s0, s0_init" in capsys.readouterr().err
    assert cli.main(["cache", "import", str(tc_file)]) == 1       # not JSON


def test_tune_command_prints_options_and_table(tc_file: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["tune", str(tc_file), "--sizes", "M=30,K=24,N=40", "--budget", "2m",
                     "--candidates", "3", "--population", "3", "--strategy", "random",
                     "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "tmm: best options" in out and "json: {" in out
    assert "speedup" in out.splitlines()[-2] and out.splitlines()[-1].startswith("tmm")
    options = json.loads(out.split("json: ")[1].splitlines()[0])
    (entry,) = TuningDatabase.of(load_config()).entries()
    assert entry.options.to_json() == options


def test_a_run_without_best_options_says_why() -> None:
    """Issue 11: a budget that ended before anything was measured printed "(no candidate
    ran correctly)", which blamed candidates that never ran."""
    from types import SimpleNamespace

    from polytile.tune.command import no_best
    text = no_best(SimpleNamespace(candidates=0), "4s")
    assert "budget of 4s ended before any candidate was measured" in text
    assert "no candidate ran correctly: 5 measured" in no_best(SimpleNamespace(candidates=5), "1m")


def test_tune_falls_back_to_zero_indices_when_random_ones_are_out_of_bounds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A shift table: random values in [0, smallest size) push h + sh(c) past the input's
    rows; the run goes on with zero shifts and says so, instead of stopping."""
    monkeypatch.setenv("POLYTILE_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "shift.tc"
    path.write_text("def shift(float(C,H) X, int32(C) sh) -> (Y) {\n"
                    "  Y(c,h) = X(c, h + 1 + sh(c)) where h in 0:H-2\n}\n")
    assert cli.main(["tune", str(path), "--sizes", "C=40,H=12", "--budget", "2m",
                     "--candidates", "3", "--population", "3", "--strategy", "random",
                     "--quiet"]) == 0
    captured = capsys.readouterr()
    assert "tuning with zero indices instead" in captured.err
    assert "shift: best options" in captured.out
