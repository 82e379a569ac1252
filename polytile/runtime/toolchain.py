"""The system C compiler: where it is, what it is, and which flags it accepts.

A `Toolchain` is found at run time (POLYTILE_CC, else `cc`, `gcc`, `clang` on PATH)
and probed once: its `--version` line and whether `-march=native` and `-fopenmp`
work, by compiling tiny files. Probing runs the compiler, and a warm start must not
(a second process that finds its kernel in the disk cache invokes no compiler at
all), so the probe result is also kept on disk, keyed by the compiler's path and
file metadata (size, mtime, inode), as ccache does: upgrading the compiler changes
them and causes a new probe. A wrapper script in front of the real compiler hides
an upgrade behind it; run `polytile cache clear` after such an upgrade.

Every compiler invocation in the process goes through `run_compiler`, which counts
them (`compiler_invocations()`), so tests can prove that a cache hit compiled nothing.
"""
from __future__ import annotations

import functools
import json
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from polytile.config import Config
from polytile.errors import BuildError
from polytile.runtime.files import atomic_write_bytes, ensure_private_dir, sha256_text

DEFAULT_COMPILERS = ("cc", "gcc", "clang")
RECORDS_DIR = "toolchains"   # below the cache directory
# Bump when the probes or the record layout change, so old records are ignored.
PROBE_FORMAT = 1
_COMPILER_HINT = "install gcc or clang, or set POLYTILE_CC to the path of a C compiler"

_MARCH_NATIVE_PROBE = "int polytile_probe(int x) { return x + 1; }\n"
_OPENMP_PROBE = """\
#include <omp.h>
int polytile_probe(int n, float *x) {
  #pragma omp parallel for
  for (int i = 0; i < n; ++i) x[i] *= 2.0f;
  return omp_get_max_threads();
}
"""


@dataclass(frozen=True)
class Toolchain:
    path: str          # as found or given; what we invoke (keeps argv[0] for ccache-style links)
    real_path: str     # symlinks resolved: /usr/bin/cc -> /usr/bin/x86_64-linux-gnu-gcc-12
    version: str       # first line of `--version`
    supports_march_native: bool
    supports_openmp: bool
    args: tuple[str, ...] = ()   # given with the compiler: POLYTILE_CC="cc -fsanitize=address"

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", tuple(self.args))   # a JSON record holds a list

    @property
    def command(self) -> tuple[str, ...]:
        """What every compilation starts with."""
        return (self.path, *self.args)

    @property
    def identity(self) -> str:
        """What the compilation cache key records about the compiler."""
        given = "".join(f" {a}" for a in self.args)
        return f"{self.path}{given} -> {self.real_path}: {self.version}"


@dataclass(frozen=True)
class BuildOptions:
    """Code-generation-independent compiler options; the target config picks them."""

    opt_level: int = 3
    native: bool = True    # -march=native where the compiler accepts it
    openmp: bool = True    # -fopenmp where the compiler and its runtime work
    extra: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.opt_level not in (0, 1, 2, 3):
            raise ValueError(f"opt_level must be 0..3, got {self.opt_level!r}")


def flags_for(toolchain: Toolchain, options: BuildOptions = BuildOptions()) -> tuple[str, ...]:
    """Compiler flags for `options`, leaving out what this compiler cannot do.

    Dropping -fopenmp is safe: generated code only uses OpenMP through pragmas and
    `#ifdef _OPENMP`, so it runs serially instead.
    """
    flags = [f"-O{options.opt_level}"]
    if options.native and toolchain.supports_march_native:
        flags.append("-march=native")
    if options.openmp and toolchain.supports_openmp:
        flags.append("-fopenmp")
    return (*flags, *options.extra)


def detect_toolchain(config: Config) -> Toolchain:
    """The configured compiler, probed at most once per process and compiler binary.
    POLYTILE_CC may be a command with arguments (shell words)."""
    words = _words(config.cc) if config.cc is not None else []
    path = find_compiler(words[0] if words else None)
    real_path = os.path.realpath(path)
    info = os.stat(real_path)
    fingerprint = (info.st_size, info.st_mtime_ns, info.st_dev, info.st_ino)
    records = None if config.disable_disk_cache else config.cache_dir
    return _detect(path, real_path, fingerprint, records, tuple(words[1:]))


def _words(command: str) -> list[str]:
    try:
        words = shlex.split(command)
    except ValueError as e:
        raise BuildError(f"POLYTILE_CC={command!r} is not a command: {e}",
                         hint=_COMPILER_HINT) from None
    if not words:
        raise BuildError("POLYTILE_CC is blank", hint=_COMPILER_HINT)
    return words


def find_compiler(requested: str | None) -> str:
    """Absolute path of `requested` (a name on PATH or a path), or of the first default."""
    if requested is not None:
        found = shutil.which(requested)
        if found is None:
            raise BuildError(f"C compiler {requested!r} from POLYTILE_CC was not found "
                             "or is not executable", hint=_COMPILER_HINT)
        return os.path.abspath(found)
    for name in DEFAULT_COMPILERS:
        found = shutil.which(name)
        if found is not None:
            return os.path.abspath(found)
    raise BuildError(f"no C compiler found: looked for {', '.join(DEFAULT_COMPILERS)} on PATH",
                     hint=_COMPILER_HINT)


class _InvocationCounter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0

    def increment(self) -> None:
        with self._lock:
            self.value += 1


_INVOCATIONS = _InvocationCounter()


def compiler_invocations() -> int:
    """How many times this process has started the C compiler."""
    return _INVOCATIONS.value


def run_compiler(compiler: str, args: Sequence[str], *, timeout: float | None = None,
                 ) -> subprocess.CompletedProcess[str]:
    """Run the compiler with `args`, capturing its output; BuildError if it cannot run."""
    _INVOCATIONS.increment()
    # LC_ALL=C: stable, English diagnostics, so "error:" lines can be picked out.
    env = {**os.environ, "LC_ALL": "C"}
    try:
        return subprocess.run([compiler, *args], check=False, capture_output=True, text=True,
                              errors="replace", env=env, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        output = e.stderr if isinstance(e.stderr, str) else ""
        raise BuildError(f"C compiler {compiler} did not finish within {timeout:g} s",
                         compiler_output=output,
                         hint="a very large generated kernel? try smaller unroll factors") from e
    except OSError as e:
        raise BuildError(f"cannot run C compiler {compiler}: {e.strerror}",
                         hint=_COMPILER_HINT) from e


@functools.cache
def _detect(path: str, real_path: str, fingerprint: tuple[int, ...],
            cache_dir: Path | None, args: tuple[str, ...] = ()) -> Toolchain:
    record = None
    if cache_dir is not None:
        name = sha256_text(json.dumps([PROBE_FORMAT, platform.machine(), path, real_path,
                                       fingerprint, list(args)]))[:32]
        record = ensure_private_dir(ensure_private_dir(cache_dir) / RECORDS_DIR) / f"{name}.json"
        found = _read_record(record, path, real_path, args)
        if found is not None:
            return found
    command = (path, *args)
    toolchain = Toolchain(
        path=path, real_path=real_path, version=_version(path),
        supports_march_native=_compiles(command, _MARCH_NATIVE_PROBE, ("-march=native",)),
        supports_openmp=_compiles(command, _OPENMP_PROBE, ("-fopenmp",)),
        args=args,
    )
    if record is not None:
        atomic_write_bytes(record, json.dumps(asdict(toolchain), indent=1).encode())
    return toolchain


def _read_record(record: Path, path: str, real_path: str,
                 args: tuple[str, ...]) -> Toolchain | None:
    """The recorded probe, or None if there is none or it does not parse as one."""
    try:
        data = json.loads(record.read_text())
        toolchain = Toolchain(**data)
    except (OSError, ValueError, TypeError):
        return None
    ok = (toolchain.path == path and toolchain.real_path == real_path
          and toolchain.args == args
          and isinstance(toolchain.version, str)
          and isinstance(toolchain.supports_march_native, bool)
          and isinstance(toolchain.supports_openmp, bool))
    return toolchain if ok else None


def _version(path: str) -> str:
    result = run_compiler(path, ["--version"], timeout=60)
    lines = [line.strip() for line in (result.stdout + result.stderr).splitlines()]
    first = next((line for line in lines if line), "")
    if result.returncode != 0 or not first:
        raise BuildError(f"{path} --version failed (exit code {result.returncode}); "
                         "is it a C compiler?", compiler_output=result.stderr,
                         hint=_COMPILER_HINT)
    return first


def _compiles(command: tuple[str, ...], source: str, flags: tuple[str, ...]) -> bool:
    """Whether `source` compiles and links into a shared object with `flags`.

    -Werror: a flag the compiler accepts with a warning ("argument unused") would
    warn on every kernel and does not do what we asked for.
    """
    with tempfile.TemporaryDirectory(prefix="polytile-probe-") as tmp:
        src = Path(tmp, "probe.c")
        src.write_text(source)
        args = ["-Werror", *flags, "-shared", "-fPIC", "-o", str(Path(tmp, "probe.so")), str(src)]
        return run_compiler(command[0], [*command[1:], *args], timeout=120).returncode == 0
