"""The IR of every corpus program, as lowered and as optimized for each shipped target.

For each program of tests/conformance/programs.py, specialized to the shapes of one of
its inputs:

* the lowered IR prints, parses back to the same nodes and prints to the same text;
  it verifies; and the IR interpreter computes what the reference interpreter
  (polytile.sema.reference, TC semantics) computes;
* the same three properties hold for the IR after the passes of cpu-avx512, cpu-avx2
  and cpu-generic (`Compiler(config, target).ir`), on the corpus sizes (small primes
  and 1) and, for a set of programs that the passes tile, at larger sizes that do
  not divide the cache or register tiles.

Every tests/paper/*.tc that analyzes is covered: each is a corpus program verbatim.
The whole module takes about 40 s, so nothing in it is marked `slow`.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conformance.programs import CASES, Case
from conformance.test_conformance import assert_agrees

import polytile as pt
from polytile.compile import Compiler
from polytile.config import load_config
from polytile.ir import interp
from polytile.ir import nodes as N
from polytile.ir.lower import lower
from polytile.ir.parser import parse_function
from polytile.ir.printer import format_function
from polytile.ir.verify import verify
from polytile.lang.parser import parse
from polytile.sema import reference
from polytile.sema.analyze import analyze
from polytile.sema.program import Function as TCFunction
from polytile.sema.specialize import Specialized, specialize
from polytile.targets.target import PREFERENCE, Target, host_features, load_target, select_target

PAPER = Path(__file__).resolve().parents[1] / "paper"
TARGETS = PREFERENCE            # cpu-avx512, cpu-avx2, cpu-generic
BY_NAME = {c.name: c for c in CASES}


# ---------------------------------------------------------------- helpers

@dataclass(frozen=True)
class Call:
    """One call of a TC function: its specialization, arguments and in/out initial values."""

    spec: Specialized
    args: tuple[Any, ...]
    initial: dict[str, np.ndarray]


def target(name: str) -> Target:
    """A shipped target, given the features it requires: the passes read only its
    parameters, so every target's IR can be checked on any x86-64 host."""
    features = host_features() | frozenset(load_target(name).requires)
    try:
        return select_target(name, features=features)
    except pt.PolytileError as err:      # not x86-64
        pytest.skip(str(err))


@cache
def tc_function(source: str, function: str) -> TCFunction:
    program = analyze(parse(source, "<corpus>"))
    return next(f for f in program.functions if f.name == function)


def specialize_call(fn: TCFunction, args: tuple[Any, ...],
                    initial: dict[str, np.ndarray] | None = None) -> Call:
    shapes = {p.name: np.shape(a) for p, a in zip(fn.params, args) if p.kind == "input"}
    scalars = {p.name: a for p, a in zip(fn.params, args) if p.kind == "scalar"}
    return Call(specialize(fn, shapes, scalars), args, dict(initial or {}))


def case_call(case: Case, seed: int = 0) -> Call:
    rng = np.random.default_rng(seed)
    args = case.make_inputs(rng)
    initial = case.make_out(rng, args) if case.make_out else {}
    return specialize_call(tc_function(case.source, case.function), args, initial)


def _outputs(call: Call) -> dict[str, np.ndarray]:
    fn = call.spec.fn
    return {o.name: (call.initial[o.name].copy() if o.name in call.initial
                     else np.zeros(call.spec.shape(o.name), o.dtype.numpy))
            for o in fn.outputs}


def run_reference(call: Call) -> tuple[np.ndarray, ...]:
    fn = call.spec.fn
    outputs = _outputs(call)
    reference.run(call.spec, {p.name: a for p, a in zip(fn.params, call.args)}, outputs)
    return tuple(outputs[o.name] for o in fn.outputs)


def run_ir(ir: N.Function, call: Call) -> tuple[np.ndarray, ...]:
    """Interpret `ir` on the call. IR parameters follow the TC function's parameters then
    outputs, in order, whatever their (possibly alpha-renamed) names."""
    fn = call.spec.fn
    outputs = _outputs(call)
    values = [np.asarray(a, dtype=p.dtype.numpy) if p.kind == "scalar" else a
              for p, a in zip(fn.params, call.args)]
    values += [outputs[o.name] for o in fn.outputs]
    assert len(ir.params) == len(values), (ir.params, len(values))
    interp.run(ir, dict(zip(ir.params, values)))
    return tuple(outputs[o.name] for o in fn.outputs)


def check_text_round_trip(ir: N.Function) -> None:
    text = format_function(ir)
    parsed = parse_function(text, f"{ir.name}.ir")
    assert parsed == ir, "parse(print(ir)) != ir"
    assert format_function(parsed) == text, "print -> parse -> print changed the text"


def check_same_results(ir: N.Function, call: Call, tolerance: float, what: str) -> None:
    want = run_reference(call)
    got = run_ir(ir, call)
    names = [o.name for o in call.spec.fn.outputs]
    for name, g, w in zip(names, got, want):
        assert_agrees(g, w, tolerance, f"{what}: output {name}")


def check_ir(ir: N.Function, call: Call, tolerance: float, what: str,
             on: Target | None = None) -> None:
    check_text_round_trip(ir)
    verify(ir, on)
    check_same_results(ir, call, tolerance, what)


def optimized(call: Call, target_name: str) -> N.Function:
    return Compiler(load_config(), target(target_name)).ir(call.spec)


# ---------------------------------------------------------------- the corpus, lowered

@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_lowered_ir(case: Case) -> None:
    for seed in (0, 1):
        call = case_call(case, seed)
        check_ir(lower(call.spec), call, case.tolerance, f"{case.name} lowered (seed {seed})")


# ---------------------------------------------------------------- the corpus, optimized

def _optimized_params() -> list[Any]:
    return [pytest.param(case, name, id=f"{case.name}-{name}")
            for case in CASES for name in TARGETS]


@pytest.mark.parametrize("case, target_name", _optimized_params())
def test_optimized_ir(case: Case, target_name: str) -> None:
    call = case_call(case)
    ir = optimized(call, target_name)
    check_ir(ir, call, case.tolerance, f"{case.name} on {target_name}", target(target_name))
    # Other data through the same IR (the specialization depends on shapes only,
    # except for integer scalars, which seed 0 fixed).
    again = case_call(case, 2)
    if again.spec == call.spec:
        check_same_results(ir, again, case.tolerance, f"{case.name} on {target_name}, seed 2")


# ---------------------------------------------------------------- the paper's programs

def _analyzing_paper_files() -> list[Path]:
    found = []
    for path in sorted(PAPER.glob("*.tc")):
        try:
            analyze(parse(path.read_text(), path.name))
        except pt.PolytileError:
            continue
        found.append(path)
    return found


PAPER_FILES = _analyzing_paper_files()


def test_most_paper_files_analyze() -> None:
    assert len(PAPER_FILES) >= 12, [p.name for p in PAPER_FILES]


@pytest.mark.parametrize("path", PAPER_FILES, ids=lambda p: p.stem)
def test_paper_program_lowers_and_optimizes(path: Path) -> None:
    """Each paper program is a corpus case verbatim (so the tests above run it with
    the case's inputs); here it runs once more, through lowering and every target."""
    text = path.read_text()
    cases = [c for c in CASES if c.source == text]
    assert cases, f"{path.name} analyzes but no corpus case uses it verbatim"
    case = cases[0]
    call = case_call(case, 4)
    check_ir(lower(call.spec), call, case.tolerance, f"{path.name} lowered")
    for name in TARGETS:
        check_ir(optimized(call, name), call, case.tolerance, f"{path.name} on {name}")


# ---------------------------------------------------------------- sizes that do not divide

def _normal(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


# (name, source, inputs): sizes chosen so that the passes tile (cache and register
# tiles) and no tile size divides them.
SCALED: list[tuple[str, str, Any]] = [
    ("mm", (PAPER / "mm.tc").read_text(),
     lambda r: (_normal(r, 37, 45), _normal(r, 45, 67))),
    ("tmm", (PAPER / "tmm.tc").read_text(),
     lambda r: (_normal(r, 37, 53), _normal(r, 29, 53))),
    ("tbmm", (PAPER / "tbmm.tc").read_text(),
     lambda r: (_normal(r, 3, 19, 37), _normal(r, 3, 23, 37))),
    ("mv", (PAPER / "mv_init.tc").read_text(),
     lambda r: (_normal(r, 45, 67), _normal(r, 67))),
    ("fcrelu", (PAPER / "fcrelu.tc").read_text(),
     lambda r: (_normal(r, 17, 45), _normal(r, 45, 45), _normal(r, 45))),
    ("conv2d", (PAPER / "conv2d.tc").read_text(),
     lambda r: (_normal(r, 2, 3, 13, 14), _normal(r, 5, 3, 3, 3))),
    ("maxpool", (PAPER / "maxpool2x2.tc").read_text(),
     lambda r: (_normal(r, 2, 3, 37, 21),)),
    ("2LUT", (PAPER / "2LUT.tc").read_text(),
     lambda r: (_normal(r, 41, 37), r.integers(0, 41, (19, 7)).astype(np.int32),
                _normal(r, 23, 37), r.integers(0, 23, (19, 5)).astype(np.int32))),
    ("softmax", BY_NAME["softmax (three temporaries)"].source,
     lambda r: (_normal(r, 19, 45),)),
    ("layernorm", BY_NAME["layernorm (scalar eps)"].source,
     lambda r: (_normal(r, 13, 67), _normal(r, 67), _normal(r, 67), np.float32(1e-5))),
    ("nanred", BY_NAME["max and min reductions propagate NaN"].source,
     lambda r: (np.where(r.random((17, 37)) < 0.02, np.nan, _normal(r, 17, 37)
                         ).astype(np.float32),)),
    ("elementwise", """
def ew(float(M,N) X, float(N) b) -> (Y) {
  Y(i,j) = tanh(X(i,j) * 0.5 + b(j)) + exp(-X(i,j) * X(i,j))
}""", lambda r: (_normal(r, 23, 45), _normal(r, 45))),
]


def _scaled_params() -> list[Any]:
    return [pytest.param(name, source, inputs, t, id=f"{name}-{t}")
            for name, source, inputs in SCALED for t in TARGETS]


@pytest.mark.parametrize("name, source, inputs, target_name", _scaled_params())
def test_optimized_ir_at_sizes_that_do_not_divide_the_tiles(name: str, source: str, inputs: Any,
                                                            target_name: str) -> None:
    fn = analyze(parse(source, name)).functions[0]
    call = specialize_call(fn, inputs(np.random.default_rng(11)))
    ir = optimized(call, target_name)
    check_ir(ir, call, 1e-5, f"{name} on {target_name}")


def _has_overflow_constraint(block: N.Block) -> bool:
    return bool(block.constraints) or any(
        isinstance(s, N.Block) and _has_overflow_constraint(s) for s in block.stmts)


@pytest.mark.parametrize("target_name", TARGETS)
def test_scaled_programs_do_get_non_dividing_tiles(target_name: str) -> None:
    """The sizes above are worth something only if the passes tile them with a tile
    that leaves a remainder, which shows as an overflow constraint."""
    remainders = []
    for name, source, inputs in SCALED:
        fn = analyze(parse(source, name)).functions[0]
        call = specialize_call(fn, inputs(np.random.default_rng(11)))
        if _has_overflow_constraint(optimized(call, target_name).body):
            remainders.append(name)
    assert {"mm", "tmm", "elementwise"} <= set(remainders), remainders
    assert len(remainders) >= len(SCALED) // 2, remainders



def test_names_that_need_a_prefix_stay_distinct() -> None:
    """TC names may start with a digit; their IR names get a prefix that a TC name may
    already carry, and the two must not become one buffer."""
    source = ("def 2fn(float(N) 2LUT, float(N) t_2LUT, float(N) t_t_2LUT) -> (t_O) {\n"
              "  t_O(i) = 2LUT(i) - t_2LUT(i) * t_t_2LUT(i)\n}\n")
    fn = analyze(parse(source, "names")).functions[0]
    rng = np.random.default_rng(0)
    call = specialize_call(fn, tuple(rng.standard_normal(5).astype(np.float32)
                                     for _ in range(3)))
    ir = lower(call.spec)
    assert len(set(ir.params)) == 4
    check_ir(ir, call, 1e-6, "prefixed names")
