"""Properties of the passes on random programs: the rewritten IR verifies, prints and
parses back, and computes what the input IR computes (the IR interpreter on random data).

* random tile sizes and random schedules on random contraction / elementwise blocks
  (any subset of indices reduced, any access order, sizes from 1 to 9);
* fuse (and the whole pipeline after it) on random chains of elementwise, row-reduction,
  broadcast and column-reduction statements.
"""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polytile.ir import nodes as N
from polytile.ir.verify import verify
from polytile.passes.fuse import fuse
from polytile.passes.pipeline import run_pipeline
from polytile.passes.schedule import Schedule, apply_schedule
from polytile.passes.tile import tile

from .helpers import (
    assert_same_meaning,
    block,
    check_round_trip,
    lowered,
    parent_sizes,
    target,
    with_block,
)

SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
INDEX_NAMES = "ijkl"


def check(before: N.Function, after: N.Function) -> None:
    verify(after)
    check_round_trip(after)
    assert_same_meaning(before, after, seeds=(0,), tolerance=1e-5, sum_of_products=True)


# ---------------------------------------------------------------- random contractions

@st.composite
def contractions(draw: st.DrawFn, max_size: int = 9) -> tuple[str, dict[str, tuple[int, ...]]]:
    """A one-statement TC function: O(out...) op= f(A(...), B(...), ...) with random index
    subsets and orders; every index appears in some input, so its range is inferred."""
    n = draw(st.integers(1, 4), label="indices")
    names = list(INDEX_NAMES[:n])
    sizes = {x: draw(st.integers(1, max_size), label=f"size {x}") for x in names}
    out = draw(st.permutations(names), label="output order")[:draw(st.integers(0, n))]
    inputs: list[list[str]] = []
    for _ in range(draw(st.integers(1, 3), label="inputs")):
        order = draw(st.permutations(names))
        inputs.append(order[:draw(st.integers(1, n))])
    missing = [x for x in names if not any(x in used for used in inputs)]
    inputs[0] = inputs[0] + missing
    reads = [f"{chr(65 + k)}({', '.join(used)})" for k, used in enumerate(inputs)]
    expr = reads[0]
    for r in reads[1:]:
        op = draw(st.sampled_from(["*", "+", "-", "fmax"]))
        expr = f"fmaxf({expr}, {r})" if op == "fmax" else f"({expr} {op} {r})"
    if draw(st.booleans(), label="unary"):
        expr = f"tanh({expr})"
    reduced = len(out) < n
    op = draw(st.sampled_from(["+=!", "max=!", "min=!"])) if reduced else "="
    params = ", ".join(f"float({', '.join(x.upper() for x in used)}) {chr(65 + k)}"
                       for k, used in enumerate(inputs))
    lhs = f"O({', '.join(out)})" if out else "O"
    source = f"def f({params}) -> (O) {{\n  {lhs} {op} {expr}\n}}\n"
    shapes = {chr(65 + k): tuple(sizes[x] for x in used) for k, used in enumerate(inputs)}
    return source, shapes


@SETTINGS
@given(program=contractions(), data=st.data())
def test_random_tiles_keep_the_meaning(program: tuple[str, dict], data: st.DataObject) -> None:
    source, shapes = program
    before = lowered(source, shapes)
    after = before
    for name in [b.name for b in before.body.stmts if isinstance(b, N.Block)]:
        kernel = block(after, name)
        sizes = {i.name: data.draw(st.integers(1, i.range + 2), label=f"{name} tile {i.name}")
                 for i in kernel.idxs}
        after = with_block(after, name, tile(kernel, sizes, parent_sizes(after.body)))
    check(before, after)


@SETTINGS
@given(program=contractions(), data=st.data())
def test_random_schedules_keep_the_meaning(program: tuple[str, dict],
                                           data: st.DataObject) -> None:
    """Any schedule the autotuner could pick: vector index (parallel or reduction) and
    width, register tile, cache tiles, in any combination."""
    source, shapes = program
    before = lowered(source, shapes)
    kernel = block(before, "s0")
    loops = [i.name for i in kernel.idxs]
    vector = data.draw(st.sampled_from([None, *loops]), label="vector")
    others = [x for x in loops if x != vector]
    unroll = tuple((x, data.draw(st.integers(1, 4), label=f"unroll {x}"))
                   for x in data.draw(st.permutations(others), label="unrolled")[
                       :data.draw(st.integers(0, min(2, len(others))))])
    tiles = tuple((x, data.draw(st.integers(1, 12), label=f"tile {x}"))
                  for x in loops if data.draw(st.booleans(), label=f"tile {x}?"))
    schedule = Schedule(vector, data.draw(st.sampled_from([1, 2, 4, 8, 16]), label="lanes")
                        if vector else 1, unroll, data.draw(st.integers(1, 2), label="vectors")
                        if vector else 1, tiles, data.draw(st.booleans(), label="parallel"))
    after = with_block(before, "s0", apply_schedule(kernel, schedule, before.body))
    check(before, after)


# ---------------------------------------------------------------- random row chains

@st.composite
def chains(draw: st.DrawFn, max_size: int = 7) -> tuple[str, dict[str, tuple[int, ...]]]:
    """X(N, M) through 1-5 statements over temporaries t1, t2, ...; the last and a
    random subset of the others are outputs."""
    rows = draw(st.integers(1, max_size), label="N")
    cols = draw(st.integers(1, max_size), label="M")
    matrices = ["X"]                # (i, j) tensors
    vectors: list[str] = []         # (i) tensors
    columns: list[str] = []         # (j) tensors
    lines = []
    for k in range(1, draw(st.integers(1, 5), label="statements") + 1):
        name = f"t{k}"
        a = draw(st.sampled_from(matrices))
        kinds = ["elementwise", "row", "column"] + (["broadcast"] if vectors or columns
                                                    else [])
        kind = draw(st.sampled_from(kinds), label=f"kind {k}")
        if kind == "elementwise":
            b = draw(st.sampled_from(matrices))
            f = draw(st.sampled_from(["{a} * {b}", "{a} + {b}", "{a} - {b}",
                                      "fmaxf({a}, {b})", "tanh({a}) + {b}"]))
            lines.append(f"{name}(i,j) = " + f.format(a=f"{a}(i,j)", b=f"{b}(i,j)"))
            matrices.append(name)
        elif kind == "row":
            op = draw(st.sampled_from(["+=!", "max=!", "min=!"]))
            lines.append(f"{name}(i) {op} {a}(i,j)")
            vectors.append(name)
        elif kind == "column":
            lines.append(f"{name}(j) +=! {a}(i,j)")
            columns.append(name)
        else:
            v = draw(st.sampled_from([f"{v}(i)" for v in vectors]
                                     + [f"{c}(j)" for c in columns]))
            op = draw(st.sampled_from(["-", "*", "+"]))
            lines.append(f"{name}(i,j) = {a}(i,j) {op} {v}")
            matrices.append(name)
    written = [f"t{k}" for k in range(1, len(lines) + 1)]
    outputs = [t for t in written[:-1] if draw(st.booleans(), label=f"{t} output")]
    outputs.append(written[-1])
    body = "\n".join("  " + line for line in lines)
    source = f"def chain(float(N,M) X) -> ({', '.join(outputs)}) {{\n{body}\n}}\n"
    return source, {"X": (rows, cols)}


@SETTINGS
@given(program=chains())
def test_fuse_keeps_the_meaning_of_random_chains(program: tuple[str, dict]) -> None:
    source, shapes = program
    before = lowered(source, shapes)
    fused = fuse(before, target("cpu-generic"), {})
    check(before, fused)


@SETTINGS
@given(program=chains(), target_name=st.sampled_from(["cpu-avx512", "cpu-generic"]))
def test_pipeline_keeps_the_meaning_of_random_chains(program: tuple[str, dict],
                                                     target_name: str) -> None:
    source, shapes = program
    before = lowered(source, shapes)
    check(before, run_pipeline(before, target(target_name), {}))


def test_chains_do_fuse() -> None:
    """The property above is only worth something if chains like these fuse."""
    source = ("def chain(float(N,M) X) -> (t3) {\n  t1(i) max=! X(i,j)\n"
              "  t2(i,j) = X(i,j) - t1(i)\n  t3(i,j) = tanh(t2(i,j)) + X(i,j)\n}\n")
    fused = fuse(lowered(source, {"X": (4, 5)}), target("cpu-generic"), {})
    assert [b.tags for b in fused.body.stmts if isinstance(b, N.Block)] == [
        frozenset({"fused"})]


# ------------------------------------------------- panels as wide as the register tile

@st.composite
def packed_contractions(draw: st.DrawFn) -> tuple[str, dict[str, tuple[int, ...]]]:
    """C(m, n) +=! A(..) * B(..) with B read across n (tmm's B(n, k), or B(k, n) with
    rows a page apart), sizes that pack copies and that do not divide the tiles."""
    transposed = draw(st.booleans(), label="B(n, k)")
    m = draw(st.integers(4, 40), label="M")
    n = draw(st.sampled_from([9, 16, 23, 40, 70, 1024]), label="N")
    k = draw(st.integers(2, 24), label="K")
    b = "B(n, kk)" if transposed else "B(kk, n)"
    source = (f"def f(float(M,K) A, float({'N,K' if transposed else 'K,N'}) B) -> (C) {{\n"
              f"  C(m, n) +=! A(m, kk) * {b}\n}}\n")
    return source, {"A": (m, k), "B": (n, k) if transposed else (k, n)}


@SETTINGS
@given(packed_contractions(), st.sampled_from(["cpu-avx2", "cpu-avx512"]))
def test_micro_kernels_read_whole_panels(program: tuple[str, dict[str, tuple[int, ...]]],
                                         name: str) -> None:
    # One decision sizes a contraction's panels and its register tile (autotile's
    # register_vectors, asked by pack): every micro-kernel that reads a panel runs its
    # vector index over exactly one panel's width.
    source, shapes = program
    fn = run_pipeline(lowered(source, shapes), target(name), {})
    panels = {r.into: r.shape.dims[-1].size for r in fn.body.refs
              if r.dir == "none" and "_panels" in r.into}

    def widths(b: N.Block, roots: dict[str, str]) -> list[tuple[int, int]]:
        """(vector range, panel width) of each micro-kernel under `b` that reads a
        panel; `roots` names each view's buffer in the function body."""
        here = {r.into: roots.get(r.from_, r.from_) for r in b.refs}
        found = []
        if b.schedule.micro and b.schedule.vector is not None:
            ranges = {i.name: i.range for i in b.idxs}
            found += [(ranges[b.schedule.vector.index], panels[root])
                      for root in here.values() if root in panels]
        for s in b.stmts:
            if isinstance(s, N.Block):
                found += widths(s, here)
        return found

    found = [w for s in fn.body.stmts if isinstance(s, N.Block)
             for w in widths(s, {r.into: r.into for r in fn.body.refs})]
    assert bool(found) == bool(panels)
    for vector_range, width in found:
        assert vector_range == width
