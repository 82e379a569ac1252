"""The disk cache seen from other processes: a warm start compiles nothing, and two
processes building the same key at once leave one valid entry."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from polytile.runtime.cache import _verified_so
from polytile.runtime.key import CacheKey

# Configured only through the environment, as a user's process would be.
CHILD = """\
import ctypes, pathlib, sys, time
from polytile.backends import Generated
from polytile.config import load_config
from polytile.runtime.cache import KernelCache
from polytile.runtime.key import CacheKey
from polytile.runtime.toolchain import BuildOptions, compiler_invocations, flags_for

go = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else None
while go is not None and not go.exists():   # start line for the concurrent test
    time.sleep(0.005)
cache = KernelCache(load_config())
tc = cache.toolchain
key = CacheKey(program="add", signature="int64,int64", target="test-host", options="",
               flags=flags_for(tc, BuildOptions(openmp=False)), compiler=tc.identity)
lib = cache.get_or_build(key, lambda: Generated((("c", SOURCE),), "kernel.c"))
fn = lib.cdll.add
fn.restype = ctypes.c_int64
fn.argtypes = [ctypes.c_int64, ctypes.c_int64]
print(fn(2, 3), compiler_invocations())
"""


def child_command(tmp_path: Path, *args: str) -> list[str]:
    from .helpers import ADD_SOURCE
    script = tmp_path / "child.py"
    script.write_text(f"SOURCE = {ADD_SOURCE!r}\n{CHILD}")
    return [sys.executable, str(script), *args]


def child_env(cache_dir: Path, cc: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYTILE_")}
    return {**env, "POLYTILE_CACHE_DIR": str(cache_dir), "POLYTILE_CC": str(cc)}


def run_child(tmp_path: Path, env: dict[str, str]) -> tuple[int, int]:
    out = subprocess.run(child_command(tmp_path), env=env, capture_output=True, text=True,
                         check=True, timeout=120).stdout.split()
    return int(out[0]), int(out[1])


def test_fresh_process_hits_the_disk_cache(tmp_path: Path,
                                           logging_cc: tuple[Path, Path]) -> None:
    wrapper, log = logging_cc
    env = child_env(tmp_path / "cache", wrapper)
    assert run_child(tmp_path, env)[0] == 5
    lines = log.read_text().splitlines()
    assert any("kernel.c" in line for line in lines)  # the wrapper really was used
    # No kernel build, no --version, no probe: the log gains no line.
    assert run_child(tmp_path, env) == (5, 0)
    assert log.read_text().splitlines() == lines


def test_fresh_process_rebuilds_a_truncated_entry(tmp_path: Path,
                                                  logging_cc: tuple[Path, Path]) -> None:
    wrapper, log = logging_cc
    env = child_env(tmp_path / "cache", wrapper)
    run_child(tmp_path, env)
    (entry,) = (tmp_path / "cache" / "kernels").iterdir()
    (so,) = entry.glob("*.so")
    so.write_bytes(so.read_bytes()[:100])
    assert run_child(tmp_path, env) == (5, 1)
    assert sum("kernel.c" in line for line in log.read_text().splitlines()) == 2


def test_two_processes_build_the_same_key_at_once(tmp_path: Path,
                                                  logging_cc: tuple[Path, Path]) -> None:
    wrapper, log = logging_cc
    cache_dir = tmp_path / "cache"
    env = child_env(cache_dir, wrapper)
    go = tmp_path / "go"
    children = [subprocess.Popen(child_command(tmp_path, str(go)), env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(3)]
    time.sleep(0.3)  # let every child import and wait at the start line
    go.touch()
    outputs = [child.communicate(timeout=120) for child in children]
    assert [child.returncode for child in children] == [0, 0, 0], outputs
    assert [out.split()[:1] for out, _ in outputs] == [["5"]] * 3, outputs
    # The lock let exactly one of them compile; the others waited and then hit.
    assert sum("kernel.c" in line for line in log.read_text().splitlines()) == 1
    (entry,) = (cache_dir / "kernels").iterdir()
    assert list((cache_dir / "tmp").iterdir()) == []
    # The key as the children made it (the polytile part is theirs: other work on
    # the package may have changed its source hash since).
    parts = json.loads((entry / "meta.json").read_text())["key"]
    key = CacheKey(**{**parts, "flags": tuple(parts["flags"])})
    assert key.digest() == entry.name
    assert all(path.exists() for path in _verified_so(entry, key))
