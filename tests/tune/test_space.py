"""The tuning space: Options values, the default point, pruning and repair."""
from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from polytile.bench.workloads import full_set, quick_set
from polytile.compile import Compiler
from polytile.config import Config
from polytile.errors import ArgumentError
from polytile.ir.lower import lower
from polytile.ir.printer import format_function
from polytile.lang.parser import parse
from polytile.passes.schedule import Schedule
from polytile.sema.analyze import analyze
from polytile.sema.canonical import canonical
from polytile.sema.specialize import specialize
from polytile.targets.target import load_target, select_target
from polytile.tune.options import Options
from polytile.tune.space import build_space, tile_sizes

# Every quick workload, and the full-size contractions (whose inputs are cheap to make).
WORKLOADS = {w.name: w for w in quick_set() + [w for w in full_set()
                                               if w.key in ("tmm", "tbmm", "MLP3")]}


def _spec(workload):  # type: ignore[no-untyped-def]
    import numpy as np
    fn = next(f for f in analyze(parse(workload.tc)).functions if f.name == workload.function)
    args = workload.tc_arguments(workload.make_inputs(np.random.default_rng(0)))
    shapes = {p.name: a.shape for p, a in zip(fn.params, args) if p.kind == "input"}
    return specialize(fn, shapes, {p.name: a for p, a in zip(fn.params, args)
                                   if p.kind == "scalar"})


def test_options_round_trip_through_json() -> None:
    options = Options.of({"s0": Schedule("i2", 16, (("i0", 4), ("i1", 3)), 1,
                                         (("i0", 64), ("i1", 96)), True, ("i1", "i0")),
                          "s0_init": Schedule(None, 1, (), 1, (), False)},
                         {"fuse.strategy": "none", "pack.enabled": False})
    back = Options.from_json(options.dumps())
    assert back == options
    assert back.text() == options.text()
    assert options.pass_options()["autotile.schedules"]["s0"].unroll == (("i0", 4), ("i1", 3))


@pytest.mark.parametrize("bad, message", [
    ('{"schedules": {"s0": {"vector": 3}}}', "vector"),
    ('{"schedules": {"s0": {"unroll": [["i0", 0]]}}}', "positive"),
    ('{"schedules": {"s0": {"tile": []}}}', "unknown fields"),
    ('{"schedules": {"s0": {"order": "i0"}}}', "order must be a list"),
    ('{"passes": {"strategy": "rows"}}', "pass.param"),
    ('{"format": 7}', "format"),
    ("[1, 2]", "JSON object"),
    ("{", "not valid JSON"),
])
def test_malformed_options_are_argument_errors(bad: str, message: str) -> None:
    with pytest.raises(ArgumentError, match=message):
        Options.from_json(bad)


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_the_default_point_compiles_to_the_heuristics_ir(name: str) -> None:
    spec = _spec(WORKLOADS[name])
    target = select_target()
    space = build_space(lower(canonical(spec)), target)
    assert space.decode(space.default_point) == space.default
    assert space.encode(space.default) == space.default_point
    config = Config(cache_dir=Path("/nonexistent"))
    plain = Compiler(config, target).ir(spec)
    tuned = Compiler(config, target, options=space.default.pass_options()).ir(spec)
    assert format_function(tuned) == format_function(plain)


def test_tile_sizes_are_powers_of_two_and_ceil_divisors() -> None:
    sizes = tile_sizes(130)
    assert {1, 2, 64, 128, 130, 65, 44, 33} <= set(sizes)
    assert max(sizes) == 130


@pytest.mark.parametrize("target_name", ["cpu-avx2", "cpu-avx512"])
def test_decoded_points_are_valid_and_repaired(target_name: str) -> None:
    from dataclasses import replace
    target = replace(load_target(target_name), features=frozenset())
    spec = _spec(WORKLOADS["tmm 1024x1024x1024"])
    space = build_space(lower(canonical(spec)), target)
    rng = random.Random(0)
    decoded = [space.decode(space.random_point(rng)) for _ in range(300)]
    valid = [o for o in decoded if o is not None]
    assert 30 < len(valid) < 300          # some pruned, most kept
    full = target.vector_bytes // 4
    assert {s.lanes for o in valid for _, s in o.schedules if s.vector} == {full, full // 2}
    for options in valid:
        widths = {s.lanes for _, s in options.schedules if s.vector}
        assert len(widths) <= 1
        for name, s in options.schedules:
            accumulators = math.prod(f for _, f in s.unroll) * s.vectors
            assert accumulators <= target.vector_registers - 4
            unroll = dict(s.unroll)
            for index, size in s.tiles:
                assert 1 <= size < 1024
                step = s.lanes * s.vectors if index == s.vector else unroll.get(index, 1)
                assert size % step == 0, (name, s)


def test_genes_take_the_values_of_extra_options() -> None:
    spec = _spec(WORKLOADS["tmm 128x32x256"])
    seed = Options.of({"s0": Schedule("i1", 16, (("i0", 7),), 1, (("i0", 77),), True)})
    space = build_space(lower(canonical(spec)), select_target(), [seed])
    genes = {g.name: g.values for g in space.genes}
    assert 7 in genes["s0.unroll.i0"] and 77 in genes["s0.tile.i0"]
    point = space.encode(seed)
    assert space.value(point, "s0.unroll.i0") == 7


def _half_width_point(space):  # type: ignore[no-untyped-def]
    """The default point at half vector width."""
    names = [g.name for g in space.genes]
    point = list(space.default_point)
    point[names.index("lanes")] = space.genes[names.index("lanes")].values.index(2)
    return tuple(point)


@pytest.mark.parametrize("target_name", ["cpu-avx512", "cpu-avx2"])
@pytest.mark.parametrize("name", ["tmm 37x19x53", "tmm 128x32x256", "tbmm 5x6x7x9",
                                  "softmax 33x101"])
def test_half_width_points_compile_and_match_numpy(name: str, target_name: str,
                                                   tmp_path: Path) -> None:
    import numpy as np

    from polytile.api import define
    from polytile.targets.target import host_features, supports
    target = load_target(target_name)
    if not supports(target, host_features()):
        pytest.skip(f"this machine cannot run {target_name}")
    workload = WORKLOADS[name]
    spec = _spec(workload)
    space = build_space(lower(canonical(spec)), select_target(target_name))
    options = space.decode(_half_width_point(space))
    assert options is not None
    full = target.vector_bytes // 4
    assert {s.lanes for _, s in options.schedules if s.vector} == {full // 2}
    module = define(workload.tc, target=target_name, config=Config(cache_dir=tmp_path))
    assert module.compiler is not None
    module.compiler.options = options.pass_options()
    args = workload.make_inputs(np.random.default_rng(0))
    got = module[workload.function](*workload.tc_arguments(args))
    expected = workload.numpy(*args)
    np.testing.assert_allclose(got, expected, rtol=workload.rtol, atol=workload.atol)


def test_half_width_applies_to_panel_copies() -> None:
    # Panels are cut at the full width; at half width their copies run 8x8 transposes.
    spec = _spec(WORKLOADS["tmm 128x32x256"])
    space = build_space(lower(canonical(spec)), select_target())
    assert any(name.startswith("pack_") for name, _ in space.default.schedules)
    assert space.decode(_half_width_point(space)) is not None


def test_a_point_of_more_vectors_than_a_panel_cuts_wider_panels(tmp_path: Path) -> None:
    # A 1024-wide tmm output's rows lie a page apart: the default tile holds one vector
    # per panel, and pack cuts 8-wide panels; the tuner's point of two vectors (6 rows)
    # still decodes, and pack then cuts 16-wide panels for it.
    import numpy as np

    from polytile.api import define
    tmm = "def tmm(float(M,K) A, float(N,K) B) -> (C) {\n  C(m,n) +=! A(m,kk) * B(n,kk)\n}\n"
    spec = specialize(analyze(parse(tmm)).functions[0], {"A": (37, 24), "B": (1024, 24)}, {})
    avx2 = select_target("cpu-avx2")
    space = build_space(lower(canonical(spec)), avx2)
    names = [g.name for g in space.genes]
    point = list(space.default_point)
    for gene, value in (("s0.vectors", 2), ("s0.unroll.i1_o", 1), ("s0.unroll.i0", 6)):
        point[names.index(gene)] = space.genes[names.index(gene)].values.index(value)
    options = space.decode(point)
    assert options is not None and options.schedule("s0").vectors == 2
    compiler = Compiler(Config(cache_dir=tmp_path), avx2, options=options.pass_options())
    panels = [r for r in compiler.ir(spec).body.refs if r.dir == "none"]
    assert [p.shape.sizes[-1] for p in panels] == [16]
    module = define(tmm, target="cpu-avx2", config=Config(cache_dir=tmp_path))
    assert module.compiler is not None
    module.compiler.options = options.pass_options()
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in ((37, 24), (1024, 24)))
    np.testing.assert_allclose(module.tmm(a, b), a @ b.T, rtol=1e-5, atol=1e-4)


def test_options_of_another_size_encode_onto_this_space() -> None:
    target = select_target()
    # Both sizes take the same pipeline variant (no packing: the reduction is long), so
    # every gene of the larger size's options has a counterpart here.
    small = build_space(lower(canonical(_spec(WORKLOADS["tmm 128x1024x1024"]))), target)
    large = build_space(lower(canonical(_spec(WORKLOADS["tmm 1024x1024x1024"]))), target)
    assert small.encode(Options()) == small.default_point     # nothing said: the default
    seed = large.default
    point = small.encode(seed)
    options = small.decode(point)
    assert options is not None
    for name, s in seed.schedules:
        got = options.schedule(name)
        assert got is not None and got.vector == s.vector and got.unroll == s.unroll
        for index, size in s.tiles:        # the nearest tile size this space has
            genes = {g.name: g.values for g in small.genes}
            if f"{name}.tile.{index}" in genes:
                nearest = min(genes[f"{name}.tile.{index}"], key=lambda v: abs(v - size))
                assert small.value(point, f"{name}.tile.{index}") == nearest


def _genes(name: str) -> dict[str, tuple[object, ...]]:
    spec = _spec(WORKLOADS[name])
    return {g.name: g.values for g in build_space(lower(canonical(spec)), select_target()).genes}


def test_pipeline_genes_are_the_choices_that_change_the_program() -> None:
    # tmm: rows leaves the contraction (shared weights) unfused, like none; max fuses it.
    assert _genes("tmm 128x32x256")["fuse.strategy"] == ("rows", "max")
    # softmax: max fuses nothing that rows does not.
    assert _genes("softmax 33x101")["fuse.strategy"] == ("rows", "none")
    # Nothing to pack or to address through pointer tables.
    assert "pack.enabled" not in _genes("softmax 33x101")
    assert "ptrinc.enabled" not in _genes("tmm 128x32x256")


# The quick set, and two full-size workloads whose shared weights only "max" fuses.
@pytest.mark.parametrize("name", sorted(w.name for w in quick_set())
                         + ["tmm 128x32x256", "MLP3 128x128x64x32x2"])
def test_every_pipeline_variant_compiles_and_matches_numpy(name: str, tmp_path: Path) -> None:
    import numpy as np

    from polytile.api import define
    workload = WORKLOADS[name]
    spec = _spec(workload)
    target = select_target()
    space = build_space(lower(canonical(spec)), target)
    args = workload.make_inputs(np.random.default_rng(1))
    expected = workload.numpy(*args)
    module = define(workload.tc, config=Config(cache_dir=tmp_path))
    assert module.compiler is not None
    for variant in space.variants:
        options = space.decode(space.encode(Options.of({}, dict(variant.passes))))
        assert options is not None and options.passes == variant.passes
        module.compiler.options = options.pass_options()
        got = module[workload.function](*workload.tc_arguments(args))
        np.testing.assert_allclose(got, expected, rtol=workload.rtol, atol=workload.atol,
                                   err_msg=options.text())


def test_predefined_points_are_the_heuristics_under_other_choices() -> None:
    spec = _spec(WORKLOADS["tmm 128x32x256"])
    space = build_space(lower(canonical(spec)), select_target())
    points = space.predefined()
    assert space.default_point not in points
    decoded = [space.decode(p) for p in points]
    assert all(o is not None for o in decoded)
    passes = {o.passes for o in decoded if o is not None}
    assert {v.passes for v in space.variants[1:]} <= passes
    assert _half_width_point(space) in points


@pytest.mark.parametrize("name", ["tmm 37x19x53", "MLP3 8x17x9x5x2", "batchnorm 4x6x7x5"])
def test_points_with_a_loop_order_compile_and_match_numpy(name: str, tmp_path: Path) -> None:
    import numpy as np

    from polytile.api import define
    workload = WORKLOADS[name]
    space = build_space(lower(canonical(_spec(workload))), select_target())
    rng = random.Random(3)
    ordered = []
    while len(ordered) < 3:
        options = space.decode(space.random_point(rng))
        if options is not None and any(s.order for _, s in options.schedules):
            ordered.append(options)
    args = workload.make_inputs(np.random.default_rng(2))
    expected = workload.numpy(*args)
    module = define(workload.tc, config=Config(cache_dir=tmp_path))
    assert module.compiler is not None
    for options in ordered:
        module.compiler.options = options.pass_options()
        np.testing.assert_allclose(module[workload.function](*args), expected,
                                   rtol=workload.rtol, atol=workload.atol,
                                   err_msg=options.text())


def test_a_gathering_block_has_a_prefetch_gene() -> None:
    from polytile.bench.contractions import TWO_LUT
    from polytile.tune.space import PREFETCH_DISTANCES
    fn = next(f for f in analyze(parse(TWO_LUT)).functions)
    spec = specialize(fn, {"LUT1": (1_000_000, 64), "I1": (128, 50),
                           "LUT2": (1_000_000, 64), "I2": (128, 50)}, {})
    space = build_space(lower(canonical(spec)), load_target("cpu-avx512"))
    genes = {g.name: g.values for g in space.genes}
    assert genes["s0.prefetch"] == PREFETCH_DISTANCES
    assert dict(space.default.schedules)["s0"].prefetch == 8      # a 256 MB table
    rng = random.Random(1)
    seen = {dict(o.schedules)["s0"].prefetch for o in
            (space.decode(space.random_point(rng)) for _ in range(60)) if o is not None}
    assert seen == set(PREFETCH_DISTANCES)
