"""Property: tiling a 2-D block, with any tile sizes (dividing the sizes or not), verifies and
computes what the untiled block computes. Exercises nested blocks, passed indices,
tail constraints, views narrowed to a tile and aggregation across tiles."""
from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from polytile import dtypes
from polytile.ir import interp
from polytile.ir.nodes import (
    Affine,
    Block,
    Constant,
    Dim,
    Function,
    Index,
    Intrinsic,
    Load,
    LoadIndex,
    Refinement,
    Store,
    TensorShape,
)
from polytile.ir.parser import parse_function
from polytile.ir.printer import format_function
from polytile.ir.verify import verify

F32 = dtypes.FLOAT32


def _shape(sizes: tuple[int, ...]) -> TensorShape:
    strides = [math.prod(sizes[d + 1:]) for d in range(len(sizes))]
    return TensorShape(F32, tuple(Dim(s, t) for s, t in zip(sizes, strides)))


def _view(direction: str, name: str, access: tuple[str, ...], full: tuple[int, ...],
          agg: str = "assign") -> Refinement:
    """A one-element view of buffer `name` at the given index names."""
    dims = tuple(Dim(1, d.stride) for d in _shape(full).dims)
    return Refinement(direction, name, name, tuple(Affine.index(a) for a in access),
                      TensorShape(F32, dims), agg)


def program(m: int, n: int, reduce: bool, kernel: Block | None = None) -> Function:
    """Y[i, j] = X[i, j] * X[i, j] + j, or Y[i] += X[i, j] * X[i, j] + j after an init block."""
    y_sizes, y_access = ((m,), ("i",)) if reduce else ((m, n), ("i", "j"))
    body = (Load("$x", "X"), Intrinsic("mul", ("$x", "$x"), "$xx", F32),
            LoadIndex("$j", Affine.index("j")), Intrinsic("ident", ("$j",), "$fj", F32),
            Intrinsic("add", ("$xx", "$fj"), "$y", F32), Store("Y", "$y"))
    kernel = kernel or Block(
        "kernel", (Index("i", m), Index("j", n)), (),
        (_view("in", "X", ("i", "j"), (m, n)),
         _view("out", "Y", y_access, y_sizes, "add" if reduce else "assign")), body)
    stmts: tuple[Block, ...] = (kernel,)
    if reduce:
        stmts = (Block("init", (Index("i", m),), (), (_view("out", "Y", ("i",), (m,)),),
                       (Constant("$z", 0.0, F32), Store("Y", "$z"))), kernel)
    top = tuple(Refinement(d, "", name, (Affine.constant(0),) * len(sizes), _shape(sizes))
                for d, name, sizes in (("in", "X", (m, n)), ("out", "Y", y_sizes)))
    return Function("f", ("X", "Y"), Block("main", (), (), top, stmts))


def tile(kernel: Block, tiles: dict[str, int]) -> Block:
    """Split every index x of `kernel` into a tile index x1 (outer block) and x0 (inner).

    A view dimension indexed by x narrows to the tile in the outer block when the tile
    divides the range; otherwise the outer view keeps the whole dimension and the inner
    block adds the constraint x + x0 <= range - 1 (x = tile * x1 is passed in)."""
    ranges = {i.name: i.range for i in kernel.idxs}
    divides = {x: ranges[x] % t == 0 for x, t in tiles.items()}
    outer_idxs = tuple(Index(f"{x}1", -(-ranges[x] // t)) for x, t in tiles.items())
    inner_idxs = tuple(Index(f"{x}0", t) for x, t in tiles.items()) + tuple(
        Index(x, 1, Affine.of({f"{x}1": t})) for x, t in tiles.items())
    constraints = tuple(Affine.of({x: -1, f"{x}0": -1}, ranges[x] - 1)
                        for x in tiles if not divides[x])
    outer_refs, inner_refs = [], []
    for ref in kernel.refs:
        (names,) = {tuple(a.names[0] for a in ref.access)}
        outer_dims, outer_access, inner_access = [], [], []
        for x, dim in zip(names, ref.shape.dims):
            full = ranges[x]
            if divides[x]:
                outer_dims.append(Dim(tiles[x], dim.stride))
                outer_access.append(Affine.of({f"{x}1": tiles[x]}))
                inner_access.append(Affine.index(f"{x}0"))
            else:
                outer_dims.append(Dim(full, dim.stride))
                outer_access.append(Affine.constant(0))
                inner_access.append(Affine.of({x: 1, f"{x}0": 1}))
        outer_refs.append(Refinement(ref.dir, ref.from_, ref.into, tuple(outer_access),
                                     TensorShape(F32, tuple(outer_dims)), ref.agg))
        inner_refs.append(Refinement(ref.dir, ref.into, ref.into, tuple(inner_access),
                                     ref.shape, ref.agg))
    # index(j) in the kernel means the original j, now j + j0.
    original = {x: Affine.of({x: 1, f"{x}0": 1}) for x in tiles}
    stmts = tuple(LoadIndex(s.into, s.value.substitute(original)) if isinstance(s, LoadIndex)
                  else s for s in kernel.stmts)
    inner = Block("inner", inner_idxs, constraints, tuple(inner_refs), stmts)
    return Block("tile", outer_idxs, (), tuple(outer_refs), (inner,), frozenset({"tile"}))


@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 9), n=st.integers(1, 9), reduce=st.booleans(), data=st.data())
def test_tiling_keeps_the_meaning(m: int, n: int, reduce: bool, data: st.DataObject) -> None:
    ti = data.draw(st.integers(1, m + 2), label="tile i")
    tj = data.draw(st.integers(1, n + 2), label="tile j")
    untiled = program(m, n, reduce)
    tiled = program(m, n, reduce, tile(untiled.body.stmts[-1], {"i": ti, "j": tj}))
    verify(tiled)
    assert parse_function(format_function(tiled)) == tiled

    x = np.random.default_rng(m * 100 + n).uniform(0.5, 2.0, (m, n)).astype(np.float32)
    outputs = []
    for fn in (untiled, tiled):
        y = np.full((m,) if reduce else (m, n), -7.0, np.float32)
        interp.run(fn, {"X": x, "Y": y})
        outputs.append(y)
    expected = x * x + np.arange(n, dtype=np.float32)
    np.testing.assert_allclose(outputs[0], expected.sum(axis=1) if reduce else expected,
                               rtol=1e-5)
    np.testing.assert_allclose(outputs[1], outputs[0], rtol=1e-5)
