"""The fixture of the CUDA tests that run on the emulated driver API."""
from __future__ import annotations

from pathlib import Path

import pytest
from gpu.cuda_emulation import emulated_device

from polytile.config import Config
from polytile.runtime import cuda as runtime


@pytest.fixture
def emulated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Config:
    """A configuration whose cuda kernels run on the emulated driver."""
    config = Config(cache_dir=tmp_path / "cache")
    device = emulated_device(tmp_path / "cache", tmp_path)
    monkeypatch.setattr(runtime, "cuda_device", lambda: device)
    return config
