"""Faults for the cluster tests (tests/tune/test_cluster.py), installed inside workers
with Client.run, or in every Python process a worker starts (its build and profiling
processes) through tests/tune/cluster_hooks/sitecustomize.py when the worker's
environment has PT_TEST_CLUSTER_FAULTS=1. No pytest here: these run in workers."""
from __future__ import annotations

import os
import signal
import time
from typing import Any

# Which candidates misbehave, by the register tile of s0 along i1 (as in test_tuning).
BEHAVIOUR = {3: "crash", 5: "wrong", 6: "hang", 4: "compile-hang"}


def behaviour(options: Any) -> str | None:
    s0 = options.schedule("s0")
    return BEHAVIOUR.get(dict(s0.unroll).get("i1", 1)) if s0 is not None else None


def misbehave_by_unroll() -> None:
    """Candidates whose s0 register tile along i1 is 3, 5, 6 or 4 crash, compute a wrong
    result, hang, or hang the compile. Patches this process's build_one and C printer."""
    import polytile.backends.c_x86 as codegen
    from polytile.codegen.c import CSource
    from polytile.tune import measure
    real_build, real_print = measure.build_one, codegen.print_c
    current: dict[str, str | None] = {"behaviour": None}

    def build_one(job: Any, options: Any, timeout: float) -> Any:
        current["behaviour"] = behaviour(options)
        return real_build(job, options, timeout)

    def print_c(kernel: Any, symbol: Any = None) -> Any:
        source = real_print(kernel, symbol)
        if current["behaviour"] == "compile-hang":
            time.sleep(60)
        bad = {"crash": "*(volatile int *)0 = 0;",
               "wrong": "((float *)args[2])[0] += 1.0f;",
               "hang": "for (volatile int spin = 1; spin;) {}"}.get(current["behaviour"] or "")
        if bad is None:
            return source
        return CSource(source.text.replace("return pt_status;", bad + " return pt_status;"),
                       source.symbol)
    codegen.print_c = print_c
    measure.build_one = build_one  # type: ignore[assignment]


def die_in_first_candidate() -> None:
    """This worker is SIGKILLed as soon as it starts measuring a candidate."""
    from polytile.tune import cluster

    def die(*args: Any) -> Any:
        os.kill(os.getpid(), signal.SIGKILL)
    cluster.measure_on_worker = die  # type: ignore[assignment]


def pretend_other_hardware() -> None:
    """This worker's host reports other cache sizes (so another Target.identity), and
    counts the candidates it is given."""
    from polytile.targets import target
    from polytile.tune import cluster
    target.host_caches = lambda: {"L1": 16 << 10, "L2": 128 << 10}  # type: ignore[assignment]
    real = cluster.measure_on_worker
    calls = [0]

    def counting(*args: Any) -> Any:
        calls[0] += 1
        return real(*args)
    counting.calls = calls  # type: ignore[attr-defined]
    cluster.measure_on_worker = counting  # type: ignore[assignment]


def candidates_given() -> int:
    from polytile.tune import cluster
    return int(getattr(cluster.measure_on_worker, "calls", [0])[0])
