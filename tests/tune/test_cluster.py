"""Tuning on a Dask LocalCluster of 2 worker processes (issue 18): a tune completes and a
fresh process uses its result without compiling; a worker killed while it measures is
survived; a worker of other hardware is skipped; bad candidates are rejected remotely."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import polytile
from polytile.config import Config
from polytile.errors import ArgumentError
from polytile.passes.schedule import Schedule
from polytile.tune.database import TuningDatabase
from polytile.tune.options import Options

from . import cluster_faults as faults
from .conftest import TMM

distributed = pytest.importorskip(
    "distributed", reason="the cluster extra (Dask distributed) is not installed: "
                          "pip install 'polytile[cluster]'")

ROOT = Path(__file__).resolve().parents[2]


def _schedule(unroll: int) -> Options:
    return Options.of({"s0": Schedule("i2", 16, (("i1", unroll),), 1, (), False)})


@pytest.fixture
def client(config: Config) -> Iterator[Any]:
    from polytile.tune.cluster import connect
    with connect("local:2", {"POLYTILE_CACHE_DIR": str(config.cache_dir)}) as c:
        yield c


def _pids(client: Any) -> dict[str, int]:
    return client.run(os.getpid)  # type: ignore[no-any-return]


# ------------------------------------------------------------ tests
USE_CHILD = """
import json, sys
import numpy as np
import polytile
from polytile.runtime.toolchain import compiler_invocations
from polytile.tune.command import random_arguments
mod = polytile.define(open(sys.argv[1]).read())
a, b = random_arguments(mod.tmm.fn, {"M": 30, "K": 24, "N": 40}, np.random.default_rng(0))
c = mod.tmm(a, b)
kernel = next(iter(mod.tmm._kernels.values()))
print(json.dumps({"invocations": compiler_invocations(), "options": kernel.key.options,
                  "error": float(np.abs(c - a @ b.T).max())}))
"""


def test_a_cluster_tune_completes_and_a_fresh_process_uses_it_without_compiling(
        tmp_path: Path, logging_cc: tuple[Path, Path]) -> None:
    wrapper, log = logging_cc
    source, script = tmp_path / "tmm.tc", tmp_path / "use.py"
    source.write_text(TMM)
    script.write_text(USE_CHILD)
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYTILE_")}
    env.update(POLYTILE_CACHE_DIR=str(tmp_path / "cache"), POLYTILE_CC=str(wrapper),
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    tuned = subprocess.run(
        [sys.executable, "-m", "polytile", "tune", str(source), "--sizes", "M=30,K=24,N=40",
         "--cluster", "local:2", "--budget", "90s", "--candidates", "3", "--population", "3",
         "--quiet"], env=env, capture_output=True, text=True, timeout=300, check=False)
    assert tuned.returncode == 0, tuned.stdout + tuned.stderr
    assert "tmm: best options" in tuned.stdout
    compiles = log.read_text().count("kernel.c")
    dispatch_builds = _dispatch_builds(log)
    lines = len(log.read_text().splitlines())
    assert compiles >= 2                       # the workers built the candidates
    db = TuningDatabase(tmp_path / "cache" / "tuning.sqlite3")
    (entry,) = db.entries()
    rows = db.measurements(entry.key)
    assert len([r for r in rows if r["detail"] == ""]) == 3     # the search's candidates
    assert all(r["status"] == "ok" for r in rows)
    used = subprocess.run([sys.executable, str(script), str(source)], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert used.returncode == 0, used.stderr
    found = json.loads(used.stdout.strip().splitlines()[-1])
    # No kernel compiled, no probe: the winner is cached. The native call path
    # (runtime/dispatch.c), once per cache, may have started building in the background.
    assert log.read_text().count("kernel.c") == compiles
    assert found["invocations"] <= 1
    assert len(log.read_text().splitlines()) - lines == _dispatch_builds(log) - dispatch_builds
    assert found["error"] < 1e-4
    for name, schedule in entry.options.schedules:
        assert f"{name}:{schedule.text()}" in found["options"]


def _dispatch_builds(log: Path) -> int:
    """Compiler runs in the log that built the native call path."""
    return sum("_pt_dispatch" in line for line in log.read_text().splitlines())


# Not marked slow (8-20 s here, under load): issue 18 asks CI to show a lost worker survived.
def test_a_worker_killed_while_measuring_loses_nothing(
        client: Any, config: Config, tmm_args: tuple[np.ndarray, np.ndarray]) -> None:
    first, second = sorted(_pids(client))
    before = _pids(client)
    client.run(faults.die_in_first_candidate, workers=[second])
    mod = polytile.define(TMM, config=config)
    result = polytile.tune(mod.tmm, *tmm_args, cluster=client, population=4, candidates=4,
                           confirm=0, budget=120, progress=False)
    assert result.candidates == 4 and result.rejected == {}, result.rejected
    rows = TuningDatabase.of(config).measurements(result.key)
    assert sorted(r["status"] for r in rows) == ["ok"] * 4
    client.wait_for_workers(2, timeout=60)
    after = _pids(client)
    assert after[first] == before[first]
    restarted = [a for a in after if a != first]
    assert len(restarted) == 1 and after[restarted[0]] != before[second]
    a, b = tmm_args
    np.testing.assert_allclose(mod.tmm(a, b), a @ b.T, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_a_worker_of_other_hardware_is_reported_and_skipped(
        client: Any, config: Config, tmm_args: tuple[np.ndarray, np.ndarray]) -> None:
    first, second = sorted(_pids(client))
    client.run(faults.pretend_other_hardware, workers=[second])
    mod = polytile.define(TMM, config=config)
    # By the scheduler's address, as `--cluster tcp://...` connects.
    address = client.scheduler.address
    assert address.startswith("tcp://")
    result = polytile.tune(mod.tmm, *tmm_args, cluster=address, population=4, candidates=4,
                           confirm=0, budget=120, progress=False)
    assert result.candidates == 4 and result.rejected == {}
    (note,) = result.notes
    assert second in note and "skipped: its target is cpu-" in note and "L2=128K" in note
    assert client.run(faults.candidates_given, workers=[second])[second] == 0
    # With no worker of the key's hardware left, the run is refused and says why.
    client.run(faults.pretend_other_hardware, workers=[first])
    with pytest.raises(ArgumentError, match="no worker of the cluster measures"):
        polytile.tune(mod.tmm, *tmm_args, cluster=client, candidates=2, progress=False)


@pytest.fixture
def faulty_client(config: Config) -> Iterator[Any]:
    """Two workers whose build and profiling processes misbehave (cluster_faults)."""
    from polytile.tune.cluster import connect
    hooks = Path(__file__).parent / "cluster_hooks"
    path = os.pathsep.join([str(hooks), str(ROOT), os.environ.get("PYTHONPATH", "")])
    with connect("local:2", {"POLYTILE_CACHE_DIR": str(config.cache_dir),
                             "PT_TEST_CLUSTER_FAULTS": "1", "PYTHONPATH": path}) as c:
        yield c


@pytest.mark.slow
def test_crashing_wrong_and_hanging_candidates_are_rejected_on_workers(
        faulty_client: Any, config: Config, tmm_args: tuple[np.ndarray, np.ndarray]) -> None:
    pids = _pids(faulty_client)
    mod = polytile.define(TMM, config=config)
    start = [_schedule(u) for u in (3, 5, 6, 4, 2)]
    result = polytile.tune(mod.tmm, *tmm_args, cluster=faulty_client, start=start,
                           population=6, candidates=6, confirm=0, run_timeout=4,
                           build_timeout=20, budget=120, progress=False)
    rows = TuningDatabase.of(config).measurements(result.key)
    status = {faults.behaviour(Options.from_json(r["options"])): r["status"] for r in rows}
    assert status["crash"] == "crash" and status["wrong"] == "wrong"
    assert status["hang"] == "timeout" and status["compile-hang"] == "compile-timeout"
    assert status[None] == "ok"
    assert result.best is not None and faults.behaviour(result.best) is None
    assert _pids(faulty_client) == pids        # the kernels and compiles died, not the workers
