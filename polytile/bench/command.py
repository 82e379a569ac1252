"""`polytile bench`: the command's flow, from arguments to the table and RESULTS.md.

    polytile bench [--quick] [--only NAME[,NAME]] [--latency | --training | --fusion]
                   [--write [FILE]]
                   [--repeats N]
                   [--no-compile]

(the arguments are declared in polytile.cli, so that parsing imports no bench code).

Throughput (default): machine facts, the measured peak, then every workload checked
against NumPy and timed against NumPy, PyTorch eager and torch.compile (unless
--no-compile; each compile time is printed as it happens), one table, printed. Only with
--write [FILE] is it also written into FILE (default: the project's record of runs,
benchmarks/RESULTS.md of the checkout polytile runs from, else of the current
directory), so a plain run leaves a clone clean. --latency instead measures first-call,
cached-call and dispatch latency; --training times a training step of layers through
polytile.torch.op against torch eager (polytile.bench.training); --fusion probes the
fusion cost model and compares kernels and times without and with the fusion plan
(polytile.bench.fusion). With --target cuda-sm80/cuda-sm90 (a GPU run,
polytile.bench.device) the inputs live on the device, polytile is timed against torch
eager on the same CUDA tensors with every timed group synchronized, NumPy only checks,
and no CPU peak is measured; a host without a device is refused before any work.
The exit status is 1 when
polytile gives a
WRONG result anywhere; a workload polytile cannot compile is FAILED in the table.

OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE, set on some machines here for old OpenBLAS builds,
slow a current NumPy down; OpenBLAS reads them when NumPy is imported, so the bench
re-runs itself in a child process without them and records that it did.
"""
from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from polytile.bench.machine import BLAS_ENV_VARS, load_average, machine_facts
from polytile.bench.timing import TimingOptions


def run(args: argparse.Namespace) -> int:
    present = [v for v in BLAS_ENV_VARS if v in os.environ]
    if present and not args.latency and not getattr(args, "training", False):
        return _rerun_without(present, args)
    # The compiler's defaults unless --tuned: an entry tuned on this machine would
    # otherwise replace them silently (gconv and tmm 1024^3 ran tuned schedules in bench
    # runs after `polytile tune`, 2026-11-28). The environment reaches every module the
    # bench defines and the processes it starts; it is restored after the run.
    tuned = getattr(args, "tuned", False)
    before = os.environ.get("POLYTILE_IGNORE_TUNED")
    if not tuned:
        os.environ["POLYTILE_IGNORE_TUNED"] = "1"
    try:
        return _run(args, tuned)
    finally:
        if before is None:
            os.environ.pop("POLYTILE_IGNORE_TUNED", None)
        else:
            os.environ["POLYTILE_IGNORE_TUNED"] = before


def _run(args: argparse.Namespace, tuned: bool) -> int:
    command = command_text(args)
    date = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    # The target first: a target this host cannot run is refused before the peaks are measured.
    target = _target_fact(args.target) if getattr(args, "target", None) else None
    facts = machine_facts()
    facts["tuning database"] = "used (--tuned)" if tuned else "ignored: the heuristics' kernels"
    if target is not None:
        facts["polytile target"] = target
    print(f"polytile bench  ({date})")
    for key, value in facts.items():
        print(f"  {key}: {value}")
    busy = _busy_warning()
    if busy:
        print(f"polytile bench: warning: {busy}", file=sys.stderr)
    if args.latency:
        return _latency(args, facts, command, date)
    if args.training:
        return _training(args, facts, command, date, busy)
    if getattr(args, "fusion", False):
        return _fusion(args, facts, command, date, busy)
    return _throughput(args, facts, command, date, busy)


def _target_fact(name: str) -> str:
    """The target a --target run compiles for; an OpenCL or CUDA one names its device (a
    cuda target without a device is refused here, before any workload runs)."""
    from polytile.targets.target import select_target
    target = select_target(name)
    if target.backend == "cuda":
        from polytile.runtime.cuda import cuda_device
        device = cuda_device()
        capability = ".".join(map(str, device.capability))
        return f"{name} on {device.name} (compute capability {capability})"
    if target.backend != "opencl":
        return target.identity
    from polytile.runtime.opencl import opencl_device
    device = opencl_device().device
    return f"{name} on {device.name} ({device.platform.name} {device.platform.version})"


def command_text(args: argparse.Namespace) -> str:
    return " ".join(["polytile", "bench", *_argv(args)])


def results_path(write: bool | str) -> Path:
    """Where `--write [FILE]` puts the tables: FILE as given; bare --write (True) the
    project's benchmarks/RESULTS.md, in the checkout this polytile runs from (an editable
    install, or PYTHONPATH) wherever the command is started, else under the current
    directory."""
    if isinstance(write, str):
        return Path(write)
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").is_file() and (root / "benchmarks").is_dir():
        return root / "benchmarks" / "RESULTS.md"
    return Path("benchmarks") / "RESULTS.md"


def _throughput(args: argparse.Namespace, facts: dict[str, str], command: str,
                date: str, busy: str) -> int:
    from polytile.bench.device import on_cuda
    from polytile.bench.harness import COMPILED, run_workload
    from polytile.bench.peak import measure_peak
    from polytile.bench.report import (
        throughput_markdown,
        throughput_text,
        write_section,
        wrong_banner,
    )
    from polytile.bench.workloads import families, select
    from polytile.errors import ArgumentError

    workloads = select(args.quick, args.only)
    if not workloads:
        raise ArgumentError(f"no workload matches --only {','.join(args.only)}",
                            hint=f"workload families: {', '.join(families())}")
    options = TimingOptions.for_run(args.quick, args.repeats)
    peak, peak_error = None, None
    if on_cuda(args.target):
        peak_error = "a GPU run (the host's FMA and STREAM peaks say nothing of the GPU)"
    else:
        print("measuring peak ...", file=sys.stderr, flush=True)
        try:
            peak = measure_peak(repeats=3 if args.quick else 5)
            for line in peak.lines():
                print(f"  {line}")
        except Exception as e:  # noqa: BLE001 - the table is still worth having without it
            peak_error = f"{type(e).__name__}: {e}"
            print(f"  peak not measured: {peak_error}")
    rows = []
    start = time.perf_counter()
    for i, w in enumerate(workloads, 1):
        print(f"[{i}/{len(workloads)}] {w.name} ({time.perf_counter() - start:.0f} s)",
              file=sys.stderr, flush=True)
        workload_rows = run_workload(w, backend=args.backend, target=args.target,
                                     options=options,
                                     use_compile=not args.no_compile)
        rows.extend(workload_rows)
        compile_seconds = workload_rows[0].outcomes[COMPILED].compile_seconds
        if compile_seconds is not None:
            print(f"  torch.compile: {compile_seconds:.1f} s to compile", file=sys.stderr,
                  flush=True)
    facts = {**facts, "load average": f"{facts['load average']} at start, "
                                      f"{load_average()} at end"}
    print()
    print(throughput_text(rows, peak))
    banner = wrong_banner(rows)
    if banner:
        print("\n" + banner, file=sys.stderr)
    if args.write:
        title = "Throughput" + (" (quick smoke run, small sizes)" if args.quick else "") + (
            f" (only {', '.join(args.only)})" if args.only else "")
        notes = [f"{args.blas_env_removed} unset for this run (NumPy's BLAS reads them at import)"
                 ] if args.blas_env_removed else []
        if args.backend != "c":
            notes.append(f"polytile backend: {args.backend}")
        if args.target:
            notes.append(f"polytile target: {args.target}" + (
                " (PoCL on the CPU: the times are functional, not a GPU performance claim)"
                if args.target == "opencl" else
                " (inputs on the device, each timed group synchronized; torch eager on the "
                "same CUDA tensors; NumPy only checks)" if on_cuda(args.target) else ""))
        if busy:
            notes.append(f"warning: {busy}")
        path = results_path(args.write)
        write_section(path, _section("throughput", args),
                      throughput_markdown(rows, peak, peak_error, facts, command, date, title,
                                          notes))
        print(f"\nwrote {path}")
    return 1 if banner else 0


def _latency(args: argparse.Namespace, facts: dict[str, str], command: str, date: str) -> int:
    from polytile.bench.latency import measure_dispatch, measure_latency, select_examples
    from polytile.bench.report import (
        dispatch_table,
        format_text,
        latency_markdown,
        latency_table,
        write_section,
    )
    from polytile.errors import ArgumentError

    examples = select_examples(args.only)
    if not examples:
        raise ArgumentError(f"no latency example matches --only {','.join(args.only)}",
                            hint="examples: mv, sgemm, fcrelu, conv2d, maxpool, gather, tmm, "
                                 "tbmm, 2LUT, MLP1")
    samples = args.repeats or (1 if args.quick else 3)
    rows = measure_latency(examples, samples=samples,
                           progress=lambda s: print(s, file=sys.stderr, flush=True))
    options = (TimingOptions(rounds=3, block_seconds=0.05, settle_seconds=0.05) if args.quick
               else TimingOptions(rounds=5, block_seconds=0.1, settle_seconds=0.05))
    dispatch = measure_dispatch(options)
    print()
    print(format_text(*latency_table(rows)))
    print()
    print(format_text(*dispatch_table(dispatch)) if not dispatch.error
          else f"dispatch overhead: FAILED: {dispatch.error}")
    if args.write:
        path = results_path(args.write)
        write_section(path, _section("latency", args),
                      latency_markdown(rows, dispatch, facts, command, date,
                                       "Latency" + (" (quick: one process per example)"
                                                    if args.quick and not args.repeats else "")))
        print(f"\nwrote {path}")
    return 0


def _training(args: argparse.Namespace, facts: dict[str, str], command: str, date: str,
              busy: str) -> int:
    from polytile.bench import training
    from polytile.bench.report import format_markdown, format_text, write_section
    from polytile.errors import ArgumentError

    try:
        import torch  # noqa: F401
    except ImportError:
        raise ArgumentError("--training needs torch",
                            hint="pip install polytile[torch]") from None
    workloads = training.training_set(args.quick)
    if args.only:
        workloads = [w for w in workloads if w.matches(args.only)]
    if not workloads:
        raise ArgumentError(f"no training workload matches --only {','.join(args.only)}",
                            hint="MLP1, MLP3, layernorm")
    options = TimingOptions.for_run(args.quick, args.repeats)
    rows = training.run(workloads, options,
                        progress=lambda s: print(s, file=sys.stderr, flush=True))
    print()
    print(format_text(*training.table(rows)))
    wrong = any(r.status.startswith("WRONG") for r in rows)
    if args.write:
        text = _section_head("Training step", args.quick, date, command, facts, busy)
        text += ["", format_markdown(*training.table(rows)), "", training.NOTE]
        path = results_path(args.write)
        write_section(path, _section("training", args), "\n".join(text))
        print(f"\nwrote {path}")
    return 1 if wrong else 0


def _fusion(args: argparse.Namespace, facts: dict[str, str], command: str, date: str,
            busy: str) -> int:
    from polytile.bench import fusion
    from polytile.bench.fusion_workloads import fusion_set
    from polytile.bench.report import format_markdown, format_text, write_section
    from polytile.config import load_config
    from polytile.errors import ArgumentError
    from polytile.graph.cost import probe_cost_model, store_cost_model
    from polytile.targets.target import select_target

    workloads = fusion_set(args.quick)
    if args.only:
        workloads = [w for w in workloads if w.matches(args.only)]
    if not workloads:
        raise ArgumentError(f"no fusion workload matches --only {','.join(args.only)}",
                            hint="attention, interests, logreg, perceptron, vae-encoder, "
                                 "ln-gelu-residual")
    config = load_config()
    target = select_target(config.target)
    print("probing the fusion cost model (M(V), phi) ...", file=sys.stderr, flush=True)
    model = probe_cost_model(config, target, quick=args.quick)
    path = store_cost_model(config, target, model)
    probe = ["M(V): " + ", ".join(f"{v >> 10} KiB {t * 1e6:.1f} us ({v / t / 1e9:.1f} GB/s)"
                                   for v, t in model.points),
             f"phi (one more kernel): {model.phi * 1e6:.2f} us", f"stored in {path}"]
    for line in probe:
        print(f"  {line}")
    options = TimingOptions.for_run(args.quick, args.repeats)
    rows = fusion.run(workloads, options,
                      progress=lambda s: print(s, file=sys.stderr, flush=True),
                      use_compile=not args.no_compile)
    print()
    print(format_text(*fusion.table(rows)))
    wrong = any(r.status.startswith("WRONG") for r in rows)
    if args.write:
        text = _section_head("Fusion plans", args.quick, date, command, facts, busy)
        text += ["", "### Cost model probe", ""] + [f"- {line}" for line in probe[:2]]
        text += ["", format_markdown(*fusion.table(rows)), "", fusion.NOTE]
        path = results_path(args.write)
        write_section(path, _section("fusion", args), "\n".join(text))
        print(f"\nwrote {path}")
    return 1 if wrong else 0


def _busy_warning() -> str:
    """A warning when other processes keep the cores busy: every number will be off."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return ""
    if load < 0.5:
        return ""
    return (f"load average {load:.2f} before starting: other processes share the cores, so "
            "times are inflated, most of all those of multithreaded code (an OpenMP region "
            "waits for the thread that lost its core)")


def _section(kind: str, args: argparse.Namespace) -> str:
    """Quick and partial runs get sections of their own, so they never replace a full run."""
    return (kind + ("-quick" if args.quick else "") + ("-partial" if args.only else "")
            + (f"-{args.target}" if getattr(args, "target", None) else ""))


def _rerun_without(present: Sequence[str], args: argparse.Namespace) -> int:
    removed = " ".join(f"{v}={os.environ[v]}" for v in present)
    print(f"polytile bench: re-running without {removed} so NumPy's BLAS picks its own kernel",
          file=sys.stderr, flush=True)
    env = {k: v for k, v in os.environ.items() if k not in BLAS_ENV_VARS}
    argv = [sys.executable, "-m", "polytile", "bench", *_argv(args),
            f"--blas-env-removed={removed}"]
    return subprocess.run(argv, env=env, check=False).returncode


def _argv(args: argparse.Namespace) -> list[str]:
    argv = []
    if args.quick:
        argv.append("--quick")
    if args.only:
        argv.append("--only=" + ",".join(args.only))
    if args.latency:
        argv.append("--latency")
    if getattr(args, "training", False):
        argv.append("--training")
    if getattr(args, "fusion", False):
        argv.append("--fusion")
    if args.write:
        argv.append("--write" if args.write is True else f"--write={args.write}")
    if args.repeats is not None:
        argv.append(f"--repeats={args.repeats}")
    if args.no_compile:
        argv.append("--no-compile")
    if args.backend != "c":
        argv.append(f"--backend={args.backend}")
    if getattr(args, "target", None):
        argv.append(f"--target={args.target}")
    if getattr(args, "tuned", False):
        argv.append("--tuned")
    return argv


def _section_head(title: str, quick: bool, date: str, command: str, facts: dict[str, str],
                  busy: str) -> list[str]:
    """The heading of a recorded run: title, date, command, the machine's facts."""
    title += " (quick smoke run, small sizes)" if quick else ""
    text = [f"## {title}", "", f"- date: {date}", f"- command: `{command}`", "",
            "### Machine", ""] + [f"- {k}: {v}" for k, v in facts.items()]
    return text + ([f"- warning: {busy}"] if busy else [])
