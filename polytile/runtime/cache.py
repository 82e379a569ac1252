"""The two-level compilation cache (TC §6.1): a dict in the process, directories on disk.

    cache = KernelCache(config)
    lib = cache.get_or_build(key, lambda: backend.generate(fn, target), backend.build)
    lib.cdll.my_kernel(...)                               # built at most once per key

On disk, below `config.cache_dir` (created 0700, see files.ensure_private_dir):

    kernels/<digest>/kernel.c           the generated source (its name is the backend's)
    kernels/<digest>/stage-<name>.txt   the text of every other stage (optimized IR, ...)
    kernels/<digest>/kernel-<id>.so     the shared object; <id> is new for every build
    kernels/<digest>/meta.json          key parts, sha256 of source and .so, creation time
    locks/<digest>.lock                 flock held while an entry is checked or built
    tmp/                                builds in progress, entries being deleted
    toolchains/                         compiler probe results (runtime/toolchain.py)
    dispatch/                           the native call path's extension (runtime/dispatch.py)

An entry is built in tmp/ and renamed into kernels/ whole, so an entry directory is
complete or absent. A process that finds no valid entry takes the entry's lock,
looks again (another process may just have built it) and builds only if it is still
missing. An entry is loaded only after meta.json, the source and the .so agree with
their recorded sha256; a torn or tampered entry is moved aside and rebuilt. The
shared object's name changes with every build because dlopen returns the handle it
already has for a path: a rebuilt entry must not be answered with the old mapping.
"""
from __future__ import annotations

import ctypes
import errno
import importlib.metadata
import json
import logging
import os
import re
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from polytile.config import Config
from polytile.errors import BuildError
from polytile.runtime.build import BuildResult, build_shared_object
from polytile.runtime.dispatch import DISPATCH_DIR
from polytile.runtime.files import ensure_private_dir, exclusive_lock, sha256_file, tree_size
from polytile.runtime.key import CacheKey
from polytile.runtime.toolchain import RECORDS_DIR, Toolchain, detect_toolchain

if TYPE_CHECKING:
    from polytile.backends import Generated

log = logging.getLogger(__name__)


class BuildStep(Protocol):
    """A backend's compile step (runtime.build.build_shared_object for C)."""

    def __call__(self, source: str, flags: Sequence[str], toolchain: Toolchain,
                 out_path: Path, *, source_path: Path) -> BuildResult: ...


ENTRY_FORMAT = 2    # 2: the source file name and the stages are recorded
META_NAME = "meta.json"
# A shared object (the C backend), or a binary its backend loads itself (OpenCL's
# program binaries, an emulated target's executable): only a shared object is opened here.
_SO_NAME = re.compile(r"kernel-[0-9a-f]{16}\.(so|bin|exe)")
_SOURCE_NAME = re.compile(r"kernel\.[a-z]{1,8}")
_STAGE_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")
_STALE_BUILD_SECONDS = 3600.0


@dataclass(frozen=True, eq=False)
class LoadedLibrary:
    """A loaded shared object. With the disk cache off, its files are gone after loading
    (unless config.keep_build_dirs): the mapping outlives them."""

    cdll: ctypes.CDLL | None      # None: a binary its backend loads (not a shared object)
    so_path: Path
    source_path: Path
    digest: str


@dataclass(frozen=True)
class CacheInfo:
    path: Path
    entries: int
    total_bytes: int

    def __str__(self) -> str:
        return (f"path: {self.path}\nentries: {self.entries}\n"
                f"size: {self.total_bytes / 1e6:.1f} MB")


class _InvalidEntry(Exception):
    """An entry on disk that must not be loaded; the message says why."""


@dataclass(frozen=True)
class _Layout:
    root: Path

    @property
    def kernels(self) -> Path:
        return self.root / "kernels"

    @property
    def locks(self) -> Path:
        return self.root / "locks"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    @staticmethod
    def open(root: Path) -> _Layout:
        layout = _Layout(ensure_private_dir(root))
        for sub in (layout.kernels, layout.locks, layout.tmp):
            ensure_private_dir(sub)
        return layout

    def lock(self, digest: str) -> Path:
        return self.locks / f"{digest}.lock"


class KernelCache:
    """Shared objects by CacheKey: first this object's dict, then the disk, then the compiler."""

    def __init__(self, config: Config, toolchain: Toolchain | None = None) -> None:
        self.config = config
        self._toolchain = toolchain
        self._memory: dict[CacheKey, LoadedLibrary] = {}

    @property
    def toolchain(self) -> Toolchain:
        if self._toolchain is None:
            self._toolchain = detect_toolchain(self.config)
        return self._toolchain

    def get_or_build(self, key: CacheKey, generate: Callable[[], Generated],
                     build: BuildStep = build_shared_object) -> LoadedLibrary:
        """The library for `key`; `generate` (the stages' texts) and `build` (default: the
        C compiler) are called only when it must be compiled."""
        hit = self._memory.get(key)
        if hit is not None:
            return hit
        if key.compiler != self.toolchain.identity:
            raise ValueError(f"key was made for compiler {key.compiler!r} but this cache "
                             f"builds with {self.toolchain.identity!r}")
        if self.config.disable_disk_cache:
            lib = self._build_in_temp_dir(key, generate, build)
        else:
            lib = self._get_or_build_on_disk(key, generate, build)
        # setdefault: if two threads raced, both get the first library stored.
        return self._memory.setdefault(key, lib)

    def clear_memory(self) -> None:
        self._memory.clear()

    def info(self) -> CacheInfo:
        return cache_info(self.config)

    def clear(self) -> int:
        self.clear_memory()
        return clear_cache(self.config)

    def _get_or_build_on_disk(self, key: CacheKey, generate: Callable[[], Generated],
                              build: BuildStep) -> LoadedLibrary:
        # Opened (a few stat calls) on every disk lookup rather than once, so a cache
        # directory removed or loosened while the process runs is noticed.
        layout = _Layout.open(self.config.cache_dir)
        digest = key.digest()
        entry = layout.kernels / digest
        if _is_entry_dir(entry):
            try:
                return _load_entry(entry, key)
            except (_InvalidEntry, OSError):
                pass  # decided again below, under the lock
        with exclusive_lock(layout.lock(digest)):
            if _is_entry_dir(entry):
                try:
                    return _load_entry(entry, key)
                except (_InvalidEntry, OSError) as e:
                    log.warning("polytile: discarding cache entry %s: %s", entry, e)
                    _discard(entry, layout.tmp)
            elif os.path.lexists(entry):
                # A file, or a symlink (dangling or not): polytile makes neither there.
                log.warning("polytile: discarding %s: not a cache entry directory", entry)
                _discard(entry, layout.tmp)
            else:
                log.debug("compilation cache miss %s: %s", digest, key.parts())
            _remove_stale_builds(layout.tmp, digest)
            build_dir = layout.tmp / f"build-{digest}-{secrets.token_hex(4)}"
            build_dir.mkdir(mode=0o700)
            source = self._build_entry(build_dir, key, generate, build)
            _install(build_dir, entry, key, layout.tmp)
            try:
                return _load_entry(entry, key)
            except (_InvalidEntry, OSError) as e:
                _discard(entry, layout.tmp)
                raise BuildError(f"the compiled kernel cannot be loaded: {e}", source,
                                 hint="the C compiler produced an unusable shared object; "
                                      "check POLYTILE_CC and the compile flags") from e

    def _build_entry(self, build_dir: Path, key: CacheKey, generate: Callable[[], Generated],
                     build: BuildStep) -> str:
        """Fill `build_dir` with a complete entry for `key`; return the source."""
        try:
            generated, _, result = self._build_files(build_dir, key, generate, build)
            so_path, source_path = result.so_path, result.source_path
            meta = {
                "format": ENTRY_FORMAT, "digest": key.digest(), "key": key.parts(),
                "so": so_path.name, "so_sha256": sha256_file(so_path),
                "source": generated.source_name, "source_sha256": sha256_file(source_path),
                "stages": [stage for stage, _ in generated.stages],
                "created": time.time(), "polytile_version": _polytile_version(),
                "build_seconds": round(result.seconds, 3),
                "compiler_output": result.compiler_output,
            }
            (build_dir / META_NAME).write_text(json.dumps(meta, indent=1), encoding="utf-8")
            return generated.source
        except BaseException as e:
            # A failed compile with keep_build_dirs was moved aside by _compile.
            if not (self.config.keep_build_dirs and isinstance(e, BuildError)):
                shutil.rmtree(build_dir, ignore_errors=True)
            raise

    def _build_in_temp_dir(self, key: CacheKey, generate: Callable[[], Generated],
                           build: BuildStep) -> LoadedLibrary:
        build_dir = Path(tempfile.mkdtemp(prefix="polytile-build-"))
        try:
            generated, _, result = self._build_files(build_dir, key, generate, build)
            so_path = result.so_path
            try:
                cdll = _open(so_path)
            except OSError as e:
                raise BuildError(f"the compiled kernel cannot be loaded: {e}",
                                 generated.source) from e
            return LoadedLibrary(cdll, so_path, result.source_path, key.digest())
        finally:
            if not self.config.keep_build_dirs:
                shutil.rmtree(build_dir, ignore_errors=True)

    def _build_files(self, build_dir: Path, key: CacheKey, generate: Callable[[], Generated],
                     build: BuildStep) -> tuple[Generated, Path, BuildResult]:
        """Write every stage's text into `build_dir` and compile the source there."""
        generated = _checked(generate())
        for stage, text in generated.stages[:-1]:
            (build_dir / f"stage-{stage}.txt").write_text(text, encoding="utf-8")
        so_path = build_dir / f"kernel-{secrets.token_hex(8)}.so"
        source_path = build_dir / generated.source_name
        return generated, so_path, self._compile(build, generated.source, key, so_path,
                                                 source_path, build_dir)

    def _compile(self, build: BuildStep, source: str, key: CacheKey, so_path: Path,
                 source_path: Path, build_dir: Path) -> BuildResult:
        try:
            return build(source, key.flags, self.toolchain, so_path, source_path=source_path)
        except BuildError as e:
            if not self.config.keep_build_dirs:
                raise
            kept = build_dir.with_name(build_dir.name.replace("build-", "failed-", 1))
            os.rename(build_dir, kept)
            raise BuildError(e.message, e.source_code, e.compiler_output,
                             hint=f"the source and the failed build are kept in {kept}") from e


def _checked(generated: Generated) -> Generated:
    """Stage and file names become paths in the entry: only plain ones."""
    if not _SOURCE_NAME.fullmatch(generated.source_name) or not all(
            _STAGE_NAME.fullmatch(stage) for stage, _ in generated.stages):
        raise ValueError(f"bad stage or source names: {generated.source_name!r}, "
                         f"{[stage for stage, _ in generated.stages]}")
    return generated


def _is_entry_dir(entry: Path) -> bool:
    """Entries are directories polytile renamed into place, never symlinks: a link could
    point anywhere (and a dangling one made every later call fail)."""
    return entry.is_dir() and not entry.is_symlink()


def _load_entry(entry: Path, key: CacheKey) -> LoadedLibrary:
    so_path, source_path = _verified_so(entry, key)
    return LoadedLibrary(_open(so_path), so_path, source_path, key.digest())


def _open(path: Path) -> ctypes.CDLL | None:
    """A shared object, opened (which checks it loads); another binary is its backend's."""
    return ctypes.CDLL(str(path)) if path.suffix == ".so" else None


def _verified_so(entry: Path, key: CacheKey) -> tuple[Path, Path]:
    """The entry's shared object and source once meta.json, the source and the .so agree,
    else _InvalidEntry."""
    try:
        meta = json.loads((entry / META_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise _InvalidEntry(f"{META_NAME} is missing or unreadable ({e})") from e
    if not isinstance(meta, dict) or meta.get("format") != ENTRY_FORMAT:
        raise _InvalidEntry(f"{META_NAME} has an unknown format")
    if meta.get("key") != key.parts():
        raise _InvalidEntry(f"{META_NAME} records a different key")
    so_name, source_name = meta.get("so"), meta.get("source")
    if not isinstance(so_name, str) or not _SO_NAME.fullmatch(so_name):
        raise _InvalidEntry(f"{META_NAME} names no valid shared object")
    if not isinstance(source_name, str) or not _SOURCE_NAME.fullmatch(source_name):
        raise _InvalidEntry(f"{META_NAME} names no valid source file")
    for name, recorded in ((so_name, meta.get("so_sha256")),
                           (source_name, meta.get("source_sha256"))):
        try:
            actual = sha256_file(entry / name)
        except OSError as e:
            raise _InvalidEntry(f"{name} is missing or unreadable ({e.strerror})") from e
        if actual != recorded:
            raise _InvalidEntry(f"{name} does not match its recorded sha256")
    return entry / so_name, entry / source_name


def _install(build_dir: Path, entry: Path, key: CacheKey, tmp: Path) -> None:
    """Rename the finished build into place; the entry must be absent."""
    try:
        os.rename(build_dir, entry)
        return
    except OSError as e:
        if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
            raise
    # Reachable only where flock does not exclude (some network filesystems):
    # another process installed the same key first. Keep exactly one valid entry.
    try:
        _verified_so(entry, key)
        shutil.rmtree(build_dir, ignore_errors=True)
    except _InvalidEntry:
        _discard(entry, tmp)
        os.rename(build_dir, entry)


def _remove_stale_builds(tmp: Path, digest: str) -> None:
    """Remove build directories of `digest` left by crashed processes.

    The age test is for filesystems where the lock does not exclude: there, a young
    build directory may belong to a live process, and it must be left to finish.
    """
    for build in tmp.glob(f"build-{digest}-*"):
        try:
            if time.time() - build.stat().st_mtime > _STALE_BUILD_SECONDS:
                shutil.rmtree(build, ignore_errors=True)
        except FileNotFoundError:
            continue


def _discard(entry: Path, tmp: Path) -> None:
    """Remove an entry; renamed away first so no reader sees it half deleted."""
    trash = tmp / f"trash-{secrets.token_hex(4)}"
    try:
        os.rename(entry, trash)
    except FileNotFoundError:
        return
    if trash.is_dir() and not trash.is_symlink():
        shutil.rmtree(trash, ignore_errors=True)
    else:
        trash.unlink()


def _polytile_version() -> str:
    try:
        return importlib.metadata.version("polytile")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def cache_info(config: Config) -> CacheInfo:
    """Entries and bytes below config.cache_dir; creates nothing."""
    root = config.cache_dir
    kernels = _Layout(root).kernels
    entries = sum(1 for p in kernels.iterdir() if p.is_dir()) if kernels.is_dir() else 0
    return CacheInfo(root, entries, tree_size(root) if root.is_dir() else 0)


def clear_cache(config: Config) -> int:
    """Delete every entry (waiting for builds in progress), probe records and leftovers.

    Returns the number of entries deleted. Safe while other processes use the cache:
    each entry is removed under its lock, and a process holding a library keeps its
    mapping.
    """
    if not config.cache_dir.exists():
        return 0
    layout = _Layout.open(config.cache_dir)
    removed = 0
    for entry in layout.kernels.iterdir():
        lock = layout.lock(entry.name)
        with exclusive_lock(lock):
            _discard(entry, layout.tmp)
            lock.unlink(missing_ok=True)  # waiters notice and retry (files.exclusive_lock)
        removed += 1
    for item in layout.tmp.iterdir():
        parts = item.name.split("-")
        if parts[0] == "build" and len(parts) == 3:
            try:  # a build in progress holds its key's lock: leave it alone
                with exclusive_lock(layout.lock(parts[1]), wait=False):
                    shutil.rmtree(item, ignore_errors=True)
            except BlockingIOError:
                continue
        else:
            shutil.rmtree(item, ignore_errors=True)
    for lock in layout.locks.iterdir():  # of failed builds; a busy one is in use, keep it
        try:
            with exclusive_lock(lock, wait=False):
                lock.unlink(missing_ok=True)
        except BlockingIOError:
            continue
    shutil.rmtree(layout.root / RECORDS_DIR, ignore_errors=True)
    # The native dispatcher's builds (a process that loaded one keeps its mapping).
    shutil.rmtree(layout.root / DISPATCH_DIR, ignore_errors=True)
    return removed
