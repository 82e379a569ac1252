"""The backend seam: a target names its backend, the backend prints the stages below the IR,
builds and loads; the cache entry keeps every stage's text."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from polytile import backends as B
from polytile.backends.c_x86 import CX86Backend
from polytile.compile import Compiler
from polytile.config import Config
from polytile.errors import ArgumentError
from polytile.ir.printer import format_function
from polytile.lang.parser import parse
from polytile.sema.analyze import analyze
from polytile.sema.specialize import specialize
from polytile.targets.target import inspection_target, select_target, shipped_targets

MM = """def mm(float(M,K) A, float(K,N) B) -> (C) {
  C(m,n) +=! A(m,k) * B(k,n)
}
"""


def mm_spec():  # type: ignore[no-untyped-def]
    fn = analyze(parse(MM, "mm.tc")).functions[0]
    return specialize(fn, {"A": (5, 7), "B": (7, 3)}, {})


def test_every_shipped_target_names_a_registered_backend() -> None:
    for target in shipped_targets():
        backend = B.backend_for(target)
        source = {"c-x86": "c", "c-arm64": "c", "opencl": "opencl",
                  "cuda": "cuda"}[target.backend]
        assert backend.name == target.backend and backend.stages[-1] == source


def test_a_target_naming_an_unknown_backend_is_refused() -> None:
    target = dataclasses.replace(select_target(None), backend="fpga-verilog")
    with pytest.raises(ArgumentError, match="names backend 'fpga-verilog'") as info:
        B.backend_for(target)
    assert "c-x86" in (info.value.hint or "")


def test_a_second_backend_under_a_taken_name_is_refused() -> None:
    with pytest.raises(ValueError, match="registered already"):
        B.register(CX86Backend())


def test_the_cache_entry_keeps_the_optimized_ir_and_the_source(tmp_path: Path) -> None:
    compiler = Compiler(Config(cache_dir=tmp_path / "cache"), select_target(None))
    built = compiler.build(mm_spec())
    entry = built.library.so_path.parent
    assert (entry / "stage-ir.txt").read_text() == format_function(built.fn)
    generated = compiler.backend.generate(built.fn, compiler.target)
    assert built.library.source_path.read_text() == generated.source


@pytest.mark.parametrize("name", ["cpu-avx512", "cpu-avx2", "cpu-generic"])
def test_c_for_any_target_is_printed_on_any_host(name: str, tmp_path: Path) -> None:
    target = inspection_target(name, frozenset())
    fn = Compiler(Config(cache_dir=tmp_path), target).ir(mm_spec())
    source = B.backend_for(target).generate(fn, target).text("c")
    assert "int32_t polytile_kernel(void **args, int64_t *err)" in source


class CommentedC(CX86Backend):
    """A new backend made of new code only: the C backend's source under a banner."""

    name = "test-commented-c"

    def generate(self, fn, target):  # type: ignore[no-untyped-def]
        below = super().generate(fn, target)
        return dataclasses.replace(below, stages=(("c", "/* banner */\n" + below.source),))


def test_a_new_backend_needs_only_its_module_and_a_target(tmp_path: Path) -> None:
    if "test-commented-c" not in {b.name for b in B.backends()}:
        B.register(CommentedC())
    target = dataclasses.replace(select_target(None), backend="test-commented-c")
    compiler = Compiler(Config(cache_dir=tmp_path / "cache"), target)
    spec = mm_spec()
    compiled = compiler.compile(spec)
    assert compiled.source_path.read_text().startswith("/* banner */\n")
    rng = np.random.default_rng(0)
    a = rng.standard_normal((5, 7), dtype=np.float32)
    b = rng.standard_normal((7, 3), dtype=np.float32)
    c = np.zeros((5, 3), np.float32)
    compiled.run({"A": a, "B": b}, {}, {"C": c})
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


def test_a_backend_module_is_found_without_being_listed(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A new file in the backends package is all it takes: it is imported on lookup."""
    (tmp_path / "c_discovered.py").write_text(
        "from polytile.backends import register\n"
        "from polytile.backends.c_x86 import CX86Backend\n"
        "class Discovered(CX86Backend):\n"
        "    name = 'test-discovered'\n"
        "register(Discovered())\n")
    monkeypatch.setattr(B, "__path__", [*B.__path__, str(tmp_path)])
    target = dataclasses.replace(select_target(None), backend="test-discovered")
    assert B.backend_for(target).name == "test-discovered"
