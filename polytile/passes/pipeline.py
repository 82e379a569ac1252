"""A target's pass pipeline, built from its config: `passes` is an ordered list of
{"pass": name, ...parameters}. Passes are looked up by name in PASSES; each is a
function (Function, Target, params) -> Function that matches structure and tags,
never op names.

Every parameter a pass reads is declared in PARAMS with a check of its values, so
options that reach the pipeline from outside (the tuning database, `cache inject`,
`cache import`, a caller's Compiler(options=...)) are refused with an ArgumentError
that names the option, instead of failing somewhere inside a pass or, worse, being
obeyed past what the hardware can do.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Callable

from polytile.errors import ArgumentError
from polytile.ir import nodes as N
from polytile.targets.target import Target

Pass = Callable[[N.Function, Target, dict[str, Any]], N.Function]
# A check of one parameter value: None when it is fine, else what is wrong.
ParamCheck = Callable[[Any], str | None]

PASSES: dict[str, Pass] = {}
PARAMS: dict[str, dict[str, ParamCheck]] = {}


def register(name: str, run: Pass, **params: ParamCheck) -> None:
    """Make pass `name` available to target pipelines, with the parameters it reads."""
    PASSES[name] = run
    PARAMS[name] = dict(params)


def flag(value: Any) -> str | None:
    return None if isinstance(value, bool) else f"must be true or false, got {value!r}"


def count(value: Any) -> str | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return None if ok else f"must be a non-negative integer, got {value!r}"


def between(lo: int, hi: int) -> ParamCheck:
    """A count from lo to hi."""
    def check(value: Any) -> str | None:
        problem = count(value)
        if problem or lo <= value <= hi:
            return problem
        return f"must be {lo}..{hi}, got {value}"
    return check


def one_of(*choices: str) -> ParamCheck:
    def check(value: Any) -> str | None:
        return None if value in choices else (f"must be one of {', '.join(choices)}, "
                                               f"got {value!r}")
    return check


def options_from_text(texts: Sequence[str]) -> dict[str, Any]:
    """Options written `PASS.PARAM=VALUE` (a command line's): the value in JSON, or a bare
    word as a string (`fuse.strategy=rows`, `gpu.rows=32`, `pack.enabled=false`). Checked
    against a target by `check_pass_options`."""
    options: dict[str, Any] = {}
    for text in texts:
        key, equals, value = text.partition("=")
        if not equals or "." not in key:
            raise ArgumentError(f"option {text!r} is not PASS.PARAM=VALUE",
                                hint="e.g. fuse.strategy=rows")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def check_pass_options(options: Mapping[str, Any], target: Target) -> None:
    """Refuse options the target's pipeline cannot take: {"pass.param": value}, where the
    pass is in the target's pipeline and declares the parameter, and the value passes
    the parameter's check."""
    _load_passes()
    in_pipeline = [name for name, _ in target.passes]
    for key, value in options.items():
        name, dot, param = str(key).partition(".")
        if not dot or name not in in_pipeline:
            raise ArgumentError(f"option {key!r} names no pass of target {target.name}",
                                hint=f"its passes are {', '.join(in_pipeline)}; options are "
                                     "named 'pass.param'")
        known = PARAMS.get(name, {})
        if param not in known:
            raise ArgumentError(f"pass {name} has no parameter {param!r}",
                                hint=f"its parameters: {', '.join(sorted(known)) or 'none'}")
        problem = known[param](value)
        if problem:
            raise ArgumentError(f"option {key} {problem}")


def run_pipeline(fn: N.Function, target: Target, options: dict[str, Any]) -> N.Function:
    """Run every pass the target lists, in order; `options` override pass parameters
    as {"pass_name.param": value}."""
    _load_passes()
    check_pass_options(options, target)
    for name, params in target.passes:
        if name not in PASSES:
            raise ArgumentError(f"target {target.name} names unknown pass {name!r}",
                                hint=f"known passes: {', '.join(sorted(PASSES)) or 'none'}")
        merged = dict(params)
        merged.update({k.split(".", 1)[1]: v for k, v in options.items()
                       if k.startswith(name + ".")})
        # The schedules given for autotile (the tuner's) also size pack's panels: one
        # decision, read by both passes.
        if "schedules" in PARAMS[name] and "autotile.schedules" in options:
            merged.setdefault("schedules", options["autotile.schedules"])
        fn = PASSES[name](fn, target, merged)
    return fn


def _load_passes() -> None:
    """Import the pass modules; each registers itself in PASSES."""
    from polytile.passes import (  # noqa: F401
        autotile, collapse, epilogue, fold, fuse, gathercopy, gpu, merge, nextrow, outlayout,
        pack, ptrinc, reorder, rowbuffer, scratch, sink, stream, tensor_cores, tensorize)
