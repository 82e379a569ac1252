"""`polytile tune` and the tuning side of `polytile cache`.

    polytile tune FILE.tc --sizes M=1024,K=1024,N=1024 --budget 2m [--strategy genetic|random]
                  [--cluster tcp://host:8786 | local:N]
    polytile cache export [--target T] FILE.json | import FILE.json
    polytile cache inject FILE.tc --sizes ... --options '{"schedules": {...}}' | @options.json

`tune` runs on random inputs (floats uniform in [-1, 1), integers in [0, smallest
size) so that gathers stay in bounds; where they still fall outside, as an offset table
can, on zero indices, and says so) and prints the best options, as text and
as the JSON `inject` takes, and the speedup table. `--cluster` runs the candidates on
Dask workers (polytile.tune.cluster). `import` takes only the entries measured on this
machine's hardware (their key's target is the one this host selects for that name).
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

from polytile.errors import ArgumentError, OutOfBoundsError, PolytileError


def run_tune(args: argparse.Namespace) -> int:
    from polytile.api import define
    from polytile.cli import _read

    module = define(_read(args.file), name=args.file, target=args.target)
    functions = [f for f in module.program.functions
                 if args.function is None or f.name == args.function]
    if not functions:
        raise PolytileError(f"{args.file} defines no function {args.function}")
    settings: dict[str, Any] = {"budget": args.budget, "strategy": args.strategy,
                                "seed": args.seed, "progress": not args.quiet}
    if args.cluster is not None:
        settings["cluster"] = args.cluster
    for name in ("candidates", "population", "generations"):
        if getattr(args, name) is not None:
            settings[name] = getattr(args, name)
    results = []
    for fn in functions:
        arguments = random_arguments(fn, args.sizes or {}, np.random.default_rng(args.seed))
        try:
            result = module[fn.name].tune(*arguments, **settings)
        except OutOfBoundsError as e:
            # Random indices fit a gather's table but not every index function (an
            # offset table like a shift convolution's: h + sh(c)); zeros fit both.
            zeroed = zero_indices(arguments)
            if zeroed is None:
                raise
            print(f"{fn.name}: random index tensors went out of bounds ({e.message}); "
                  "tuning with zero indices instead", file=sys.stderr)
            result = module[fn.name].tune(*zeroed, **settings)
        results.append(result)
        for note in result.notes:
            print(f"{fn.name}: {note}")
        print(f"{fn.name}: best options")
        print(f"  {result.best.text() if result.best else no_best(result, args.budget)}")
        if result.best:
            print(f"  json: {result.best.dumps()}")
    print()
    for k, result in enumerate(results):
        lines = result.table().splitlines()
        print("\n".join(lines if k == 0 else lines[1:]))
    return 0 if all(r.best for r in results) else 1


def no_best(result: Any, budget: str) -> str:
    """Why a tuning run has no best options: nothing was measured, or all failed."""
    if result.candidates == 0:
        return (f"(the budget of {budget} ended before any candidate was measured: give it "
                "more time, e.g. --budget 1m)")
    return f"(no candidate ran correctly: {result.candidates} measured, none passed the check)"


def random_arguments(fn: Any, sizes: dict[str, int], rng: np.random.Generator) -> list[Any]:
    from polytile.cli import _specialize
    spec = _specialize(fn, sizes)
    smallest = min((v for _, v in spec.env if v > 0), default=1)
    out: list[Any] = []
    for p in fn.params:
        dtype = p.dtype.numpy
        if p.kind == "scalar":
            out.append(dtype.type(sizes.get(p.name, 1)))
            continue
        shape = spec.shape(p.name)
        if dtype.kind == "f" or p.dtype.name in ("bfloat16", "half"):
            out.append((rng.random(shape) * 2 - 1).astype(dtype))
        elif dtype.kind in "iu":
            out.append(rng.integers(0, max(1, smallest), shape).astype(dtype))
        else:
            out.append(rng.random(shape) < 0.5)
    return out


def zero_indices(arguments: list[Any]) -> list[Any] | None:
    """`arguments` with every integer tensor zeroed; None if there is none."""
    if not any(isinstance(a, np.ndarray) and a.dtype.kind in "iu" for a in arguments):
        return None
    return [np.zeros_like(a) if isinstance(a, np.ndarray) and a.dtype.kind in "iu" else a
            for a in arguments]


def run_cache(args: argparse.Namespace) -> int:
    from polytile.config import load_config
    from polytile.runtime.cache import cache_info, clear_cache
    from polytile.tune.database import TuningDatabase

    config = load_config()
    db = TuningDatabase.of(config)
    if args.action == "info":
        print(cache_info(config))
        print(db.info())
    elif args.action == "clear":
        removed = clear_cache(config)
        print(f"removed {removed} entries from {config.cache_dir}")
        if args.tuning:
            print(f"removed {db.clear()} tuned entries from {db.path}")
    elif args.action == "export":
        data = db.export(args.target)
        text = json.dumps(data, indent=1, sort_keys=True)
        if args.file == "-":
            sys.stdout.write(text + "\n")
        else:
            from pathlib import Path

            from polytile.runtime.files import atomic_write_bytes
            atomic_write_bytes(Path(args.file), (text + "\n").encode())
            print(f"exported {len(data['best'])} tuned entries and "
                  f"{len(data['measurements'])} measurements to {args.file}")
    elif args.action == "import":
        from polytile.cli import _read
        try:
            data = json.loads(_read(args.file))
        except ValueError as e:
            raise ArgumentError(f"{args.file} is not JSON: {e}") from None
        from polytile.tune.database import only_targets
        mine, skipped = only_targets(data, runs_here())
        taken, added = db.import_(mine)
        print(f"imported {taken} tuned entries and {added} measurements into {db.path}")
        for target, count in sorted(skipped.items()):
            print(f"skipped {count} entries and measurements for {target}: not this "
                  "machine's hardware")
    else:
        return _inject(args, config, db)
    return 0


def runs_here() -> Any:
    """identity -> whether it is the Target.identity this host selects for its name."""
    from polytile.targets.target import select_target
    mine: dict[str, str | None] = {}

    def keep(identity: str) -> bool:
        name = identity.split("[")[0]
        if name not in mine:
            try:
                mine[name] = select_target(name).identity
            except PolytileError:          # an unknown target, or one this host cannot run
                mine[name] = None
        return mine[name] == identity
    return keep


def _inject(args: argparse.Namespace, config: Any, db: Any) -> int:
    from polytile.api import define
    from polytile.cli import _read, _specialize
    from polytile.ir.lower import lower
    from polytile.sema.canonical import canonical
    from polytile.tune.options import Options
    from polytile.tune.tuner import program_family

    text = args.options
    if text.startswith("@"):
        text = _read(text[1:])
    options = Options.from_json(text)
    module = define(_read(args.file), name=args.file, target=args.target)
    functions = [f for f in module.program.functions
                 if args.function is None or f.name == args.function]
    if len(functions) != 1:
        raise ArgumentError(f"{args.file} defines {len(module.program.functions)} functions",
                            hint="name one with --function")
    fn = functions[0]
    compiler = module.compiler
    assert compiler is not None
    spec = _specialize(fn, args.sizes or {})
    options.check(compiler.target)
    _check_blocks(options, compiler, spec)
    # Applied once now, so an entry later calls could not apply is refused here.
    lowered = lower(canonical(spec))
    compiler.optimize(lowered, options.pass_options())
    key = compiler.tuning_key(spec, lowered)
    db.inject(key, options, fn.name, program_family(spec))
    print(f"injected options for {fn.name} ({key.signature}) into {db.path}:\n"
          f"  {options.text()}")
    return 0


def _check_blocks(options: Any, compiler: Any, spec: Any) -> None:
    """A hand-written entry must name blocks the program has (in its fusion variant)."""
    from polytile.ir.lower import lower
    from polytile.sema.canonical import canonical
    from polytile.tune.space import build_space
    from polytile.tune.tuner import plan_groups

    space = build_space(lower(canonical(spec)), compiler.target,
                        plan=plan_groups(compiler, spec))
    names = {kb.name for kb in space.variant_of(options).blocks}
    unknown = [name for name, _ in options.schedules if name not in names]
    if unknown:
        raise ArgumentError(f"the options name blocks {unknown} that this program does not "
                            f"have", hint=f"its kernel blocks are {', '.join(sorted(names))} "
                                          "(see `polytile show --stage ir`)")
