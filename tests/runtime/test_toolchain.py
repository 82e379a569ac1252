from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from polytile.config import Config
from polytile.errors import BuildError
from polytile.runtime.toolchain import (
    BuildOptions,
    Toolchain,
    compiler_invocations,
    detect_toolchain,
    find_compiler,
    flags_for,
)


def test_finds_a_compiler_by_default() -> None:
    path = find_compiler(None)
    assert os.path.isabs(path) and os.access(path, os.X_OK)


def test_explicit_missing_compiler_is_an_error() -> None:
    with pytest.raises(BuildError, match="POLYTILE_CC"):
        find_compiler("no-such-compiler-polytile")


def test_detect_probes_once_and_records(toolchain: Toolchain, config: Config) -> None:
    assert toolchain.version and toolchain.real_path == os.path.realpath(toolchain.path)
    assert toolchain.path in toolchain.identity and toolchain.version in toolchain.identity
    before = compiler_invocations()
    assert detect_toolchain(config) is toolchain  # per-process cache
    assert compiler_invocations() == before
    (record,) = (config.cache_dir / "toolchains").iterdir()
    assert Toolchain(**json.loads(record.read_text())) == toolchain


def test_wrapper_is_its_own_identity(logging_cc: tuple[Path, Path], tmp_path: Path) -> None:
    wrapper, log = logging_cc
    toolchain = detect_toolchain(Config(cache_dir=tmp_path / "cache", cc=str(wrapper)))
    assert toolchain.path == str(wrapper)
    assert "--version" in log.read_text()


def test_unreadable_record_is_probed_again(logging_cc: tuple[Path, Path], tmp_path: Path) -> None:
    wrapper, log = logging_cc
    first = detect_toolchain(Config(cache_dir=tmp_path / "a", cc=str(wrapper)))
    (record,) = (tmp_path / "a" / "toolchains").iterdir()
    other = tmp_path / "b" / "toolchains"
    other.mkdir(parents=True, mode=0o700)
    (tmp_path / "b").chmod(0o700)
    (other / record.name).write_text("{not json")
    lines = len(log.read_text().splitlines())
    assert detect_toolchain(Config(cache_dir=tmp_path / "b", cc=str(wrapper))) == first
    assert len(log.read_text().splitlines()) > lines
    assert json.loads((other / record.name).read_text())["version"] == first.version


def test_no_disk_cache_writes_no_record(tmp_path: Path) -> None:
    detect_toolchain(Config(cache_dir=tmp_path / "cache", disable_disk_cache=True))
    assert not (tmp_path / "cache").exists()


def test_flags_follow_what_the_compiler_supports() -> None:
    full = Toolchain("/cc", "/cc", "cc 1", supports_march_native=True, supports_openmp=True)
    bare = Toolchain("/cc", "/cc", "cc 1", supports_march_native=False, supports_openmp=False)
    assert flags_for(full) == ("-O3", "-march=native", "-fopenmp")
    assert flags_for(bare) == ("-O3",)
    assert flags_for(full, BuildOptions(opt_level=1, native=False, openmp=False,
                                        extra=("-DX=1",))) == ("-O1", "-DX=1")
    with pytest.raises(ValueError):
        BuildOptions(opt_level=7)
