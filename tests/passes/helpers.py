"""Shared by the pass tests: golden IR files, lowering TC snippets, and the check that a
pass kept the meaning (the IR interpreter on random data, before and after).

Golden files live in tests/golden/passes/<name>.before.ir and <name>.after.ir. To
accept a deliberate change of a pass's output, run the tests with
POLYTILE_UPDATE_GOLDEN=1 and review the diff.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conformance.test_conformance import assert_agrees

from polytile.ir import interp
from polytile.ir import nodes as N
from polytile.ir.parser import parse_function
from polytile.ir.printer import format_function
from polytile.ir.verify import verify
from polytile.lang.parser import parse
from polytile.sema.analyze import analyze
from polytile.sema.specialize import specialize
from polytile.targets.target import Target, host_features, inspection_target, load_target

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "passes"
UPDATE = bool(os.environ.get("POLYTILE_UPDATE_GOLDEN"))


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / f"{name}.ir"
    if UPDATE:
        GOLDEN.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    if not path.exists():
        pytest.fail(f"no golden file {path.name}: run with POLYTILE_UPDATE_GOLDEN=1")
    assert text == path.read_text(), (
        f"{path.name} changed; if that is intended, regenerate with POLYTILE_UPDATE_GOLDEN=1 "
        "and review the diff")


def lowered(source: str, shapes: Mapping[str, tuple[int, ...]],
            scalars: Mapping[str, int | float] | None = None) -> N.Function:
    """The lowered IR of the first function of `source` at the given shapes (TC names)."""
    from polytile.ir.lower import lower
    fn = analyze(parse(source, "<test>")).functions[0]
    return lower(specialize(fn, shapes, scalars or {}))


def target(name: str) -> Target:
    """A shipped target, whatever the host: the passes read only its parameters, and the
    cache sizes are the file's, not this machine's, so a schedule does not change with the
    host the tests run on. A target whose device the host lacks (opencl without a working
    OpenCL driver) is the one `polytile show --target` prints for."""
    shipped = load_target(name)
    chosen = inspection_target(name, features=host_features() | frozenset(shipped.requires))
    return replace(chosen, cache_bytes=shipped.cache_bytes)


def block(fn: N.Function, name: str) -> N.Block:
    found = next((s for s in fn.body.stmts if isinstance(s, N.Block) and s.name == name), None)
    assert found is not None, f"no top-level block {name}"
    return found


def marked(fn: N.Function, field: str) -> list[tuple[str, Any]]:
    """(block name, value) of every block, at any depth, whose schedule's `field` is set."""
    found: list[tuple[str, Any]] = []

    def walk(b: N.Block) -> None:
        if getattr(b.schedule, field):
            found.append((b.name, getattr(b.schedule, field)))
        for s in b.stmts:
            if isinstance(s, N.Block):
                walk(s)
    walk(fn.body)
    return found


def with_block(fn: N.Function, name: str, new: N.Block) -> N.Function:
    """`fn` with its top-level block `name` replaced by `new`."""
    block(fn, name)
    stmts = tuple(new if isinstance(s, N.Block) and s.name == name else s
                  for s in fn.body.stmts)
    return replace(fn, body=replace(fn.body, stmts=stmts))


def parent_sizes(holder: N.Block) -> dict[str, tuple[int, ...]]:
    return {r.into: r.shape.sizes for r in holder.refs}


# ---------------------------------------------------------------- meaning

IntBounds = Mapping[str, int]


def random_buffers(fn: N.Function, rng: np.random.Generator,
                   int_high: IntBounds | None = None) -> dict[str, np.ndarray]:
    """Every parameter of `fn`: floats standard normal, integers in [0, int_high[name])
    (default 4, small enough to be a valid index of every test's gathers)."""
    refs = {r.into: r for r in fn.body.refs}
    out = {}
    for name in fn.params:
        shape = refs[name].shape
        dtype = shape.dtype.numpy
        if shape.dtype.is_float:
            value = rng.standard_normal(shape.sizes).astype(dtype)
        elif dtype == np.bool_:
            value = rng.random(shape.sizes) < 0.5
        else:
            value = rng.integers(0, (int_high or {}).get(name, 4), shape.sizes).astype(dtype)
        out[name] = np.asarray(value)
    return out


def run(fn: N.Function, buffers: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Interpret `fn` on copies of `buffers`; the out/inout buffers afterwards."""
    copies = {k: v.copy() for k, v in buffers.items()}
    interp.run(fn, copies)
    writes = {r.into for r in fn.body.refs if r.dir in ("out", "inout")}
    return {k: v for k, v in copies.items() if k in writes}


def assert_same_meaning(before: N.Function, after: N.Function, seeds: tuple[int, ...] = (0, 1),
                        int_high: IntBounds | None = None, tolerance: float = 1e-5,
                        sum_of_products: bool = False) -> None:
    """Both functions compute the same outputs from the same random inputs.

    With `sum_of_products`, floating-point results are compared against the size of the
    terms (the same function on |inputs|) rather than the possibly cancelled result:
    reordering a float32 sum (what tiling does) moves it by that much."""
    assert before.params == after.params
    for seed in seeds:
        buffers = random_buffers(before, np.random.default_rng(seed), int_high)
        want, got = run(before, buffers), run(after, buffers)
        assert want.keys() == got.keys()
        if sum_of_products:
            magnitude = run(before, {k: np.asarray(np.abs(v)) if v.dtype.kind == "f" else v
                                     for k, v in buffers.items()})
        for name in want:
            if sum_of_products and want[name].dtype.kind == "f":
                error = np.linalg.norm(got[name].astype(np.float64) - want[name])
                scale = np.linalg.norm(magnitude[name].astype(np.float64))
                assert error <= tolerance * max(scale, 1e-30), f"{name} (seed {seed})"
                continue
            assert_agrees(got[name], want[name], tolerance, f"{name} (seed {seed})")


def check_round_trip(fn: N.Function) -> None:
    text = format_function(fn)
    assert parse_function(text) == fn
    assert format_function(parse_function(text)) == text


def check_pass(name: str, before: N.Function, after: N.Function,
               int_high: IntBounds | None = None) -> None:
    """The golden before/after texts, both verify, the output round-trips through its
    text, and the pass kept the meaning."""
    verify(before)
    check_golden(f"{name}.before", format_function(before))
    check_golden(f"{name}.after", format_function(after))
    verify(after)
    check_round_trip(after)
    assert_same_meaning(before, after, int_high=int_high)


PassFn = Callable[[N.Function], N.Function]
