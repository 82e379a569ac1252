"""The autotuner (TC §6): search space, search strategies, measurement, database.

    import polytile
    result = polytile.tune(mod.fn, x, w, budget="60s")   # this package, called
    print(result.table())

| module      | what                                                          |
| ----------- | ------------------------------------------------------------- |
| options     | Options: one point of the space, as replayable decisions      |
| space       | the genes of a program on a target, decode / encode, pruning  |
| search      | genetic algorithm and random search over an evaluate callback |
| measure     | parallel builds in worker processes, the profiling process    |
| runner      | the profiling process itself: check once, time, rotate inputs |
| database    | SQLite: every measurement, the best options per key           |
| tuner       | one run, wired together                                       |
| cluster     | the same per-candidate step on Dask workers (`cluster=`)      |
| command     | `polytile tune` and `polytile cache export|import|inject`     |

The package is callable so that `polytile.tune(...)` and `polytile.tune.search` can
both exist: a function named `tune` in polytile/__init__.py would be replaced by
this package the first time any of its modules is imported.
"""
from __future__ import annotations

import sys
import types
from typing import Any


class _CallableModule(types.ModuleType):
    def __call__(self, fn: Any, *args: Any, **settings: Any) -> Any:
        from polytile.api import tune
        return tune(fn, *args, **settings)


sys.modules[__name__].__class__ = _CallableModule
