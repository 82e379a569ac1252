from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from polytile.errors import BuildError
from polytile.runtime.build import build_shared_object
from polytile.runtime.toolchain import Toolchain, compiler_invocations

from .helpers import ADD_SOURCE

BAD_SOURCE = """\
#include <stdint.h>
int64_t add(int64_t a, int64_t b) {
  return a + undeclared_name;
}
"""


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    (tmp_path / "out").mkdir()
    return tmp_path / "out"


def test_builds_a_callable_shared_object(toolchain: Toolchain, out_dir: Path) -> None:
    before = compiler_invocations()
    result = build_shared_object(ADD_SOURCE, ("-O2",), toolchain, out_dir / "add.so")
    assert compiler_invocations() == before + 1
    assert result.so_path == out_dir / "add.so"
    assert result.source_path.read_text() == ADD_SOURCE
    assert sorted(p.name for p in out_dir.iterdir()) == ["add.c", "add.so"]  # no temp left
    fn = ctypes.CDLL(str(result.so_path)).add
    fn.restype = ctypes.c_int64
    fn.argtypes = [ctypes.c_int64, ctypes.c_int64]
    assert fn(40, 2) == 42


def test_bad_c_raises_build_error_with_source(toolchain: Toolchain, out_dir: Path) -> None:
    with pytest.raises(BuildError) as info:
        build_shared_object(BAD_SOURCE, (), toolchain, out_dir / "bad.so")
    error = info.value
    assert error.source_code == BAD_SOURCE
    assert "undeclared_name" in error.message and "undeclared_name" in error.compiler_output
    assert "source_code" in (error.hint or "")
    assert "build error: C compiler failed" in str(error)
    assert not (out_dir / "bad.so").exists()
    assert [p.name for p in out_dir.iterdir()] == ["bad.c"]


def test_message_quotes_only_the_first_errors(toolchain: Toolchain, tmp_path: Path) -> None:
    source = "".join(f"int f{i}(void) {{ return missing{i}; }}\n" for i in range(12))
    with pytest.raises(BuildError) as info:
        build_shared_object(source, (), toolchain, tmp_path / "many.so")
    assert "missing0" in info.value.message and "missing11" not in info.value.message
    assert "more" in info.value.message
    assert "missing11" in info.value.compiler_output


def test_compiler_that_cannot_run(tmp_path: Path) -> None:
    broken = Toolchain(str(tmp_path / "gone"), str(tmp_path / "gone"), "x", False, False)
    with pytest.raises(BuildError, match="cannot run C compiler") as info:
        build_shared_object(ADD_SOURCE, (), broken, tmp_path / "add.so")
    assert info.value.source_code == ADD_SOURCE
