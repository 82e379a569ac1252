"""Tuner child processes live no longer than the process that started them.

The compile workers and the profiling process are private to one tuning run: when
its process dies, even by SIGKILL where no cleanup code runs, they must not go on
(they held its stdout and cores indefinitely). Each child calls `die_with_parent`
first thing:

* on Linux, prctl(PR_SET_PDEATHSIG, SIGKILL): the kernel kills the child when the
  thread that started it exits. The tuner starts its children from the thread that
  runs the tuning and waits for them there, so that thread outlives them unless the
  process dies;
* elsewhere (or if prctl fails), a daemon thread polls the parent's pid.

Either way, a parent that died before the call is noticed at once (the race the
prctl man page describes: the child was then adopted by another process).
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

_PR_SET_PDEATHSIG = 1
POLL_SECONDS = 0.5


def die_with_parent(parent: int) -> None:
    """Make this process exit when process `parent` (the one that started it) dies."""
    if not _kernel_kills_us_with(parent):
        threading.Thread(target=_watch, args=(parent,), name="polytile-parent-watch",
                         daemon=True).start()
    if os.getppid() != parent:
        os._exit(1)


def _kernel_kills_us_with(parent: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_SECONDS)
    os._exit(1)
