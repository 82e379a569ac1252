"""The native call path: a TC function's cached calls dispatched in C.

A call through cffi spends most of a small kernel's time in Python: finding the
kernel by shape, checking each array, allocating the outputs, taking each data
address (14 us per call of a 16-float add on the Intel Xeon of 2026-11-27, of which
the kernel is 0.1). `dispatch.c`, a CPython extension built once per cache with the
host's compiler against this Python's and NumPy's headers (in a background thread
while the first calls take the Python path), does the same checks in C (see its
header). Each TCFunction gets a Dispatcher; every kernel compiled for it
(a native one, whose parameters the C side knows) is added as an entry:

    dispatcher = new_dispatcher(config)          # None: not buildable here
    dispatcher.add(*entry)                       # CompiledFunction.dispatch_entry()
    dispatcher(args, out)                        # the outputs, or NotImplemented
    dispatcher.torch(args)                       # polytile.torch: a tuple of tensors

NotImplemented sends the call down the Python path, which handles every case and
raises every error; the C side only ever takes calls that path would take unchanged.
The torch call reads each tensor argument's shape, dtype, place, layout and data
pointer itself, once polytile.torch has named torch's types (`use_torch`).
Where the extension cannot be built (no Python.h, no compiler), or when it is off
(`Config.native_dispatch`, POLYTILE_NO_NATIVE_DISPATCH=1), calls take the Python path
alone.
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np

from polytile.config import Config
from polytile.errors import PolytileError
from polytile.runtime.build import build_shared_object
from polytile.runtime.files import ensure_private_dir, exclusive_lock
from polytile.runtime.toolchain import Toolchain, detect_toolchain

log = logging.getLogger(__name__)

_SOURCE = Path(__file__).with_name("dispatch.c")
DISPATCH_DIR = "dispatch"         # below the cache directory: the built extensions
_MODULE = "_pt_dispatch"
_FLAGS = ("-O2", "-std=gnu11", "-fvisibility=hidden")
_TIMEOUT = 120.0                  # seconds: a process waits this long at most at its end
_LOCK = threading.Lock()
_LOADED: dict[str, Any] = {}      # digest -> the extension module (or None: not buildable)
_BUILDS: dict[str, threading.Thread] = {}     # digest -> its build in the background
_TORCH: tuple[Any, ...] | None = None    # use_torch's arguments
# Bumped when a background build ends: a function without a dispatcher asks again.
generation = 0


def _after_fork_in_child() -> None:
    # The tuner profiles candidates in forked processes: a lock another thread held at
    # the fork stays held in the child, and no build runs there.
    global _LOCK
    _LOCK = threading.Lock()
    _BUILDS.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def new_dispatcher(config: Config, wait: bool = False) -> Any | None:
    """A new, empty Dispatcher; None where the extension cannot be built, is off
    (`config.native_dispatch`), or is being built: a cache without it builds it in a
    background thread (about half a second), so that no call waits, and `generation`
    changes when it is done (`wait`: build it now instead)."""
    if not config.native_dispatch:
        return None
    module = _module(config, wait)
    return None if module is None else module.Dispatcher()


def use_torch(types: tuple[type, ...], wrap: Any, pairs: tuple[tuple[Any, Any], ...]) -> None:
    """Let `Dispatcher.torch` take tensors of exactly `types`, wrap the outputs with
    `wrap(ndarray)`, and map NumPy dtypes to torch's by `pairs` (np.dtype, torch.dtype)."""
    global _TORCH
    with _LOCK:
        _TORCH = (types, wrap, pairs)
        for module in _LOADED.values():
            if module is not None:
                module.use_torch(*_TORCH)


def _module(config: Config, wait: bool) -> Any | None:
    try:
        toolchain = detect_toolchain(config)
    except PolytileError:
        return None
    source = _SOURCE.read_text(encoding="utf-8")
    includes = (sysconfig.get_paths()["include"], np.get_include())
    identity = "\n".join([source, sys.version, np.__version__, toolchain.real_path,
                          toolchain.version, *_FLAGS, *includes])
    digest = hashlib.sha256(identity.encode()).hexdigest()[:24]
    with _LOCK:
        if digest in _LOADED:
            return _LOADED[digest]
        build = _BUILDS.get(digest)
        built = not config.disable_disk_cache and _so_path(config, digest).is_file()
        if build is None and (wait or built):        # loading a built one takes a ms
            return _store(digest, _build_and_load(config, toolchain, source, includes,
                                                  digest))
        if build is None:
            # Not a daemon: a process that ends first waits for the build to land in
            # the cache (a daemon's build was cut off before its rename, and every
            # short process started it again).
            build = _BUILDS[digest] = threading.Thread(
                target=_build_in_background, name="polytile-dispatch-build",
                args=(config, toolchain, source, includes, digest))
            build.start()
    if wait:
        build.join()
        return _LOADED.get(digest)
    return None


def wait_for_builds() -> None:
    """Wait until the builds started in the background have landed (before their cache
    directory goes away: a temporary one, as the fuzzer's)."""
    with _LOCK:
        pending = list(_BUILDS.values())
    for build in pending:
        build.join()


def _build_in_background(config: Config, toolchain: Toolchain, source: str,
                         includes: tuple[str, ...], digest: str) -> None:
    global generation
    module = _build_and_load(config, toolchain, source, includes, digest)
    with _LOCK:
        _store(digest, module)
        _BUILDS.pop(digest, None)
        generation += 1


def _store(digest: str, module: Any | None) -> Any | None:
    """Record a loaded (or unbuildable) extension; the caller holds _LOCK."""
    _LOADED[digest] = module
    if module is not None and _TORCH is not None:
        module.use_torch(*_TORCH)
    return module


def _so_path(config: Config, digest: str) -> Path:
    return config.cache_dir / DISPATCH_DIR / f"{_MODULE}-{digest}.so"


def _build_and_load(config: Config, toolchain: Toolchain, source: str,
                    includes: tuple[str, ...], digest: str) -> Any | None:
    if not Path(includes[0], "Python.h").is_file():
        log.info("native dispatch off: no Python.h in %s", includes[0])
        return None
    flags = (*_FLAGS, *(f"-I{d}" for d in includes))
    # The compiler alone, without POLYTILE_CC's extra arguments (a sanitizer's runtime
    # cannot be loaded into an interpreter that was not started with it).
    plain = Toolchain(toolchain.path, toolchain.real_path, toolchain.version,
                      toolchain.supports_march_native, toolchain.supports_openmp)
    try:
        if config.disable_disk_cache:
            with tempfile.TemporaryDirectory(prefix="polytile-dispatch-") as tmp:
                return _load(build_shared_object(source, flags, plain,
                                                 Path(tmp, f"{_MODULE}.so"),
                                                 timeout=_TIMEOUT).so_path)
        root = ensure_private_dir(config.cache_dir)
        directory = ensure_private_dir(root / DISPATCH_DIR)
        so_path = _so_path(config, digest)
        locks = ensure_private_dir(root / "locks")
        with exclusive_lock(locks / f"dispatch-{digest}.lock"):
            if not so_path.is_file():
                build_shared_object(source, flags, plain, so_path,
                                    source_path=directory / f"{_MODULE}-{digest}.c",
                                    timeout=_TIMEOUT)
        return _load(so_path)
    except (PolytileError, OSError, ImportError) as e:    # BuildError, a cache directory
        log.info("native dispatch off: %s", getattr(e, "message", e))
        return None


def _load(so_path: Path) -> Any:
    loader = importlib.machinery.ExtensionFileLoader(_MODULE, str(so_path))
    spec = importlib.util.spec_from_file_location(_MODULE, so_path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module
