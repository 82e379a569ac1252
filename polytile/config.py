"""The one place that reads POLYTILE_* environment variables.

Everything else receives a `Config` explicitly, so a test (or a caller with two
caches) builds its own instead of patching the environment, and importing polytile
changes nothing:

    config = load_config()                                   # from os.environ
    config = Config(cache_dir=tmp_path / "cache")            # in a test
    config = dataclasses.replace(load_config(), disable_disk_cache=True)

| variable                  | field              | default                                  |
| ------------------------- | ------------------ | ---------------------------------------- |
| POLYTILE_CACHE_DIR        | cache_dir          | platformdirs.user_cache_dir("polytile")  |
| POLYTILE_CC               | cc                 | None: `cc`, then `gcc`, then `clang` on PATH |
| POLYTILE_TARGET           | target             | None: the best target the host supports  |
| POLYTILE_NO_DISK_CACHE    | disable_disk_cache | off                                      |
| POLYTILE_KEEP_BUILD_DIRS  | keep_build_dirs    | off                                      |
| POLYTILE_IGNORE_TUNED     | ignore_tuned       | off: calls use the tuning database's best |
| POLYTILE_SANITIZE         | sanitize           | none; `address,undefined` builds kernels with those sanitizers (polytile.runtime.sanitize) |
| POLYTILE_OUTPUT_POOL_MB   | output_pool_bytes  | 256: large outputs reuse up to this much memory the process already touched (polytile.runtime.pool); 0: off |
| POLYTILE_NO_NATIVE_DISPATCH | native_dispatch  | off: cached calls run through the native call path (polytile.runtime.dispatch); on: through Python alone |

POLYTILE_CC may be a command with arguments, e.g. `POLYTILE_CC="ccache gcc"` or
`POLYTILE_CC="cc -fno-strict-aliasing"`.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from polytile.errors import PolytileError

SANITIZERS = ("address", "undefined")     # what kernels can be built with (-fsanitize=)

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})


@dataclass(frozen=True)
class Config:
    cache_dir: Path
    # None means "search PATH when a compiler is needed": the toolchain, not the
    # configuration, decides, so an explicit POLYTILE_CC that is wrong is an error
    # rather than a silent fallback to another compiler.
    cc: str | None = None
    target: str | None = None
    disable_disk_cache: bool = False
    # Keep build directories of failed builds (and of builds when the disk cache is
    # off) so the generated C and the exact compiler command can be inspected.
    keep_build_dirs: bool = False
    # Compile with the heuristics even where the tuning database has better options
    # (to measure what tuning gained, or to rule it out when debugging).
    ignore_tuned: bool = False
    # Sanitizers kernels are built with, sorted: () or a subset of ("address", "undefined").
    sanitize: tuple[str, ...] = ()
    # Bytes of output blocks kept for reuse (polytile.runtime.pool); 0 turns it off.
    output_pool_bytes: int = 256 << 20
    # Cached calls through the C call path (polytile.runtime.dispatch), where it builds.
    native_dispatch: bool = True

    def __post_init__(self) -> None:
        # A str or any os.PathLike works; made absolute now, so a later os.chdir
        # cannot move the cache.
        path = Path(os.path.abspath(os.path.expanduser(os.fspath(self.cache_dir))))
        object.__setattr__(self, "cache_dir", path)


def load_config(environ: Mapping[str, str] | None = None) -> Config:
    """A Config from `environ` (default: os.environ); unset or empty variables mean default."""
    env = os.environ if environ is None else environ
    cache_dir = env.get("POLYTILE_CACHE_DIR") or platformdirs.user_cache_dir("polytile")
    return Config(
        cache_dir=Path(cache_dir),
        cc=env.get("POLYTILE_CC") or None,
        target=env.get("POLYTILE_TARGET") or None,
        disable_disk_cache=_flag(env, "POLYTILE_NO_DISK_CACHE"),
        keep_build_dirs=_flag(env, "POLYTILE_KEEP_BUILD_DIRS"),
        ignore_tuned=_flag(env, "POLYTILE_IGNORE_TUNED"),
        sanitize=parse_sanitizers(env.get("POLYTILE_SANITIZE", ""), "POLYTILE_SANITIZE"),
        output_pool_bytes=_megabytes(env, "POLYTILE_OUTPUT_POOL_MB", 256) << 20,
        native_dispatch=not _flag(env, "POLYTILE_NO_NATIVE_DISPATCH"),
    )


def parse_sanitizers(value: str | Sequence[str] | None, source: str = "sanitize"
                     ) -> tuple[str, ...]:
    """("address", "undefined") from "address,undefined" or a sequence of names."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    names = tuple(sorted({str(n).strip() for n in items if str(n).strip()}))
    unknown = [n for n in names if n not in SANITIZERS]
    if unknown:
        raise PolytileError(f"{source}={value!r} names unknown sanitizers "
                            f"{', '.join(unknown)}",
                            hint=f"use a comma list of {', '.join(SANITIZERS)}")
    return names


def _flag(env: Mapping[str, str], name: str) -> bool:
    value = env.get(name, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise PolytileError(f"{name}={env[name]!r} is not a yes/no value",
                        hint=f"set {name}=1 to turn it on or unset it to turn it off")


def _megabytes(env: Mapping[str, str], name: str, default: int) -> int:
    value = env.get(name, "").strip()
    if not value:
        return default
    if not value.isdigit():
        raise PolytileError(f"{name}={env[name]!r} is not a whole number of megabytes",
                            hint=f"set {name}=0 to turn it off, or unset it for {default}")
    return int(value)
