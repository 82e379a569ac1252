"""Fixtures for runtime tests: every test gets its own cache directory, never the user's."""
from __future__ import annotations

from pathlib import Path

import pytest

from polytile.config import Config
from polytile.runtime.toolchain import Toolchain, detect_toolchain

from .helpers import logging_compiler


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return Config(cache_dir=tmp_path / "cache")


@pytest.fixture
def toolchain(config: Config) -> Toolchain:
    return detect_toolchain(config)


@pytest.fixture
def logging_cc(tmp_path: Path) -> tuple[Path, Path]:
    """A POLYTILE_CC wrapper that appends its arguments to a log, then runs the real cc."""
    found = logging_compiler(tmp_path)
    if found is None:
        pytest.skip("no C compiler on PATH")
    return found
