"""Deep expressions: limits, and one place that gives deep trees the stack they need.

A TC expression is a tree, and every stage walks it recursively: typing, range
inference, the reference interpreter, lowering, the printers. A flat chain of
10,000 `+` terms (as a generator writes) is a left-deep tree 10,000 levels deep,
far past Python's default recursion limit of 1,000. Rather than rewrite every
visitor as a loop, or reassociate the chain (which would change float results),
the stages of a function whose trees are deep run in one worker thread with a large
stack and a raised recursion limit (`call_deep`). Shallow programs, nearly all of
them, run as before on the caller's stack.

The limits, each reported as a ParseError at the expression that passes it:

* MAX_NESTING: parentheses, calls, unary operators and ternaries inside each other
  (the parser itself recurses on these);
* MAX_DEPTH: the depth of the whole tree, a chain of binary operators counting one
  level per operator.
"""
from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from polytile.errors import PolytileError

MAX_NESTING = 500
MAX_DEPTH = 100_000
SHALLOW = 100               # trees up to this depth run on the caller's stack
_STACK_BYTES = 1 << 30      # virtual memory: only the pages a deep walk touches are used
_FRAMES_PER_LEVEL = 12      # Python frames a visitor may spend per tree level
_LIMIT = MAX_DEPTH * _FRAMES_PER_LEVEL

_lock = threading.Lock()
_active = 0
_saved_limit = 0

T = TypeVar("T")


def retry_deep(fn: Callable[[], T]) -> T:
    """fn() on the caller's stack, and again on a deep one if it recursed too deeply
    there. Only for functions without side effects (parsing, checking)."""
    try:
        return fn()
    except RecursionError:
        return call_deep(fn)


def call_deep(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """fn(*args, **kwargs) in a thread whose stack and recursion limit fit MAX_DEPTH.

    The recursion limit is per interpreter, so it is raised while any deep call runs
    and restored when the last one ends."""
    global _active, _saved_limit
    result: list[Any] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result.append(fn(*args, **kwargs))
        except BaseException as e:      # noqa: BLE001 - re-raised in the caller
            failure.append(e)

    with _lock:
        if _active == 0:
            _saved_limit = sys.getrecursionlimit()
            sys.setrecursionlimit(max(_saved_limit, _LIMIT))
        _active += 1
        previous = threading.stack_size(_STACK_BYTES)
        try:
            worker = threading.Thread(target=run, name="polytile-deep")
            worker.start()
        finally:
            threading.stack_size(previous)
    try:
        worker.join()
    finally:
        with _lock:
            _active -= 1
            if _active == 0:
                sys.setrecursionlimit(_saved_limit)
    if failure:
        error = failure[0]
        if isinstance(error, RecursionError):
            raise PolytileError(f"an expression is nested too deeply to compile ({error})",
                                hint=f"expressions may be up to {MAX_DEPTH} levels deep") \
                from None
        raise error
    return result[0]  # type: ignore[no-any-return]
