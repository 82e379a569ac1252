"""Sanitizer builds (issue 11): kernels built with AddressSanitizer and UBSan, a report
that names the kernel and ends the process, POLYTILE_CC with arguments, and the
sanitizer job: conformance cases, gathers and boundary-tile sizes with zero reports."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import polytile as pt
from polytile.config import Config, load_config, parse_sanitizers
from polytile.errors import BuildError, PolytileError
from polytile.runtime.toolchain import detect_toolchain

ROOT = Path(__file__).resolve().parents[2]
CORPUS = Path(__file__).with_name("sanitized_corpus.py")
REPORTS = ("ERROR: AddressSanitizer", "runtime error:", "LeakSanitizer")


def env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "POLYTILE_CACHE_DIR": str(tmp_path / "cache"),
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            **extra}


def sanitized(tmp_path: Path, *command: str, timeout: float = 600
              ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "polytile", "sanitize", "--", *command],
                          env=env(tmp_path), capture_output=True, text=True, timeout=timeout)


def test_compiler_command_with_arguments(tmp_path: Path) -> None:
    config = Config(cache_dir=tmp_path, cc="cc -DPOLYTILE_UNUSED=1 -fno-strict-aliasing")
    toolchain = detect_toolchain(config)
    assert toolchain.args == ("-DPOLYTILE_UNUSED=1", "-fno-strict-aliasing")
    assert "-fno-strict-aliasing" in toolchain.identity
    mod = pt.define("def f(float(N) A) -> (B) { B(i) = A(i) * 3 }", config=config)
    np.testing.assert_array_equal(mod.f(np.ones(5, np.float32)), np.full(5, 3, np.float32))
    with pytest.raises(BuildError, match="not a command"):
        detect_toolchain(Config(cache_dir=tmp_path, cc="cc 'unclosed"))


def test_sanitizer_settings_are_checked_and_keyed(tmp_path: Path) -> None:
    assert load_config({"POLYTILE_SANITIZE": "undefined, address"}).sanitize == (
        "address", "undefined")
    with pytest.raises(PolytileError, match="unknown sanitizers thread"):
        load_config({"POLYTILE_SANITIZE": "thread"})
    with pytest.raises(PolytileError, match="unknown sanitizers"):
        pt.define("def f(float(N) A) -> (B) { B(i) = A(i) }", sanitize="memory")
    assert parse_sanitizers(["undefined"]) == ("undefined",)
    # UBSan loads into any process: a sanitized build is its own cache entry.
    config = Config(cache_dir=tmp_path / "cache")
    source = "def f(int32(N) A) -> (B) { B(i) = A(i) * 3 }"
    a = np.arange(5, dtype=np.int32)
    np.testing.assert_array_equal(pt.define(source, config=config).f(a), a * 3)
    np.testing.assert_array_equal(pt.define(source, config=config, sanitize="undefined").f(a),
                                  a * 3)
    assert len(list((tmp_path / "cache" / "kernels").iterdir())) == 2


def test_address_sanitizing_without_its_runtime_says_how_to_run(tmp_path: Path) -> None:
    mod = pt.define("def f(float(N) A) -> (B) { B(i) = A(i) }",
                    config=Config(cache_dir=tmp_path), sanitize="address")
    with pytest.raises(BuildError, match="AddressSanitizer need its runtime") as info:
        mod.f(np.ones(3, np.float32))
    assert "polytile sanitize -- python" in info.value.render()


BAD_KERNELS = {
    "address": ("float *a = args[0]; volatile int i = 4; a[i] = 1.0f;",
                "AddressSanitizer: heap-buffer-overflow"),
    # A positive addend from the arguments (a pointer's low bits, or 1), so the compiler
    # cannot fold it: taking the pointer's low 32 bits as they are made the test pass only
    # when they happened to be a positive int.
    "undefined": ("volatile int x = 2147483647; x = x + (int)(((long)args[1] & 0xffff) | 1);",
                  "runtime error: signed integer overflow"),
}


@pytest.mark.parametrize("kind", list(BAD_KERNELS))
def test_a_report_names_the_kernel_and_ends_the_process(kind: str, tmp_path: Path) -> None:
    """Proof that the job below can see something: a hand-written bad kernel, built and
    loaded the way polytile builds and loads its own."""
    body, report = BAD_KERNELS[kind]
    script = tmp_path / "bad.py"
    script.write_text(f"""
import numpy as np
from pathlib import Path
from polytile.config import load_config
from polytile.runtime.build import build_shared_object
from polytile.runtime.kernel import Kernel
from polytile.runtime.sanitize import sanitizer_flags
from polytile.runtime.toolchain import detect_toolchain
config = load_config()
source = '''#include <stdint.h>
int32_t polytile_kernel(void **args, int64_t *err) {{ {body} return 0; }}
'''
so = Path({str(tmp_path)!r}) / "kernel.so"
build_shared_object(source, ("-O1", *sanitizer_flags(config.sanitize)),
                    detect_toolchain(config), so)
a = np.zeros(4, np.float32)
Kernel(so, 2)([a, np.ones(1, np.int64)])
print("not reported")
""")
    done = subprocess.run([sys.executable, "-m", "polytile", "sanitize", "--with", kind, "--",
                           sys.executable, str(script)], env=env(tmp_path),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "not reported" not in done.stdout
    assert report in done.stderr and "kernel.c" in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize("every", [
    15, pytest.param(1, marks=pytest.mark.slow, id="whole corpus")])
def test_the_conformance_corpus_gathers_and_boundary_tiles_have_no_reports(
        tmp_path: Path, every: int) -> None:
    """The sanitizer job: conformance cases (every 15th in the ordinary run; all 109
    take three minutes under ASan + UBSan on a Zen 3 EPYC, a slow test), gathers at the
    bounds and out of them, and matmuls at boundary-tile sizes such as 97x13x31."""
    done = sanitized(tmp_path, sys.executable, str(CORPUS), "--every", str(every),
                     timeout=1800)
    assert not any(r in done.stderr for r in REPORTS), done.stderr[-3000:]
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ok gathers at the bounds" in done.stdout and "ok mm/tmm 97x13x31" in done.stdout
