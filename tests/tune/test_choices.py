"""Which pipeline choices are genes (polytile/tune/choices.py): only those that change the
program, with only the values that build programs of their own; the pruned space still
reaches every program the full product of the choices builds, and its points compute
what the reference interpreter does."""
from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from passes.test_gpu_rows import LAYERNORM, SOFTMAX

from polytile.compile import Compiler
from polytile.config import Config
from polytile.ir.lower import lower
from polytile.lang.parser import parse
from polytile.loops import interp
from polytile.sema import reference
from polytile.sema.analyze import analyze
from polytile.sema.canonical import canonical
from polytile.sema.specialize import Specialized, specialize
from polytile.targets.target import Target, inspection_target, load_target, select_target
from polytile.tune.choices import PIPELINE_CHOICES, Programs, offered_choices, pipeline_choices
from polytile.tune.options import Options
from polytile.tune.space import Space, build_space

from .conftest import TMM
from .test_space import WORKLOADS, _spec

GELU = WORKLOADS["gelu 33x101"]
# Row groups need an intermediate the fused row keeps to itself: the tests' softmax
# (e = exp(...)) and layernorm have one; the bench's softmax writes Y and reads it back,
# a buffer in global memory between members, so its row stays a row per work-item.
ROWS = {"softmax": (SOFTMAX, {"X": (5, 37)}),
        "layernorm": (LAYERNORM, {"X": (5, 37), "gamma": (37,), "beta": (37,)}),
        "tmm": (TMM, {"A": (30, 24), "B": (40, 24)}),
        # every row adds into gw: fused, but not a row group (work-groups would race)
        "colsum": ("def colsum(float(N,D) X, float(N) y) -> (gw) {\n"
                   "  g(n) = y(n) * 2\n  gw(d) +=! X(n,d) * g(n)\n}\n",
                   {"X": (37, 11), "y": (37,)})}


def _source_spec(name: str) -> Specialized:
    source, shapes = ROWS[name]
    return specialize(analyze(parse(source)).functions[0], shapes, {})


def _space(spec: Specialized, target: Target) -> Space:
    return build_space(lower(canonical(spec)), target)


def _pipeline_genes(space: Space) -> dict[str, tuple[Any, ...]]:
    return {g.name: g.values for g in space.genes if g.name in PIPELINE_CHOICES}


def test_a_program_with_nothing_to_fuse_or_pack_has_fewer_genes() -> None:
    target = select_target()
    gelu = _space(_spec(GELU), target)                  # one elementwise statement
    tmm = _space(_spec(WORKLOADS["tmm 128x32x256"]), target)
    assert _pipeline_genes(gelu) == {}
    assert {"fuse.strategy", "pack.enabled"} <= set(gelu.fixed)
    assert {"fuse.strategy", "pack.enabled"} <= set(_pipeline_genes(tmm))
    assert len(gelu.variants) == 1 < len(tmm.variants)
    assert len(_pipeline_genes(gelu)) < len(_pipeline_genes(tmm))


def test_gpu_rows_is_a_gene_only_where_a_fused_row_becomes_a_row_group() -> None:
    opencl = load_target("opencl")
    genes = {name: _pipeline_genes(_space(_source_spec(name), opencl)) for name in ROWS}
    # 37 elements: 64 and more work-items take 32 (the largest power of two that fits).
    assert genes["softmax"]["gpu.rows"] == (64, 0)
    assert genes["layernorm"]["gpu.rows"] == (64, 0)
    assert "fuse.strategy" in genes["softmax"]     # rows only act under fuse.strategy=rows
    colsum = _space(_source_spec("colsum"), opencl)
    assert "gpu.rows" not in _pipeline_genes(colsum)
    # a small matmul's row (its contraction spread over the columns) is a row group
    assert genes["tmm"]["gpu.rows"] == (64, 0)
    assert genes["tmm"]["gpu.threads"] == (64, 32, 128, 256)
    # the bench's softmax passes its output Y between members, in global memory: a row
    # group whose barriers order global memory too
    bench_softmax = _space(_spec(WORKLOADS["softmax 33x101"]), opencl)
    assert _pipeline_genes(bench_softmax)["gpu.rows"] == (64, 0, 32)


def test_a_value_that_builds_what_another_builds_lands_on_it() -> None:
    space = _space(_source_spec("softmax"), load_target("opencl"))
    rows = next(g for g in space.genes if g.name == "gpu.rows")
    assert dict(rows.same) == {32: 64, 128: 64, 256: 64}
    point = space.encode(Options.of({}, {"fuse.strategy": "rows", "gpu.rows": 256}))
    assert space.value(point, "gpu.rows") == 64
    assert space.variant_of(Options.of({}, {"gpu.rows": 128})) == space.variants[0]


def _every_setting(offered: dict[str, tuple[Any, ...]]) -> list[dict[str, Any]]:
    return [dict(zip(offered, combo)) for combo in itertools.product(*offered.values())]


def _check_covers_the_full_product(programs: Programs,
                                   offered: dict[str, tuple[Any, ...]]) -> None:
    """Every setting of every offered value builds the program of the setting its values
    resolve to, and the kept values' product builds every distinct program."""
    choices = {c.name: c for c in pipeline_choices(programs, offered)}
    full = set()
    for setting in _every_setting(offered):
        built = programs.program(setting)[1]
        full.add(built)
        resolved = {name: choices[name].resolve(v) for name, v in setting.items()}
        assert programs.program(resolved)[1] == built, (setting, resolved)
    kept = {name: c.values for name, c in choices.items()}
    assert {programs.program(s)[1] for s in _every_setting(kept)} == full
    assert len(full) > 1


@pytest.mark.parametrize("name", ["tmm 37x19x53", "tmm 128x32x256", "MLP3 8x17x9x5x2",
                                  "softmax 33x101", "2LUT 1000x8x6x5",
                                  "conv-einsum 2x3x5x9x7"])
def test_the_pruned_cpu_choices_reach_every_program_of_the_full_product(name: str) -> None:
    target = select_target()
    _check_covers_the_full_product(Programs(lower(canonical(_spec(WORKLOADS[name]))), target),
                                   offered_choices(target, False))


# The GPU choices that act on each other (rows only under fuse.strategy=rows, the
# shared reduction only without staging, the padding only of a staged tile): the full
# product of all eight is some 13000 settings per program, half a minute to two.
GPU_OFFERED = {name: values for name, values in offered_choices(load_target("opencl"),
                                                                 False).items()
               if name in ("fuse.strategy", "gpu.rows", "gpu.tile_k", "gpu.reduce",
                           "gpu.pad")}


@pytest.mark.parametrize("name", sorted(ROWS))
def test_the_pruned_gpu_choices_reach_every_program_of_the_full_product(name: str) -> None:
    programs = Programs(lower(canonical(_source_spec(name))), load_target("opencl"))
    _check_covers_the_full_product(programs, GPU_OFFERED)


def test_every_row_group_setting_of_the_opencl_space_matches_the_reference(
        tmp_path: Path) -> None:
    """The points of the opencl space that differ in gpu.rows (row groups of 64 and of
    32 work-items, a row per work-item) run in the loop interpreter, a group's
    work-items in lock-step between barriers, and agree with the reference."""
    target = load_target("opencl")
    spec = _source_spec("layernorm")
    space = _space(spec, target)
    rng = np.random.default_rng(0)
    args = [(3 * rng.standard_normal((5, 37))).astype(np.float32),
            rng.standard_normal(37).astype(np.float32),
            rng.standard_normal(37).astype(np.float32)]
    expected = {"Y": np.zeros((5, 37), np.float32)}
    reference.run(spec, dict(zip(("X", "gamma", "beta"), args)), expected)
    built = set()
    for value in next(g for g in space.genes if g.name == "gpu.rows").values:
        options = space.decode(space.encode(Options.of({}, {"fuse.strategy": "rows",
                                                            "gpu.rows": value})))
        assert options is not None and dict(options.passes)["gpu.rows"] == value
        fn = Compiler(Config(cache_dir=tmp_path), target,
                      options=options.pass_options()).ir(spec)
        built.add(fn)
        out = np.full((5, 37), 12345, np.float32)
        interp.run(fn, dict(zip(fn.params, [*args, out])))
        np.testing.assert_allclose(out, expected["Y"], rtol=1e-4, atol=1e-4,
                                   err_msg=options.text())
    assert len(built) == 2


I8 = "def mm(uint8(M,K) A, int8(K,N) B) -> (C) {\n  C(m,n) +=! int32(A(m,k)) * int32(B(k,n))\n}"


def test_unit_s_tuning_space_is_genes_of_a_tensorized_contraction_only() -> None:
    """UNIT §IV-B: the mapping (vpdpbusd or vpmaddwd here), the register tile and the
    threads, where pass tensorize takes the contraction; none of them for a float32
    matmul. Rows 6 builds what rows 0 builds on AVX-512 (six rows fit). With AMX, its
    tiles or the lane-dot instructions are one more choice."""
    target = inspection_target("cpu-avx512", frozenset())
    spec = specialize(analyze(parse(I8)).functions[0], {"A": (64, 40), "B": (40, 48)}, {})
    lane_dot = {"tensorize.chains": (4, 2), "tensorize.mapping": (0, 1),
                "tensorize.parallel": (True, False), "tensorize.rows": (0, 2, 3, 4)}
    genes = _pipeline_genes(_space(spec, target))
    assert {k: v for k, v in genes.items() if k.startswith("tensorize.")} == {
        **lane_dot, "tensorize.tiles": (True, False)}
    no_amx = replace(target, features=frozenset(f for f in target.features
                                                if not f.startswith("amx")))
    genes = _pipeline_genes(_space(spec, no_amx))
    assert {k: v for k, v in genes.items() if k.startswith("tensorize.")} == lane_dot
    tmm = _pipeline_genes(_space(_spec(WORKLOADS["tmm 128x32x256"]), target))
    assert not any(k.startswith("tensorize.") for k in tmm)
    offered = {k: v for k, v in offered_choices(target, False).items()
               if k.startswith("tensorize.")}
    _check_covers_the_full_product(Programs(lower(canonical(spec)), target), offered)
