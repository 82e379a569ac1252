"""python -m polytile.fuzz: run a fuzz campaign, or replay one failure.

    python -m polytile.fuzz --cases 100000 --compile-cases 300 --seed 7
    python -m polytile.fuzz --compile-cases 300 --seed 22 --target opencl
    python -m polytile.fuzz --cases 0 --gradient-cases 200 --seed 3
    python -m polytile.fuzz --compile-cases 300 --target opencl --option fuse.strategy=rows
    python -m polytile.fuzz --replay failures/compile-mismatch-3.tc

Compiled kernels go to a temporary cache directory (removed at the end), never to the
user's cache. `--target` compiles for another target than the host's best (the OpenCL
backend on PoCL, cpu-generic's SSE code); a failure's first line names it, and
`--replay` compiles for it again. `--option PASS.PARAM=VALUE` (repeatable; the value
in JSON, or a bare word as a string) sets a pass option of the compiled side, checked
against the target first, and is replayed too; a `--target` or `--option` given with
`--replay` takes the place of the file's. The exit status is 1 when a case
failed, 2 when hypothesis is missing, an option is wrong or the target cannot run here.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from polytile.config import load_config
from polytile.errors import PolytileError, UnsupportedError
from polytile.fuzz import require_hypothesis
from polytile.runtime.dispatch import wait_for_builds


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m polytile.fuzz", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=1000, help="front-end cases")
    parser.add_argument("--compile-cases", type=int, default=0,
                        help="accepted programs to compile and compare with the interpreter")
    parser.add_argument("--gradient-cases", type=int, default=0,
                        help="programs with a gradient (polytile.autodiff) whose derived "
                             "program is compiled and compared with the interpreter")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--corpus", type=Path, nargs="*",
                        help="files or directories of TC programs to mutate (default: the "
                             "paper's programs and the conformance corpus of this checkout, "
                             "and the benchmark workloads)")
    parser.add_argument("--failures", type=Path,
                        help="directory to write each failure to, as a TC file that replays it")
    parser.add_argument("--replay", type=Path, help="run the case of a failure file again")
    parser.add_argument("--target", help="the compiled side's target (default: POLYTILE_TARGET "
                                         "or the host's best), e.g. opencl or cpu-generic")
    parser.add_argument("--option", action="append", default=[], metavar="PASS.PARAM=VALUE",
                        help="a pass option of the compiled side, e.g. fuse.strategy=rows")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    return parser.parse_args(argv)


def _options(texts: list[str], target: str | None) -> dict[str, Any]:
    """`--option` values as pass options, checked against the target (ArgumentError)."""
    from polytile.passes.pipeline import check_pass_options, options_from_text
    from polytile.targets.target import load_target, select_target
    options = options_from_text(texts)
    # the target's passes, without probing its device here: PoCL's threads would stay in
    # this process, and the cases, each in a fork of it, would hang on their locks
    check_pass_options(options, load_target(target) if target else select_target())
    return options


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    try:
        require_hypothesis()
    except UnsupportedError as err:
        print(err, file=sys.stderr)
        return 2
    from polytile.fuzz.mutations import corpus, default_corpus_paths
    from polytile.fuzz.runner import Campaign, run
    with tempfile.TemporaryDirectory(prefix="polytile-fuzz-") as cache:
        try:
            config = dataclasses.replace(load_config(), cache_dir=Path(cache), ignore_tuned=True)
            if args.target:
                problem = _unusable(args.target)
                if problem:
                    print(problem, file=sys.stderr)
                    return 2
                config = dataclasses.replace(config, target=args.target)
            try:
                options = _options(args.option, config.target)
            except PolytileError as err:
                print(err, file=sys.stderr)
                return 2
            if args.replay:
                return _replay(args.replay, config, options, bool(args.target))
            programs = corpus(args.corpus if args.corpus is not None else default_corpus_paths())
            progress = None if args.quiet else (lambda line: print(line, file=sys.stderr,
                                                                   flush=True))
            campaign = Campaign(args.cases, args.compile_cases, args.seed, tuple(programs), config,
                                progress=progress, gradient_cases=args.gradient_cases,
                                options=tuple(options.items()))
            print(f"corpus: {len(programs)} programs; seed {args.seed}", file=sys.stderr)
            report = run(campaign)
        finally:
            # The native call path builds into the cache in the background: wait for
            # it before the directory goes (a replay ends before it lands).
            wait_for_builds()
    print(report.summary())
    if args.failures and report.failures:
        args.failures.mkdir(parents=True, exist_ok=True)
        for k, failure in enumerate(report.failures):
            name = f"{failure.stage.replace(' ', '-')}-{failure.kind}-{k}.tc"
            (args.failures / name).write_text(failure.reproducer())
        print(f"{len(report.failures)} failures written to {args.failures}")
    return 0 if report.ok else 1


def _unusable(target: str) -> str | None:
    """Why `target` cannot run here, or None. Asked in a forked child: probing an
    OpenCL device in this process would leave the runtime's threads behind, and the
    cases, each run in a fork of this process, would hang on its locks."""
    from polytile.fuzz.oracle import Outcome
    from polytile.fuzz.runner import isolated
    from polytile.targets.target import select_target

    def probe() -> Outcome:
        try:
            select_target(target)
        except PolytileError as err:
            return Outcome("rejected", str(err))
        return Outcome("accepted")
    outcome = isolated(probe, 120)
    return None if outcome.kind == "accepted" else outcome.detail or outcome.kind


def _replay(path: Path, config, options: dict[str, Any],  # type: ignore[no-untyped-def]
            target_given: bool) -> int:
    """The failure in `path` again, with its target and pass options; a `--target` or
    `--option` of the command line takes the place of the file's (an option of the
    file that the command line does not name stays)."""
    from polytile.fuzz.oracle import check_compiled, check_front_end, check_gradient
    text = path.read_text()
    seed = re.search(r"^# polytile\.fuzz (\S+) \S+ seed=(\d+)", text, re.MULTILINE)
    target = re.search(r"^# polytile\.fuzz \S+ \S+ seed=\d+ target=(\S+)", text, re.MULTILINE)
    if target is not None and not target_given:
        config = dataclasses.replace(config, target=target.group(1))
    recorded = re.search(r"^# options: (.*)$", text, re.MULTILINE)
    chosen = {**(json.loads(recorded.group(1)) if recorded else {}), **options} or None
    outcome = check_front_end(text)
    print(f"front end: {outcome.kind} {outcome.detail}")
    if seed is not None and outcome.kind == "accepted":
        stage, number = seed.group(1), int(seed.group(2))
        check = check_gradient if stage == "gradient" else check_compiled
        outcome = check(text, number, config, chosen)
        print(f"{stage} (seed {number}): {outcome.kind} {outcome.detail}")
    return 0 if outcome.kind in ("accepted", "rejected", "compared", "raised", "overflowed") else 1


if __name__ == "__main__":
    sys.exit(main())
