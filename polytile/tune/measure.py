"""Measuring candidates (TC §6.2, Figure 4; TVM's builder / runner split).

    builds = build_all(job, candidates, BuildSettings(workers=2, timeout=60))
    with Runner(setup) as runner:
        report = runner.run(builds[0], prune_seconds=None)

Builder: candidates compile in parallel in worker processes (a ProcessPoolExecutor),
each through the ordinary Compiler into the ordinary compilation cache, so the winner
is already built when a later call asks for it. A compile that raises is a
"compile-error"; one that outlives the timeout is a "compile-timeout" (SIGALRM in
the worker, which also stops the C compiler it waits for; a worker stuck where no
signal reaches is killed with its pool).

BuildProcess: `build_one` in a child process of its own, for a caller that runs in a
thread (a Dask worker, polytile.tune.cluster), where SIGALRM cannot stop a compile.

Runner: one profiling process (polytile.tune.runner) at a time, fed one candidate
at a time, so candidates never compete for the cores. A candidate that kills it
(segfault, abort) is a "crash"; one that does not answer in time is a "timeout",
and its process is killed. Either way a fresh process serves the next candidate.

The pool uses fork, not spawn: spawn and forkserver import the caller's __main__
again, which runs an unguarded user script (`mod.fn(x, tune=True)` at top level)
once more in every worker. Forked workers only run Python and the C compiler,
never the kernels (and so never OpenMP), which is what makes fork safe here.
"""
from __future__ import annotations

import concurrent.futures as cf
import io
import multiprocessing
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Self

from polytile.config import Config
from polytile.errors import PolytileError
from polytile.ir import nodes as N
from polytile.sema.specialize import Specialized
from polytile.targets.target import Target
from polytile.tune.lifetime import die_with_parent
from polytile.tune.options import Options
from polytile.tune.runner import RunReport, recv, send

_KILL_GRACE_SECONDS = 10.0


@dataclass(frozen=True)
class BuildJob:
    """What a worker needs to compile candidates of one specialized function."""

    config: Config
    target: Target
    spec: Specialized


@dataclass(frozen=True)
class BuildSettings:
    workers: int = 0               # 0: one per core
    timeout: float = 120.0         # seconds per candidate


@dataclass(frozen=True)
class Build:
    options: Options
    status: str                # "ok", "compile-error" or "compile-timeout"
    so_path: str = ""
    program: str = ""          # sha256 of the optimized IR: equal programs, equal kernels
    backend: str = ""          # the backend that loads it (polytile.backends)
    fn: N.Function | None = None   # the optimized IR, for the backend's loader
    seconds: float = 0.0
    detail: str = ""


@dataclass(frozen=True)
class Outcome:
    """A candidate's build and its measurement, and where it was measured."""

    build: Build
    report: RunReport
    host: str = ""             # "": this machine


class _CompileTimeout(BaseException):
    """Raised by SIGALRM in a worker; a BaseException so no `except Exception` eats it."""


_JOB: BuildJob | None = None


def _init_worker(job: BuildJob, parent: int) -> None:
    global _JOB
    die_with_parent(parent)
    _JOB = job
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is the tuner's to handle


def _on_alarm(signum: int, frame: Any) -> None:
    raise _CompileTimeout


def build_one(job: BuildJob, options: Options, timeout: float) -> Build:
    """Compile one candidate (in a worker process, a Dask worker, or the caller)."""
    from polytile.compile import Compiler
    # Signals reach the main thread only: a Dask worker (polytile.tune.cluster) compiles
    # in a task thread, where the caller's deadline bounds a compile instead.
    alarm = threading.current_thread() is threading.main_thread()
    if alarm:
        previous = signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout)
    start = time.perf_counter()
    try:
        built = Compiler(job.config, job.target, options=options.pass_options()).build(job.spec)
        return Build(options, "ok", str(built.library.so_path), built.key.program,
                     job.target.backend, built.fn, time.perf_counter() - start)
    except _CompileTimeout:
        return Build(options, "compile-timeout", seconds=time.perf_counter() - start,
                     detail=f"compiling took more than {timeout:g} s")
    except Exception as e:  # noqa: BLE001 - any failure rejects the candidate, nothing more
        return Build(options, "compile-error", seconds=time.perf_counter() - start,
                     detail=f"{type(e).__name__}: {e}"[:2000])
    finally:
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


def measure_build(runner: Runner, build: Build, prune_seconds: float | None = None
                  ) -> RunReport:
    """Check and time one candidate: a failed build becomes its report. The one
    per-candidate step of both the local tuner and a cluster worker."""
    if build.status != "ok":
        return RunReport(build.status, detail=build.detail)
    return runner.run(build, prune_seconds)


def measure_rounds(runner: Runner, builds: Sequence[Build], rounds: int,
                   seconds: float) -> dict[str, list[RunReport]]:
    """Each build measured `rounds` times, in turns that start at a different build
    each round (so drift in the machine's speed spreads over all of them); rounds
    after the first only while `seconds` last. Reports of successful runs, by program."""
    deadline = time.monotonic() + seconds
    reports: dict[str, list[RunReport]] = {b.program: [] for b in builds}
    for k in range(rounds):
        if k and time.monotonic() >= deadline:
            break
        turn = list(builds)
        for b in turn[k % len(turn):] + turn[:k % len(turn)]:
            report = runner.run(b)
            if report.status == "ok" and report.median is not None:
                reports[b.program].append(report)
    return reports


def _build_in_worker(options: Options, timeout: float) -> Build:
    assert _JOB is not None, "worker not initialized"
    return build_one(_JOB, options, timeout)


def build_all(job: BuildJob, candidates: Sequence[Options],
              settings: BuildSettings = BuildSettings()) -> list[Build]:
    """Compile every candidate, in parallel; one Build per candidate, in order."""
    if not candidates:
        return []
    workers = settings.workers or len(os.sched_getaffinity(0))
    workers = max(1, min(workers, len(candidates)))
    context = multiprocessing.get_context("fork")
    pool = cf.ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker,
                                  initargs=(job, os.getpid()))
    results: list[Build | None] = [None] * len(candidates)
    try:
        futures = {pool.submit(_build_in_worker, c, settings.timeout): k
                   for k, c in enumerate(candidates)}
        # Every candidate has its own timeout in the worker; this wait only catches a
        # worker that the alarm could not stop.
        rounds = -(-len(candidates) // workers)
        done, _ = cf.wait(futures, timeout=rounds * settings.timeout + _KILL_GRACE_SECONDS)
        for future, k in futures.items():
            if future in done and future.exception() is None:
                results[k] = future.result()
            elif future in done:
                results[k] = Build(candidates[k], "compile-error",
                                   detail=f"build worker failed: {future.exception()}")
    except BaseException:          # Ctrl-C: do not wait for the compiles in flight
        _kill_workers(pool)
        raise
    finally:
        if any(r is None for r in results):
            _kill_workers(pool)
        pool.shutdown(wait=True, cancel_futures=True)
    return [r or Build(c, "compile-timeout", detail="the build worker did not answer")
            for r, c in zip(results, candidates)]


def _kill_workers(pool: cf.ProcessPoolExecutor) -> None:
    # ProcessPoolExecutor cannot stop a running task; its processes are private.
    for process in list(getattr(pool, "_processes", {}).values()):
        process.kill()


class Runner:
    """The profiling process, restarted after a candidate kills it."""

    # The child's entry point (module, function) and what it is called in errors.
    entry = ("polytile.tune.runner", "main")
    role = "profiling process"

    def __init__(self, setup: Any, start_timeout: float = 300.0):
        self.setup = setup
        self.start_timeout = start_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: Any = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                if proc.stdin:
                    send(proc.stdin.fileno(), None)
                proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def run(self, build: Build, prune_seconds: float | None = None) -> RunReport:
        """Check and time one built candidate; crash and timeout become reports."""
        if self._proc is None:
            self._start()
        assert self._proc is not None and self._proc.stdin is not None
        timeout = self.setup.settings.timeout
        try:
            send(self._proc.stdin.fileno(),
                 (build.backend, build.so_path, build.fn, prune_seconds))
            reply = self._receive(timeout)
        except (EOFError, OSError):
            return self._died()
        if reply is None:
            self._kill()
            return RunReport("timeout", detail=f"no answer within {timeout:g} s")
        return reply  # type: ignore[no-any-return]

    def _start(self) -> None:
        # Kept open for the process's lifetime: a crash report reads its tail.
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115
        module, function = self.entry
        command = [sys.executable, "-c", (f"from {module} import {function}; "
                                          f"{function}(parent={os.getpid()})")]
        self._proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=self._stderr, bufsize=0)
        assert self._proc.stdin is not None
        try:
            send(self._proc.stdin.fileno(), self.setup)
            ready = self._receive(self.start_timeout)
        except (EOFError, OSError):
            ready = None
        if ready != "ready":
            detail = self._stderr_tail()
            self._kill()
            raise PolytileError(f"the {self.role} did not start: {detail}",
                                hint=f"run `python -c 'from {module} import {function}'` "
                                     "to see why it cannot start")

    def _receive(self, timeout: float) -> Any:
        """The next reply, or None after `timeout` seconds; EOFError if the process died."""
        assert self._proc is not None and self._proc.stdout is not None
        stream = self._proc.stdout
        deadline = time.monotonic() + timeout
        chunks = bytearray()
        need = 8
        header_done = False
        while len(chunks) < need:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            readable, _, _ = select.select([stream], [], [], left)
            if not readable:
                return None
            data = os.read(stream.fileno(), need - len(chunks))
            if not data:
                raise EOFError
            chunks += data
            if not header_done and len(chunks) >= 8:
                need = 8 + int.from_bytes(chunks[:8], "little")
                header_done = True
        return recv(io.BytesIO(bytes(chunks)))

    def _died(self) -> RunReport:
        assert self._proc is not None
        code = self._proc.wait()
        detail = (f"killed by signal {-code} ({signal.Signals(-code).name})" if code < 0
                  else f"exited with status {code}")
        tail = self._stderr_tail()
        self._kill()
        return RunReport("crash", detail=detail + (f": {tail}" if tail else ""))

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
        if proc is not None:
            proc.wait()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def _stderr_tail(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0, os.SEEK_END)
        size = self._stderr.tell()
        self._stderr.seek(max(0, size - 600))
        return self._stderr.read().decode(errors="replace").strip()


class BuildProcess(Runner):
    """A child process that compiles candidates one at a time with `build_one`, in its
    main thread, where the compile timeout (SIGALRM) works. A Dask worker runs its tasks
    in threads, so it compiles here (polytile.tune.cluster): a compile that hangs or
    crashes costs this process, which is killed and started again, not the worker."""

    entry = ("polytile.tune.measure", "build_main")
    role = "build process"

    def build(self, options: Options, timeout: float) -> Build:
        if self._proc is None:
            self._start()
        assert self._proc is not None and self._proc.stdin is not None
        start = time.perf_counter()
        try:
            send(self._proc.stdin.fileno(), (options, timeout))
            reply = self._receive(timeout + _KILL_GRACE_SECONDS)
        except (EOFError, OSError):
            report = self._died()
            return Build(options, "compile-error", seconds=time.perf_counter() - start,
                         detail=f"the build process died: {report.detail}")
        if reply is None:
            self._kill()
            return Build(options, "compile-timeout", seconds=time.perf_counter() - start,
                         detail=f"the build process did not answer within {timeout:g} s")
        return reply  # type: ignore[no-any-return]


def build_main(parent: int | None = None) -> None:
    """The build process: a BuildJob, answered by "ready"; then (options, timeout)
    pairs, each answered by a Build; None ends it. Protocol as polytile.tune.runner's."""
    if parent is not None:
        die_with_parent(parent)
    out = os.dup(1)
    os.dup2(2, 1)           # anything a compile prints goes to stderr
    stdin = sys.stdin.buffer
    job: BuildJob = recv(stdin)
    send(out, "ready")
    while True:
        try:
            request = recv(stdin)
        except EOFError:
            return
        if request is None:
            return
        options, timeout = request
        send(out, build_one(job, options, timeout))
