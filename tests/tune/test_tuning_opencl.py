"""Tuning on the opencl target (TC §6 genes: work-group size, staged reduction tile,
mapped dimensions; row groups where a fused row becomes one): a crashing, a hanging and a
wrong kernel are rejected and tuning goes on, as on the C backend, and every row group
size the tuner tries computes what the reference does. Skips, saying why, without a
working OpenCL device."""
from __future__ import annotations

import numpy as np
import pytest
from passes.test_gpu_rows import LAYERNORM

import polytile
import polytile.backends.opencl as backend
from polytile.codegen.opencl import OpenCLSource
from polytile.config import Config
from polytile.runtime.opencl import device_problem
from polytile.tune import measure
from polytile.tune.database import TuningDatabase
from polytile.tune.options import Options

from .conftest import TMM

PROBLEM = device_problem()
pytestmark = pytest.mark.skipif(PROBLEM is not None,
                                reason=f"the opencl target needs {PROBLEM}")

# Which candidates misbehave, by their work-group size.
BEHAVIOUR = {32: "crash", 128: "wrong", 256: "hang"}
_CURRENT: dict[str, str | None] = {"behaviour": None}
_real_build_one = measure.build_one
_real_print = backend.print_opencl


def _behaviour(options: Options) -> str | None:
    return BEHAVIOUR.get(dict(options.passes).get("gpu.threads", 64))


def _build_one(job, options, timeout):  # type: ignore[no-untyped-def]
    _CURRENT["behaviour"] = _behaviour(options)     # runs in the (forked) build worker
    return _real_build_one(job, options, timeout)


def _print(kernel):  # type: ignore[no-untyped-def]
    source = _real_print(kernel)
    bad = {"crash": "*(__global volatile int *)0 = 0;",
           "wrong": "if (get_global_id(0) == 0 && get_global_id(1) == 0) b2[0] += 1.0f;",
           "hang": "for (volatile int spin = 1; spin;) {}"}.get(_CURRENT["behaviour"] or "")
    if bad is None:
        return source
    head, mark, tail = source.text.rpartition("/* an earlier launch failed */")
    return OpenCLSource(head + mark + "\n    " + bad + tail, source.launches)


def test_crashing_hanging_and_wrong_opencl_candidates_are_rejected(
        config: Config, tmm_args: tuple[np.ndarray, np.ndarray],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(measure, "build_one", _build_one)
    monkeypatch.setattr(backend, "print_opencl", _print)
    mod = polytile.define(TMM, target="opencl", config=config)
    start = [Options.of({}, {"gpu.threads": t}) for t in (32, 128, 256, 64)]
    result = polytile.tune(mod.tmm, *tmm_args, start=start, population=4, generations=2,
                           elites=1, budget=120, build_timeout=30, run_timeout=3, confirm=0,
                           progress=False)
    rows = TuningDatabase.of(config).measurements(result.key)
    status: dict[str | None, set[str]] = {}
    for row in rows:
        status.setdefault(_behaviour(Options.from_json(row["options"])), set()).add(
            row["status"])
    assert status["crash"] == {"crash"}
    assert status["wrong"] == {"wrong"}
    assert status["hang"] == {"timeout"}
    assert "ok" in status[None]
    assert result.best is not None and _behaviour(result.best) is None
    monkeypatch.setattr(backend, "print_opencl", _real_print)
    a, b = tmm_args
    np.testing.assert_allclose(mod.tmm(a, b), a @ b.T, rtol=1e-4, atol=1e-4)


def test_row_group_sizes_are_genes_the_tuner_checks_against_the_reference(
        config: Config) -> None:
    """Layernorm's fused row is a row group: gpu.rows is a gene, and each size tried
    (and a row per work-item) is checked on random inputs against the reference
    interpreter before it is timed."""
    mod = polytile.define(LAYERNORM, target="opencl", config=config)
    rng = np.random.default_rng(0)
    x = (3 * rng.standard_normal((33, 67))).astype(np.float32)
    gamma, beta = rng.standard_normal((2, 67)).astype(np.float32)
    start = [Options.of({}, {"fuse.strategy": "rows", "gpu.rows": r}) for r in (64, 0, 32)]
    result = polytile.tune(mod.layernorm, x, gamma, beta, start=start, population=4,
                           generations=1, budget=120, confirm=0, progress=False)
    rows = TuningDatabase.of(config).measurements(result.key)
    passes = [dict(Options.from_json(row["options"]).passes) for row in rows]
    assert {p.get("gpu.rows", 64) for p in passes if p.get("fuse.strategy") == "rows"} >= {
        64, 0, 32}
    assert {row["status"] for row in rows} == {"ok"}
    mean = x.mean(axis=1, keepdims=True)
    expected = (x - mean) / np.sqrt(x.var(axis=1, keepdims=True) + 1e-5) * gamma + beta
    np.testing.assert_allclose(mod.layernorm(x, gamma, beta), expected, rtol=1e-4, atol=1e-4)
