"""Block schedules (BlockSchedule) in the IR text, and the verifier's schedule rules."""
from __future__ import annotations

import pytest

from polytile.dtypes import FLOAT32, FLOAT64
from polytile.errors import IRError
from polytile.ir import nodes as N
from polytile.ir.parser import parse_function
from polytile.ir.printer import format_function
from polytile.ir.verify import verify
from polytile.targets.target import load_target

TEXT = """function f(A, B) {{
  block main (
    in A[0, 0] {dtype}(8:32, 32:1)
    out B[0, 0] {dtype}(8:32, 32:1)
  ) {{
    block k [i:8, j:32] #kernel {schedule} (
      out B <- B[i, j] {dtype}(1:32, 1:1)
      in A <- A[{access}] {dtype}(1:32, 1:1)
    ) {{
      $a = load(A)
      B = store($a)
    }}
  }}
}}
"""


def function(schedule: str, dtype: str = "float32", access: str = "i, j") -> N.Function:
    return parse_function(TEXT.format(schedule=schedule, dtype=dtype, access=access))


def kernel(fn: N.Function) -> N.Block:
    block = fn.body.stmts[0]
    assert isinstance(block, N.Block)
    return block


@pytest.mark.parametrize("text, schedule", [
    ("schedule(micro, vector(j, float32, 16), unroll(i))",
     N.BlockSchedule(micro=True, vector=N.VectorLoop("j", FLOAT32, 16), unroll=("i",))),
    ("schedule(micro, transpose(8))", N.BlockSchedule(micro=True, transpose=8)),
    ("schedule(parallel(j), simd)", N.BlockSchedule(parallel="j", simd=True)),
    ("schedule(grid(i), thread(j))", N.BlockSchedule(gpu=(("i", "grid"), ("j", "thread")))),
])
def test_schedules_print_and_parse_back(text: str, schedule: N.BlockSchedule) -> None:
    fn = function(text)
    assert kernel(fn).schedule == schedule
    assert f"#kernel {text} (" in format_function(fn)
    assert parse_function(format_function(fn)) == fn
    verify(fn)


def test_no_schedule_prints_nothing() -> None:
    fn = function("")
    assert kernel(fn).schedule == N.BlockSchedule()
    assert "schedule(" not in format_function(fn)


def test_an_unknown_item_is_an_ir_error_naming_the_items() -> None:
    with pytest.raises(IRError, match="unknown schedule item 'fast'"):
        function("schedule(fast)")


@pytest.mark.parametrize("text, access, message", [
    ("schedule(micro, vector(q, float32, 8))", "i, j", "maps q, which is not a loop"),
    ("schedule(unroll(i, i))", "i, j", "maps an index twice"),
    ("schedule(micro, vector(j, float32, 6))", "i, j", "lanes 6 is not a power of two"),
    ("schedule(micro, vector(i, float32, 8))", "i, j", "does not move every view"),
    ("schedule(micro, vector(j, float32, 8))", "i, 2*j", "does not move every view"),
])
def test_the_verifier_checks_schedules(text: str, access: str, message: str) -> None:
    with pytest.raises(IRError, match=message):
        verify(function(text, access=access))


def test_vectors_wider_than_the_targets_registers_are_refused() -> None:
    avx2 = load_target("cpu-avx2")
    verify(function("schedule(micro, vector(j, float32, 8))"), avx2)
    with pytest.raises(IRError, match="wider than the 32-byte vectors of target cpu-avx2"):
        verify(function("schedule(micro, vector(j, float32, 16))"), avx2)
    with pytest.raises(IRError, match="8 lanes of float64"):
        verify(function("schedule(micro, vector(j, float64, 8))", dtype="float64"), avx2)
    assert FLOAT64.bits == 64


SUMS = """function f(A, B) {
  block main (
    in A[0, 0] float32(8:32, 32:1)
    out B[0] float32(32:1)
  ) {
    block k [i:8, j:32] schedule(parallel(%s)) (
      out B <- B[j] float32(1:1):add
      in A <- A[i, j] float32(1:32, 1:1)
    ) {
      $a = load(A)
      B = store($a)
    }
  }
}
"""


def test_the_parallel_index_must_write_disjoint_elements() -> None:
    verify(parse_function(SUMS % "j"))           # j's iterations write different elements
    with pytest.raises(IRError, match="runs index i in threads, but its iterations may"):
        verify(parse_function(SUMS % "i"))       # every i adds into the same B[j]


def test_the_c_backend_refuses_gpu_mappings() -> None:
    from polytile.codegen.c import generate_c
    from polytile.errors import UnsupportedError
    with pytest.raises(UnsupportedError, match="runs on a GPU grid"):
        generate_c(function("schedule(grid(i), thread(j))"))


def test_gpu_mappings_lower_to_grid_and_thread_loops() -> None:
    from polytile.loops.lower import lower
    from polytile.loops.text import kernel_text
    text = kernel_text(lower(function("schedule(grid(i), thread(j))")))
    assert "grid for i0 in [0, " in text and "thread for i1 in [0, " in text
