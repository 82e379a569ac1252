"""Tuning end to end on a small tmm: bad candidates are rejected and tuning goes on; a
tuned entry is used by the next call, in a fresh process, without compiling."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import polytile
import polytile.backends.c_x86 as codegen   # the C backend's print_c, as it calls it
from polytile.codegen.c import CSource
from polytile.config import Config
from polytile.passes.schedule import Schedule
from polytile.tune import measure
from polytile.tune.database import TuningDatabase
from polytile.tune.options import Options

from .conftest import TMM

# Which candidates misbehave, by the register tile of s0 along i1 (the heuristics
# unroll it by 8 at these sizes, so the default is a good kernel).
BEHAVIOUR = {3: "crash", 5: "wrong", 6: "hang", 4: "compile-hang"}
_CURRENT: dict[str, str | None] = {"behaviour": None}
_real_build_one = measure.build_one
_real_print_c = codegen.print_c


def _behaviour(options: Options) -> str | None:
    s0 = options.schedule("s0")
    return BEHAVIOUR.get(dict(s0.unroll).get("i1", 1)) if s0 is not None else None


def _build_one(job, options, timeout):  # type: ignore[no-untyped-def]
    _CURRENT["behaviour"] = _behaviour(options)     # runs in the (forked) build worker
    return _real_build_one(job, options, timeout)


def _print_c(kernel, symbol=None):  # type: ignore[no-untyped-def]
    source = _real_print_c(kernel, symbol)
    behaviour = _CURRENT["behaviour"]
    bad = {"crash": "*(volatile int *)0 = 0;",
           "wrong": "((float *)args[2])[0] += 1.0f;",
           "hang": "for (volatile int spin = 1; spin;) {}"}.get(behaviour or "")
    if behaviour == "compile-hang":
        time.sleep(60)      # the tests' build timeout is 20 s: a loaded host (two test
        # workers on two cores) compiled an ordinary candidate in more than 4 s
    if bad is None:
        return source
    return CSource(source.text.replace("return pt_status;", bad + " return pt_status;"),
                   source.symbol)


def _schedule(unroll: int) -> Options:
    return Options.of({"s0": Schedule("i2", 16, (("i1", unroll),), 1, (), False)})


def test_crashing_hanging_and_wrong_candidates_are_rejected(
        config: Config, tmm_args: tuple[np.ndarray, np.ndarray],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(measure, "build_one", _build_one)
    monkeypatch.setattr(codegen, "print_c", _print_c)
    mod = polytile.define(TMM, config=config)
    start = [_schedule(u) for u in (3, 5, 6, 4, 2)]
    result = polytile.tune(mod.tmm, *tmm_args, start=start, population=6, generations=2,
                           elites=1, budget=240, build_timeout=20, run_timeout=4, confirm=0,
                           progress=False)
    rows = TuningDatabase.of(config).measurements(result.key)
    status = {}
    for row in rows:
        o = Options.from_json(row["options"])
        status.setdefault(_behaviour(o), set()).add(row["status"])
    assert status["crash"] == {"crash"}
    assert status["wrong"] == {"wrong"}
    assert status["hang"] == {"timeout"}
    assert status["compile-hang"] == {"compile-timeout"}
    assert "ok" in status[None]
    # Tuning went on: the second generation was measured after the failures.
    assert result.candidates > 6 and len(rows) == result.candidates
    assert result.best is not None and _behaviour(result.best) is None
    assert result.rejected["crash"] >= 1 and result.rejected["timeout"] >= 1
    entry = TuningDatabase.of(config).best(result.key)
    assert entry is not None and entry.options == result.best
    # The tuned kernel runs and is right.
    monkeypatch.setattr(codegen, "print_c", _real_print_c)
    a, b = tmm_args
    np.testing.assert_allclose(mod.tmm(a, b), a @ b.T, rtol=1e-4, atol=1e-4)


TUNE_CHILD = """
import json, sys
import numpy as np
import polytile
from polytile.runtime.toolchain import compiler_invocations
rng = np.random.default_rng(0)
a = rng.random((30, 24), dtype=np.float32); b = rng.random((40, 24), dtype=np.float32)
mod = polytile.define(open(sys.argv[1]).read())
if sys.argv[2] == "tune":
    settings = {"start": [sys.argv[3]], "candidates": 3, "population": 3, "confirm": 0,
                "progress": False}
    c = mod.tmm(a, b, tune=settings)        # tunes, then runs the tuned kernel
    from polytile.tune.database import TuningDatabase
    from polytile.config import load_config
    (entry,) = TuningDatabase.of(load_config()).entries()
    print(json.dumps({"best": entry.options.text()}))
else:
    c = mod.tmm(a, b)
    kernel = next(iter(mod.tmm._kernels.values()))
    print(json.dumps({"invocations": compiler_invocations(), "options": kernel.key.options,
                      "error": float(np.abs(c - a @ b.T).max())}))
"""


def test_a_tuned_entry_is_used_in_a_fresh_process_without_compiling(
        tmp_path: Path, logging_cc: tuple[Path, Path]) -> None:
    wrapper, log = logging_cc
    script, source = tmp_path / "child.py", tmp_path / "tmm.tc"
    script.write_text(TUNE_CHILD)
    source.write_text(TMM)
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYTILE_")}
    env.update(POLYTILE_CACHE_DIR=str(tmp_path / "cache"), POLYTILE_CC=str(wrapper))
    # A starting point much faster than the default is hard to guarantee; what matters
    # is that whatever won is what the next process uses.
    start = _schedule(2).dumps()

    def child(*args: str) -> dict:
        out = subprocess.run([sys.executable, str(script), str(source), *args], env=env,
                             capture_output=True, text=True, timeout=300, check=False)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])

    best = child("tune", start)["best"]
    compiles = log.read_text().count("kernel.c")
    assert compiles >= 2                              # the candidates were built
    used = child("use")
    assert used["invocations"] == 0                   # no compile, no probe
    assert log.read_text().count("kernel.c") == compiles
    assert used["error"] < 1e-4
    db_best = TuningDatabase(tmp_path / "cache" / "tuning.sqlite3").entries()
    assert [e.options.text() for e in db_best] == [best]
    assert "autotile.schedules=" in used["options"]   # the tuned options, not the default key
    for name, schedule in Options.from_json(db_best[0].options.to_json()).schedules:
        assert f"{name}:{schedule.text()}" in used["options"]


def test_the_best_entry_of_another_size_seeds_the_first_generation(
        config: Config, tmm_args: tuple[np.ndarray, np.ndarray]) -> None:
    from polytile.sema.specialize import specialize
    from polytile.tune.tuner import program_family
    mod = polytile.define(TMM, config=config)
    a, b = tmm_args
    other = specialize(mod.tmm.fn, {"A": (50, 24), "B": (40, 24)}, {})
    assert mod.tmm.compiler is not None
    db = TuningDatabase.of(config)
    db.inject(mod.tmm.compiler.tuning_key(other), _schedule(2), "tmm", program_family(other))
    # Two candidates: the default, then the seed (random points come after the seeds).
    result = polytile.tune(mod.tmm, a, b, candidates=2, population=4, confirm=0,
                           progress=False, budget=120)
    measured = [Options.from_json(row["options"]) for row in db.measurements(result.key)]
    assert len(measured) == 2
    unrolls = [dict(o.schedule("s0").unroll).get("i1", 1) for o in measured]
    assert unrolls[0] != 2 and unrolls[1] == 2, unrolls
