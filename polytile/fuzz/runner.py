"""A fuzz campaign: hypothesis draws the cases, the oracle judges them, a Report counts.

Front-end cases run in this process, each under a time limit (a hang is a failure).
Compile cases run each in a forked child, so that a kernel that crashes the process
(a segfault) is counted and reported instead of ending the campaign. Hypothesis only
generates here (no shrinking, no example database): a failure is recorded with its
program and seed, and the campaign goes on.
"""
from __future__ import annotations

import json
import os
import pickle
import select
import signal
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable

from polytile.config import Config
from polytile.fuzz.mutations import mutants
from polytile.fuzz.oracle import Outcome, check_compiled, check_front_end, check_gradient
from polytile.fuzz.programs import programs

FAILURE_KINDS = ("error", "mismatch", "crash", "timeout", "hang")


@dataclass(frozen=True)
class Failure:
    stage: str                  # "front end" or "compile"
    kind: str                   # one of FAILURE_KINDS
    source: str
    seed: int | None            # the compile case's sizes and inputs
    detail: str
    target: str | None = None   # the compiled side's target (None: the host's best)
    options: tuple[tuple[str, Any], ...] = ()    # the compiled side's pass options

    def reproducer(self) -> str:
        """The program as a TC file whose first lines say how to replay it."""
        seed = f" seed={self.seed}" if self.seed is not None else ""
        seed += f" target={self.target}" if self.target and self.seed is not None else ""
        lines = [f"# polytile.fuzz {self.stage.replace(' ', '-')} {self.kind}{seed}",
                 "# replay: python -m polytile.fuzz --replay THIS_FILE"]
        if self.options and self.seed is not None:
            lines.append(f"# options: {json.dumps(dict(self.options))}")
        lines += ["# " + line for line in self.detail.strip().splitlines()[-40:]]
        return "\n".join(lines) + "\n" + self.source


@dataclass
class Report:
    front_end: Counter[str] = field(default_factory=Counter)    # outcome kind -> cases
    compiled: Counter[str] = field(default_factory=Counter)
    gradients: Counter[str] = field(default_factory=Counter)
    rejected_by: Counter[str] = field(default_factory=Counter)  # PolytileError class -> cases
    failures: list[Failure] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    def summary(self) -> str:
        fe, cc = self.front_end, self.compiled
        lines = [
            (f"front end: {sum(fe.values())} cases in {self.seconds.get('front end', 0):.0f} s:"
             f" {fe['accepted']} accepted, {fe['rejected']} rejected with a PolytileError,"
             f" {fe['error']} non-Polytile exceptions, {fe['hang']} hangs"),
            "  rejected by: " + ", ".join(f"{k} {v}" for k, v in self.rejected_by.most_common()),
            (f"compile: {sum(cc.values())} accepted programs in "
             f"{self.seconds.get('compile', 0):.0f} s: {cc['compared']} compiled and compared,"
             f" {cc['raised']} raised a PolytileError in both backends at the call,"
             f" {cc['overflowed']} overflowed in a reduction (either order is right),"
             f" {cc['rejected']} rejected, {cc['mismatch']} mismatches,"
             f" {cc['error']} non-Polytile exceptions, {cc['crash']} crashes,"
             f" {cc['timeout']} timeouts"),
        ]
        if self.gradients:
            gc = self.gradients
            lines.append(
                f"gradient: {sum(gc.values())} programs with a gradient in "
                f"{self.seconds.get('gradient', 0):.0f} s: {gc['compared']} compiled and compared,"
                f" {gc['raised']} raised a PolytileError in both backends at the call,"
                f" {gc['overflowed']} overflowed in a reduction, {gc['mismatch']} mismatches"
                f" (a derived program the front end rejects is one),"
                f" {gc['error']} non-Polytile exceptions, {gc['crash']} crashes,"
                f" {gc['timeout']} timeouts")
        return "\n".join(lines)

    @property
    def ok(self) -> bool:
        return not self.failures


@dataclass(frozen=True)
class Campaign:
    cases: int = 1000                    # front-end cases
    compile_cases: int = 0               # accepted programs compiled and compared
    seed: int = 0
    corpus: tuple[str, ...] = ()         # programs to mutate
    config: Config | None = None         # for the C backend (a private cache directory)
    front_end_seconds: float = 10.0      # per case
    compile_seconds: float = 300.0       # per case
    progress: Callable[[str], None] | None = None
    gradient_cases: int = 0              # programs whose derived gradient is compared
    options: tuple[tuple[str, Any], ...] = ()    # pass options of the compiled side


def run(campaign: Campaign) -> Report:
    report = Report()
    start = time.perf_counter()
    if campaign.cases:
        _front_end(campaign, report)
    report.seconds["front end"] = time.perf_counter() - start
    start = time.perf_counter()
    if campaign.compile_cases:
        _compile(campaign, report)
    report.seconds["compile"] = time.perf_counter() - start
    start = time.perf_counter()
    if campaign.gradient_cases:
        _gradients(campaign, report)
    report.seconds["gradient"] = time.perf_counter() - start
    return report


def _hypothesis(strategy: st.SearchStrategy[Any], cases: int, seed: int,
                body: Callable[[Any], None]) -> None:
    @hypothesis_seed(seed)
    @settings(max_examples=cases, phases=[Phase.generate], database=None, deadline=None,
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False)
    @given(strategy)
    def case(example: Any) -> None:
        body(example)
    try:
        case()
    except Unsatisfiable:    # every generated program was rejected: the counts say so
        pass


def _front_end(campaign: Campaign, report: Report) -> None:
    corpus = list(campaign.corpus)
    choices = [programs(), programs()]
    if corpus:
        choices += [mutants(corpus), programs().flatmap(lambda p: mutants([p, *corpus]))]

    def body(source: str) -> None:
        try:
            with _time_limit(campaign.front_end_seconds):
                outcome = check_front_end(source)
        except _Hang:
            outcome = Outcome("hang", f"more than {campaign.front_end_seconds:g} s")
        _record(report, report.front_end, "front end", source, None, outcome, campaign)
        if outcome.kind == "rejected":
            report.rejected_by[outcome.detail] += 1
    _hypothesis(st.one_of(choices), campaign.cases, campaign.seed, body)


def _compile(campaign: Campaign, report: Report) -> None:
    def body(example: tuple[str, int]) -> None:
        source, seed = example
        if check_front_end(source).kind != "accepted":
            assume(False)      # only accepted programs count as compile cases
        outcome = isolated(lambda: check_compiled(source, seed, campaign.config,
                                                  dict(campaign.options)),
                           campaign.compile_seconds)
        _record(report, report.compiled, "compile", source, seed, outcome, campaign)
    strategy = st.tuples(programs(), st.integers(0, 2**32 - 1))
    _hypothesis(strategy, campaign.compile_cases, campaign.seed + 1, body)


def _gradients(campaign: Campaign, report: Report) -> None:
    """Accepted programs with a gradient: the derived program must be valid TC, and
    compiled it must agree with the reference interpreter."""
    def body(example: tuple[str, int]) -> None:
        source, seed = example
        if check_front_end(source).kind != "accepted":
            assume(False)
        outcome = isolated(lambda: check_gradient(source, seed, campaign.config,
                                                  dict(campaign.options)),
                           campaign.compile_seconds)
        if outcome.kind == "rejected":      # no gradient: not a case
            assume(False)
        _record(report, report.gradients, "gradient", source, seed, outcome, campaign)
    strategy = st.tuples(programs(), st.integers(0, 2**32 - 1))
    _hypothesis(strategy, campaign.gradient_cases, campaign.seed + 2, body)


def _record(report: Report, counts: Counter[str], stage: str, source: str, seed: int | None,
            outcome: Outcome, campaign: Campaign) -> None:
    counts[outcome.kind] += 1
    if outcome.kind in FAILURE_KINDS:
        target = campaign.config.target if campaign.config is not None else None
        failure = Failure(stage, outcome.kind, source, seed, outcome.detail, target,
                          campaign.options)
        report.failures.append(failure)
        if campaign.progress:
            campaign.progress(f"--- {stage} {outcome.kind} ---\n{failure.reproducer()}")
    total = sum(counts.values())
    goal = {"front end": campaign.cases, "compile": campaign.compile_cases,
            "gradient": campaign.gradient_cases}[stage]
    if campaign.progress and goal >= 20 and total % max(1, goal // 10) == 0:
        campaign.progress(f"{stage}: {total}/{goal} cases, {dict(counts)}")


# ---------------------------------------------------------------- isolation

class _Hang(BaseException):
    """Raised by the timer; a BaseException so that no `except Exception` swallows it."""


@contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise _Hang()
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def isolated(job: Callable[[], Outcome], seconds: float) -> Outcome:
    """job() in a forked child: a crash or a timeout becomes an Outcome."""
    if not hasattr(os, "fork"):
        return job()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:                                   # the child
        os.close(read_end)
        try:
            outcome = job()
        except BaseException:  # noqa: BLE001 - reported to the parent
            outcome = Outcome("error", traceback.format_exc())
        with os.fdopen(write_end, "wb") as pipe:
            pipe.write(pickle.dumps(outcome))
        os._exit(0)
    os.close(write_end)
    chunks = []
    deadline = time.monotonic() + seconds
    with os.fdopen(read_end, "rb") as pipe:
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([pipe], [], [], max(0.0, left))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return Outcome("timeout", f"more than {seconds:g} s")
            chunk = os.read(pipe.fileno(), 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return Outcome("crash", f"killed by {signal.Signals(os.WTERMSIG(status)).name}")
    if not chunks:
        return Outcome("crash", f"exited with status {os.waitstatus_to_exitcode(status)}")
    result: Outcome = pickle.loads(b"".join(chunks))
    return result
