"""Cache sizes come from the host when Linux reports them (the tiles follow them), from
the target file otherwise; they are part of the target's identity, so kernels tiled for
other caches are never served from the compilation cache."""
from __future__ import annotations

from pathlib import Path

import pytest

from polytile.targets import target as T


def fake_sysfs(root: Path, entries: list[tuple[int, str, str]]) -> Path:
    for k, (level, kind, size) in enumerate(entries):
        d = root / f"index{k}"
        d.mkdir(parents=True)
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
    return root


@pytest.fixture
def sysfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    T.host_caches.cache_clear()
    monkeypatch.setattr(T, "_CACHE_DIR", str(tmp_path))
    yield tmp_path
    T.host_caches.cache_clear()


def test_data_caches_are_read_by_level(sysfs: Path) -> None:
    fake_sysfs(sysfs, [(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Unified", "1024K"),
                       (3, "Unified", "32M")])
    assert T.host_caches() == {"L1": 48 << 10, "L2": 1 << 20, "L3": 32 << 20}


def test_an_unreadable_or_odd_sysfs_gives_nothing(sysfs: Path) -> None:
    assert T.host_caches() == {}                  # no index directories
    T.host_caches.cache_clear()
    fake_sysfs(sysfs, [(2, "Unified", "lots")])
    assert T.host_caches() == {}


def test_the_running_target_takes_the_host_caches_and_names_them() -> None:
    file_target = T.load_target("cpu-generic")
    merged = T.with_host_caches(file_target, {"L2": 3 << 20, "L4": 1 << 30})
    assert merged.cache_size("L2") == 3 << 20
    assert merged.cache_size("L1") == file_target.cache_size("L1")     # the file's stands
    assert "L4" not in dict(merged.cache_bytes)
    assert "L2=3072K" in merged.identity and merged.identity != file_target.identity


def test_a_target_the_host_cannot_run_keeps_its_file_caches(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    monkeypatch.setattr(T, "host_features", lambda: frozenset({"sse4_2"}))
    monkeypatch.setattr(T, "host_caches", lambda: {"L2": 12345 << 10})
    shown = T.inspection_target("cpu-avx512")
    assert shown.cache_bytes == T.load_target("cpu-avx512").cache_bytes
    assert T.select_target().cache_size("L2") == 12345 << 10
