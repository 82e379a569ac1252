"""Every conformance-corpus program and every bench workload compiles to a CUBIN for sm_80
and sm_90 (NVRTC, no GPU needed), through the kernel cache as a call would build it.

NVRTC takes about 0.2 s per kernel on this project's 2-core test machine, so the cross
product (2 x 138) takes about a minute: each program compiles for one architecture in the
ordinary run (sm_80 and sm_90 in turn, so both are exercised on every kind of kernel) and
for the other one in the slow run (`-m slow`). Without NVRTC every test here skips and says
why (`pytest -rs`)."""
from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conformance.programs import CASES
from gpu.cubin import cubin_arch

import polytile as pt
from polytile.bench.workloads import full_set, quick_set
from polytile.compile import Compiler
from polytile.config import Config
from polytile.runtime.cuda import nvrtc_problem
from polytile.sema.specialize import Specialized, specialize
from polytile.targets.target import inspection_target

PROBLEM = nvrtc_problem()
pytestmark = pytest.mark.skipif(PROBLEM is not None, reason=f"compiling CUDA needs {PROBLEM}")

ARCHES = {"cuda-sm80": 80, "cuda-sm90": 90}


def _programs() -> list[tuple[str, str, str, Any]]:
    """(name, TC, function, a maker of the arguments) of every corpus case and workload."""
    found = [(f"corpus {c.name}", c.source, c.function, c.make_inputs) for c in CASES]
    for w in dict.fromkeys(full_set() + quick_set()):
        found.append((f"bench {w.name}", w.tc, w.function,
                      lambda rng, w=w: w.tc_arguments(w.make_inputs(rng))))
    return found


PROGRAMS = _programs()


@cache
def specialized(index: int) -> Specialized:
    _, source, function, make = PROGRAMS[index]
    fn = pt.define(source, backend="interp")[function].fn
    args = make(np.random.default_rng(0))
    shapes = {p.name: np.shape(a) for p, a in zip(fn.params, args) if p.kind == "input"}
    scalars = {p.name: a for p, a in zip(fn.params, args) if p.kind == "scalar"}
    return specialize(fn, shapes, scalars)


def _cases() -> list[Any]:
    cases = []
    for index, (name, *_) in enumerate(PROGRAMS):
        for k, target in enumerate(ARCHES):
            marks = [pytest.mark.slow] if (index + k) % 2 else []
            cases.append(pytest.param(index, target, marks=marks, id=f"{name}-{target}"))
    return cases


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cubins")


@pytest.mark.parametrize("index, target", _cases())
def test_compiles_to_cubin(index: int, target: str, cache_dir: Path) -> None:
    compiler = Compiler(Config(cache_dir=cache_dir), inspection_target(target))
    built = compiler.build(specialized(index))
    binary = built.library.so_path.read_bytes()
    assert cubin_arch(binary) == ARCHES[target]
    source = built.library.source_path.read_text()
    assert '__global__ void pt_k0(' in source
