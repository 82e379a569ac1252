"""Options that reach the compiler from outside are checked against the target (issue
11, defects 3 and 4): `cache inject` and `cache import` refuse what cannot be applied,
and an entry that is in the database anyway is reported once and replaced by the
heuristics, never obeyed past the hardware (a 16-lane vector on an 8-lane target wrote
64 bytes past the output) and never an error on every call."""
from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import polytile as pt
from polytile import cli
from polytile.config import Config, load_config
from polytile.errors import ArgumentError, TuningEntryWarning
from polytile.sema.specialize import specialize
from polytile.targets.target import host_features, load_target, supports
from polytile.tune.database import TuningDatabase
from polytile.tune.options import Options

MM = """
def mm(float(M,K) A, float(K,N) B) -> (C) {
  C(m,n) +=! A(m,k) * B(k,n)
}
"""
SIZES = "M=48,K=40,N=56"
# cpu-avx2 has 8 float32 lanes; every x86-64 host these tests run on has it.
TARGET = "cpu-avx2"
pytestmark = pytest.mark.skipif(not supports(load_target(TARGET), host_features()),
                                reason="these tests compile for cpu-avx2: the host lacks AVX2")

BAD: dict[str, tuple[dict[str, Any], str]] = {
    "lanes wider than the target": ({"schedules": {"s0": {"vector": "i1", "lanes": 16}}},
                                     "lanes 16 is not possible on target cpu-avx2"),
    "lanes 1000": ({"schedules": {"s0": {"vector": "i1", "lanes": 1000}}}, "lanes 1000"),
    "lanes not a power of two": ({"schedules": {"s0": {"vector": "i1", "lanes": 6}}},
                                 "lanes 6"),
    "schedules not a mapping": ({"passes": {"autotile.schedules": 5}},
                                "autotile.schedules must map block names"),
    "unknown strategy": ({"passes": {"fuse.strategy": "bogus"}},
                         "fuse.strategy must be one of rows, max, none"),
    "unknown pass": ({"passes": {"nosuch.enabled": True}}, "names no pass of target"),
    "unknown parameter": ({"passes": {"pack.bogus": 1}}, "pack has no parameter 'bogus'"),
    "flag not a bool": ({"passes": {"ptrinc.enabled": "yes"}}, "must be true or false"),
    "unknown vector index": ({"schedules": {"s0": {"vector": "zz", "lanes": 8}}},
                             "vector index 'zz' is not an index"),
    "unknown unrolled index": ({"schedules": {"s0": {"unroll": [["q", 2]]}}},
                               "unrolled index 'q'"),
    "huge unroll": ({"schedules": {"s0": {"unroll": [["i0", 100000]]}}},
                    "unroll factor 100000"),
    "order not of tiled indices": ({"schedules": {"s0": {"tiles": [["i0", 8]],
                                                         "order": ["i0", "i0"]}}},
                                   "must name tiled indices once each"),
}


@pytest.fixture
def tc_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("POLYTILE_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "mm.tc"
    path.write_text(MM)
    return path


def inject(tc_file: Path, options: dict[str, Any]) -> int:
    return cli.main(["cache", "inject", str(tc_file), "--sizes", SIZES, "--target", TARGET,
                     "--options", json.dumps(options)])


@pytest.mark.parametrize("case", list(BAD))
def test_inject_refuses_options_the_target_cannot_apply(case: str, tc_file: Path,
                                                       capsys: pytest.CaptureFixture) -> None:
    options, message = BAD[case]
    assert inject(tc_file, options) == 1
    assert message in capsys.readouterr().err
    assert TuningDatabase.of(load_config()).entries() == []


def test_inject_takes_options_the_target_can_apply(tc_file: Path) -> None:
    assert inject(tc_file, {"schedules": {"s0": {"vector": "i1", "lanes": 8,
                                                 "unroll": [["i0", 4]]}},
                            "passes": {"fuse.strategy": "none"}}) == 0


def store_directly(config: Config, options: Options) -> None:
    """Write an entry as a hand-edited database would hold it: no inject-time check."""
    module = pt.define(MM, target=TARGET, config=config)
    assert module.compiler is not None
    spec = specialize(module.program.functions[0], {"A": (48, 40), "B": (40, 56)}, {})
    TuningDatabase.of(config).inject(module.compiler.tuning_key(spec), options, "mm")


def unchecked(data: dict[str, Any]) -> Options:
    """Options as from_json reads them (it checks the form, not the target)."""
    return Options.from_json(data)


@pytest.mark.parametrize("case", ["lanes wider than the target", "lanes 1000",
                                  "schedules not a mapping", "unknown strategy",
                                  "unknown vector index", "huge unroll"])
def test_a_stored_entry_that_cannot_be_applied_warns_once_and_uses_the_heuristics(
        case: str, tmp_path: Path) -> None:
    config = Config(cache_dir=tmp_path / "cache")
    store_directly(config, unchecked(BAD[case][0]))
    rng = np.random.default_rng(3)
    a = rng.standard_normal((48, 40), dtype=np.float32)
    b = rng.standard_normal((40, 56), dtype=np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):       # two modules: each compiles, the warning comes once
            c = pt.define(MM, target=TARGET, config=config).mm(a, b)
            np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)
    reports = [w for w in caught if issubclass(w.category, TuningEntryWarning)]
    assert len(reports) == 1, [str(w.message) for w in caught]
    text = str(reports[0].message)
    assert "mm" in text and "heuristics" in text and "polytile cache clear --tuning" in text


def test_options_given_by_the_caller_still_raise(tmp_path: Path) -> None:
    from polytile.compile import Compiler
    module = pt.define(MM, target=TARGET, config=Config(cache_dir=tmp_path))
    assert module.compiler is not None
    compiler = Compiler(module.compiler.config, module.compiler.target,
                        options=unchecked(BAD["lanes wider than the target"][0]).pass_options())
    spec = specialize(module.program.functions[0], {"A": (48, 40), "B": (40, 56)}, {})
    with pytest.raises(ArgumentError, match="lanes 16 is not possible"):
        compiler.build(spec)


@pytest.mark.parametrize("case", ["unknown strategy", "unknown pass", "unknown parameter",
                                  "flag not a bool"])
def test_the_pass_options_of_starting_points_are_checked_before_they_seed_the_tuner(
        case: str, tmp_path: Path) -> None:
    """The space would take the nearest gene value, or drop a choice that is not a gene
    of this program, and tune on: the caller's mistake is reported first."""
    config = Config(cache_dir=tmp_path / "cache")
    module = pt.define(MM, target=TARGET, config=config)
    rng = np.random.default_rng(3)
    a = rng.standard_normal((48, 40), dtype=np.float32)
    b = rng.standard_normal((40, 56), dtype=np.float32)
    with pytest.raises(ArgumentError, match=BAD[case][1]):
        pt.tune(module.mm, a, b, start=[unchecked(BAD[case][0])], budget=30, progress=False)
    assert TuningDatabase.of(config).measurements() == []


def test_import_refuses_an_export_with_an_entry_its_target_cannot_apply(
        tc_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert inject(tc_file, {"schedules": {"s0": {"vector": "i1", "lanes": 8}}}) == 0
    exported = tmp_path / "export.json"
    assert cli.main(["cache", "export", str(exported)]) == 0
    data = json.loads(exported.read_text())
    data["best"][0]["options"]["schedules"]["s0"]["lanes"] = 16
    exported.write_text(json.dumps(data))
    assert cli.main(["cache", "clear", "--tuning"]) == 0
    capsys.readouterr()
    assert cli.main(["cache", "import", str(exported)]) == 1
    err = capsys.readouterr().err
    assert "lanes 16 is not possible on target cpu-avx2" in err and "nothing was imported" in err
    assert TuningDatabase.of(load_config()).entries() == []


def _break_ir_with_options(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass that mishandles options (as pass sink split a folded contraction for one
    tuner candidate): with any option given, the product's micro-kernel is marked to
    store its first sums where no init block's fold proves that."""
    from dataclasses import replace

    from polytile import compile as compile_module
    from polytile.analysis.fold import with_leaf
    from polytile.ir import nodes as N

    real = compile_module.Compiler.optimize

    def optimize(self: Any, fn: N.Function, options: dict[str, Any] | None = None) -> N.Function:
        out = real(self, fn, options)
        if not (self.options if options is None else options):
            return out
        stmts = tuple(with_leaf(s, lambda leaf: replace(leaf, schedule=replace(
            leaf.schedule, first=("i0",)))) if isinstance(s, N.Block) and s.name == "s0"
            else s for s in out.body.stmts)
        return replace(out, body=replace(out.body, stmts=stmts))

    monkeypatch.setattr(compile_module.Compiler, "optimize", optimize)


def test_options_from_outside_compile_only_to_ir_the_verifier_accepts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller's options (a tuner's candidate) raise an IRError; a stored entry is
    reported and the heuristics, which the verifier is not asked about, compute C."""
    from polytile.compile import Compiler
    from polytile.errors import IRError
    _break_ir_with_options(monkeypatch)
    config = Config(cache_dir=tmp_path / "cache")
    module = pt.define(MM, target=TARGET, config=config)
    assert module.compiler is not None
    spec = specialize(module.program.functions[0], {"A": (48, 40), "B": (40, 56)}, {})
    options = {"passes": {"fuse.strategy": "none"}}
    given = Compiler(module.compiler.config, module.compiler.target,
                     options=unchecked(options).pass_options())
    with pytest.raises(IRError, match=r"block main/s0: .*first\("):
        given.build(spec)
    store_directly(config, unchecked(options))
    rng = np.random.default_rng(5)
    a = rng.standard_normal((48, 40), dtype=np.float32)
    b = rng.standard_normal((40, 56), dtype=np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        c = pt.define(MM, target=TARGET, config=config).mm(a, b)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)
    reports = [str(w.message) for w in caught if issubclass(w.category, TuningEntryWarning)]
    assert len(reports) == 1 and "first(" in reports[0], reports
