"""The compilation cache key (TC §6.1): named parts, each a string the caller made canonical.

    key = CacheKey(program=sha256_text(canonical_text), signature="float32[3,5] float32[5]",
                   target="cpu-avx2 avx2,fma", options="tile=32,8 unroll=4",
                   flags=flags_for(toolchain, opts), compiler=toolchain.identity)
    key.digest()           # names the on-disk entry
    key.explain(other)     # ["signature: ... != ..."]: why two keys differ

The runtime knows nothing about programs or targets, so it cannot make those parts
canonical itself: `program` must be a hash of alpha-renamed program text, `options`
a canonical rendering (not `str()` of a dict). `polytile` (a hash of polytile's own
source files) is filled in automatically so that changing the compiler invalidates
every kernel it produced. When `flags` contain -march=native, `target` must name the
host's CPU features: the flag does not say what it compiled for.
"""
from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field, fields
from pathlib import Path

# Bump when the meaning of a part or the entry layout changes.
KEY_FORMAT = 1
_PACKAGE_DIR = Path(__file__).resolve().parents[1]


@functools.lru_cache(maxsize=1)
def polytile_source_hash() -> str:
    """sha256 over polytile's .py and .json files (relative path and content), once per process."""
    h = hashlib.sha256()
    files = sorted(p for pattern in ("*.py", "*.json") for p in _PACKAGE_DIR.rglob(pattern)
                   if "__pycache__" not in p.parts)
    for path in files:
        data = path.read_bytes()
        name = path.relative_to(_PACKAGE_DIR).as_posix().encode()
        # Lengths first, so no two different file sets hash the same bytes.
        h.update(b"%d:%s%d:" % (len(name), name, len(data)))
        h.update(data)
    return h.hexdigest()


@dataclass(frozen=True)
class CacheKey:
    program: str           # hash of the canonical, alpha-renamed program text
    signature: str         # input shapes and dtypes
    target: str            # target name and features
    options: str           # canonical text of the code-generation options
    flags: tuple[str, ...]  # the exact compiler flags the entry is built with
    compiler: str          # Toolchain.identity
    polytile: str = field(default_factory=polytile_source_hash)

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            ok = (isinstance(value, tuple) and all(isinstance(v, str) for v in value)
                  if f.name == "flags" else isinstance(value, str))
            if not ok:
                raise TypeError(f"CacheKey.{f.name} must be "
                                f"{'a tuple of str' if f.name == 'flags' else 'a str'}, "
                                f"got {value!r}")

    def parts(self) -> dict[str, str | list[str]]:
        """The named parts as JSON values, as recorded in an entry's meta.json."""
        return {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v
                for f in fields(self)}

    @functools.cached_property
    def _digest(self) -> str:
        text = json.dumps({"format": KEY_FORMAT, **self.parts()}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def digest(self) -> str:
        return self._digest

    def explain(self, other: CacheKey) -> list[str]:
        """One line per part that differs, for logging why a lookup missed."""
        return [f"{name}: {mine!r} != {theirs!r}"
                for (name, mine), theirs in zip(self.parts().items(), other.parts().values())
                if mine != theirs]
