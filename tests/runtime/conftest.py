"""Fixtures for runtime tests: every test gets its own cache directory, never the user's."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from polytile.config import Config
from polytile.runtime.toolchain import Toolchain, detect_toolchain


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return Config(cache_dir=tmp_path / "cache")


@pytest.fixture
def toolchain(config: Config) -> Toolchain:
    return detect_toolchain(config)


@pytest.fixture
def logging_cc(tmp_path: Path) -> tuple[Path, Path]:
    """A POLYTILE_CC wrapper that appends its arguments to a log, then runs the real cc."""
    real = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if real is None:
        pytest.skip("no C compiler on PATH")
    log = tmp_path / "cc.log"
    log.touch()
    wrapper = tmp_path / "logging-cc"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> "{log}"\nexec "{real}" "$@"\n')
    wrapper.chmod(0o755)
    return wrapper, log
