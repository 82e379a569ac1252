"""Fresh names for what a pass adds to the IR (a buffer, a merged index)."""
from __future__ import annotations

from collections.abc import Container


def fresh_name(stem: str, taken: Container[str]) -> str:
    """`stem`, or `stem1`, `stem2`, ...: the first that is not in `taken`."""
    name, k = stem, 0
    while name in taken:
        k += 1
        name = f"{stem}{k}"
    return name
