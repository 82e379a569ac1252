"""A cache directory damaged by hand, a crash or another program heals or says what to
delete (issue 11, defect 6: these raised NotADirectoryError / IsADirectoryError on every
later call)."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import polytile as pt
from polytile.compile import kernel_cache
from polytile.config import Config
from polytile.errors import PolytileError

SOURCE = "def f(float(N) A) -> (B) { B(i) = A(i) * 2 + 1 }"
A = np.arange(7, dtype=np.float32)


def call(config: Config) -> np.ndarray:
    kernel_cache(config).clear_memory()          # as a fresh process: look on disk
    return pt.define(SOURCE, config=config).f(A)


def entry_of(config: Config) -> Path:
    (entry,) = (config.cache_dir / "kernels").iterdir()
    return entry


@pytest.mark.parametrize("damage", ["regular file", "dangling symlink", "symlink to a copy",
                                    "empty directory"])
def test_a_damaged_entry_is_discarded_and_rebuilt(damage: str, tmp_path: Path) -> None:
    config = Config(cache_dir=tmp_path / "cache")
    np.testing.assert_array_equal(call(config), A * 2 + 1)
    entry = entry_of(config)
    copy = tmp_path / "copy"
    os.rename(entry, copy)
    if damage == "regular file":
        entry.write_text("not an entry")
    elif damage == "dangling symlink":
        entry.symlink_to(tmp_path / "nowhere")
    elif damage == "symlink to a copy":
        entry.symlink_to(copy)
    else:
        entry.mkdir()
    for _ in range(2):
        np.testing.assert_array_equal(call(config), A * 2 + 1)
    assert entry.is_dir() and not entry.is_symlink()
    assert (entry / "meta.json").is_file()


def test_a_lock_that_is_a_directory_names_the_path_to_delete(tmp_path: Path) -> None:
    config = Config(cache_dir=tmp_path / "cache")
    call(config)
    entry = entry_of(config)
    lock = config.cache_dir / "locks" / f"{entry.name}.lock"
    os.rename(entry, tmp_path / "moved")          # a miss: the next call takes the lock
    lock.unlink(missing_ok=True)
    (lock / "inside").mkdir(parents=True)
    with pytest.raises(PolytileError, match="is not a lock file") as info:
        call(config)
    assert str(lock) in info.value.render()
    # An empty directory is nobody's: it is removed and the call goes on.
    (lock / "inside").rmdir()
    np.testing.assert_array_equal(call(config), A * 2 + 1)
