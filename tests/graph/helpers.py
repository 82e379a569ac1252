"""Shared by the graph tests: a TC function specialized at given shapes."""
from __future__ import annotations

from collections.abc import Mapping

from polytile.lang.parser import parse
from polytile.sema.analyze import analyze
from polytile.sema.specialize import Specialized, specialize


def spec_of(source: str, shapes: Mapping[str, tuple[int, ...]],
            scalars: Mapping[str, int | float] | None = None) -> Specialized:
    fn = analyze(parse(source, "<test>")).functions[0]
    return specialize(fn, shapes, scalars or {})
