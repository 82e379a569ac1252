"""Fixtures for tuner tests: a private cache (and so a private tuning database) per test."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from polytile.config import Config

# Small sizes that divide no tile: tmm compiles in well under a second.
TMM = """
def tmm(float(M,K) A, float(N,K) B) -> (C) {
  C(m,n) +=! A(m,kk) * B(n,kk)
}
"""


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return Config(cache_dir=tmp_path / "cache")


@pytest.fixture
def tmm_args() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return (rng.random((30, 24), dtype=np.float32) * 2 - 1,
            rng.random((40, 24), dtype=np.float32) * 2 - 1)


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
