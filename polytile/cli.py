"""The `polytile` command (also `python -m polytile`).

    polytile check FILE.tc [--sizes M=128,K=64]
"""
from __future__ import annotations

import argparse
import sys

from polytile.errors import PolytileError


def _sizes(text: str) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or not value.strip().lstrip("-").isdigit():
            raise argparse.ArgumentTypeError(f"expected NAME=INT, got {item!r}")
        sizes[name.strip()] = int(value)
    return sizes


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    with open(path, encoding="utf-8") as f:
        return f.read()


def cmd_check(args: argparse.Namespace) -> int:
    from polytile.lang.parser import parse
    from polytile.sema.analyze import analyze
    from polytile.sema.printer import format_function
    from polytile.sema.specialize import specialize

    program = analyze(parse(_read(args.file), args.file))
    for fn in program.functions:
        spec = None
        if args.sizes:
            shapes = {}
            for p in fn.params:
                if p.kind == "input":
                    missing = [str(d) for d in p.shape if not d.is_const
                               and str(d) not in args.sizes]
                    if missing:
                        raise PolytileError(f"--sizes does not give {', '.join(missing)} "
                                            f"(needed by {p.name} of {fn.name})")
                    shapes[p.name] = tuple(d.evaluate(args.sizes) for d in p.shape)
            scalars = {p.name: args.sizes.get(p.name, 1) for p in fn.params
                       if p.kind == "scalar"}
            spec = specialize(fn, shapes, scalars)
        print(format_function(fn, spec))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="polytile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="check a TC file and print inferred ranges")
    check.add_argument("file", help="TC source file, or - for standard input")
    check.add_argument("--sizes", type=_sizes, default=None,
                       help="concrete sizes, e.g. M=128,K=64 (integer scalars too)")
    check.set_defaults(run=cmd_check)
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except PolytileError as err:
        print(err.render(), file=sys.stderr)
        return 1
    except OSError as err:
        print(f"polytile: {err}", file=sys.stderr)
        return 1
