"""`polytile einsum SPEC --shapes x=8,64,30,30 w=64,64,3,3 [--dtypes x=float64]`: print
the TC a spec lowers to.

`--shapes` names the operands, in order, and gives each one's sizes; a name the spec
uses as a table (`sh` in `(h+sh[c])`) is that table, wherever it stands. Operands are
float32 and tables int32 unless `--dtypes` says otherwise. The shapes are checked
against the spec (one size per subscript, every table given) before the TC is printed.
"""
from __future__ import annotations

import argparse

from polytile import dtypes
from polytile.einsum.lower import lower
from polytile.einsum.spec import parse_spec
from polytile.errors import ArgumentError


def shape_item(text: str) -> tuple[str, tuple[int, ...]]:
    """NAME=D0,D1,... (as `--sizes` items are NAME=INT)."""
    name, sep, value = text.partition("=")
    sizes = [v.strip() for v in value.split(",")] if value.strip() else []
    if not sep or not name.strip().isidentifier() or not all(v.isdigit() for v in sizes):
        raise argparse.ArgumentTypeError(f"expected NAME=INT,INT,..., got {text!r}")
    return name.strip(), tuple(int(v) for v in sizes)


def dtype_items(text: str) -> dict[str, str]:
    """NAME=TYPE,NAME=TYPE with TC type names (float64, int64, ...)."""
    found: dict[str, str] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        name, sep, value = item.partition("=")
        dtype = dtypes.lookup(value.strip())
        if not sep or dtype is None:
            raise argparse.ArgumentTypeError(f"expected NAME=TYPE with a TC type, got {item!r}")
        found[name.strip()] = dtype.name
    return found


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help="an einsum spec, e.g. 'nc(h+r)(w+s),ckrs->nkhw'")
    parser.add_argument("--shapes", type=shape_item, nargs="+", required=True,
                        metavar="NAME=D0,D1,...",
                        help="each operand's name and sizes, in order; tables by name")
    parser.add_argument("--dtypes", type=dtype_items, default={}, metavar="NAME=TYPE,...",
                        help="types other than float32 (operands) and int32 (tables)")


def run(args: argparse.Namespace) -> int:
    spec = parse_spec(args.spec)
    shapes = dict(args.shapes)
    if len(shapes) != len(args.shapes):
        raise ArgumentError("--shapes names an operand twice")
    unknown = [n for n in args.dtypes if n not in shapes]
    if unknown:
        raise ArgumentError(f"--dtypes names {unknown[0]}, which --shapes does not")
    tables = set(spec.table_names())
    operands = [n for n in shapes if n not in tables]
    if len(operands) != len(spec.operands):
        raise ArgumentError(f"the spec has {len(spec.operands)} operand(s), --shapes gives "
                            f"{len(operands)} ({', '.join(operands) or 'none'})")
    for name, op in zip(operands, spec.operands):
        if len(shapes[name]) != len(op.subscripts):
            raise ArgumentError(f"{name} has {len(shapes[name])} size(s), its subscripts "
                                f"name {len(op.subscripts)}", op.loc)
    for term in spec.tables:
        if term.table in shapes and len(shapes[term.table]) != len(term.args):
            raise ArgumentError(f"table {term.table} has {len(shapes[term.table])} size(s), "
                                f"the spec looks it up with {len(term.args)}", term.loc)
    lowered = lower(spec, [args.dtypes.get(n, "float32") for n in operands],
                    {t: args.dtypes.get(t, "int32") for t in shapes if t in tables}, operands)
    print(lowered.tc, end="")
    return 0
