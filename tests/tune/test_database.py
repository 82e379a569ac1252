"""The tuning database: best-entry rules, export / import, injection, concurrency, damage."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from polytile.compile import TuningKey
from polytile.config import Config
from polytile.errors import ArgumentError, PolytileError
from polytile.passes.schedule import Schedule
from polytile.tune.database import Measurement, TuningDatabase, lookup
from polytile.tune.options import Options

KEY = TuningKey("p" * 64, "float32[8, 8] | ", "cpu-avx2[]", "cc -> gcc: 12")
OTHER = TuningKey("p" * 64, "float32[16, 16] | ", "cpu-avx2[]", "cc -> gcc: 12")


def options(unroll: int) -> Options:
    return Options.of({"s0": Schedule("i1", 8, (("i0", unroll),), 1, (), False)},
                      {"fuse.strategy": "rows"})


def test_best_entry_is_the_fastest_measurement(tmp_path: Path) -> None:
    db = TuningDatabase(tmp_path / "t.sqlite3")
    assert db.best(KEY) is None
    db.record(KEY, "mm", [Measurement(options(1), "ok", 2e-3, 1e-5),
                          Measurement(options(2), "crash", detail="signal 11"),
                          Measurement(options(3), "ok", 1e-3, 1e-5)], "run1", 2e-3)
    best = db.best(KEY)
    assert best is not None and best.options == options(3) and best.median == 1e-3
    assert best.default_median == 2e-3 and best.function == "mm"
    db.record(KEY, "mm", [Measurement(options(4), "ok", 5e-3, 1e-5)], "run2")
    assert db.best(KEY).options == options(3)                     # slower: kept
    confirmed = Measurement(options(4), "ok", 5e-3, 1e-5)
    db.record(KEY, "mm", [confirmed], "run2", best=confirmed)
    assert db.best(KEY).options == options(4)                     # a confirmation: replaced
    assert [m["status"] for m in db.measurements(KEY)] == ["ok", "crash", "ok", "ok", "ok"]
    assert lookup(Config(cache_dir=tmp_path), KEY) is None         # another file name
    db2 = TuningDatabase.of(Config(cache_dir=tmp_path))
    db2.record(KEY, "mm", [Measurement(options(5), "ok", 1e-3)], "r")
    found = lookup(Config(cache_dir=tmp_path), KEY)
    assert found is not None and found["autotile.schedules"]["s0"].unroll == (("i0", 5),)


def test_injected_entry_is_used_until_something_is_measured(tmp_path: Path) -> None:
    db = TuningDatabase(tmp_path / "t.sqlite3")
    db.record(KEY, "mm", [Measurement(options(1), "ok", 1e-3)], "run1")
    db.inject(KEY, options(6), "mm")
    entry = db.best(KEY)
    assert entry.options == options(6) and entry.source == "injected" and entry.median is None
    db.record(KEY, "mm", [Measurement(options(2), "ok", 9e-3)], "run2")
    assert db.best(KEY).options == options(2)


def test_export_clear_import_restores_the_best_entries(tmp_path: Path) -> None:
    db = TuningDatabase(tmp_path / "t.sqlite3")
    db.record(KEY, "mm", [Measurement(options(1), "ok", 2e-3),
                          Measurement(options(3), "wrong", detail="3 elements")], "r", 4e-3)
    db.record(OTHER, "mm", [Measurement(options(2), "ok", 7e-3)], "r")
    data = json.loads(json.dumps(db.export()))            # through text, as the CLI does
    assert data["format"] == "polytile-tuning" and data["version"] == 1
    before = {(e.key, e.options, e.median, e.default_median) for e in db.entries()}
    assert db.clear() == 2
    assert db.best(KEY) is None and db.entries() == []
    assert db.import_(data) == (2, 3)
    assert {(e.key, e.options, e.median, e.default_median) for e in db.entries()} == before
    assert db.import_(data) == (0, 0)                     # idempotent
    assert len(db.measurements()) == 3


def test_import_keeps_the_faster_entry_and_rejects_bad_files(tmp_path: Path) -> None:
    db = TuningDatabase(tmp_path / "t.sqlite3")
    db.record(KEY, "mm", [Measurement(options(1), "ok", 1e-3)], "r")
    data = db.export()
    data["best"][0]["median"] = 5e-3
    data["best"][0]["options"] = options(2).to_json()
    db.import_(data)
    assert db.best(KEY).options == options(1)
    with pytest.raises(ArgumentError, match="not a polytile tuning export"):
        db.import_({"best": []})
    with pytest.raises(ArgumentError, match="version"):
        db.import_({**data, "version": 99})
    broken = {**data, "measurements": [{**data["measurements"][0], "status": "fine"}]}
    with pytest.raises(ArgumentError, match="malformed"):
        db.import_(broken)
    assert len(db.measurements()) == 1                    # nothing half-imported


def test_a_damaged_database_is_an_error_and_never_breaks_a_call(tmp_path: Path) -> None:
    path = tmp_path / "tuning.sqlite3"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(PolytileError, match="tuning database"):
        TuningDatabase(path).best(KEY)
    assert lookup(Config(cache_dir=tmp_path), KEY) is None


WRITER = """
import sys, time
from pathlib import Path
from polytile.compile import TuningKey
from polytile.passes.schedule import Schedule
from polytile.tune.database import Measurement, TuningDatabase
from polytile.tune.options import Options
path, tag, go = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
while not go.exists():
    time.sleep(0.005)
db = TuningDatabase(Path(path))
key = TuningKey("p", "s", "t", "c")
for k in range(150):
    o = Options.of({"s0": Schedule("i1", 8, (("i0", 1 + k),), 1, (), False)})
    db.record(key, "mm", [Measurement(o, "ok", (1000 + k * 2 + tag) * 1e-6)], f"run{tag}")
print("done")
"""


def test_two_tuners_writing_at_once_lose_no_records(tmp_path: Path) -> None:
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    path, go = tmp_path / "db" / "tuning.sqlite3", tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, str(script), str(path), str(tag), str(go)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for tag in (0, 1)]
    time.sleep(0.5)
    go.touch()
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    db = TuningDatabase(path)
    rows = db.measurements()
    assert len(rows) == 300
    assert {r["run"] for r in rows} == {"run0", "run1"}
    best = db.best(TuningKey("p", "s", "t", "c"))
    assert best is not None and best.median == pytest.approx(1000e-6)   # run0's first


def test_a_writer_killed_mid_run_leaves_a_consistent_database(tmp_path: Path) -> None:
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    path, go = tmp_path / "db" / "tuning.sqlite3", tmp_path / "go"
    go.touch()
    proc = subprocess.Popen([sys.executable, str(script), str(path), "0", str(go)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (path.exists() and
                                               len(TuningDatabase(path).measurements()) > 5):
        time.sleep(0.02)
    proc.kill()
    proc.communicate()
    db = TuningDatabase(path)
    import sqlite3
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    rows = db.measurements()
    assert 5 < len(rows) <= 150
    db.record(TuningKey("p", "s", "t", "c"), "mm", [Measurement(options(1), "ok", 1.0)], "next")
    assert len(db.measurements()) == len(rows) + 1


def test_similar_entries_are_the_same_program_family_at_other_sizes(tmp_path: Path) -> None:
    db = TuningDatabase(tmp_path / "t.sqlite3")
    unrelated = TuningKey("q" * 64, "float32[16, 16] | ", "cpu-avx2[]", "cc -> gcc: 12")
    elsewhere = TuningKey("p" * 64, "float32[32, 32] | ", "cpu-avx512[]", "cc -> gcc: 12")
    db.record(KEY, "mm", [Measurement(options(1), "ok", 1e-3)], "r", family="mm-family")
    db.record(OTHER, "mm", [Measurement(options(2), "ok", 2e-3)], "r", family="mm-family")
    db.record(unrelated, "mv", [Measurement(options(3), "ok", 3e-3)], "r", family="mv-family")
    db.record(elsewhere, "mm", [Measurement(options(4), "ok", 4e-3)], "r", family="mm-family")
    assert [e.options for e in db.similar(KEY, "mm-family")] == [options(2)]
    assert db.similar(KEY, "") == []
    # The family survives export -> clear -> import, and a key recorded without one
    # (an import from an older export) does not erase it.
    data = json.loads(json.dumps(db.export()))
    db.clear()
    db.import_(data)
    db.record(OTHER, "mm", [Measurement(options(5), "ok", 9e-3)], "r")
    assert [e.family for e in db.similar(KEY, "mm-family")] == ["mm-family"]


def test_a_version_1_database_is_migrated(tmp_path: Path) -> None:
    import sqlite3
    path = tmp_path / "t.sqlite3"
    db = TuningDatabase(path)
    db.record(KEY, "mm", [Measurement(options(1), "ok", 1e-3)], "r", family="f")
    with sqlite3.connect(path) as conn:      # what schema 1 looked like
        conn.execute("ALTER TABLE keys DROP COLUMN family")
        conn.execute("UPDATE meta SET value = '1' WHERE name = 'schema'")
    assert db.best(KEY).options == options(1) and db.best(KEY).family == ""
    db.record(KEY, "mm", [Measurement(options(2), "ok", 2e-3)], "r", family="f")
    assert db.best(KEY).family == "f" and db.similar(OTHER, "f")[0].key == KEY
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT value FROM meta WHERE name = 'schema'").fetchone() == ("2",)
