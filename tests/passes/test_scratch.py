"""Pass scratch (FusionStitching Alg. 4 on a chain of statements): locals of equal shape
whose lifetimes do not overlap share one buffer, when the later one writes what it reads
first. Golden IR, the cases that must not share, the IR interpreter before and after, and
compiled programs against the reference interpreter (hypothesis chains of row ops)."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import polytile as pt
from polytile.ir import nodes as N
from polytile.ir.parser import parse_function
from polytile.ir.printer import format_function
from polytile.ir.verify import verify
from polytile.passes.fuse import fuse
from polytile.passes.scratch import scratch

from .helpers import assert_same_meaning, check_golden, check_round_trip, lowered, target

GENERIC = target("cpu-generic")

# Layer norm then GELU then a residual, all rows of one fused loop: Z, N and G are rows
# of equal shape, and N's row can take Z's once the statistics are taken.
CHAIN = """
def chain(float(N,D) X, float(D) gamma, float(N,D) R) -> (Y) {
  Z(n,d) = X(n,d) + R(n,d)
  mean(n) +=! Z(n,d)
  var(n) +=! (Z(n,d) - mean(n) / D) * (Z(n,d) - mean(n) / D)
  A(n,d) = (Z(n,d) - mean(n) / D) * rsqrt(var(n) / D + 1e-5) * gamma(d)
  G(n,d) = 0.5 * A(n,d) * (1 + erf(A(n,d) * 0.7071067811865476))
  Y(n,d) = G(n,d) + X(n,d)
}
"""
SHAPES = {"X": (7, 13), "gamma": (13,), "R": (7, 13)}


def _locals(block: N.Block) -> list[str]:
    return [r.into for r in block.refs if r.dir == "none" and not r.from_]


def _fused(fn: N.Function) -> N.Block:
    [block] = [s for s in fn.body.stmts if isinstance(s, N.Block) and "fused" in s.tags]
    return block


def test_row_locals_of_a_fused_chain_share_buffers() -> None:
    before = fuse(lowered(CHAIN, SHAPES), GENERIC, {"strategy": "rows"})
    after = scratch(before, GENERIC, {})
    verify(after)
    check_round_trip(after)
    check_golden("scratch_chain.after", format_function(after))
    assert len(_locals(_fused(after))) < len(_locals(_fused(before)))
    assert_same_meaning(before, after)


def test_disabled_the_pass_changes_nothing() -> None:
    before = fuse(lowered(CHAIN, SHAPES), GENERIC, {"strategy": "rows"})
    assert scratch(before, GENERIC, {"enabled": False}) == before


# Two locals of the main block: T, then U. {second} is U's first writer.
TWO = """\
function two(X, Y) {{
  block main (
    in X[0] float32(6:1)
    out Y[0] float32(6:1)
    none T[0] float32(6:1)
    none U[0] float32({u_size}:1)
  ) {{
    block a [i:6] (
      in X <- X[i] float32(1:1)
      out T <- T[i] float32(1:1)
    ) {{
      $x = load(X)
      T = store($x)
    }}
    block b [i:6] (
      in T <- T[i] float32(1:1)
      {u_ref}
    ) {{
      $t = load(T)
      U = store($t)
    }}
    block c [i:6] (
      in U <- U[i] float32(1:1)
      out Y <- Y[i] float32(1:1)
    ) {{
      $u = load(U)
      Y = store($u)
    }}
  }}
}}
"""
LATER = """\
    block d [i:6] (
      in T <- T[i] float32(1:1)
      out Y <- Y[i] float32(1:1):add
    ) {
      $t = load(T)
      Y = store($t)
    }
"""


def _two(u_ref: str = "out U <- U[i] float32(1:1)", u_size: int = 6,
         tail: str = "") -> N.Function:
    text = TWO.format(u_ref=u_ref, u_size=u_size)
    if tail:
        text = text.replace("  }\n}\n", tail + "  }\n}\n")
    fn = parse_function(text)
    verify(fn)
    return fn


def test_a_local_born_after_the_last_use_of_another_takes_its_buffer() -> None:
    # T's last use is block b, where U is born: they overlap, so they stay apart...
    fn = _two()
    assert _locals(scratch(fn, GENERIC, {}).body) == ["T", "U"]
    # ...but a third local born after b takes T's buffer.
    text = format_function(fn).replace("none U[0] float32(6:1)",
                                       "none U[0] float32(6:1)\n    none V[0] float32(6:1)")
    text = text.replace("    block c [i:6] (\n      in U <- U[i] float32(1:1)\n",
                        "    block v [i:6] (\n      in U <- U[i] float32(1:1)\n"
                        "      out V <- V[i] float32(1:1)\n    ) {\n      $u = load(U)\n"
                        "      V = store($u)\n    }\n"
                        "    block c [i:6] (\n      in V <- V[i] float32(1:1)\n")
    text = text.replace("      $u = load(U)\n      Y = store($u)", "      $v = load(V)\n"
                        "      Y = store($v)")
    three = parse_function(text)
    verify(three)
    after = scratch(three, GENERIC, {})
    verify(after)
    assert _locals(after.body) == ["T", "U"]
    assert [r.from_ for r in after.body.stmts[2].refs] == ["U", "T"]
    assert_same_meaning(three, after)


def test_locals_whose_lifetimes_overlap_stay_apart() -> None:
    assert _locals(scratch(_two(tail=LATER), GENERIC, {}).body) == ["T", "U"]


def test_a_local_that_is_read_before_it_is_written_keeps_its_own_buffer() -> None:
    # U is first accumulated into: it would read what the earlier occupant left.
    text = format_function(_two()).replace(
        "none U[0] float32(6:1)", "none U[0] float32(6:1)\n    none W[0] float32(6:1)")
    text = text.replace("      $u = load(U)\n      Y = store($u)\n    }\n",
                        "      $u = load(U)\n      Y = store($u)\n    }\n"
                        "    block w [i:6] (\n      in X <- X[i] float32(1:1)\n"
                        "      out W <- W[i] float32(1:1):add\n    ) {\n"
                        "      $x = load(X)\n      W = store($x)\n    }\n"
                        "    block z [i:6] (\n      in W <- W[i] float32(1:1)\n"
                        "      out Y <- Y[i] float32(1:1)\n    ) {\n"
                        "      $w = load(W)\n      Y = store($w)\n    }\n")
    fn = parse_function(text)
    verify(fn)
    assert "W" in _locals(scratch(fn, GENERIC, {}).body)


def test_locals_of_other_shapes_stay_apart() -> None:
    text = format_function(_two()).replace(
        "none U[0] float32(6:1)", "none U[0] float32(6:1)\n    none V[0] float32(7:1)")
    text = text.replace("    block c [i:6] (\n      in U <- U[i] float32(1:1)\n",
                        "    block v [i:6] (\n      in U <- U[i] float32(1:1)\n"
                        "      out V <- V[i] float32(1:1)\n    ) {\n      $u = load(U)\n"
                        "      V = store($u)\n    }\n"
                        "    block c [i:6] (\n      in V <- V[i] float32(1:1)\n")
    text = text.replace("      $u = load(U)\n      Y = store($u)", "      $v = load(V)\n"
                        "      Y = store($v)")
    fn = parse_function(text)
    verify(fn)
    assert _locals(scratch(fn, GENERIC, {}).body) == ["T", "U", "V"]


# Hypothesis: chains of row ops over (N, D) temporaries and row statistics, compiled
# with the target's pipeline (scratch included) against the reference interpreter.
UNARY = ["exp({a} * 0.25)", "fmaxf({a}, 0)", "{a} * {a}", "tanh({a})"]


@st.composite
def chains(draw: st.DrawFn) -> str:
    rows, stats, lines = ["X"], [], []
    for k in range(draw(st.integers(2, 7))):
        a = draw(st.sampled_from(rows))
        kind = draw(st.sampled_from(["unary", "binary", "stat", "scale"]))
        if kind == "stat":
            stats.append(f"r{k}")
            lines.append(f"  r{k}(n) +=! {a}(n,d)")
            continue
        if kind == "scale" and stats:
            expr = f"{a}(n,d) * {draw(st.sampled_from(stats))}(n)"
        elif kind == "binary":
            expr = f"{a}(n,d) - {draw(st.sampled_from(rows))}(n,d)"
        else:
            expr = draw(st.sampled_from(UNARY)).format(a=f"{a}(n,d)")
        rows.append(f"T{k}")
        lines.append(f"  T{k}(n,d) = {expr}")
    last = rows[-1] if len(rows) > 1 else "X"
    lines.append(f"  Y(n,d) = {last}(n,d) + 1")
    return "def chain(float(N,D) X) -> (Y) {\n" + "\n".join(lines) + "\n}\n"


@settings(max_examples=15, deadline=None)
@given(source=chains(), n=st.integers(1, 9), d=st.integers(1, 21))
def test_compiled_chains_agree_with_the_reference(source: str, n: int, d: int) -> None:
    x = np.random.default_rng(n * 31 + d).standard_normal((n, 2 * d)).astype(np.float32)
    x = x[:, ::2]                                   # a non-contiguous input
    compiled = pt.define(source).chain(x)
    want = pt.define(source, backend="interp").chain(x)
    np.testing.assert_allclose(compiled, want, rtol=1e-4, atol=1e-4, err_msg=source)
