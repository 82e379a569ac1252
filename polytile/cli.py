"""The `polytile` command (also `python -m polytile`).

    polytile check FILE.tc [--sizes M=128,K=64]
    polytile show FILE.tc --stage ast|program|plan|ir|loops|c [--sizes ...] [--function NAME] [--target T]
                           (loops and c, or any stage of the target's backend)
    polytile grad FILE.tc [--name NAME] [--saved] [--wrt W,B]
    polytile targets
    polytile instructions [FILE.tc --sizes M=64,K=64 [--function NAME]]
    polytile sanitize [--with address,undefined] -- COMMAND [ARGS...]
    polytile tune FILE.tc --sizes M=1024,K=1024,N=1024 [--budget 2m] [--strategy genetic|random]
                  [--cluster tcp://host:8786|local:N]
    polytile cache info|clear [--tuning]
    polytile cache export [--target T] FILE | import FILE
    polytile cache inject FILE.tc --sizes ... --options JSON|@FILE [--function NAME]
    polytile bench [--quick] [--only NAME[,NAME]] [--latency | --training | --fusion] [--write [FILE]] [--repeats N]
                   [--no-compile]
    polytile einsum SPEC --shapes x=8,64,30,30 w=64,64,3,3 [--dtypes x=float64,...]
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from polytile.deep import call_deep
from polytile.errors import PolytileError

if TYPE_CHECKING:
    from polytile.isa import Description


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


def _specialize(fn, sizes: dict[str, int]):  # type: ignore[no-untyped-def]
    from polytile.sema.specialize import specialize

    shapes = {}
    for p in fn.params:
        if p.kind == "input":
            missing = [str(d) for d in p.shape if not d.is_const and str(d) not in sizes]
            if missing:
                raise PolytileError(f"--sizes does not give {', '.join(missing)} "
                                    f"(needed by {p.name} of {fn.name})")
            shapes[p.name] = tuple(d.evaluate(sizes) for d in p.shape)
    missing = [p.name for p in fn.params if p.kind == "scalar" and p.dtype.is_integral
               and p.name not in sizes]
    if missing:
        raise PolytileError(f"--sizes does not give the integer argument(s) {', '.join(missing)}"
                            f" of {fn.name}")
    scalars = {p.name: sizes.get(p.name, 1) for p in fn.params if p.kind == "scalar"}
    return specialize(fn, shapes, scalars)


def _program(path: str):  # type: ignore[no-untyped-def]
    from polytile.lang.parser import parse
    from polytile.sema.analyze import analyze

    return analyze(parse(_read(path), path))


def _functions(path: str, name: str | None):  # type: ignore[no-untyped-def]
    """The functions of the file at `path`, or only `name`."""
    functions = _program(path).functions
    if name:
        functions = tuple(f for f in functions if f.name == name)
        if not functions:
            raise PolytileError(f"{path} defines no function {name!r}")
    return functions


def cmd_check(args: argparse.Namespace) -> int:
    from polytile.sema.printer import format_function

    for fn in _program(args.file).functions:
        spec = _specialize(fn, args.sizes) if args.sizes is not None else None
        print(format_function(fn, spec))
    return 0


def cmd_grad(args: argparse.Namespace) -> int:
    """Print the backward TC of each function (or of --name)."""
    from polytile.autodiff import backward, forward_saving

    for fn in _functions(args.file, args.name):
        derived = backward(fn, saved=args.saved, wrt=args.wrt)
        if args.saved:
            print(forward_saving(fn, derived.saved))
        print(derived.source)
    return 0


def _stages() -> tuple[str, ...]:
    """Every stage `show` prints: the front end's, then each backend's below the IR."""
    from polytile.backends import backends

    below = (stage for backend in backends() for stage in backend.stages)
    return ("ast", "program", "plan", "ir", *dict.fromkeys(below))


def cmd_show(args: argparse.Namespace) -> int:
    from polytile.lang.parser import parse
    from polytile.lang.printer import format_module

    if args.stage not in _stages():     # checked here: the backends load only for `show`
        raise PolytileError(f"there is no stage {args.stage!r}",
                            hint=f"the stages: {', '.join(_stages())}")
    if args.stage == "ast":
        print(format_module(parse(_read(args.file), args.file)), end="")
        return 0
    from polytile.sema.printer import format_function

    for fn in _functions(args.file, args.function):
        if args.stage == "program":
            spec = _specialize(fn, args.sizes) if args.sizes is not None else None
            print(format_function(fn, spec))
            continue
        if args.sizes is None:
            raise PolytileError(f"--stage {args.stage} needs --sizes (code is specialized to "
                                "the sizes of a call)")
        from polytile.api import tuned_lookup
        from polytile.compile import Compiler
        from polytile.config import load_config
        from polytile.ir.printer import format_function as format_ir
        from polytile.passes.pipeline import options_from_text

        config = load_config()
        # What a call would compile: with the tuned options, if any; with --option, those.
        compiler = Compiler(config, _shown_target(args.target or config.target, args.features),
                            options=options_from_text(args.option), tuned=tuned_lookup(config))
        if args.stage == "plan":
            _show_plan(compiler, _specialize(fn, args.sizes))
            continue
        ir = compiler.ir(_specialize(fn, args.sizes))
        if args.stage == "ir":
            print(format_ir(ir))
            continue
        backend = compiler.backend
        if args.stage not in backend.stages:
            raise PolytileError(f"target {compiler.target.name} has backend {backend.name}, "
                                f"which has no stage {args.stage!r}",
                                hint=f"its stages: ir, {', '.join(backend.stages)}")
        print(backend.generate(ir, compiler.target).text(args.stage))
    return 0


def _show_plan(compiler, spec) -> None:  # type: ignore[no-untyped-def]
    """The fusion plan (polytile.graph): ops, scored patterns, the kernels chosen; the
    ILP's solve time on stderr, so that the printed plan is the same on every run. Then
    the memory traffic of each kernel of the IR built with the plan."""
    from polytile.analysis.traffic import format_traffic, kernel_traffic
    from polytile.compile import Compiler
    from polytile.graph.plan import format_plan, plan_fusion

    plan = plan_fusion(spec, compiler.target, compiler.config)
    print(format_plan(plan), end="")
    planned = Compiler(compiler.config, compiler.target, options={"fuse.groups": plan.option})
    print(format_traffic(kernel_traffic(planned.ir(spec))), end="")
    print(f"note: ILP solved in {plan.solve_seconds * 1e3:.1f} ms ({plan.rounds} solve(s))",
          file=sys.stderr)


def _shown_target(name: str | None, features: str | None = None):  # type: ignore[no-untyped-def]
    """Any target, on any host: printing code needs no hardware. With `features` (a
    comma-separated list of the target's optional features), for a machine that has
    exactly those besides the required ones. Says so on stderr when this host could not
    run the code it prints."""
    from dataclasses import replace

    from polytile.targets.target import host_features, inspection_target, missing_features

    target = inspection_target(name)
    if features is not None:
        wanted = [f for f in (s.strip() for s in features.split(",")) if f]
        unknown = [f for f in wanted if f not in target.optional]
        if unknown:
            raise PolytileError(f"target {target.name} has no optional feature "
                                f"{', '.join(unknown)}",
                                hint=f"its optional features: "
                                     f"{', '.join(target.optional) or 'none'}")
        target = replace(target, features=frozenset(target.requires) | frozenset(wanted))
    missing = missing_features(target, host_features())
    if features is not None and not missing:
        missing = sorted(f for f in target.features if f not in host_features())
    if missing:
        print(f"note: this host lacks {', '.join(missing)}: showing {target.name} code for a "
              f"machine with {', '.join(sorted(target.features)) or 'no optional features'} "
              "(it cannot run here)", file=sys.stderr)
    return target


def cmd_targets(args: argparse.Namespace) -> int:
    from polytile.targets.target import (
        EMULATED_BACKENDS,
        host_features,
        missing_features,
        shipped_targets,
    )

    host = host_features()
    rows = [("target", "backend", "vector", "requires", "optional", "this host")]
    for t in shipped_targets():
        missing = missing_features(t, host)
        runs = (f"no (lacks {', '.join(missing)})" if missing
                else "yes" + (f", with {', '.join(sorted(set(t.optional) & host))}"
                              if set(t.optional) & host else ""))
        if not missing and t.backend == "cuda":     # NVRTC compiles; a device runs
            from polytile.backends.cuda import target_arch
            from polytile.runtime.cuda import device_problem
            problem = device_problem(target_arch(t))
            runs = f"compiles only ({problem})" if problem else runs
        if not missing and t.backend in EMULATED_BACKENDS:
            runs = "under qemu-aarch64 (emulated: correct, not timed)"
        needs = {"opencl": "an OpenCL device", "cuda": "NVRTC; a GPU to run",
                 "c-arm64": "a cross compiler and qemu-aarch64"}
        rows.append((t.name, t.backend, f"{t.vector_bytes * 8} bit",
                     ",".join(t.requires) or needs.get(t.backend, "-"),
                     ",".join(t.optional + t.provides) or "-", runs))
    _print_table(rows)
    return 0


def cmd_instructions(args: argparse.Namespace) -> int:
    from polytile.isa import descriptions
    from polytile.targets.target import host_features, shipped_targets

    if args.file is not None:
        return _matched_instructions(args)
    host = host_features()
    rows = [("instruction", "feature", "operands", "targets", "this host")]
    for d in descriptions():
        ins = ", ".join(str(t) for t in d.definition.inputs)
        outs = ", ".join(str(t) for t in d.definition.outputs)
        targets = [t.name for t in shipped_targets()
                   if d.feature in t.requires + t.optional + t.provides]
        rows.append((d.name, d.feature, f"{ins} -> {outs}", ",".join(targets) or "-",
                     _runs_here(d, host)))
    _print_table(rows)
    return 0


def _runs_here(d: Description, host: frozenset[str]) -> str:
    """Whether this host runs a description: a CPU feature it has, or, for a warp-level
    (GPU) instruction, a CUDA device; an AArch64 one (no x86 form) runs under qemu where
    the cross tools are (polytile.runtime.emulated)."""
    if "c-arm64" in d.definition.forms and "c-x86" not in d.definition.forms:
        from polytile.runtime.emulated import cross_problem
        return "no" if cross_problem() else "under qemu-aarch64"
    if not d.definition.warp:
        return "yes" if d.feature in host else "no"
    from polytile.runtime.cuda import device_problem
    problem = device_problem()
    return f"no ({problem.split(' (')[0]})" if problem else "yes"


def _matched_instructions(args: argparse.Namespace) -> int:
    """Where each instruction could run the file's contractions (UNIT's inspector)."""
    from polytile.isa import descriptions
    from polytile.isa.inspect import find

    if args.sizes is None:
        raise PolytileError("polytile instructions FILE.tc needs --sizes (the inspector "
                            "reads the program at the sizes of a call)")
    functions = [f for f in _program(args.file).functions
                 if args.function in (None, f.name)]
    if not functions:
        raise PolytileError(f"{args.file} defines no function {args.function}")
    for fn in functions:
        matches = find(_specialize(fn, args.sizes), descriptions())
        print(f"{fn.name}: {len(matches) or 'no'} mapping{'s' if len(matches) != 1 else ''}")
        for m in matches:
            loc = fn.statements[m.statement].loc
            print(f"  statement {m.statement + 1} (line {loc.line}): {m.mapping.text()}")
    return 0


def _print_table(rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])


def cmd_sanitize(args: argparse.Namespace) -> int:
    """Run COMMAND with kernels built under sanitizers, and with their runtime loaded."""
    import os
    import subprocess

    from polytile.config import load_config, parse_sanitizers
    from polytile.runtime.sanitize import sanitized_environment
    from polytile.runtime.toolchain import detect_toolchain

    command = args.command_line[1:] if args.command_line[:1] == ["--"] else args.command_line
    if not command:
        raise PolytileError("polytile sanitize needs a command to run",
                            hint="e.g. polytile sanitize -- python my_script.py")
    config = load_config()
    names = parse_sanitizers(args.sanitizers or config.sanitize or "address,undefined",
                             "--with")
    env = sanitized_environment(detect_toolchain(config), names, os.environ)
    code = subprocess.run(command, env=env, check=False).returncode
    return code if code >= 0 else 128 - code


def cmd_cache(args: argparse.Namespace) -> int:
    from polytile.tune.command import run_cache

    return run_cache(args)


def cmd_tune(args: argparse.Namespace) -> int:
    from polytile.tune.command import run_tune

    return run_tune(args)


def cmd_bench(args: argparse.Namespace) -> int:
    from polytile.bench.command import run

    return run(args)


def _add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    # Declared here, not in polytile.bench, so that parsing imports nothing of the bench.
    parser.add_argument("--quick", action="store_true",
                        help="small sizes and short blocks: a smoke run of about a minute, "
                             "torch.compile included (it adds ~10 s, or ~50 s while "
                             "inductor's on-disk cache is cold; --no-compile skips it)")
    parser.add_argument("--only", type=_names, default=None, metavar="NAME[,NAME]",
                        help="only these workloads (a family like tmm, or a full name like "
                             "'tmm 128x32x256'); with --latency, these examples")
    parser.add_argument("--latency", action="store_true",
                        help="measure first-call, cached-call and dispatch latency instead")
    parser.add_argument("--training", action="store_true",
                        help="time a training step (forward + derived backward through "
                             "polytile.torch.op) against torch eager instead (needs torch)")
    parser.add_argument("--fusion", action="store_true",
                        help="probe the fusion cost model (stored for this target) and run "
                             "the fusion workloads without and with the fusion plan instead")
    # const=True: the project's benchmarks/RESULTS.md, found by bench.command.results_path.
    parser.add_argument("--write", nargs="?", const=True, default=None, metavar="FILE",
                        help="also write the tables into FILE (default: benchmarks/RESULTS.md "
                             "of the checkout, the project's record of runs), replacing only "
                             "this kind of run's section; without it, bench only prints")
    parser.add_argument("--repeats", type=_positive, default=None, metavar="N",
                        help="timing rounds per workload (default 5, quick 3); with "
                             "--latency, processes per example (default 3, quick 1)")
    parser.add_argument("--no-compile", action="store_true",
                        help="skip the torch.compile column (compiling takes 0.1-5 s per "
                             "workload, and ~30 s more for inductor's first C++ build while "
                             "its on-disk cache is cold)")
    parser.add_argument("--target", default=None,
                        help="compile polytile's kernels for this target, e.g. opencl (default: "
                             "the host's best; on PoCL the times are functional, not a "
                             "performance claim)")
    parser.add_argument("--tuned", action="store_true",
                        help="compile with the tuning database's entries where it has them "
                             "(default: the heuristics only, so that a run measures the "
                             "compiler's defaults whatever was tuned on this machine)")
    parser.add_argument("--backend", choices=("c", "interp"), default="c",
                        help=argparse.SUPPRESS)
    parser.add_argument("--blas-env-removed", default="", help=argparse.SUPPRESS)


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected NAME[,NAME]")
    return names


def _positive(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="polytile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="check a TC file and print inferred ranges")
    check.add_argument("file", help="TC source file, or - for standard input")
    check.add_argument("--sizes", type=_sizes, default=None,
                       help="concrete sizes, e.g. M=128,K=64 (integer scalars too)")
    check.set_defaults(run=cmd_check)
    show = sub.add_parser("show", help="print one stage: ast, program, plan, ir, or a "
                          "backend's (loops, c, opencl, cuda)")
    show.add_argument("file", help="TC source file, or - for standard input")
    show.add_argument("--stage", default="program",
                      help="ast, program, plan, ir, or a stage of a backend (loops, c; opencl "
                           "for --target opencl, cuda for --target cuda-sm80 or cuda-sm90)")
    show.add_argument("--sizes", type=_sizes, default=None, help="e.g. M=128,K=64")
    show.add_argument("--function", default=None, help="only this function")
    show.add_argument("--target", default=None,
                      help="e.g. cpu-avx512, any target on any host (default: the host's best)")
    show.add_argument("--features", default=None, metavar="F,...",
                      help="print for a machine with these optional features of the target "
                           "(and no others), e.g. --target cpu-avx512 --features "
                           "amx_tile,amx_bf16")
    show.add_argument("--option", action="append", default=[], metavar="PASS.PARAM=VALUE",
                      help="a pass option instead of the tuned ones, e.g. fuse.strategy=rows "
                           "(repeatable)")
    show.set_defaults(run=cmd_show)
    grad = sub.add_parser("grad", help="print the TC that computes a function's gradients")
    grad.add_argument("file", help="TC source file, or - for standard input")
    grad.add_argument("--name", "--function", dest="name", default=None,
                      help="only this function")
    grad.add_argument("--saved", action="store_true",
                      help="read the forward's intermediate values instead of recomputing "
                           "them, and print the forward that returns them first")
    grad.add_argument("--wrt", type=lambda text: [x for x in text.split(",") if x],
                      default=None, help="only the gradients of these inputs, e.g. w,b "
                                         "(default: every floating-point input)")
    grad.set_defaults(run=cmd_grad)
    targets = sub.add_parser("targets", help="list the shipped targets, their backends and "
                             "features, and whether this host runs them")
    targets.set_defaults(run=cmd_targets)
    instructions = sub.add_parser("instructions", help="list the tensorized instructions "
                                  "described in TC, the targets that provide them, and "
                                  "whether this host runs them")
    instructions.add_argument("file", nargs="?", default=None,
                              help="a TC file: show where the instructions could run its "
                                   "contractions instead")
    instructions.add_argument("--sizes", type=_sizes, default=None, help="e.g. M=128,K=64")
    instructions.add_argument("--function", default=None, help="only this function")
    instructions.set_defaults(run=cmd_instructions)
    sanitize = sub.add_parser("sanitize", help="run a command whose kernels are built with "
                              "AddressSanitizer and UBSan (reports name the kernel and end "
                              "the process)")
    sanitize.add_argument("--with", dest="sanitizers", default=None, metavar="NAMES",
                          help="address,undefined (default: POLYTILE_SANITIZE, else both)")
    sanitize.add_argument("command_line", nargs=argparse.REMAINDER,
                          help="-- COMMAND [ARGS...]")
    sanitize.set_defaults(run=cmd_sanitize)
    tune = sub.add_parser("tune", help="autotune a TC function for given sizes and keep the "
                          "best options (later calls use them)")
    tune.add_argument("file", help="TC source file, or - for standard input")
    tune.add_argument("--sizes", type=_sizes, default=None, help="e.g. M=1024,K=1024,N=1024")
    tune.add_argument("--budget", default="2m", help="wall clock per function: 90s, 2m, 1h "
                      "(default 2m)")
    tune.add_argument("--strategy", choices=("genetic", "random"), default="genetic")
    tune.add_argument("--function", default=None, help="only this function")
    tune.add_argument("--candidates", type=_positive, default=None, metavar="N",
                      help="stop after N distinct candidates")
    tune.add_argument("--population", type=_positive, default=None, metavar="N")
    tune.add_argument("--generations", type=_positive, default=None, metavar="N")
    tune.add_argument("--seed", type=int, default=0)
    tune.add_argument("--target", default=None, help="e.g. cpu-avx2 (default: the host's best)")
    tune.add_argument("--quiet", action="store_true", help="no progress line")
    tune.add_argument("--cluster", default=None, metavar="ADDRESS|local:N",
                      help="compile and measure candidates on Dask workers: a scheduler "
                           "address (tcp://host:8786) or local:N worker processes "
                           "(needs the cluster extra)")
    tune.set_defaults(run=cmd_tune)
    cache = sub.add_parser("cache", help="the compilation cache and the tuning database")
    actions = cache.add_subparsers(dest="action", required=True)
    actions.add_parser("info", help="where they are and how big")
    clear = actions.add_parser("clear", help="delete compiled kernels")
    clear.add_argument("--tuning", action="store_true",
                       help="also delete every tuned entry and measurement")
    export = actions.add_parser("export", help="write the tuning database as JSON")
    export.add_argument("file", help="output file, or - for standard output")
    export.add_argument("--target", default=None,
                        help="only entries for this target: a name (cpu-avx2) or an identity "
                             "as `polytile cache info` lists it")
    load = actions.add_parser("import", help="merge a JSON export into the tuning database "
                              "(only entries measured on this machine's hardware)")
    load.add_argument("file", help="a file written by `polytile cache export`, or -")
    inject = actions.add_parser("inject", help="store hand-written options for a function "
                                "and sizes (used until tuning finds faster ones)")
    inject.add_argument("file", help="TC source file")
    inject.add_argument("--sizes", type=_sizes, default=None, help="e.g. M=128,K=64")
    inject.add_argument("--options", required=True,
                        help="options JSON (as `polytile tune` prints it), or @FILE")
    inject.add_argument("--function", default=None, help="the function, if the file has more")
    inject.add_argument("--target", default=None, help="e.g. cpu-avx2 (default: the host's best)")
    cache.set_defaults(run=cmd_cache)
    bench = sub.add_parser("bench", help="benchmark against NumPy and PyTorch and print the "
                           "tables (--write records them in benchmarks/RESULTS.md)")
    _add_bench_arguments(bench)
    bench.set_defaults(run=cmd_bench)
    einsum = sub.add_parser("einsum", help="print the TC an einsum spec lowers to")
    from polytile.einsum import command as einsum_command
    einsum_command.add_arguments(einsum)
    einsum.set_defaults(run=einsum_command.run)
    args = parser.parse_args(argv)
    try:
        # On a deep stack: a generated program's expressions may be thousands of levels deep.
        return int(call_deep(args.run, args))
    except PolytileError as err:
        print(err.render(), file=sys.stderr)
        return 1
    except OSError as err:
        print(f"polytile: {err}", file=sys.stderr)
        return 1
