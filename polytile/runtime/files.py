"""Filesystem primitives the caches rely on: private directories, atomic writes,
content hashes and an inter-process lock.

Loading a cached shared object runs its code, so the caches assume one rule that
this module enforces: only the current user can write below the cache directory.
POSIX only (fcntl), like the C toolchain the runtime drives.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import stat
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from polytile.errors import CacheError, PolytileError


def ensure_private_dir(path: Path) -> Path:
    """Create `path` (mode 0700) or check an existing one; return it.

    An existing directory must be owned by the current user and not writable by
    anyone else: others could plant a shared object we would load. We refuse rather
    than repair that case, because we cannot know what was planted, and the directory
    could be one the user shares on purpose (pointing the cache at /tmp must not
    chmod /tmp). A directory that others can merely read is tightened to 0700 with a
    warning, which loses nothing.
    """
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = os.stat(path)
    except OSError as e:
        raise PolytileError(f"cannot create cache directory {path}: {e.strerror}",
                            hint="set POLYTILE_CACHE_DIR to a directory you can write") from e
    if not stat.S_ISDIR(info.st_mode):
        raise PolytileError(f"cache path {path} is not a directory",
                            hint="remove it or set POLYTILE_CACHE_DIR elsewhere")
    if info.st_uid != os.getuid():
        raise PolytileError(
            f"cache directory {path} is owned by uid {info.st_uid}, not by you "
            f"(uid {os.getuid()}); polytile does not load code from it",
            hint="set POLYTILE_CACHE_DIR to a directory you own")
    mode = stat.S_IMODE(info.st_mode)
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PolytileError(
            f"cache directory {path} is writable by other users (mode {mode:04o}); "
            "polytile does not load code from it",
            hint=f"delete its contents and run `chmod 700 {path}`, "
                 "or set POLYTILE_CACHE_DIR elsewhere")
    if mode & 0o077:
        warnings.warn(f"polytile: cache directory {path} was readable by other users "
                      f"(mode {mode:04o}); changed it to 0700", RuntimeWarning, stacklevel=2)
        os.chmod(path, 0o700)
    return path


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so readers see the old file or the new one, never a mix.

    There is no fsync: after a power loss the file may be empty or torn, and every
    reader of the caches checks a content hash before trusting a file, so such a
    file is rebuilt rather than used.
    """
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(temp, path)
    except BaseException:
        _unlink_quietly(Path(temp))
        raise


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@contextmanager
def exclusive_lock(path: Path, *, wait: bool = True) -> Iterator[None]:
    """Hold an flock on `path` (created if missing) for the duration of the block.

    With wait=False, raise BlockingIOError at once if another holder has it. The
    lock is held on a file descriptor, so a process that dies releases it. While
    we waited, `polytile cache clear` may have unlinked the lock file: a lock on an
    unlinked inode excludes nobody, so we check that the path still names our inode
    and start over if it does not.
    """
    while True:
        _not_a_directory(path)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            if _same_file(fd, path):
                break
        except OSError as e:
            if e.errno not in _NO_LOCKING:
                os.close(fd)
                raise
            # Some network and FUSE filesystems have no flock. Callers stay correct
            # without it (complete entries are renamed into place and checked by
            # hash); they only lose the guarantee that a key is compiled once.
            warnings.warn(f"polytile: cannot lock {path} ({e.strerror}); concurrent "
                          "processes may compile the same kernel twice", RuntimeWarning,
                          stacklevel=3)
            break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    try:
        yield
    finally:
        os.close(fd)  # closing the last descriptor releases the flock


def _not_a_directory(path: Path) -> None:
    """A lock file is never a directory: an empty one is removed, anything else is
    somebody's data, which polytile does not delete."""
    if not path.is_dir() or path.is_symlink():
        return
    try:
        path.rmdir()
    except FileNotFoundError:
        pass
    except OSError:
        raise CacheError(f"{path} is not a lock file but a directory with files in it",
                         hint=f"polytile keeps only lock files there: delete it (rm -r "
                              f"'{path}') or run `polytile cache clear`") from None


_NO_LOCKING = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS})


def _same_file(fd: int, path: Path) -> bool:
    try:
        on_disk = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (on_disk.st_dev, on_disk.st_ino)


def tree_size(path: Path) -> int:
    """Total size in bytes of the regular files below `path` (symlinks not followed)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                info = os.lstat(os.path.join(root, name))
            except FileNotFoundError:  # removed by another process while we walked
                continue
            if stat.S_ISREG(info.st_mode):
                total += info.st_size
    return total


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
