"""A target's pass pipeline, built from its config: `passes` is an ordered list of
{"pass": name, ...parameters}. Passes are looked up by name in PASSES; each is a
function (Function, Target, params) -> Function that matches structure and tags,
never op names."""
from __future__ import annotations

from typing import Any, Callable

from polytile.errors import ArgumentError
from polytile.ir import nodes as N
from polytile.targets.target import Target

Pass = Callable[[N.Function, Target, dict[str, Any]], N.Function]

PASSES: dict[str, Pass] = {}


def run_pipeline(fn: N.Function, target: Target, options: dict[str, Any]) -> N.Function:
    """Run every pass the target lists, in order; `options` override pass parameters
    as {"pass_name.param": value}."""
    _load_passes()
    for name, params in target.passes:
        if name not in PASSES:
            raise ArgumentError(f"target {target.name} names unknown pass {name!r}",
                                hint=f"known passes: {', '.join(sorted(PASSES)) or 'none'}")
        merged = dict(params)
        merged.update({k.split(".", 1)[1]: v for k, v in options.items()
                       if k.startswith(name + ".")})
        fn = PASSES[name](fn, target, merged)
    return fn


def _load_passes() -> None:
    """Import the pass modules; each registers itself in PASSES."""
    from polytile.passes import autotile, fuse, pack, ptrinc, reorder  # noqa: F401
