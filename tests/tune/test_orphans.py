"""`kill -9` of a tuning process takes its children with it (issue 11, defect 5: the
compile workers and the profiling process ran on indefinitely, holding its stdout)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import TMM

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")


def children(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            found.add(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_children_exit_when_the_tuner_is_killed(tmp_path: Path) -> None:
    source = tmp_path / "tmm.tc"
    source.write_text(TMM)
    env = dict(os.environ, POLYTILE_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join(sys.path))
    tuner = subprocess.Popen([sys.executable, "-m", "polytile", "tune", str(source),
                              "--sizes", "M=30,K=24,N=40", "--budget", "5m", "--quiet"],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 60
        # Wait for the profiling process and the compile workers to exist together.
        while time.monotonic() < deadline and len(seen) < 2:
            seen |= children(tuner.pid)
            time.sleep(0.05)
        assert len(seen) >= 2, "the tuner started no child processes in time"
        seen = {p for p in seen if alive(p)} | children(tuner.pid)
        os.kill(tuner.pid, signal.SIGKILL)
        tuner.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(alive(p) for p in seen):
            time.sleep(0.05)
        assert not [p for p in seen if alive(p)], "children outlived the killed tuner"
    finally:
        try:
            os.killpg(tuner.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize("prctl", [True, False], ids=["prctl", "polling"])
def test_die_with_parent_with_and_without_prctl(prctl: bool, tmp_path: Path) -> None:
    """The polling fallback (systems without PR_SET_PDEATHSIG) works as well."""
    child = ("import sys, time\n"
             "from polytile.tune import lifetime\n"
             f"if not {prctl}: lifetime._kernel_kills_us_with = lambda parent: False\n"
             "lifetime.die_with_parent(int(sys.argv[1]))\n"
             "time.sleep(60)\n")
    parent = ("import os, subprocess, sys, time\n"
              f"c = subprocess.Popen([sys.executable, '-c', {child!r}, str(os.getpid())])\n"
              "print(c.pid, flush=True)\n"
              "time.sleep(60)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, "-c", parent], env=env, stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        pid = int(proc.stdout.readline())
        time.sleep(0.5)                    # let it reach its sleep
        assert alive(pid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and alive(pid):
            time.sleep(0.05)
        assert not alive(pid)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
