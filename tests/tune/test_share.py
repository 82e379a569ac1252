"""Sharing tuning databases (TC §8.1): `polytile cache export --target T` and `polytile
cache import`, which keeps the best per key and never a result measured on other hardware."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from polytile import cli
from polytile.compile import TuningKey
from polytile.config import load_config
from polytile.errors import ArgumentError
from polytile.passes.schedule import Schedule
from polytile.targets.target import select_target
from polytile.tune.database import Measurement, TuningDatabase, only_targets, target_matches
from polytile.tune.options import Options

HERE = select_target().identity            # what this host measures for
ELSEWHERE = "cpu-avx2[avx2,fma](L1=48K,L2=2048K,L3=98304K)"   # another machine's caches
GENERIC = "cpu-generic[](L1=32K,L2=512K,L3=8192K)"


def key(target: str, size: int = 8) -> TuningKey:
    return TuningKey("p" * 64, f"float32[{size}, {size}] | ", target, "cc -> gcc: 12")


def options(unroll: int) -> Options:
    return Options.of({"s0": Schedule("i1", 8, (("i0", unroll),), 1, (), False)})


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> TuningDatabase:
    monkeypatch.setenv("POLYTILE_CACHE_DIR", str(tmp_path / "cache"))
    return TuningDatabase.of(load_config())


def test_export_of_one_target(db: TuningDatabase) -> None:
    db.record(key(ELSEWHERE), "mm", [Measurement(options(2), "ok", 1e-3)], "r")
    db.record(key(GENERIC), "mm", [Measurement(options(1), "ok", 4e-3),
                                   Measurement(options(3), "crash", detail="11")], "r")
    generic = db.export("cpu-generic")
    assert [e["key"]["target"] for e in generic["best"]] == [GENERIC]
    assert [r["status"] for r in generic["measurements"]] == ["ok", "crash"]
    assert db.export(ELSEWHERE)["best"][0]["key"]["target"] == ELSEWHERE
    assert db.export("cpu-avx512")["best"] == []
    assert len(db.export()["best"]) == 2
    assert target_matches(ELSEWHERE, "cpu-avx2") and not target_matches(GENERIC, "cpu-avx2")


def test_only_targets_validates_first_and_counts_what_it_leaves_out(db: TuningDatabase) -> None:
    db.record(key(ELSEWHERE), "mm", [Measurement(options(2), "ok", 1e-3)], "r")
    db.record(key(HERE), "mm", [Measurement(options(1), "ok", 4e-3)], "r")
    data = json.loads(json.dumps(db.export()))
    kept, skipped = only_targets(data, lambda t: t == HERE)
    assert [e["key"]["target"] for e in kept["best"] + kept["measurements"]] == [HERE] * 2
    assert skipped == {ELSEWHERE: 2}
    with pytest.raises(ArgumentError, match="not a polytile tuning export"):
        only_targets({"best": []}, lambda t: True)


def test_import_keeps_this_hardware_only_and_the_best_per_key(
        db: TuningDatabase, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Another machine's database: a fast result for this host's target, a faster one
    # measured on other hardware, and a slower one for a key we have tuned already.
    other = TuningDatabase(tmp_path / "other.sqlite3")
    other.record(key(HERE), "mm", [Measurement(options(2), "ok", 2e-3, host="b")], "r")
    other.record(key(ELSEWHERE), "mm", [Measurement(options(4), "ok", 1e-4, host="c")], "r")
    other.record(key(HERE, 16), "mm", [Measurement(options(3), "ok", 9e-3, host="b")], "r")
    exported = tmp_path / "other.json"
    exported.write_text(json.dumps(other.export()))
    db.record(key(HERE, 16), "mm", [Measurement(options(1), "ok", 5e-3)], "r")
    assert cli.main(["cache", "import", str(exported)]) == 0
    out = capsys.readouterr().out
    assert "imported 1 tuned entries and 2 measurements" in out
    assert f"skipped 2 entries and measurements for {ELSEWHERE}" in out
    entries = {e.key: e for e in db.entries()}
    assert set(entries) == {key(HERE), key(HERE, 16)}
    assert entries[key(HERE)].options == options(2) and entries[key(HERE)].host == "b"
    assert entries[key(HERE, 16)].options == options(1)          # ours was faster
    assert {m["host"] for m in db.measurements(key(HERE))} == {"b"}


def test_export_target_on_the_command_line(db: TuningDatabase, tmp_path: Path) -> None:
    db.record(key(HERE), "mm", [Measurement(options(2), "ok", 2e-3)], "r")
    db.record(key(ELSEWHERE, 4), "mm", [Measurement(options(1), "ok", 2e-3)], "r")
    out = tmp_path / "here.json"
    assert cli.main(["cache", "export", "--target", HERE, str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["target"] == HERE
    assert [e["key"]["target"] for e in data["best"]] == [HERE]
