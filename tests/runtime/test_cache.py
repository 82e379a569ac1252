"""The two-level compilation cache, within one process."""
from __future__ import annotations

import dataclasses
import json
import os
import stat
import threading
from pathlib import Path

import pytest

from polytile.backends import Generated
from polytile.config import Config
from polytile.errors import BuildError, PolytileError
from polytile.runtime.cache import KernelCache, cache_info, clear_cache
from polytile.runtime.toolchain import Toolchain, compiler_invocations

from .helpers import ADD_SOURCE, c_only, call_add, get_add, make_key


def entries(config: Config) -> list[Path]:
    return sorted((config.cache_dir / "kernels").iterdir())


def test_build_load_and_call(config: Config) -> None:
    lib = get_add(KernelCache(config))
    assert call_add(lib, 2, 3) == 5
    (entry,) = entries(config)
    assert entry.name == lib.digest and lib.so_path.parent == entry
    assert sorted(p.name for p in entry.iterdir()) == sorted(
        ["kernel.c", "meta.json", lib.so_path.name])
    meta = json.loads((entry / "meta.json").read_text())
    assert meta["key"] == make_key(KernelCache(config).toolchain).parts()
    assert {"so_sha256", "source_sha256", "created", "polytile_version"} <= set(meta)
    assert (entry / "kernel.c").read_text() == ADD_SOURCE
    assert meta["source"] == "kernel.c" and meta["stages"] == ["c"]
    assert list((config.cache_dir / "tmp").iterdir()) == []


def test_every_stage_is_kept_beside_the_source(config: Config) -> None:
    cache = KernelCache(config)
    stages = Generated((("ir", "the optimized IR"), ("loops", "the loops"), ("c", ADD_SOURCE)),
                       "kernel.c")
    lib = cache.get_or_build(make_key(cache.toolchain), lambda: stages)
    entry = lib.so_path.parent
    assert (entry / "stage-ir.txt").read_text() == "the optimized IR"
    assert (entry / "stage-loops.txt").read_text() == "the loops"
    assert lib.source_path == entry / "kernel.c" and lib.source_path.read_text() == ADD_SOURCE
    assert json.loads((entry / "meta.json").read_text())["stages"] == ["ir", "loops", "c"]


@pytest.mark.parametrize("generated", [Generated((("c", ADD_SOURCE),), "../kernel.c"),
                                       Generated((("../c", ADD_SOURCE),), "kernel.c")])
def test_stage_and_source_names_are_plain(config: Config, generated: Generated) -> None:
    cache = KernelCache(config)
    with pytest.raises(ValueError, match="bad stage or source names"):
        cache.get_or_build(make_key(cache.toolchain), lambda: generated)
    assert entries(config) == []


def test_memory_hit_calls_nothing(config: Config) -> None:
    cache = KernelCache(config)
    calls: list[int] = []

    def source() -> Generated:
        calls.append(1)
        return c_only(ADD_SOURCE)

    key = make_key(cache.toolchain)
    first = cache.get_or_build(key, source)
    before = compiler_invocations()
    assert cache.get_or_build(key, source) is first
    assert compiler_invocations() == before and len(calls) == 1


def test_disk_hit_invokes_no_compiler(config: Config) -> None:
    get_add(KernelCache(config))
    before = compiler_invocations()
    second = KernelCache(config)  # empty in-memory level
    assert call_add(get_add(second), 4, 5) == 9
    assert compiler_invocations() == before


def test_clear_memory_falls_back_to_disk(config: Config) -> None:
    cache = KernelCache(config)
    get_add(cache)
    cache.clear_memory()
    before = compiler_invocations()
    get_add(cache)
    assert compiler_invocations() == before


def replace_file(path: Path, data: bytes) -> None:
    """Give `path` new content in a new inode. This process has the old file mapped
    (dlopen); truncating or rewriting that inode in place would make the mapping fault
    with SIGBUS/SIGSEGV when the library's pages are next touched, at the latest when
    the process exits and runs its destructors."""
    tmp = path.with_name(path.name + ".corrupt")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def corrupt_truncate(entry: Path, so: Path) -> None:
    data = so.read_bytes()
    replace_file(so, data[:len(data) // 2])


def corrupt_flip_byte(entry: Path, so: Path) -> None:
    data = bytearray(so.read_bytes())
    data[len(data) // 2] ^= 0xFF
    replace_file(so, bytes(data))


def corrupt_remove_so(entry: Path, so: Path) -> None:
    so.unlink()


def corrupt_remove_source(entry: Path, so: Path) -> None:
    (entry / "kernel.c").unlink()


def corrupt_meta(entry: Path, so: Path) -> None:
    (entry / "meta.json").write_text('{"format": 1, "so": "kern')


def corrupt_meta_points_elsewhere(entry: Path, so: Path) -> None:
    meta = json.loads((entry / "meta.json").read_text())
    meta["so"] = "../../evil.so"
    (entry / "meta.json").write_text(json.dumps(meta))


def corrupt_meta_source_elsewhere(entry: Path, so: Path) -> None:
    meta = json.loads((entry / "meta.json").read_text())
    meta["source"] = "../../kernel.c"
    (entry / "meta.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("corrupt", [corrupt_truncate, corrupt_flip_byte, corrupt_remove_so,
                                     corrupt_remove_source, corrupt_meta,
                                     corrupt_meta_points_elsewhere,
                                     corrupt_meta_source_elsewhere])
def test_corrupted_entry_is_discarded_and_rebuilt(config: Config, corrupt, caplog) -> None:
    old = get_add(KernelCache(config))
    corrupt(old.so_path.parent, old.so_path)
    before = compiler_invocations()
    new = get_add(KernelCache(config))
    assert compiler_invocations() == before + 1
    # A new file name: dlopen would answer the old path with the old (broken) mapping.
    assert new.so_path != old.so_path and not old.so_path.exists()
    assert call_add(new, 20, 22) == 42
    assert entries(config) == [new.so_path.parent]
    assert "discarding cache entry" in caplog.text
    assert list((config.cache_dir / "tmp").iterdir()) == []


def test_concurrent_threads_build_once(config: Config, toolchain: Toolchain) -> None:
    before = compiler_invocations()
    results: list[int] = []
    barrier = threading.Barrier(4)

    def work() -> None:
        cache = KernelCache(config, toolchain)
        barrier.wait()
        results.append(call_add(get_add(cache), 1, 1))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [2, 2, 2, 2]
    assert compiler_invocations() == before + 1
    assert len(entries(config)) == 1


def test_build_error_leaves_no_entry(config: Config) -> None:
    cache = KernelCache(config)
    with pytest.raises(BuildError) as info:
        cache.get_or_build(make_key(cache.toolchain), lambda: c_only("int broken( {"))
    assert info.value.source_code == "int broken( {"
    assert entries(config) == []
    assert list((config.cache_dir / "tmp").iterdir()) == []


def test_build_error_keeps_build_dir_when_asked(config: Config) -> None:
    cache = KernelCache(dataclasses.replace(config, keep_build_dirs=True))
    with pytest.raises(BuildError) as info:
        cache.get_or_build(make_key(cache.toolchain), lambda: c_only("int broken( {"))
    (kept,) = (config.cache_dir / "tmp").iterdir()
    assert str(kept) in (info.value.hint or "")
    assert (kept / "kernel.c").read_text() == "int broken( {"
    assert entries(config) == []
    assert clear_cache(config) == 0 and list((config.cache_dir / "tmp").iterdir()) == []


def test_source_fn_errors_propagate_and_release_the_lock(config: Config) -> None:
    cache = KernelCache(config)

    def fail() -> Generated:
        raise RuntimeError("codegen bug")

    with pytest.raises(RuntimeError, match="codegen bug"):
        cache.get_or_build(make_key(cache.toolchain), fail)
    assert call_add(get_add(cache), 1, 2) == 3


def test_key_for_another_compiler_is_refused(config: Config, toolchain: Toolchain) -> None:
    key = dataclasses.replace(make_key(toolchain), compiler="some other cc")
    with pytest.raises(ValueError, match="compiler"):
        KernelCache(config, toolchain).get_or_build(key, lambda: c_only(ADD_SOURCE))


def test_no_disk_cache_touches_no_cache_dir(tmp_path: Path) -> None:
    config = Config(cache_dir=tmp_path / "cache", disable_disk_cache=True)
    cache = KernelCache(config)
    lib = get_add(cache)
    assert call_add(lib, 3, 4) == 7
    assert get_add(cache) is lib
    assert not (tmp_path / "cache").exists() and not lib.so_path.exists()


def test_cache_dirs_are_private(config: Config) -> None:
    get_add(KernelCache(config))
    for path in [config.cache_dir, *config.cache_dir.iterdir()]:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700, path


def test_readable_cache_dir_is_tightened(config: Config) -> None:
    config.cache_dir.mkdir(mode=0o755)
    config.cache_dir.chmod(0o755)
    with pytest.warns(RuntimeWarning, match="readable by other users"):
        get_add(KernelCache(config))
    assert stat.S_IMODE(os.stat(config.cache_dir).st_mode) == 0o700


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777])
def test_writable_cache_dir_is_refused(config: Config, mode: int) -> None:
    config.cache_dir.mkdir()
    config.cache_dir.chmod(mode)
    with pytest.raises(PolytileError, match="writable by other users") as info:
        get_add(KernelCache(config))
    assert "chmod 700" in (info.value.hint or "")
    assert stat.S_IMODE(os.stat(config.cache_dir).st_mode) == mode  # not ours to change


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give the directory away")
def test_cache_dir_of_another_user_is_refused(config: Config) -> None:
    config.cache_dir.mkdir(mode=0o700)
    os.chown(config.cache_dir, 65534, -1)
    with pytest.raises(PolytileError, match="not by you"):
        get_add(KernelCache(config))


def test_info_and_clear(config: Config) -> None:
    assert cache_info(config).entries == 0 and not config.cache_dir.exists()
    cache = KernelCache(config)
    get_add(cache, "one")
    get_add(cache, "two")
    info = cache.info()
    assert (info.path, info.entries) == (config.cache_dir, 2)
    assert info.total_bytes > 2 * len(ADD_SOURCE)
    assert "entries: 2" in str(info)
    assert cache.clear() == 2
    assert cache.info().entries == 0
    assert list((config.cache_dir / "locks").iterdir()) == []
    assert not (config.cache_dir / "toolchains").exists()
    before = compiler_invocations()
    assert call_add(get_add(cache, "one"), 1, 1) == 2  # memory level was cleared too
    assert compiler_invocations() == before + 1


def test_without_working_locks_racing_builds_leave_one_entry(
        config: Config, toolchain: Toolchain, monkeypatch: pytest.MonkeyPatch) -> None:
    # As on a filesystem where flock does not exclude: every thread builds, the
    # renames race, and the losers keep the winner's entry.
    import contextlib

    import polytile.runtime.cache as cache_module
    monkeypatch.setattr(cache_module, "exclusive_lock",
                        lambda path, wait=True: contextlib.nullcontext())
    results: list[int] = []
    barrier = threading.Barrier(4)

    def work() -> None:
        cache = KernelCache(config, toolchain)
        barrier.wait()
        results.append(call_add(get_add(cache), 2, 2))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [4, 4, 4, 4]
    assert len(entries(config)) == 1
    assert list((config.cache_dir / "tmp").iterdir()) == []


def test_filesystem_without_flock_still_works(config: Config,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    import fcntl

    def no_flock(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    with pytest.warns(RuntimeWarning, match="cannot lock"):
        assert call_add(get_add(KernelCache(config)), 1, 2) == 3


def test_crashed_builds_are_cleaned_up_but_young_ones_kept(config: Config) -> None:
    cache = KernelCache(config)
    digest = make_key(cache.toolchain).digest()
    tmp = config.cache_dir / "tmp"
    tmp.mkdir(mode=0o700)  # the cache dir itself exists: the toolchain probe made it
    old, young = tmp / f"build-{digest}-00000000", tmp / f"build-{digest}-11111111"
    old.mkdir()
    young.mkdir()
    os.utime(old, (0, 0))
    get_add(cache)
    assert sorted(tmp.iterdir()) == [young]


def test_cache_dir_removed_while_running_is_recreated(config: Config) -> None:
    import shutil
    cache = KernelCache(config)
    get_add(cache, "one")
    shutil.rmtree(config.cache_dir)
    assert call_add(get_add(cache, "two"), 5, 5) == 10
    assert stat.S_IMODE(os.stat(config.cache_dir).st_mode) == 0o700
