from __future__ import annotations

from pathlib import Path

import platformdirs
import pytest

from polytile.config import Config, load_config
from polytile.errors import PolytileError


def test_defaults_from_an_empty_environment() -> None:
    config = load_config({})
    assert config == Config(cache_dir=Path(platformdirs.user_cache_dir("polytile")).absolute())
    assert config.cc is None and config.target is None
    assert not config.disable_disk_cache and not config.keep_build_dirs


def test_every_variable(tmp_path: Path) -> None:
    config = load_config({
        "POLYTILE_CACHE_DIR": str(tmp_path / "c"), "POLYTILE_CC": "clang",
        "POLYTILE_TARGET": "cpu-avx2", "POLYTILE_NO_DISK_CACHE": "1",
        "POLYTILE_KEEP_BUILD_DIRS": "yes",
    })
    assert config == Config(cache_dir=tmp_path / "c", cc="clang", target="cpu-avx2",
                            disable_disk_cache=True, keep_build_dirs=True)


def test_cache_dir_is_made_absolute(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    assert load_config({"POLYTILE_CACHE_DIR": "rel"}).cache_dir == tmp_path / "rel"


@pytest.mark.parametrize("value", ["", "0", "false", "off", "No"])
def test_false_flags(value: str) -> None:
    assert not load_config({"POLYTILE_NO_DISK_CACHE": value}).disable_disk_cache


def test_bad_flag_is_a_clear_error() -> None:
    with pytest.raises(PolytileError, match="POLYTILE_NO_DISK_CACHE='maybe'"):
        load_config({"POLYTILE_NO_DISK_CACHE": "maybe"})


def test_reads_os_environ_only_when_called(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLYTILE_TARGET", "cpu-generic")
    assert load_config().target == "cpu-generic"


def test_cache_dir_may_be_any_path_like(tmp_path: Path) -> None:
    """Config(cache_dir="...") with a str crashed in the first compile (AttributeError)."""
    import numpy as np

    import polytile as pt

    config = Config(cache_dir=str(tmp_path / "c"))
    assert config.cache_dir == tmp_path / "c"
    assert Config(cache_dir="relative").cache_dir.is_absolute()
    mod = pt.define("def f(float(N) A) -> (B) { B(i) = A(i) + 1 }", config=config)
    np.testing.assert_array_equal(mod.f(np.arange(3, dtype=np.float32)), [1, 2, 3])
