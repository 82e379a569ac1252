"""An einsum spec, with its operands' dtypes, as the TC function that computes it.

    lower(parse_spec("nc(h+r)(w+s),ckrs->nkhw"), ("float32", "float32")).tc
    def einsum(float32(N, C, HR, WS) in0, float32(C, K, R, S) in1) -> (out) {
      out(n, k, h, w) +=! in0(n, c, h + r, w + s) * in1(c, k, r, s)
    }

The output is the product of the operands, reduced with `+=!` over the summed indices
(plain `=` when nothing is summed), so its type and accumulation are TC's promotion of
the operands' types. A dimension indexed by one letter gets that letter's size name
(`N` for n), so two operands that share an index must agree on its size, as TC checks;
any other dimension gets a fresh name, and TC's range inference (TC §3.1) finds the
ranges: `(h+r)` with the input's HR and the filter's R gives h in 0:HR-R+1.

TC cannot infer the range of an index whose every subscript also holds a table lookup
(`(h+1+sh[c])`): the lookup's values are data. Such an index gets a `where` range whose
end is an int64 argument, and `Lowered.extents` says how a call computes it from the
tables' values: the largest range that keeps every access in bounds, the rule TC's
inference applies to affine subscripts. The kernel still checks every data-dependent
subscript at run time (a negative table value at index 0 is an OutOfBoundsError).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from polytile import dtypes
from polytile.einsum.spec import ConstTerm, IndexTerm, Spec, Subscript, TableTerm
from polytile.errors import ArgumentError, UnsupportedError
from polytile.ir.intrinsics import BUILTIN_ALIASES, BUILTINS

FUNCTION = "einsum"
OUTPUT = "out"
_KEYWORDS = frozenset({"def", "where", "in", "exists", FUNCTION, OUTPUT}) | dtypes.TYPE_NAMES \
    | BUILTINS | frozenset(BUILTIN_ALIASES)


@dataclass(frozen=True)
class Size:
    """Where a call finds an index's size: dimension `dim` of operand `operand`, or of
    table `table` when that is set."""

    operand: int
    dim: int
    table: str | None = None


@dataclass(frozen=True)
class Bound:
    """One subscript that limits an extent: `coeff * index + rest` must stay inside
    dimension `dim` of operand `operand`. `rest` is `const`, the other indices' terms
    (coefficient, where their size is) and the table terms (coefficient, table)."""

    operand: int
    dim: int
    coeff: int
    const: int
    others: tuple[tuple[int, Size], ...]
    tables: tuple[tuple[int, str], ...]


@dataclass(frozen=True)
class Extent:
    """An index whose range a call computes from the tables: `0:min over bounds`."""

    index: str
    param: str          # the int64 argument of the TC function that carries it
    bounds: tuple[Bound, ...]


@dataclass(frozen=True)
class Lowered:
    spec: Spec
    tc: str
    operands: tuple[str, ...]              # TC names of the positional operands
    tables: tuple[tuple[str, str], ...]    # (keyword, TC name), in TC argument order
    extents: tuple[Extent, ...]            # int64 arguments after the tables


def lower(spec: Spec, operand_types: Sequence[str], table_types: dict[str, str],
          names: Sequence[str] | None = None) -> Lowered:
    """The TC of `spec` for operands of `operand_types` (TC type names) and tables of
    `table_types` (keyword -> TC type name); `names` names the operands in the TC
    (default in0, in1, ...)."""
    if len(operand_types) != len(spec.operands):
        raise ArgumentError(f"the spec has {len(spec.operands)} operand(s), the call "
                            f"gives {len(operand_types)}")
    wanted = [f"in{k}" for k in range(len(spec.operands))] if names is None else list(names)
    alloc = _Names(set(spec.letters()) | _KEYWORDS)
    operand_names = tuple(alloc.take(n) for n in wanted)
    table_keys = spec.table_names()
    _check_tables(spec, table_keys, table_types)
    table_names = {t: alloc.take(t) for t in table_keys}
    letter_sizes, dims = _dimension_names(spec, alloc)
    extents = tuple(_extent(spec, i, alloc.take(f"size_{i}")) for i in _uninferable(spec))
    params = [f"{operand_types[k]}({', '.join(dims[k])}) {operand_names[k]}"
              for k in range(len(spec.operands))]
    params += [f"{table_types[t]}({', '.join(letter_sizes[a] for a in _table_args(spec, t))})"
               f" {table_names[t]}" for t in table_keys]
    params += [f"int64 {e.param}" for e in extents]
    reads = [f"{operand_names[k]}({', '.join(_subscript_tc(s, table_names) for s in op.subscripts)})"
             for k, op in enumerate(spec.operands)]
    target = f"{OUTPUT}({', '.join(letter.name for letter in spec.output)})"
    op = "+=!" if spec.summed() else "="
    lines = [f"def {FUNCTION}({', '.join(params)}) -> ({OUTPUT}) {{",
             f"  {target} {op} {' * '.join(reads)}"]
    if extents:
        lines.append("    where " + ", ".join(f"{e.index} in 0:{e.param}" for e in extents))
    lines.append("}")
    return Lowered(spec, "\n".join(lines) + "\n", operand_names,
                   tuple((t, table_names[t]) for t in table_keys), extents)


class _Names:
    """Hands out TC names that collide with no index, keyword or earlier name."""

    def __init__(self, taken: set[str]):
        self.taken = set(taken)

    def take(self, want: str) -> str:
        name, k = want, 1
        while name in self.taken:
            k += 1
            name = f"{want}_{k}" if want[-1].isdigit() else f"{want}{k}"
        self.taken.add(name)
        return name


def _check_tables(spec: Spec, keys: Sequence[str], table_types: dict[str, str]) -> None:
    missing = [t for t in keys if t not in table_types]
    if missing:
        first = next(t for t in spec.tables if t.table == missing[0])
        raise ArgumentError(f"the spec reads table {missing[0]}, which the call does not "
                            "pass", first.loc, f"pass it by keyword: {missing[0]}=array")
    extra = [t for t in table_types if t not in keys]
    if extra:
        raise ArgumentError(f"the call passes {extra[0]}=..., which the spec does not read",
                            hint="a table is read in a subscript, e.g. (h+sh[c])")
    for t in keys:
        dtype = dtypes.lookup(table_types[t])
        if dtype is None or not dtype.is_integral:
            raise ArgumentError(f"table {t} holds {table_types[t]}; a table holds integers")


def _dimension_names(spec: Spec, alloc: _Names) -> tuple[dict[str, str], list[list[str]]]:
    """The size name of each index a plain subscript or a table argument sizes (its
    uppercase letter: shared, so TC checks that the operands agree), and each operand
    dimension's size name: a plain index's, else a fresh one made of its letters."""
    plain = {s.plain for op in spec.operands for s in op.subscripts if s.plain}
    plain |= {a for t in spec.tables for a in t.args}
    letter_sizes = {i: alloc.take(i.upper()) for i in sorted(plain)}
    return letter_sizes, [[letter_sizes[s.plain] if s.plain else
                           alloc.take("".join(dict.fromkeys(i.upper() for i in s.indices)) or "D")
                           for s in op.subscripts] for op in spec.operands]


def _table_args(spec: Spec, table: str) -> tuple[str, ...]:
    return next(t.args for t in spec.tables if t.table == table)


def _subscript_tc(s: Subscript, tables: dict[str, str]) -> str:
    text = ""
    for term in s.terms:
        if isinstance(term, ConstTerm):
            coeff, body = term.value, ""
        elif isinstance(term, IndexTerm):
            coeff, body = term.coeff, term.index
        else:
            coeff, body = term.coeff, f"{tables[term.table]}({', '.join(term.args)})"
        magnitude = abs(coeff)
        piece = str(magnitude) if not body else body if magnitude == 1 \
            else f"{magnitude} * {body}"
        if not text:
            text = piece if coeff >= 0 else f"-{piece}"
        else:
            text += f" {'-' if coeff < 0 else '+'} {piece}"
    return text


def _uninferable(spec: Spec) -> list[str]:
    """Indices TC cannot find a range for: neither a table's argument nor in a subscript
    free of table lookups. In order of first use."""
    table_args = {a for t in spec.tables for a in t.args}
    found = []
    for i in spec.letters():
        if i in table_args:
            continue
        uses = [s for op in spec.operands for s in op.subscripts if i in s.indices]
        if all(s.tables for s in uses):
            found.append(i)
    return found


def _known_sizes(spec: Spec) -> dict[str, Size]:
    """Where a call reads the size of each index that a plain subscript or a table
    argument determines."""
    sizes: dict[str, Size] = {}
    for k, op in enumerate(spec.operands):
        for d, s in enumerate(op.subscripts):
            if s.plain:
                sizes.setdefault(s.plain, Size(k, d))
    for t in spec.tables:
        for d, a in enumerate(t.args):
            sizes.setdefault(a, Size(-1, d, t.table))
    return sizes


def _extent(spec: Spec, index: str, param: str) -> Extent:
    known = _known_sizes(spec)
    bounds = []
    for k, op in enumerate(spec.operands):
        for d, s in enumerate(op.subscripts):
            if index not in s.indices:
                continue
            coeff = sum(t.coeff for t in s.terms if isinstance(t, IndexTerm) and t.index == index)
            if coeff <= 0:
                raise UnsupportedError(
                    f"index {index} has coefficient {coeff} in a subscript with a table "
                    "lookup; its range is computed only for positive coefficients", s.loc,
                    "write the subscript with a positive coefficient of the index")
            others = []
            for t in s.terms:
                if isinstance(t, IndexTerm) and t.index != index:
                    if t.index not in known:
                        raise UnsupportedError(
                            f"the ranges of {index} and {t.index} depend on each other through "
                            "a table lookup", s.loc,
                            f"index {t.index} plainly in another operand, which gives its range")
                    others.append((t.coeff, known[t.index]))
            const = sum(t.value for t in s.terms if isinstance(t, ConstTerm))
            tables = tuple((t.coeff, t.table) for t in s.terms if isinstance(t, TableTerm))
            bounds.append(Bound(k, d, coeff, const, tuple(others), tables))
    return Extent(index, param, tuple(bounds))


def extent_value(extent: Extent, shapes: Sequence[tuple[int, ...]],
                 tables: Mapping[str, np.ndarray]) -> int:
    """The extent for a call: operands of `shapes`, tables (NumPy integer arrays) by
    keyword. The largest n such that every subscript stays below its dimension's size
    for index values 0..n-1, every other index in its range and every table value."""
    def size(where: Size) -> int:
        if where.table is not None:
            return int(tables[where.table].shape[where.dim])
        return shapes[where.operand][where.dim]

    best: int | None = None
    for b in extent.bounds:
        rest = b.const
        for coeff, where in b.others:
            rest += max(0, coeff * (size(where) - 1))
        for coeff, name in b.tables:
            values = np.asarray(tables[name])
            if values.size:
                rest += max(coeff * int(values.max()), coeff * int(values.min()))
        limit = (shapes[b.operand][b.dim] - 1 - rest) // b.coeff + 1
        best = limit if best is None else min(best, limit)
    return max(0, best if best is not None else 0)
