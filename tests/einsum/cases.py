"""Random valid einsum specs for property tests, with a NumPy reference computed from
the case's own structure (not from polytile's parser or lowering).

A case picks index sizes first, then operands whose subscripts are plain letters or
sums `a*h + b*r + k + t[c]` (strides, dilations, offsets, table lookups), then makes
every dimension exactly as large as its subscript reaches plus a slack smaller than
the stride, so the largest in-bounds range of every index is the size it was given.
Each table holds values in 0..V with V itself present, so the range computed from its
values is that size too.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from hypothesis import strategies as st


@dataclass(frozen=True)
class Sum:
    """coeffs: ((coeff, letter), ...); const; tables: ((name, args), ...)."""

    coeffs: tuple[tuple[int, str], ...]
    const: int = 0
    tables: tuple[tuple[str, tuple[str, ...]], ...] = ()
    slack: int = 0
    starred: bool = False      # print 2*h rather than 2h

    def text(self) -> str:
        if len(self.coeffs) == 1 and self.coeffs[0][0] == 1 and not self.const \
                and not self.tables:
            return self.coeffs[0][1]
        parts = [(f"{c}*{i}" if self.starred else f"{c}{i}") if c != 1 else i
                 for c, i in self.coeffs]
        parts += [str(self.const)] if self.const else []
        parts += [f"{name}[{','.join(args)}]" for name, args in self.tables]
        return "(" + "+".join(parts) + ")"


@dataclass
class Case:
    sizes: dict[str, int]
    operands: list[list[Sum]]
    output: list[str]
    table_values: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def spec(self) -> str:
        return ",".join("".join(s.text() for s in op) for op in self.operands) + \
            "->" + "".join(self.output)

    def dim(self, s: Sum) -> int:
        reach = sum(c * (self.sizes[i] - 1) for c, i in s.coeffs) + s.const
        reach += sum(int(self.table_values[name].max()) for name, _ in s.tables)
        return reach + 1 + s.slack

    def shapes(self) -> list[tuple[int, ...]]:
        return [tuple(self.dim(s) for s in op) for op in self.operands]

    def reference(self, arrays: list[np.ndarray]) -> np.ndarray:
        """Every index point at once: each operand gathered at its subscripts' values,
        their product summed into the output with np.add.at (float64)."""
        letters = sorted(self.sizes)
        grids = np.meshgrid(*[np.arange(self.sizes[i]) for i in letters], indexing="ij")
        env = dict(zip(letters, grids))

        def value(s: Sum) -> np.ndarray:
            total = sum((c * env[i] for c, i in s.coeffs), np.zeros_like(grids[0])) + s.const
            for name, args in s.tables:
                total = total + self.table_values[name][tuple(env[a] for a in args)]
            return total

        product = np.ones(grids[0].shape)
        for op, array in zip(self.operands, arrays):
            product = product * array.astype(np.float64)[tuple(value(s) for s in op)]
        out = np.zeros(tuple(self.sizes[i] for i in self.output))
        np.add.at(out, tuple(env[i] for i in self.output), product)
        return out


TABLE_NAMES = ("sh", "off_w", "t")


@st.composite
def cases(draw: st.DrawFn, tables: bool = True) -> Case:
    letters = draw(st.permutations("abcdefghijklmnopqrstuvwxyz"))
    n_out = draw(st.integers(1, 3))
    n_sum = draw(st.integers(0, 3))
    output = list(letters[:n_out])
    used = letters[:n_out + n_sum]
    sizes = {i: draw(st.integers(1, 4)) for i in used}
    # Anchored indices appear plainly somewhere (every summed one, some output ones);
    # the others are sized only by a sum whose other indices are anchored.
    anchored = set(used[n_out:]) | {i for i in output if draw(st.booleans())}
    free = [i for i in used if i not in anchored]
    anchors = sorted(anchored)
    table_values: dict[str, np.ndarray] = {}
    table_args: dict[str, tuple[str, ...]] = {}

    def draw_sum(main: str) -> Sum:
        coeffs = [(draw(st.integers(1, 3)), main)]
        if anchors and draw(st.booleans()):
            coeffs.append((draw(st.integers(1, 2)), draw(st.sampled_from(anchors))))
        looked_up: list[tuple[str, tuple[str, ...]]] = []
        if tables and anchors and draw(st.booleans()):
            name = draw(st.sampled_from(TABLE_NAMES))
            if name not in table_args:
                table_args[name] = tuple(draw(st.lists(st.sampled_from(anchors), min_size=1,
                                                       max_size=2)))
                top = draw(st.integers(0, 3))
                shape = tuple(sizes[a] for a in table_args[name])
                values = np.array(draw(st.lists(st.integers(0, top), min_size=int(np.prod(shape)),
                                                max_size=int(np.prod(shape)))))
                values.flat[draw(st.integers(0, values.size - 1))] = top
                table_values[name] = values.reshape(shape).astype(
                    draw(st.sampled_from([np.int32, np.int64, np.int16])))
            looked_up.append((name, table_args[name]))
        return Sum(tuple(coeffs), draw(st.integers(0, 2)), tuple(looked_up),
                   slack=draw(st.integers(0, coeffs[0][0] - 1)), starred=draw(st.booleans()))

    n_operands = draw(st.integers(1, 3))
    operands: list[list[Sum]] = [[] for _ in range(n_operands)]
    for i in used:
        home = operands[draw(st.integers(0, n_operands - 1))]
        home.append(Sum(((1, i),)) if i in anchored else draw_sum(i))
    for op in operands:
        while len(op) < draw(st.integers(1, 4)):
            kind = draw(st.sampled_from(["plain", "sum"]))
            if kind == "plain" and anchors:
                op.append(Sum(((1, draw(st.sampled_from(anchors))),)))
            else:
                op.append(draw_sum(draw(st.sampled_from(used))
                                   if not free else draw(st.sampled_from(free + anchors))))
        draw(st.randoms()).shuffle(op)
    return Case(sizes, operands, output, table_values)
