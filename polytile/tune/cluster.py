"""Tuning on a Dask cluster (TC §6: candidates compiled and benchmarked on many machines).

    polytile tune mm.tc --sizes M=512,K=512,N=512 --budget 5m --cluster tcp://sched:8786
    polytile.tune(mod.mm, a, b, budget="2m", cluster="local:2")

The search stays on the client: the tuner (polytile.tune.tuner) hands each generation to
`ClusterMeasurer.measure`, which submits one Dask task per candidate. A task
(`measure_on_worker`) does on its worker what the local tuner does here, with the same
functions: `build_one` compiles the candidate into the worker's compilation cache (in
the worker's build process, measure.BuildProcess: a Dask task runs in a thread, where the
compile timeout cannot fire) and `measure_build` checks it against the reference output
and times it in the worker's profiling process (polytile.tune.runner). A compile that
hangs or crashes, or a kernel that does, takes down one of those processes, which is
started again; never the worker. Workers should run one thread each (`local:N` does):
two candidates timed at once on one machine would slow each other.

Hardware never mixes. Before the first generation every worker describes itself
(`WorkerTarget`: the target it selects for the key's target name, its CPU features, its
C compiler); only workers whose target identity and compiler equal the key's get tasks,
the others are reported and skipped. Every result carries the describing of the worker
that measured it and is checked again: one that does not match (a worker restarted on
other hardware at the same address) is reported, not used, and its candidate retried
once on a matching worker.

Loss: when a worker dies mid-generation, the scheduler runs its tasks again on the
workers left (and on the one its nanny restarts); other tasks are untouched. A
`local:N` cluster allows one such failure per task (`distributed.scheduler.
allowed-failures = 1`); an external scheduler keeps its own setting (Dask's default
is 3). A task that fails for good is recorded as a crash. Tasks still running when the
budget ends are cancelled and count as unmeasured, as locally.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from polytile.compile import TuningKey
from polytile.errors import ArgumentError, PolytileError
from polytile.tune.measure import (
    Build,
    BuildJob,
    BuildProcess,
    Outcome,
    Runner,
    measure_build,
    measure_rounds,
)
from polytile.tune.options import Options
from polytile.tune.runner import RunnerSetup, RunReport

_LOCAL = re.compile(r"local:(\d+)")
_CONNECT_SECONDS = 20.0        # to reach a scheduler (Dask retries a refused connection)
_START_SECONDS = 60.0          # for workers to join it


def distributed_module() -> Any:
    """The `distributed` package, or a clear error naming the extra that provides it."""
    try:
        import distributed
    except ImportError:
        raise ArgumentError("tuning on a cluster needs Dask's `distributed` package",
                            hint="pip install 'polytile[cluster]'") from None
    return distributed


@dataclass(frozen=True)
class RemoteJob:
    """What every task of one tuning run needs; scattered to the workers once."""

    build: BuildJob
    setup: RunnerSetup
    run_id: str
    build_timeout: float
    key_target: str            # TuningKey.target: the hardware the results are for
    key_compiler: str          # TuningKey.compiler


@dataclass(frozen=True)
class WorkerTarget:
    """What a worker would compile for: the key's target name as its host runs it."""

    address: str
    host: str
    target: str                # Target.identity ("" when the host cannot run the target)
    features: tuple[str, ...]  # the host's CPU features
    compiler: str              # Toolchain.identity
    problem: str = ""          # why it cannot run the target

    def mismatch(self, job: RemoteJob) -> str:
        """Why this worker's measurements are not for the key ("" when they are)."""
        if self.problem:
            return self.problem
        if self.target != job.key_target:
            return f"its target is {self.target}, the key's is {job.key_target}"
        if self.compiler != job.key_compiler:
            return f"its C compiler is {self.compiler}, the key's is {job.key_compiler}"
        return ""

    def name(self) -> str:
        return f"worker {self.address} ({self.host})"


@dataclass(frozen=True)
class RemoteOutcome:
    build: Build               # without its IR (only the worker loads the kernel)
    report: RunReport
    worker: WorkerTarget
    seconds: float = 0.0       # the task on its worker: compile, check and timing


# ---------------------------------------------------------------- on a worker
def describe_worker(job: RemoteJob) -> WorkerTarget:
    from polytile.compile import kernel_cache
    from polytile.targets.target import host_features, select_target
    from polytile.tune.database import host_name
    address = _worker_address()
    features = tuple(sorted(host_features()))
    try:
        target = select_target(job.build.target.name)
        compiler = kernel_cache(worker_config(job)).toolchain.identity
    except PolytileError as e:
        return WorkerTarget(address, host_name(), "", features, "", e.message)
    return WorkerTarget(address, host_name(), target.identity, features, compiler)


def worker_config(job: RemoteJob) -> Any:
    """The worker's own configuration (its cache directory and C compiler, from its
    environment), compiling for the run's target name."""
    from polytile.config import load_config
    return dataclasses.replace(load_config(), target=job.build.config.target)


def measure_on_worker(job: RemoteJob, options: Options,
                      prune_seconds: float | None) -> RemoteOutcome:
    """One candidate, compiled and measured on this worker (a Dask task)."""
    start = time.perf_counter()
    worker = describe_worker(job)
    if worker.mismatch(job):
        return RemoteOutcome(Build(options, "target-mismatch"),
                             RunReport("target-mismatch", detail=worker.mismatch(job)), worker)
    builder, runner = _processes(job)
    build = builder.build(options, job.build_timeout)
    report = measure_build(runner, build, prune_seconds)
    return RemoteOutcome(dataclasses.replace(build, fn=None), report, worker,
                         time.perf_counter() - start)


def confirm_on_worker(job: RemoteJob, candidates: Sequence[Options], rounds: int,
                      seconds: float) -> dict[str, list[RunReport]]:
    """The confirmation rounds (polytile.tune.tuner) on one worker, so that the
    contenders are compared on one machine; built again here (cache hits where this
    worker built them)."""
    builder, runner = _processes(job)
    builds = [builder.build(o, job.build_timeout) for o in candidates]
    ok = [b for b in builds if b.status == "ok"]
    reports = measure_rounds(runner, ok, rounds, seconds) if ok else {}
    return {o.text(): reports.get(b.program, []) for o, b in zip(candidates, builds)}


# A build process and a profiling process per (run, worker thread): their children die
# with the thread that started them (polytile.tune.lifetime).
_PROCESSES: dict[tuple[str, int], tuple[BuildProcess, Runner]] = {}
_PROCESSES_LOCK = threading.Lock()


def _processes(job: RemoteJob) -> tuple[BuildProcess, Runner]:
    me = (job.run_id, threading.get_ident())
    with _PROCESSES_LOCK:
        pair = _PROCESSES.get(me)
        if pair is None:
            # A run that ended without closing them (its client died) leaves them.
            for old in [k for k in _PROCESSES if k[1] == me[1]]:
                for process in _PROCESSES.pop(old):
                    process.close()
            build_job = dataclasses.replace(job.build, config=worker_config(job))
            pair = _PROCESSES[me] = (BuildProcess(build_job), Runner(job.setup))
        return pair


def close_runners(run_id: str) -> int:
    """Stop this worker's build and profiling processes of run `run_id` (Client.run)."""
    with _PROCESSES_LOCK:
        mine = [k for k in _PROCESSES if k[0] == run_id]
        for k in mine:
            for process in _PROCESSES.pop(k):
                process.close()
    return len(mine)


def _worker_address() -> str:
    try:
        from distributed import get_worker
        return str(get_worker().address)
    except (ImportError, ValueError):
        return f"pid {os.getpid()}"


# ---------------------------------------------------------------- on the client
@contextmanager
def connect(cluster: Any, env: dict[str, str] | None = None) -> Iterator[Any]:
    """A distributed.Client for `cluster`: "local:N" starts a LocalCluster of N worker
    processes (one thread each, environment `env`), closed on exit; "tcp://host:port"
    connects to a running scheduler; a Client is used as it is (and left open)."""
    distributed = distributed_module()
    if isinstance(cluster, distributed.Client):
        yield cluster
        return
    spec = str(cluster)
    local = _LOCAL.fullmatch(spec)
    if local:
        import dask
        workers = int(local.group(1))
        if workers < 1:
            raise ArgumentError("local:N needs at least one worker", hint="e.g. local:2")
        # The scheduler reads this when it starts: a task whose worker dies under it
        # runs once more, then fails (KilledWorker).
        with dask.config.set({"distributed.scheduler.allowed-failures": 1}), \
                distributed.LocalCluster(
                    n_workers=workers, threads_per_worker=1, processes=True,
                    dashboard_address=None, silence_logs=logging.ERROR,
                    env=env or {}) as local_cluster, \
                distributed.Client(local_cluster) as client:
            client.wait_for_workers(workers, timeout=_START_SECONDS)
            yield client
        return
    if "://" not in spec:
        raise ArgumentError(f"cluster {spec!r} is neither local:N nor a scheduler address",
                            hint="e.g. --cluster local:2 or --cluster tcp://host:8786")
    try:
        client = distributed.Client(spec, timeout=_CONNECT_SECONDS)
    except (OSError, TimeoutError) as e:
        raise ArgumentError(f"cannot reach the Dask scheduler at {spec}: {e}",
                            hint="start one with `dask scheduler` and workers with "
                                 f"`dask worker {spec} --nthreads 1`") from None
    with client:
        client.wait_for_workers(1, timeout=_START_SECONDS)
        yield client


class ClusterMeasurer:
    """The tuner's measurements on Dask workers of the key's hardware."""

    def __init__(self, client: Any, job: RemoteJob, job_future: Any,
                 workers: dict[str, WorkerTarget], notes: list[str]):
        self.client, self.job, self._job_future = client, job, job_future
        self.workers = workers                 # address -> description, matching only
        self.notes = notes
        self.retried = 0
        self._seen: set[str] = set(workers)
        # (compile seconds, task seconds on the worker, submit-to-result seconds) per
        # candidate: where a cluster run's time goes (benchmarks/tune_cluster.py).
        self.timings: list[tuple[float, float, float]] = []

    @staticmethod
    @contextmanager
    def start(cluster: Any, build: BuildJob, setup: RunnerSetup, key: TuningKey,
              run_id: str, build_timeout: float) -> Iterator[ClusterMeasurer]:
        job = RemoteJob(build, setup, run_id, build_timeout, key.target, key.compiler)
        env = {"POLYTILE_CACHE_DIR": str(build.config.cache_dir)}
        with connect(cluster, env) as client:
            measurer = ClusterMeasurer(client, job, None, {}, [])
            measurer.refresh_workers()
            measurer._job_future = client.scatter(job, broadcast=True, hash=False)
            try:
                yield measurer
            finally:
                with contextlib.suppress(Exception):  # a worker gone has none open
                    client.run(close_runners, run_id)

    def refresh_workers(self) -> None:
        """Describe the workers not seen yet (at the start, and ones that joined or
        were restarted since) and forget those that left; an error if none is left
        that measures for the key."""
        live = set(self.client.scheduler_info()["workers"])
        for gone in set(self.workers) - live:
            del self.workers[gone]
        new = sorted(live - self._seen)
        if new:
            # Client.run calls outside a task, where a worker does not know its address.
            described = self.client.run(describe_worker, self.job, workers=new,
                                        on_error="ignore")
            for address, w in described.items():
                w = dataclasses.replace(w, address=address)
                self._seen.add(address)
                if w.mismatch(self.job):
                    self.notes.append(f"{w.name()} skipped: {w.mismatch(self.job)}")
                else:
                    self.workers[address] = w
        if not self.workers:
            raise ArgumentError(
                "no worker of the cluster measures for this key's hardware:\n  "
                + "\n  ".join(self.notes or ["(no workers)"]),
                hint="tune on workers with the client's CPU and C compiler, or choose "
                     "their target with --target")

    def _submit(self, options: Options, prune: float | None,
                avoid: frozenset[str] = frozenset()) -> Any:
        allowed = [a for a in self.workers if a not in avoid] or list(self.workers)
        return self.client.submit(measure_on_worker, self._job_future, options, prune,
                                  workers=allowed, allow_other_workers=False, pure=False)

    def measure(self, candidates: Sequence[Options], prune_seconds: float | None,
                deadline: float) -> list[Outcome | None]:
        """One Outcome per candidate, in order; None for those the budget cut off."""
        distributed = distributed_module()
        self.refresh_workers()
        submitted = time.monotonic()
        futures = {self._submit(c, prune_seconds): k for k, c in enumerate(candidates)}
        outcomes: list[Outcome | None] = [None] * len(candidates)
        retried: set[int] = set()
        pending = set(futures)
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                done, pending = distributed.wait(list(pending), timeout=left,
                                                 return_when="FIRST_COMPLETED")
            except TimeoutError:
                break
            pending = set(pending)
            for future in done:
                k = futures[future]
                retry, outcome = self._outcome(future, candidates[k], k in retried)
                if retry is not None:
                    retried.add(k)
                    self.retried += 1
                    new = self._submit(candidates[k], prune_seconds, retry)
                    futures[new] = k
                    pending.add(new)
                else:
                    outcomes[k] = outcome
                    if future.status == "finished":
                        remote: RemoteOutcome = future.result()
                        self.timings.append((remote.build.seconds, remote.seconds,
                                             time.monotonic() - submitted))
        if pending:
            self.client.cancel(list(pending))
        return outcomes

    def _outcome(self, future: Any, options: Options, retried: bool
                 ) -> tuple[frozenset[str] | None, Outcome | None]:
        """(workers to avoid in a retry, None) or (None, the candidate's outcome)."""
        if future.status == "error":
            error = future.exception()
            if not retried and type(error).__name__ != "KilledWorker":
                return frozenset(), None
            detail = (f"its worker was lost while running it ({error})"
                      if type(error).__name__ == "KilledWorker"
                      else f"the task failed twice: {type(error).__name__}: {error}")
            return None, Outcome(Build(options, "lost"), RunReport("crash", detail=detail))
        if future.status != "finished":
            return (None, Outcome(Build(options, "lost"),
                                  RunReport("crash", detail=f"task {future.status}")))
        result: RemoteOutcome = future.result()
        problem = result.worker.mismatch(self.job)
        if problem:
            note = f"{result.worker.name()} skipped: {problem}"
            if note not in self.notes:
                self.notes.append(note)
            self.workers.pop(result.worker.address, None)
            if not retried and self.workers:
                return frozenset({result.worker.address}), None
            return None, Outcome(Build(options, "lost"),
                                 RunReport("crash", detail=f"no matching worker: {problem}"))
        return None, Outcome(result.build, result.report, result.worker.host)

    def measure_rounds(self, builds: Sequence[Build], rounds: int,
                       seconds: float) -> dict[str, list[RunReport]]:
        """Confirmation rounds on one matching worker; reports by program."""
        options = [b.options for b in builds]
        worker = next(iter(self.workers))
        future = self.client.submit(confirm_on_worker, self._job_future, options, rounds,
                                    seconds, workers=[worker], allow_other_workers=True,
                                    pure=False)
        try:
            by_text = future.result(timeout=max(seconds, 0.0) + self._round_seconds(builds))
        except Exception:  # noqa: BLE001 - no confirmation: the search's best stands
            self.client.cancel([future])
            by_text = {}
        return {b.program: by_text.get(b.options.text(), []) for b in builds}

    def _round_seconds(self, builds: Sequence[Build]) -> float:
        """A bound on one round: each build checked and timed once, plus a compile."""
        return len(builds) * (self.job.setup.settings.timeout + self.job.build_timeout)
