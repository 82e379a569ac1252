"""overwritten_first: a buffer needs no fill only when the first touch of every element is a
write with `assign`, and every element of an output is written."""
from __future__ import annotations

from polytile.analysis.overwrite import overwritten_first
from polytile.ir.parser import parse_function
from polytile.ir.verify import verify

# Y = T, the last statement of both programs below.
COPY = """\
    block copy [i:6] (
      in T <- T[i] float32(1:1)
      out Y <- Y[i] float32(1:1)
    ) {
      $t = load(T)
      Y = store($t)
    }
"""

# T(i) = 0 for every i, then T(i) += X(i, k), then Y = T; {init} is the first toucher.
TEMPLATE = """\
function sums(X, Y) {{
  block main (
    in X[0, 0] float32(6:4, 4:1)
    out Y[0] float32(6:1)
    none T[0] float32(6:1)
  ) {{
{init}
    block acc [i:6, k:4] (
      in X <- X[i, k] float32(1:4, 1:1)
      out T <- T[i] float32(1:1):add
    ) {{
      $x = load(X)
      T = store($x)
    }}
{copy}  }}
}}
"""

FULL_INIT = """\
    block init [i:6] (
      out T <- T[i] float32(1:1)
    ) {
      $z = const(0.0, float32)
      T = store($z)
    }"""


def analyse(init: str) -> frozenset[str]:
    fn = parse_function(TEMPLATE.format(init=init, copy=COPY))
    verify(fn)
    return overwritten_first(fn.body)


def test_full_assign_write_needs_no_fill() -> None:
    assert analyse(FULL_INIT) == {"T"}


def test_tiled_full_write_with_a_constraint_needs_no_fill() -> None:
    # Tiles of 4 over 6 elements: the constraint cuts the last tile, and the tiles
    # still cover every element.
    init = """\
    block init [t:2] (
      out T <- T[0] float32(6:1)
    ) {
      block inner [j:4, o = 4*t] (
        -o - j + 5 >= 0
        out T <- T[o + j] float32(1:1)
      ) {
        $z = const(0.0, float32)
        T = store($z)
      }
    }"""
    assert analyse(init) == {"T"}


def test_tiles_that_miss_the_last_elements_need_the_fill() -> None:
    init = """\
    block init [t:1] (
      out T <- T[0] float32(6:1)
    ) {
      block inner [j:4, o = 4*t] (
        out T <- T[o + j] float32(1:1)
      ) {
        $z = const(0.0, float32)
        T = store($z)
      }
    }"""
    assert analyse(init) == frozenset()


def test_partial_write_needs_the_fill() -> None:
    assert analyse(FULL_INIT.replace("[i:6]", "[i:5]")) == frozenset()


def test_constraint_that_skips_an_element_needs_the_fill() -> None:
    init = FULL_INIT.replace("[i:6] (\n", "[i:6] (\n      -i + 4 >= 0\n")
    assert analyse(init) == frozenset()


def test_add_as_first_writer_needs_the_fill() -> None:
    # Without an init block, `acc` is the first toucher: `:add` combines with the fill.
    assert analyse("") == frozenset()


def test_read_in_the_first_toucher_needs_the_fill() -> None:
    init = """\
    block init [i:6] (
      in X <- X[i, 0] float32(1:4, 1:1)
      out T <- T[i] float32(1:1)
    ) {
      block peek [j:1] (
        in T <- T[0] float32(1:1)
      ) {
        $t = load(T)
      }
      $x = load(X)
      T = store($x)
    }"""
    assert analyse(init) == frozenset()


def test_a_read_after_the_write_in_the_same_iteration_needs_no_fill() -> None:
    # Each iteration stores T[i] and then reads it back: the first touch is the store.
    init = """\
    block init [i:6] (
      in X <- X[i, 0] float32(1:4, 1:1)
      out T <- T[i] float32(1:1)
    ) {
      $x = load(X)
      T = store($x)
      block peek [j:1] (
        in T <- T[0] float32(1:1)
      ) {
        $t = load(T)
      }
    }"""
    assert analyse(init) == {"T"}


def test_write_after_a_read_needs_the_fill() -> None:
    read_first = """\
    block early [i:6] (
      in T <- T[i] float32(1:1)
      out Y <- Y[i] float32(1:1)
    ) {
      $t = load(T)
      Y = store($t)
    }
"""
    assert analyse(read_first + FULL_INIT) == frozenset()


def test_a_block_that_does_not_touch_the_local_is_skipped() -> None:
    other = """\
    block other [i:6] (
      out Y <- Y[i] float32(1:1)
    ) {
      $z = const(1.0, float32)
      Y = store($z)
    }
"""
    assert analyse(other + FULL_INIT) == {"T"}


def test_zero_special_in_a_block_counts_as_a_full_write() -> None:
    init = """\
    block init [i:1] (
      out T <- T[0] float32(6:1)
    ) {
      special zero() -> (T)
    }"""
    assert analyse(init) == {"T"}


# The shape of a fused contraction: per row, an init block writes T[i], then an
# accumulation adds into it; then Y is copied out.
FUSED = """\
function rows(X, Y) {{
  block main (
    in X[0, 0] float32(6:4, 4:1)
    out Y[0] float32(6:1)
    none T[0] float32(6:1)
  ) {{
    block fused [r:6] (
      in X <- X[r, 0] float32(1:4, 4:1)
      out T <- T[r] float32(1:1)
    ) {{
      block init [j:1, q = r] (
{cond}
        out T <- T[0] float32(1:1)
      ) {{
        $z = const(0.0, float32)
        T = store($z)
      }}
      block acc [k:4] (
        in X <- X[0, k] float32(1:4, 1:1)
        out T <- T[0] float32(1:1):add
      ) {{
        $x = load(X)
        T = store($x)
      }}
    }}
{copy}  }}
}}
"""


def fused(dirs: tuple[str, ...], cond: str = "") -> frozenset[str]:
    fn = parse_function(FUSED.format(cond=cond, copy=COPY))
    verify(fn)
    return overwritten_first(fn.body, dirs)


def test_a_fused_init_then_accumulate_needs_no_fill() -> None:
    assert fused(("none",)) == {"T"}


def test_an_init_that_skips_a_row_needs_the_fill() -> None:
    # The last row is accumulated into without a write first.
    assert fused(("none",), cond="        -q + 4 >= 0") == frozenset()


def test_outputs_are_found_with_their_direction() -> None:
    assert fused(("out",)) == {"Y"}
    assert fused(("none", "out")) == {"T", "Y"}


# A packed panel's tail: T has 8 elements, the pack writes the 6 of the operand and the
# reader reads those 6 only; elements 6 and 7 are never touched.
PANEL = """\
function panel(X, Y) {
  block main (
    in X[0] float32(6:1)
    out Y[0] float32(6:1)
    none T[0] float32(8:1)
  ) {
    block pack [i:6] (
      in X <- X[i] float32(1:1)
      out T <- T[i] float32(1:1)
    ) {
      $x = load(X)
      T = store($x)
    }
    block use [i:6] (
      in T <- T[i] float32(1:1)
      out Y <- Y[i] float32(1:1)
    ) {
      $t = load(T)
      Y = store($t)
    }
  }
}
"""


def test_a_local_whose_tail_nothing_touches_needs_no_fill() -> None:
    fn = parse_function(PANEL)
    verify(fn)
    assert overwritten_first(fn.body) == {"T"}


def test_a_local_read_beyond_what_was_written_needs_the_fill() -> None:
    fn = parse_function(PANEL.replace("in T <- T[i]", "in T <- T[i + 2]"))
    verify(fn)
    assert overwritten_first(fn.body) == frozenset()


# A per-row local of a fused row loop (allocated in each iteration of r): the pack writes
# the 6 elements of row r's operand into an 8-element panel, then the product reads them.
ROW_PANEL = """\
function rows(X, Y) {{
  block main (
    in X[0, 0] float32(4:6, 6:1)
    out Y[0, 0] float32(4:6, 6:1)
  ) {{
    block fused [r:4] (
      in X <- X[r, 0] float32(1:6, 6:1)
      out Y <- Y[r, 0] float32(1:6, 6:1)
      none P[0] float32(8:1)
    ) {{
      block pack [i:6, q = r] (
        in X <- X[0, i] float32(1:6, 1:1)
        out P <- P[i] float32(1:1)
      ) {{
        $x = load(X)
        P = store($x)
      }}
      block use [i:6, q = r] (
        in P <- P[{read}] float32(1:1)
        out Y <- Y[0, i] float32(1:6, 1:1)
      ) {{
        $p = load(P)
        Y = store($p)
      }}
    }}
  }}
}}
"""


def _row_local(read: str) -> frozenset[str]:
    fn = parse_function(ROW_PANEL.format(read=read))
    verify(fn)
    (fused,) = fn.body.stmts
    return overwritten_first(fused, nested=True)


def test_a_row_loops_private_local_written_first_in_each_row_needs_no_fill() -> None:
    assert _row_local("i") == {"P"}


def test_a_row_loops_private_local_read_past_the_write_needs_the_fill() -> None:
    assert _row_local("i + 1") == frozenset()
